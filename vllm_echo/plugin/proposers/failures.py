# SPDX-License-Identifier: Apache-2.0
"""What goes wrong while drafting: the failure log, and the step's drafting deadline.

A failure costs speed, never output: the affected requests fall back to safe
verification, and each kind of failure is counted and logged once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

# Drafting is cooperative-timed: once a step's drafting has taken this long, the
# requests not drafted yet go without drafts this step (counted as a failure of
# kind "propose:TimeoutError", logged once). Normal drafting takes well under 10 ms
# even at batch 64 with 8k contexts (benchmarks/micro_proposer.py).
PROPOSE_DEADLINE_S = 0.1


class FailureLog:
    """Counts of each kind of failure (``counts``), each kind logged once."""

    def __init__(self):
        self.counts: dict[str, int] = {}  # kind of failure -> how often
        self._logged: set[str] = set()

    def failed(self, where: str, exc: BaseException) -> None:
        kind = f"{where}:{type(exc).__name__}"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.once(kind,
                  "vllm-echo: %s failed (%s: %s); the affected requests fall back to "
                  "safe verification for this step. Logged once per kind of failure.",
                  where, type(exc).__name__, exc, exc_info=exc)

    def unavailable(self, hook: str, reason: str, consequence: str) -> None:
        """One log line (and one counted failure) for a hook point vLLM changed,
        found at start-up or by the hook itself at run time."""
        kind = f"hook {hook}:unavailable"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.once(kind, "vllm-echo: cannot hook vLLM's %s (%s); running in %s.",
                  hook, reason, consequence)

    def once(self, kind: str, msg: str, *args, **kwargs) -> None:
        """Log ``msg`` the first time ``kind`` comes up (not counted)."""
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning(msg, *args, **kwargs)


class StepDeadline:
    """``passed()`` turns True once the step's drafting exceeded PROPOSE_DEADLINE_S;
    the first time, the timeout is reported as a failure (logged once per kind)."""

    def __init__(self, on_error: Any):
        self._end = time.perf_counter() + PROPOSE_DEADLINE_S
        self._on_error = on_error
        self._passed = False

    def passed(self) -> bool:
        if not self._passed and time.perf_counter() > self._end:
            self._passed = True
            self._on_error("propose", TimeoutError(
                f"drafting took over {PROPOSE_DEADLINE_S * 1e3:.0f} ms in one step; the "
                "requests not drafted yet go without drafts this step"))
        return self._passed
