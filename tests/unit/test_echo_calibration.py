# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.echo.calibration import (DEFAULT_GATE, Calibrator, GateConfig,
                                              auc_mann_whitney, youden_threshold)


def brute_auc(pos, neg):
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def brute_youden(scores, labels):
    """Every observed score as tau, "positive iff score > tau"; first best (smallest tau)."""
    scores = np.asarray(scores, float)
    labels = np.asarray(labels, bool)
    best = None
    for tau in sorted(set(scores.tolist())):
        pred = scores > tau
        j = pred[labels].mean() - pred[~labels].mean()
        if best is None or j > best[1] + 1e-12:
            best = (tau, j)
    return best


def test_auc_known_answers():
    assert auc_mann_whitney([3, 4, 5], [0, 1, 2]) == 1.0
    assert auc_mann_whitney([0, 1], [2, 3]) == 0.0
    assert auc_mann_whitney([1, 1, 1], [1, 1]) == 0.5
    # one tie, one win, one loss, one win: (1 + 0.5 + 0 + 1) / 4
    assert auc_mann_whitney([2, 1], [1, 3]) == pytest.approx(brute_auc([2, 1], [1, 3]))


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_pair_counting_with_ties(seed):
    rng = np.random.default_rng(seed)
    pos = rng.integers(0, 6, size=rng.integers(1, 30))  # small range: many ties
    neg = rng.integers(0, 5, size=rng.integers(1, 30))
    assert auc_mann_whitney(pos, neg) == pytest.approx(brute_auc(pos, neg))


def test_auc_rejects_empty_and_nan():
    with pytest.raises(ValueError, match="empty"):
        auc_mann_whitney([], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        auc_mann_whitney([np.nan], [1.0])


def test_youden_hand_example():
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    labels = [0, 0, 1, 0, 1, 1]
    # tau = 0.2: TPR 3/3, FPR 1/3, J = 2/3; tau = 0.4: TPR 2/3, FPR 0, J = 2/3.
    # Equal J: the smaller tau (keeps extending) wins.
    tau, j = youden_threshold(scores, labels)
    assert tau == 0.2 and j == pytest.approx(2 / 3)
    assert youden_threshold([0.1, 0.9], [0, 1]) == (0.1, 1.0)


@pytest.mark.parametrize("seed", range(5))
def test_youden_matches_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 40))
    scores = rng.integers(0, 8, size=n) / 8.0
    labels = rng.random(n) < 0.5
    labels[0], labels[1] = True, False
    tau, j = youden_threshold(scores, labels)
    b_tau, b_j = brute_youden(scores, labels)
    assert j == pytest.approx(b_j) and tau == b_tau


def test_youden_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        youden_threshold([0.1, 0.2], [1, 1])
    with pytest.raises(ValueError, match="entries"):
        youden_threshold([0.1, 0.2], [1])


def test_gate_config_validation_and_default_mapping():
    assert DEFAULT_GATE.sweet_spots == (1, 3, 6)
    assert DEFAULT_GATE.taus == (0.2, 0.2, 0.3)
    assert DEFAULT_GATE.source == "default"
    assert DEFAULT_GATE.tau_at(3) == 0.2 and DEFAULT_GATE.tau_at(2) is None
    with pytest.raises(ValueError, match="length"):
        GateConfig((1, 2), (0.2, ))
    with pytest.raises(ValueError, match="increasing"):
        GateConfig((3, 1), (0.2, 0.2))
    with pytest.raises(ValueError, match="probabilities"):
        GateConfig((1, ), (1.5, ))
    with pytest.raises(ValueError, match="source"):
        GateConfig((1, ), (0.2, ), source="guess")
    with pytest.raises(ValueError, match="depths"):
        GateConfig((0, ), (0.2, ))


def synthetic_trees(n, rng, max_depth=6):
    """Depth-2 confidence predicts reaching depth 2; depth-4 confidence is noise."""
    conf = rng.uniform(0.05, 0.95, size=(n, max_depth))
    reached = np.zeros(n, dtype=int)
    for i in range(n):
        # Reach depth 1 always, depth 2 iff c_2 is high, depth 3..4 by coin flips.
        reached[i] = 1
        if conf[i, 1] > 0.5:
            reached[i] = 2 + int(rng.random() < 0.5) + int(rng.random() < 0.5)
    return conf, reached


def test_calibrator_picks_the_informative_depth():
    rng = np.random.default_rng(7)
    cal = Calibrator(max_depth=6, warmup_steps=400)
    conf, reached = synthetic_trees(400, rng)
    for c, r in zip(conf, reached):
        assert not cal.ready
        cal.observe(c, r)
    assert cal.ready
    gate, report = cal.finalize()
    assert gate.source == "calibrated"
    assert gate.sweet_spots == (2, )
    # The true split is at 0.5; Youden picks an observed confidence next to it.
    assert 0.4 < gate.taus[0] <= 0.5
    assert gate.aucs[1] > 0.95 and abs(gate.aucs[3] - 0.5) < 0.15
    assert "depth 2" in report and "sweet spots (2,)" in report
    assert cal.gate is gate and not cal.ready


def test_calibrator_too_few_samples_returns_defaults():
    cal = Calibrator(max_depth=4, warmup_steps=5, min_samples_per_class=20)
    for _ in range(5):
        cal.observe([0.9, 0.5, 0.2, 0.1], 2)
    gate, report = cal.finalize()
    assert gate.source == "default"
    assert (gate.sweet_spots, gate.taus) == (DEFAULT_GATE.sweet_spots, DEFAULT_GATE.taus)
    assert "enough samples" in report


def test_calibrator_no_informative_depth_returns_defaults():
    rng = np.random.default_rng(3)
    cal = Calibrator(max_depth=3, warmup_steps=300)
    for _ in range(300):
        cal.observe(rng.uniform(0.1, 0.9, size=3), int(rng.integers(0, 4)))
    gate, report = cal.finalize()
    assert gate.source == "default"
    assert "no depth has AUC >" in report
    assert not np.isnan(gate.aucs).all()


def test_calibrator_finalize_without_data_does_not_crash():
    gate, report = Calibrator(max_depth=3).finalize()
    assert gate.source == "default" and "enough samples" in report


def test_calibrator_caps_sweet_spots_by_auc():
    rng = np.random.default_rng(11)
    cal = Calibrator(max_depth=4, warmup_steps=500, max_sweet_spots=2, delta=0.6)
    for _ in range(500):
        reached = int(rng.integers(0, 5))
        conf = rng.uniform(0.05, 0.95, size=4)
        for d in range(1, 5):
            # Separation grows with depth: depth 4 best, depth 1 worst.
            noise = [0.45, 0.3, 0.15, 0.0][d - 1]
            informative = rng.random() >= noise
            if informative:
                conf[d - 1] = rng.uniform(0.6, 0.95) if reached >= d else rng.uniform(0.05, 0.4)
        cal.observe(conf, reached)
    gate, _ = cal.finalize()
    assert gate.sweet_spots == (3, 4)


def test_calibrator_skips_depths_without_nodes():
    cal = Calibrator(max_depth=2, warmup_steps=1, min_samples_per_class=1)
    # Depth 2 absent in every tree: only depth 1 can be measured.
    for i in range(40):
        cal.observe([0.9 if i % 2 else 0.1, 0.0], 1 if i % 2 else 0)
    gate, report = cal.finalize()
    assert gate.sweet_spots == (1, ) and gate.taus == (0.1, )
    assert np.isnan(gate.aucs[1])


def test_calibrator_is_ready_once_after_the_warm_up():
    cal = Calibrator(max_depth=2, warmup_steps=4, min_samples_per_class=1)
    for _ in range(3):
        cal.observe([0.5, 0.5], 1)
    assert not cal.ready
    cal.observe([0.5, 0.5], 1)
    assert cal.ready and cal.num_observations == 4
    cal.finalize()
    for _ in range(8):
        cal.observe([0.5, 0.5], 1)
    assert not cal.ready  # calibrated once, thresholds frozen


def test_calibrator_rejects_bad_observations():
    cal = Calibrator(max_depth=3)
    with pytest.raises(ValueError, match="shape"):
        cal.observe([0.5, 0.5], 1)
    with pytest.raises(ValueError, match="probabilities"):
        cal.observe([0.5, 1.5, 0.1], 1)
    with pytest.raises(ValueError, match="no node"):
        cal.observe([0.5, 0.0, 0.0], 2)
    with pytest.raises(ValueError, match=">= 0"):
        cal.observe([0.5, 0.5, 0.5], -1)
    with pytest.raises(ValueError, match="delta"):
        Calibrator(max_depth=3, delta=0.2)


def test_calibrator_window_keeps_latest_observations():
    cal = Calibrator(max_depth=1, warmup_steps=2, window=4, min_samples_per_class=2)
    # Old regime: confidence unrelated to acceptance; then 4 separable trees.
    for _ in range(10):
        cal.observe([0.5], 1)
        cal.observe([0.5], 0)
    for c, r in ((0.9, 1), (0.8, 1), (0.2, 0), (0.1, 0)):
        cal.observe([c], r)
    gate, _ = cal.finalize()
    assert gate.aucs[0] == 1.0 and gate.sweet_spots == (1, ) and gate.taus == (0.2, )


def test_censored_labels_are_left_out_above_their_known_depth():
    """Trees reach depth 2 iff c_2 > 0.5; but half of the high-c_2 trees were cut after
    depth 1 and the cut hid where they went. Counted as 'stopped at 1', they make
    depth 2 look uninformative; left out above the known depth, the split is found."""
    rng = np.random.default_rng(11)

    def run(with_known: bool):
        cal = Calibrator(max_depth=3, warmup_steps=400)
        for _ in range(400):
            c2 = rng.uniform(0.05, 0.95)
            conf = [0.9, c2, c2 / 2]
            observed = (2 if c2 > 0.5 else 1, None)
            if c2 > 0.5 and rng.random() < 0.5:
                # cut after depth 1 where the target's next token was the unverified
                # depth-2 child: reached 2 is known, depth 3 is not
                observed = (2, 2) if with_known else (1, None)
            cal.observe(conf, *observed)
        return cal.finalize()[0]

    censored = run(with_known=False)
    corrected = run(with_known=True)
    assert corrected.sweet_spots[:1] == (2,) and 0.4 < corrected.taus[0] <= 0.55
    assert corrected.aucs[1] > 0.95 > censored.aucs[1]
    # depth 3 of a cut tree is unknown: only the uncut trees label it
    with pytest.raises(ValueError, match="below reached_depth"):
        Calibrator(max_depth=3).observe([0.9, 0.5, 0.2], 2, known_depth=1)
