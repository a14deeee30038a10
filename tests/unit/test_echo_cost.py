# SPDX-License-Identifier: Apache-2.0
"""StepCost: the measured curve interpolates, stays monotone, and follows the timed
steps online (a shifted curve, a jump the base cannot show, no curve at all)."""

import numpy as np
import pytest

from vllm_echo.algos.echo import EchoTuning, StepCost


def test_set_curve_interpolates_and_extrapolates_the_last_segment():
    cost = StepCost()
    cost.set_curve([9, 1, 5], [30.0, 10.0, 14.0])  # any order
    assert cost.time([1, 3, 5, 7, 9]) == pytest.approx([10, 12, 14, 22, 30])
    assert cost.time(13) == pytest.approx(30 + 4 * 4)  # slope of the last segment
    assert cost.time(0.5) == pytest.approx(10)  # flat below the first point


def test_set_curve_is_forced_non_decreasing():
    cost = StepCost()
    cost.set_curve([1, 2, 3, 4], [10.0, 8.0, 12.0, 11.0])
    assert cost.time([1, 2, 3, 4]) == pytest.approx([10, 10, 12, 12])


def test_no_curve_and_no_step_cannot_price():
    cost = StepCost()
    assert not cost.ready
    with pytest.raises(RuntimeError):
        cost.time(4)
    assert "no curve" in cost.describe()


def test_one_timed_step_without_a_curve_prices_with_the_prior_slope():
    cost = StepCost(EchoTuning(prior_token_cost=0.03))
    cost.observe(4, 0.1)
    assert cost.ready
    assert cost.time(4) == pytest.approx(0.1)
    assert cost.time(5) - cost.time(4) == pytest.approx(0.03 * 0.1 / 4)  # per token of the step


def test_tracks_a_shifted_and_steeper_curve_online():
    """Base 10 + n, truth 25 + 1.5 n: the timed steps (sizes 8..24) add the line
    15 + 0.5 n, which holds at untimed sizes too (the plain step the rule compares
    with may never be timed)."""
    cost = StepCost()
    cost.set_curve([1, 100], [11.0, 110.0])
    rng = np.random.default_rng(0)
    for n in rng.integers(8, 25, size=300):
        cost.observe(int(n), 25 + 1.5 * n)
    timed = np.array([8, 16, 24])
    assert cost.time(timed) == pytest.approx(25 + 1.5 * timed, rel=0.005)
    # Past the timed sizes the slope is shrunk a little toward the base's (the prior
    # weight of the base's slope against the sizes' spread).
    untimed = np.array([4, 40])
    assert cost.time(untimed) == pytest.approx(25 + 1.5 * untimed, rel=0.02)


def test_follows_drift():
    cost = StepCost()
    cost.set_curve([1, 64], [1.0, 1.0])
    for _ in range(200):
        cost.observe(10, 2.0)
    assert cost.time(10) == pytest.approx(2.0, rel=0.01)
    for _ in range(200):  # the machine got slower
        cost.observe(10, 3.0)
    assert cost.time(10) == pytest.approx(3.0, rel=0.01)


def test_size_buckets_learn_a_jump_the_line_cannot():
    """A step with drafts costs 7% more than one without (a different sampler), then
    1% a token: no line fits both, the buckets at the timed sizes do."""
    def truth(n):
        return 1.0 if n == 1 else 1.07 + 0.01 * (n - 2)

    cost = StepCost()
    cost.set_curve([1, 64], [1.0, 1.63])  # a dummy forward sees no jump
    for _ in range(100):
        for n in range(1, 7):
            cost.observe(n, truth(n))
    assert cost.time(range(1, 7)) == pytest.approx([truth(n) for n in range(1, 7)], rel=0.005)
    lines_only = StepCost(EchoTuning(bucket_prior_steps=1e12))
    lines_only.set_curve([1, 64], [1.0, 1.63])
    for _ in range(100):
        for n in range(1, 7):
            lines_only.observe(n, truth(n))
    assert abs(lines_only.time(1)[()] - 1.0) > 0.01


def test_stays_monotone_under_noise():
    cost = StepCost()
    rng = np.random.default_rng(1)
    for n in rng.integers(1, 40, size=500):
        cost.observe(int(n), (30 + n) * float(np.exp(rng.normal(0, 0.2))))
    times = cost.time(np.arange(1, 200))
    assert np.all(np.diff(times) >= 0)
    assert "ms by tokens" in cost.describe() and "\n" not in cost.describe()


def test_a_few_hiccups_do_not_tilt_the_curve():
    """The cold-start cell's failed round, rebuilt: the start-up curve, 16-25-token steps
    at 60 ms plus 1.2 ms a token, and three slow steps (92, 113, 92 ms: a first call,
    the VM pausing) early on. Unclipped, they teach a 64-token step at 1.4x the truth
    (in the engine run, with its noise, 1.6x: the rule stopped drafting)."""
    probe = {1: 29.4, 2: 30.6, 4: 31.3, 8: 35.4, 16: 43.5, 32: 59.0, 64: 89.5, 128: 138.8}

    def truth(n):
        return 60.0 + 1.2 * (n - 16)

    sizes = [16] * 10 + [18, 25, 18] + [16] * 20 + [17] * 5 + [20, 24] + [16] * 22
    curves = {}
    for band in (0.0, EchoTuning().outlier_band):
        cost = StepCost(EchoTuning(outlier_band=band))
        cost.set_curve(list(probe), list(probe.values()))
        for i, n in enumerate(sizes):
            cost.observe(n, {10: 92.0, 11: 113.0, 12: 92.0}.get(i, truth(n)))
        curves[band] = cost.time(64)[()]
    assert curves[0.0] > 1.35 * truth(64)
    assert curves[EchoTuning().outlier_band] < 1.15 * truth(64)


def test_a_step_with_drafts_costs_a_share_more_than_its_tokens():
    """Truth: the base curve, plus 5% of a plain step for any step that verifies a
    draft (vLLM's speculative path). Drafted steps are learned as plain ones (their
    time less the share), so the curve stays right at every size, and every drafted
    step is priced with the share: a first draft must pay for it."""
    cost = StepCost()
    assert EchoTuning().drafted_share == 0.05
    cost.set_curve([1, 256], [100.0, 355.0])  # 99 + n
    rng = np.random.default_rng(0)
    for _ in range(300):
        drafts = int(rng.integers(1, 31)) if rng.random() < 0.8 else 0
        cost.observe(64 + drafts, (99 + 64 + drafts) * (1.05 if drafts else 1.0), drafts > 0)
    assert cost.time(np.array([64, 80])) == pytest.approx([163, 179], rel=0.01)
    plain = cost.time(64)[()]
    assert cost.step_times(64, 3) == pytest.approx(
        [plain, plain * 1.05 + 1, plain * 1.05 + 2, plain * 1.05 + 3], rel=0.01)


