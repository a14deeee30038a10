# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.echo.cost import (expected_tokens_per_second, knee_k_max,
                                       step_time_at)

GRID = np.array([1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256])


def flat_then_linear(k, knee=64, base=1.0, gamma=0.01):
    return base * (1 + gamma * np.maximum(np.asarray(k) - knee, 0))


def test_knee_on_clean_flat_then_linear_curve():
    res = knee_k_max(GRID, flat_then_linear(GRID))
    assert res.k_knee == 64
    # 1.1 x base allows 10 tokens past the knee; the largest measured K is 64.
    assert res.k_tolerance == 64 and res.k_max == 64 and res.method == "tolerance"
    assert res.slope == pytest.approx(0.01)
    assert res.base_time == 1.0


def test_knee_on_noisy_repeated_measurements():
    rng = np.random.default_rng(0)
    k = np.repeat(GRID, 5)
    t = flat_then_linear(k) * rng.normal(1.0, 0.01, size=k.size)
    res = knee_k_max(k, t)
    assert res.k_knee in (48, 64, 96)
    assert res.k_tolerance in (64, 96)


def test_non_monotone_dip_does_not_extend_k_max():
    k = [8, 16, 32, 64, 128]
    t = [1.0, 1.02, 1.5, 1.05, 3.0]  # a fast outlier at 64 after the jump at 32
    res = knee_k_max(k, t)
    assert res.k_tolerance == 16


def test_cpu_measurement_is_compute_bound_from_the_start():
    # Measured on the CPU wheel: target forward time vs drafts per step, relative
    # to plain decoding (K = 1).
    k = [1, 4, 16, 32, 64]
    t = [1.0, 1.07, 1.59, 2.0, 2.9]
    res = knee_k_max(k, t)
    assert res.k_tolerance == 4 and res.k_max == 4
    assert res.k_knee <= 4
    assert knee_k_max(k[1:], t[1:]).k_max == 4


def test_methods_and_capture_rounding():
    k = GRID
    t = flat_then_linear(k, knee=48, gamma=0.002)  # tolerance reaches 96
    assert knee_k_max(k, t).k_max == 96
    assert knee_k_max(k, t, method="knee").k_max == 48
    assert knee_k_max(k, t, method="min").k_max == 48
    assert knee_k_max(k, t, capture_sizes=[8, 16, 32, 64, 128]).k_max == 64
    res = knee_k_max(k, t, capture_sizes=[512])
    assert res.k_max == 96 and "not rounded" in res.note


def test_tiny_inputs_do_not_crash():
    one = knee_k_max([16], [2.0])
    assert one.k_max == 16 and one.k_knee is None and "too few" in one.note
    two = knee_k_max([4, 64], [1.0, 1.05], method="knee")
    assert two.k_max == 64 and "tolerance rule" in two.note
    flat = knee_k_max([4, 8, 16], [1.0, 1.0, 1.0])
    assert flat.k_knee == 16 and flat.k_max == 16


@pytest.mark.parametrize("args, message", [
    (([], []), "at least one"),
    (([1, 2], [1.0]), "entries"),
    (([0], [1.0]), "positive integers"),
    (([1.5], [1.0]), "positive integers"),
    (([1], [0.0]), "positive"),
    (([1], [np.nan]), "finite"),
])
def test_knee_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        knee_k_max(*args)


def test_knee_rejects_bad_options():
    with pytest.raises(ValueError, match="tolerance"):
        knee_k_max([1], [1.0], tolerance=0.9)
    with pytest.raises(ValueError, match="method"):
        knee_k_max([1], [1.0], method="best")


def test_step_time_interpolates_and_extrapolates():
    k, t = [10, 20, 40], [1.0, 1.0, 3.0]
    np.testing.assert_allclose(step_time_at([10, 15, 30, 60], k, t), [1.0, 1.0, 2.0, 5.0])
    assert step_time_at(1, k, t) == 1.0  # floored at the cheapest step
    assert step_time_at(100, [8], [2.0]) == 2.0


def test_expected_tokens_per_second_known_answer():
    k, t = [1, 10], [0.01, 0.01]
    # Two requests: chain with path probs 0.5, 0.25 -> 1 + 0.75; empty tree -> 1.
    s = [np.log([0.5, 0.25]), np.array([])]
    assert expected_tokens_per_second(s, k, t) == pytest.approx(2.75 / 0.01)
    assert expected_tokens_per_second([], k, t) == 0.0
    with pytest.raises(ValueError, match="log-prob"):
        expected_tokens_per_second([np.array([0.5])], k, t)
