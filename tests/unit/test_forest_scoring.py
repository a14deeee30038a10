# SPDX-License-Identifier: Apache-2.0
"""The compiled forest scoring against the numpy functions it fuses."""
import numpy as np
import pytest

from vllm_echo.algos.echo.calibration import GateConfig
from vllm_echo.algos.echo.forest_scoring import count_tree_observations, score_forest
from vllm_echo.algos.echo.gate import gate_checks
from vllm_echo.algos.echo.planner import _HEAD_P_EDGES, head_bucket
from vllm_echo.algos.echo.scores import AcceptancePrior, observe_retrieved_and_heads
from vllm_echo.algos.tree import tree_depths
from echo_reference import (depth_confidence, exclusive_sibling_logp, observe_tree, path_scores,
                            truncation_depth)

GATE = GateConfig(sweet_spots=(1, 3, 6), taus=(0.3, 0.05, 0.02), source="calibrated")


def _random_forest(rng, n, top_k=8, max_ngram=3):
    parents = np.array([-1 if j == 0 or rng.random() < 0.3 else rng.integers(0, j)
                        for j in range(n)], dtype=np.int64)
    rank = np.where(rng.random(n) < 0.3, rng.integers(0, top_k, n), -1)
    match_len = np.where(rank < 0, rng.integers(1, max_ngram + 1, n), 0)
    head_logp = np.log(np.sort(rng.random(top_k))[::-1] * 0.5)
    return parents, rank.astype(np.int64), match_len.astype(np.int64), head_logp


def _trained_prior(rng, max_ngram=3, max_depth=16, prior_mean=0.5):
    prior = AcceptancePrior(max_ngram=max_ngram, max_depth=max_depth, prior_mean=prior_mean,
                            optimism=1.0)
    d = rng.integers(1, max_depth + 1, 300)
    m = rng.integers(1, max_ngram + 1, 300)
    prior.update(d, m, rng.random(300) < 0.8 / d)
    return prior


@pytest.mark.parametrize("mode", ["sparse", "dense", "fixed"])
def test_score_forest_matches_the_numpy_reference(mode):
    rng = np.random.default_rng(7)
    prior = _trained_prior(rng)
    head_prior = AcceptancePrior(max_ngram=len(_HEAD_P_EDGES) + 1, max_depth=1,
                                 prior_mean=0.1, optimism=1.0)
    head_prior.update(np.ones(50, np.int64), rng.integers(1, 7, 50), rng.random(50) < 0.2)
    for n in (1, 2, 5, 17, 40):
        parents, rank, match_len, head_logp = _random_forest(rng, n)
        checks = gate_checks(GATE, mode, max_depth=n, fixed_tau=0.1)
        depths, buckets, scores, conf, trunc, truncated, best_root = score_forest(
            parents, rank, match_len, head_logp, prior.prob_table(), head_prior.prob_table(),
            _HEAD_P_EDGES, -30.0, 32, *checks)

        # the planner's numpy pipeline, function by function
        ref_depths = tree_depths(parents)
        heads = rank >= 0
        ref_buckets = np.ones(n, np.int64)
        ref_buckets[heads] = head_bucket(head_logp[rank[heads]])
        logp = np.empty(n)
        logp[~heads] = prior.log_prob(ref_depths[~heads], match_len[~heads])
        logp[heads] = head_prior.log_prob(np.ones(heads.sum(), np.int64), ref_buckets[heads])
        ref_scores = path_scores(parents, exclusive_sibling_logp(parents,
                                                                 np.clip(logp, -30.0, 0.0)))
        decision = truncation_depth(ref_scores, ref_depths, GATE, mode=mode, fixed_tau=0.1)

        assert depths.tolist() == ref_depths.tolist()
        assert buckets.tolist() == ref_buckets.tolist()
        assert scores == pytest.approx(ref_scores, rel=1e-12, abs=1e-12)
        assert conf[:32] == pytest.approx(depth_confidence(ref_scores, ref_depths, 32))
        assert (trunc, truncated) == (decision.trunc_depth, decision.truncated)
        assert best_root == pytest.approx(logp[parents == -1].max())


def test_score_forest_rejects_out_of_range_lookups():
    table = np.full((4, 3), 0.5)
    args = (np.array([-1, 0]), np.array([-1, -1]))
    checks = gate_checks(GATE, "sparse", 2)
    with pytest.raises(ValueError, match="match length"):
        score_forest(*args, np.array([1, 4]), np.zeros(1), table, table, _HEAD_P_EDGES,
                     -30.0, 32, *checks)
    with pytest.raises(ValueError, match="rank"):
        score_forest(np.array([-1]), np.array([2]), np.array([0]), np.zeros(2), table, table,
                     _HEAD_P_EDGES, -30.0, 32, *checks)


def test_compiled_observations_equal_observe_tree():
    rng = np.random.default_rng(11)
    checked, compiled = (AcceptancePrior(max_ngram=3, max_depth=4) for _ in range(2))
    recorded = 0
    for _ in range(200):
        n = int(rng.integers(1, 12))
        parents, rank, match_len, _ = _random_forest(rng, n)
        tokens = rng.integers(0, 5, n)  # few distinct tokens: duplicate siblings happen
        # accept a random root path
        path, node = [], -1
        while True:
            children = np.flatnonzero(parents == node)
            if not children.size or rng.random() < 0.3:
                break
            node = int(rng.choice(children))
            path.append(node)
        depths, retrieved = tree_depths(parents), rank < 0
        mlen = np.maximum(match_len, 1)
        next_token = int(rng.integers(0, 5))
        recorded += observe_tree(checked, parents, depths, mlen, retrieved, path, tokens,
                                         next_token)
        assert compiled.observe_tree(parents, depths, mlen, retrieved, path, tokens,
                                             next_token) >= 0
    assert recorded > 200
    assert compiled._total.tolist() == checked._total.tolist()
    assert compiled._accepted.tolist() == checked._accepted.tolist()
    assert compiled.prob_table() == pytest.approx(checked.prob_table())


def test_both_priors_in_one_call_equal_one_call_each():
    rng = np.random.default_rng(5)
    head_buckets = len(_HEAD_P_EDGES) + 1
    separate = (AcceptancePrior(max_ngram=3, max_depth=4, optimism=1.0),
                AcceptancePrior(max_ngram=head_buckets, max_depth=1, optimism=1.0))
    together = (AcceptancePrior(max_ngram=3, max_depth=4, optimism=1.0),
                AcceptancePrior(max_ngram=head_buckets, max_depth=1, optimism=1.0))
    for _ in range(100):
        n = int(rng.integers(1, 12))
        parents, rank, match_len, _ = _random_forest(rng, n)
        tokens = rng.integers(0, 5, n).astype(np.int32)
        depths, retrieved = tree_depths(parents), rank < 0
        buckets = np.where(retrieved, 1, rng.integers(1, head_buckets + 1, n))
        path, node = [], -1
        while (children := np.flatnonzero(parents == node)).size and rng.random() < 0.7:
            node = int(rng.choice(children))
            path.append(node)
        # the planner's dtypes: int32 from the forest kernel
        parents, match_len = parents.astype(np.int32), match_len.astype(np.int32)
        next_token = int(rng.integers(0, 5))
        separate[0].observe_tree(parents, depths, match_len, retrieved, path, tokens,
                                 next_token)
        separate[1].observe_tree(parents, depths, buckets, ~retrieved, path, tokens,
                                 next_token)
        observe_retrieved_and_heads(*together, parents, depths, match_len, buckets, retrieved,
                                    path, tokens, next_token)
        for one, other in zip(separate, together):
            assert one._total.tolist() == other._total.tolist()
            assert one._accepted.tolist() == other._accepted.tolist()
            assert one.prob_table().tolist() == other.prob_table().tolist()
            assert one.best_first_rate() == other.best_first_rate()
    assert together[1]._total.sum() > 20 and together[0]._total.sum() > 100


def test_compiled_observations_check_the_path():
    total = np.zeros((2, 2))
    with pytest.raises(ValueError, match="root-first path"):
        count_tree_observations(total, total.copy(), np.array([-1, -1]), np.array([1, 1]),
                                np.array([1, 1]), np.ones(2, bool), np.array([0, 1]),
                                np.array([3, 4]), 5)


def test_candidates_past_a_fully_accepted_plan_are_observed():
    """Forest 10 -> 11 -> {12 (m=3), head 13}; 10 -> 14 (m=1). The plan verified 10 and
    11 (forest nodes 0 and 1)."""
    forest_tokens = np.array([10, 11, 12, 13, 14], np.int32)
    forest_parents = np.array([-1, 0, 1, 1, -1], np.int32)
    forest_match = np.array([3, 3, 3, 1, 1], np.int32)
    forest_rank = np.array([-1, -1, -1, 0, -1], np.int32)
    keep = np.array([0, 1])
    plan = (np.array([-1, 0], np.int32), np.array([1, 2]), np.array([3, 3], np.int32),
            np.ones(2, np.int64), np.ones(2, bool))  # parents, depths, m, buckets, retrieved
    forest = (keep, forest_parents, forest_tokens, forest_match, forest_rank)

    def observe(path, next_token):
        priors = (AcceptancePrior(max_ngram=3, max_depth=4),
                  AcceptancePrior(max_ngram=len(_HEAD_P_EDGES) + 1, max_depth=1))
        observe_retrieved_and_heads(*priors, *plan, path, forest_tokens[keep], next_token,
                                    forest)
        return priors[0]._total, priors[0]._accepted, priors[1]._total

    # both accepted, the target went on with 12: depth 3 (m=3) learned as accepted; the
    # head 13 is no retrieved node, 14 no child of the path's end
    total, accepted, head_total = observe([0, 1], 12)
    assert total[:, 2].tolist() == [1, 1, 1, 0] and accepted[:, 2].tolist() == [1, 1, 1, 0]
    assert total[:, 0].sum() == 0 and head_total.sum() == 0
    # ... with another token: depth 3 learned as rejected
    total, accepted, _ = observe([0, 1], 99)
    assert total[2, 2] == 1 and accepted[2, 2] == 0
    # 11 rejected: the verified nodes tell it all
    total, accepted, _ = observe([0], 99)
    assert total[:, 2].tolist() == [1, 1, 0, 0] and accepted[:, 2].tolist() == [1, 0, 0, 0]
