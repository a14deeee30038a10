# SPDX-License-Identifier: Apache-2.0
"""Decode step times for ECHO's step-cost curve."""

from __future__ import annotations

import time
from typing import Callable


class StepTimer:
    """Decode step time vs its size, for ECHO's step-cost curve: a step's cycle, from the
    end of its ``_prepare_inputs`` (``started``) to the end of the next step's
    (``started`` or ``skip``). That is forward, sampling (the rejection sampler when
    the step has drafts), drafting, and the engine's scheduling and output processing,
    all of which the step's throughput pays for (at batch 24 on the CPU a fit of the
    forward alone put a step at 76-80 ms, against about 120 ms of wall time per decode
    step). A cycle whose gap after ``propose`` is over
    ``max_gap_ratio`` times the step's own work is dropped: the engine was idle (no
    requests), not working (EchoTuning.idle_gap_ratio). Fed to ``sink(num_tokens, seconds, drafted)``.
    """

    def __init__(self, sink: Callable[[int, float, bool], None], max_gap_ratio: float):
        self.sink = sink
        self.max_gap_ratio = max_gap_ratio
        self._start: tuple[int, bool, float] | None = None
        self._stopped_at: float | None = None  # end of the started step's propose

    def started(self, num_tokens: int, drafted: bool = False) -> None:
        now = time.perf_counter()
        self._close(now)
        self._start = (num_tokens, drafted, now)

    def skip(self) -> None:
        """A step that is not timed (it prefills) ends the previous one's cycle."""
        self._close(time.perf_counter())
        self._start = None

    def stopped(self) -> None:
        if self._start is not None:
            self._stopped_at = time.perf_counter()

    def _close(self, now: float) -> None:
        start, stopped_at = self._start, self._stopped_at
        self._start = self._stopped_at = None
        if start is None or stopped_at is None:
            return
        num_tokens, drafted, t0 = start
        if now - stopped_at <= self.max_gap_ratio * (stopped_at - t0):
            self.sink(num_tokens, now - t0, drafted)

