# SPDX-License-Identifier: Apache-2.0
"""StepTimer: a decode step is timed over its whole cycle, idle gaps are not."""

import pytest

from vllm_echo.plugin.runner import step_timer
from vllm_echo.plugin.runner.step_timer import StepTimer


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(step_timer.time, "perf_counter", fake)
    return fake


def test_cycle_runs_to_the_next_prepared_step(clock):
    seen = []
    timer = StepTimer(lambda *sample: seen.append(sample), max_gap_ratio=3.0)
    timer.started(5, True)             # step 1 prepared at t = 0, with drafts
    clock.now = 0.030
    timer.stopped()                    # its propose ends at 30 ms
    clock.now = 0.040
    timer.started(1)                   # step 2 prepared: step 1 took 40 ms in all
    assert seen == [(5, pytest.approx(0.040), True)]
    clock.now = 0.070
    timer.stopped()
    clock.now = 0.075
    timer.skip()                       # a prefill step also closes step 2's cycle
    assert seen[-1] == (1, pytest.approx(0.035), False)  # 40 to 75 ms
    clock.now = 0.200
    timer.stopped()                    # nothing started: nothing to time
    timer.started(3)
    assert len(seen) == 2
    clock.now = 0.230
    timer.stopped()
    clock.now = 0.240
    timer.started(3)
    assert seen[-1] == (3, pytest.approx(0.040), False)


def test_an_idle_engine_is_not_counted_as_step_time(clock):
    seen = []
    timer = StepTimer(lambda *sample: seen.append(sample), max_gap_ratio=3.0)
    timer.started(2)
    clock.now = 0.030
    timer.stopped()
    clock.now = 5.0                    # no request for seconds, then a new one
    timer.started(2)
    assert seen == []
    clock.now = 5.030
    timer.started(2)                   # step without propose's end: not timed
    assert seen == []
