# SPDX-License-Identifier: Apache-2.0
import math

import numpy as np
import pytest

from echo_reference import depth_confidence, exclusive_sibling_logp, observe_tree, path_scores
from vllm_echo.algos.echo.scores import AcceptancePrior
from vllm_echo.algos.tree import tree_depths

# LogitSpec-style forest: retrieved chain [0, 1, 2], branch [3 (candidate), 4, 5],
# branch [6 (candidate)].
FOREST_PARENTS = np.array([-1, 0, 1, -1, 3, 4, -1])
FOREST_RETRIEVED = np.array([True, True, True, False, True, True, False])
FOREST_MATCH = np.array([3, 3, 3, 0, 2, 2, 0])


def test_prior_defined_before_data_is_prior_mean():
    prior = AcceptancePrior(max_ngram=3, prior_mean=0.5)
    assert prior.num_observations == 0
    np.testing.assert_allclose(prior.prob([1, 5, 40], [1, 2, 3]), 0.5)
    assert prior.log_prob(1, 1) == pytest.approx(math.log(0.5))


def test_prior_hierarchical_smoothing_known_answer():
    prior = AcceptancePrior(max_ngram=3, prior_mean=0.5, prior_strength=2.0)
    # depth 2, m = 3: 8 accepted of 10; nothing else.
    prior.update([2] * 10, [3] * 10, [True] * 8 + [False] * 2)
    depth_rate = (8 + 2 * 0.5) / (10 + 2)  # 0.75
    assert prior.prob(2, 3) == pytest.approx((8 + 2 * depth_rate) / (10 + 2))
    # Unseen m at the same depth borrows the depth's rate, other depths the prior.
    assert prior.prob(2, 1) == pytest.approx(depth_rate)
    assert prior.prob(3, 3) == pytest.approx(0.5)


def test_prior_depth_cap_and_vectorised_shapes():
    prior = AcceptancePrior(max_ngram=2, max_depth=4)
    prior.update([4, 9, 100], [1, 1, 1], [False, False, False])
    # Depths beyond max_depth share the last bucket.
    assert prior.prob(4, 1) == prior.prob(50, 1) < 0.5
    out = prior.log_prob(np.array([[1, 2], [3, 4]]), 1)
    assert out.shape == (2, 2) and np.isfinite(out).all()
    assert prior.prob_table().shape == (4, 2)


def test_prior_converges_to_rate():
    rng = np.random.default_rng(0)
    prior = AcceptancePrior(max_ngram=1)
    prior.update(np.ones(4000, int), np.ones(4000, int), rng.random(4000) < 0.7)
    assert prior.prob(1, 1) == pytest.approx(0.7, abs=0.03)


@pytest.mark.parametrize("kwargs", [
    dict(max_ngram=0), dict(max_ngram=3, max_depth=0), dict(max_ngram=3, prior_mean=1.0),
    dict(max_ngram=3, prior_strength=0.0),
    dict(max_ngram=3, optimism=-1.0)
])
def test_prior_rejects_bad_config(kwargs):
    with pytest.raises(ValueError):
        AcceptancePrior(**kwargs)


def test_prior_rejects_bad_buckets():
    prior = AcceptancePrior(max_ngram=3)
    with pytest.raises(ValueError, match="depths"):
        prior.prob(0, 1)
    with pytest.raises(ValueError, match="match_lens"):
        prior.prob(1, 4)
    with pytest.raises(ValueError, match="accepted_mask"):
        prior.update([1, 2], [1, 1], [True])


def test_observe_tree_counts_only_nodes_whose_parent_was_accepted():
    prior = AcceptancePrior(max_ngram=3)
    depths = tree_depths(FOREST_PARENTS)
    # The branch [3, 4] was accepted (node 5 rejected).
    n = observe_tree(prior, FOREST_PARENTS, depths, FOREST_MATCH, FOREST_RETRIEVED, [3, 4])
    # Chances: node 0 (root child, retrieved, rejected), node 4 (parent 3
    # accepted, accepted), node 5 (parent 4 accepted, rejected). Nodes 1, 2
    # (parent rejected) and 3, 6 (not retrieved) are not observations.
    assert n == 3
    table_total = prior._total
    assert table_total.sum() == 3
    assert table_total[0, 2] == 1  # node 0: depth 1, m 3
    assert table_total[1, 1] == 1 and prior._accepted[1, 1] == 1  # node 4: depth 2, m 2
    assert table_total[2, 1] == 1 and prior._accepted[2, 1] == 0  # node 5


def test_observe_tree_token_labels_credit_duplicate_heads():
    prior = AcceptancePrior(max_ngram=3)
    tokens = np.array([10, 11, 12, 10, 11, 13, 20])  # chain 0 and branch 3 share "10 11"
    depths = tree_depths(FOREST_PARENTS)
    retrieved = np.array([True, True, True, True, True, True, False])
    match = np.array([3, 3, 3, 1, 2, 2, 1])
    # Verifier kept the branch path [3, 4] and emitted 99 after it; the chain
    # head 0 (token 10) was just as correct as node 3.
    observe_tree(prior, FOREST_PARENTS, depths, match, retrieved, [3, 4],
                       token_ids=tokens, next_token=99)
    assert prior._accepted[0, 2] == 1  # node 0 credited
    assert prior._accepted[0, 0] == 1  # node 3
    assert prior._total.sum() == 4  # nodes 0, 3, 4, 5


def test_observe_tree_empty_path_and_validation():
    prior = AcceptancePrior(max_ngram=3)
    depths = tree_depths(FOREST_PARENTS)
    assert observe_tree(prior, FOREST_PARENTS, depths, FOREST_MATCH, FOREST_RETRIEVED, []) == 1
    assert prior._accepted.sum() == 0
    with pytest.raises(ValueError, match="path"):
        observe_tree(prior, FOREST_PARENTS, depths, FOREST_MATCH, FOREST_RETRIEVED, [1])
    with pytest.raises(ValueError, match="both"):
        observe_tree(prior, FOREST_PARENTS, depths, FOREST_MATCH, FOREST_RETRIEVED, [],
                           token_ids=np.zeros(7, int))
    with pytest.raises(ValueError, match="shape"):
        observe_tree(prior, FOREST_PARENTS, depths[:3], FOREST_MATCH, FOREST_RETRIEVED, [])


def test_accepted_over_expected_known_answers():
    from vllm_echo.algos.echo.scores import AcceptedOverExpected

    share = AcceptedOverExpected(decay=0.5, pseudo=5.0, bounds=(0.2, 5.0))
    assert share.ratio == 1.0  # no plan yet
    share.observe(10.0, 5)
    assert share.ratio == pytest.approx((5 + 5) / (10 + 5))
    share.observe(4.0, 1)  # earlier sums halve first
    assert share.ratio == pytest.approx((2.5 + 1 + 5) / (5 + 4 + 5))
    for _ in range(50):
        share.observe(100.0, 0)
    assert share.ratio == 0.2  # bounded
    with pytest.raises(ValueError, match="decay"):
        AcceptedOverExpected(decay=0.0)


def test_siblings_are_exclusive_best_first():
    # root children 0 (0.5), 1 (0.7), 5 (0.1); children of 0: 2 (0.6), 3 (0.2), 4 (0.6)
    parents = np.array([-1, -1, 0, 0, 0, -1])
    p = np.array([0.5, 0.7, 0.6, 0.2, 0.6, 0.1])
    got = np.exp(exclusive_sibling_logp(parents, np.log(p)))
    # 1 first (0.7); 0 only if 1 missed: 0.5 * 0.3; 5 if both missed: 0.1 * 0.3 * 0.5.
    # Under 0: 2 then 4 (tie, lower index first): 0.6 * 0.4; 3 last: 0.2 * 0.4 * 0.4
    np.testing.assert_allclose(got, [0.15, 0.7, 0.6, 0.032, 0.24, 0.015])
    # a lone child keeps its probability; a chain is unchanged
    chain = np.array([-1, 0, 1])
    np.testing.assert_allclose(exclusive_sibling_logp(chain, np.log([0.9, 0.5, 0.2])),
                               np.log([0.9, 0.5, 0.2]))
    with pytest.raises(ValueError, match="shape"):
        exclusive_sibling_logp(parents, np.zeros(3))


def test_path_scores_known_answer():
    logp = np.log([0.5, 0.5, 0.5, 0.1, 0.9, 0.9, 0.05])
    s = path_scores(FOREST_PARENTS, logp)
    np.testing.assert_allclose(np.exp(s), [0.5, 0.25, 0.125, 0.1, 0.09, 0.081, 0.05])
    assert path_scores([], []).shape == (0, )


def test_path_scores_rejects_bad_logp():
    with pytest.raises(ValueError, match="log-prob"):
        path_scores([-1, 0], [0.0, 0.5])
    with pytest.raises(ValueError, match="NaN"):
        path_scores([-1], [np.nan])
    with pytest.raises(ValueError, match="shape"):
        path_scores([-1, 0], [0.0])
    # Float noise just above zero is clipped, not rejected.
    assert path_scores([-1], [1e-9])[0] == 0.0


def test_depth_confidence_known_answer():
    s = np.log([0.5, 0.25, 0.125, 0.1, 0.09, 0.081, 0.05])
    depths = tree_depths(FOREST_PARENTS)
    c = depth_confidence(s, depths, max_depth=5)
    np.testing.assert_allclose(c, [0.5, 0.25, 0.125, 0.0, 0.0])
    np.testing.assert_allclose(depth_confidence(s, depths, max_depth=2), [0.5, 0.25])
    np.testing.assert_allclose(depth_confidence([], [], 3), [0, 0, 0])
    with pytest.raises(ValueError):
        depth_confidence(s, depths, 0)
