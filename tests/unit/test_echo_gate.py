# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.echo.calibration import DEFAULT_GATE, GateConfig
from echo_reference import GateDecision, truncation_depth, truncation_depths


def chain(probs):
    """Depths and path scores of a single chain whose per-depth best path prob is ``probs``."""
    return np.log(np.asarray(probs, float)), np.arange(1, len(probs) + 1)


def test_confident_tree_keeps_full_depth():
    s, d = chain([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.35, 0.3])
    assert truncation_depth(s, d, DEFAULT_GATE) == GateDecision(8, False)


def test_truncates_at_first_failing_sweet_spot_late_break():
    # c_1 = 0.9 > 0.2 passes; c_3 = 0.15 <= 0.2 fails: keep depths 1..3.
    s, d = chain([0.9, 0.5, 0.15, 0.1, 0.05])
    assert truncation_depth(s, d, DEFAULT_GATE) == GateDecision(3, True)
    # Root-level gate: c_1 <= 0.2 truncates at depth 1 (reference: depth = 0, widen).
    s, d = chain([0.2, 0.19, 0.18])
    assert truncation_depth(s, d, DEFAULT_GATE) == GateDecision(1, True)
    # Depth 6 with tau 0.3.
    s, d = chain([0.9, 0.8, 0.7, 0.6, 0.5, 0.3, 0.29])
    assert truncation_depth(s, d, DEFAULT_GATE) == GateDecision(6, True)


def test_gate_uses_max_over_siblings():
    # Two depth-1 nodes: the better one (0.5) decides, not the worse one.
    s = np.log([0.1, 0.5, 0.4, 0.3])
    d = np.array([1, 1, 2, 3])
    assert truncation_depth(s, d, DEFAULT_GATE) == GateDecision(3, False)


def test_tree_shallower_than_a_sweet_spot_is_not_truncated():
    s, d = chain([0.9, 0.8])
    assert truncation_depth(s, d, DEFAULT_GATE) == GateDecision(2, False)
    assert truncation_depth([], [], DEFAULT_GATE) == GateDecision(0, False)


def test_dense_mode_checks_every_depth_with_nearest_tau():
    gate = GateConfig((2, 6), (0.2, 0.5))
    # Depth 4 is equidistant from 2 and 6: the shallower spot's tau (0.2) applies,
    # so 0.25 passes; depth 5 is nearest 6 (tau 0.5): 0.24 fails there.
    s, d = chain([0.9, 0.5, 0.3, 0.25, 0.24, 0.2])
    assert truncation_depth(s, d, gate, mode="sparse") == GateDecision(6, True)
    assert truncation_depth(s, d, gate, mode="dense") == GateDecision(5, True)
    # Depth 1 is nearest spot 2: tau 0.2, so 0.19 truncates at depth 1 in dense only.
    s, d = chain([0.19, 0.18, 0.17])
    assert truncation_depth(s, d, gate, mode="dense") == GateDecision(1, True)
    assert truncation_depth(s, d, gate, mode="sparse") == GateDecision(2, True)
    assert truncation_depth(s, d, gate, mode="dense", dense_tau=0.1) == GateDecision(3, False)


def test_fixed_mode_one_tau_at_the_sweet_spots():
    s, d = chain([0.9, 0.8, 0.7, 0.6, 0.5, 0.25, 0.2])
    # Per-depth tau 0.3 at depth 6 truncates; fixed 0.2 does not.
    assert truncation_depth(s, d, DEFAULT_GATE) == GateDecision(6, True)
    assert truncation_depth(s, d, DEFAULT_GATE, mode="fixed") == GateDecision(7, False)
    assert truncation_depth(s, d, DEFAULT_GATE, mode="fixed",
                            fixed_tau=0.7) == GateDecision(3, True)


def test_batch_version_and_validation():
    trees = [chain([0.9, 0.5, 0.15]), chain([0.9, 0.5, 0.4]), chain([0.1])]
    depths, truncated = truncation_depths([t[0] for t in trees], [t[1] for t in trees],
                                          DEFAULT_GATE)
    np.testing.assert_array_equal(depths, [3, 3, 1])
    np.testing.assert_array_equal(truncated, [True, False, True])
    with pytest.raises(ValueError, match="mode"):
        truncation_depth(*trees[0], DEFAULT_GATE, mode="eager")
    with pytest.raises(ValueError, match="fixed_tau"):
        truncation_depth(*trees[0], DEFAULT_GATE, mode="fixed", fixed_tau=2.0)
    with pytest.raises(ValueError, match="dense"):
        truncation_depth(*trees[0], GateConfig((), ()), mode="dense")
    with pytest.raises(ValueError, match="score arrays"):
        truncation_depths([trees[0][0]], [], DEFAULT_GATE)
