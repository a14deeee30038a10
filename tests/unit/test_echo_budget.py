# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.echo.budget import (CandidateTree, concatenate, schedule_budget,
                                         split_selection, subtree)
from vllm_echo.algos.echo.pricing import choose_nodes
from vllm_echo.algos.echo.calibration import DEFAULT_GATE
from echo_reference import path_scores, schedule_shared, shape_selection, truncation_depth
from vllm_echo.algos.tree import tree_depths, validate_tree


def candidate(parents, path_probs=None, logp=None, gate=DEFAULT_GATE):
    """CandidateTree gated by ``gate``; give per-node path probabilities or log-probs."""
    parents = np.asarray(parents, dtype=np.int64)
    depths = tree_depths(parents)
    if logp is None:
        p = np.asarray(path_probs, float)
        parent_p = np.where(parents == -1, 1.0, p[np.maximum(parents, 0)])
        logp = np.log(p / parent_p)
    scores = path_scores(parents, logp)
    decision = truncation_depth(scores, depths, gate)
    return CandidateTree(np.arange(parents.size) + 100, parents, scores, depths,
                         decision.trunc_depth, not decision.truncated)


def chain_parents(n):
    return np.arange(n) - 1


# Confident request: one retrieved chain whose path probability decays slowly.
CONFIDENT = dict(parents=chain_parents(8),
                 path_probs=[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.12])
# Unconfident request: c_1 = 0.18 <= 0.2, truncated at depth 1. Four
# root children (0.18 .. 0.15), each followed by a likely-looking child.
UNCONFIDENT = dict(parents=[-1, 0, -1, 2, -1, 4, -1, 6],
                   path_probs=[0.18, 0.17, 0.17, 0.16, 0.16, 0.15, 0.15, 0.14])


def test_fixtures_gate_as_intended():
    a, b = candidate(**CONFIDENT), candidate(**UNCONFIDENT)
    assert a.confident and a.trunc_depth == 8
    assert not b.confident and b.trunc_depth == 1


def test_low_load_single_request_truncates_and_widens_locally():
    b = candidate(**UNCONFIDENT)
    res = schedule_budget([b], k_max=100)
    # Every depth-1 node (the widening), no depth-2 node despite the budget.
    np.testing.assert_array_equal(res.selected[0], [0, 2, 4, 6])
    np.testing.assert_array_equal(res.from_priority1, [1])  # the core: best depth-1 node
    np.testing.assert_array_equal(res.from_priority2, [3])
    # Short budget: the core first, then siblings by descending S.
    np.testing.assert_array_equal(schedule_budget([b], k_max=2).selected[0], [0, 2])


def test_low_load_batch_fills_everyone():
    a, b = candidate(**CONFIDENT), candidate(**UNCONFIDENT)
    res = schedule_budget([a, b], k_max=100)
    np.testing.assert_array_equal(res.selected[0], np.arange(8))
    np.testing.assert_array_equal(res.selected[1], [0, 2, 4, 6])
    assert res.used == 12


def test_high_load_moves_budget_to_the_confident_request():
    a, b = candidate(**CONFIDENT), candidate(**UNCONFIDENT)
    res = schedule_budget([a, b], k_max=9)
    # Priority 1: A's whole chain (deepening) and B's core; no width for B,
    # although B's siblings (0.17..0.15) outscore A's depth-8 node (0.12).
    np.testing.assert_array_equal(res.selected[0], np.arange(8))
    np.testing.assert_array_equal(res.selected[1], [0])
    assert res.from_priority2.sum() == 0
    # Literal S competition (no core): B's siblings beat A's deep nodes.
    flat = schedule_budget([a, b], k_max=9, core_width=None)
    np.testing.assert_array_equal(flat.selected[0], np.arange(7))  # S >= 0.3, not 0.12
    np.testing.assert_array_equal(flat.selected[1], [0, 2])  # 0.18, 0.17
    # Fixed K per request (no pooling): 9 // 2 = 4 each, A stops at depth 4.
    fixed = schedule_budget([a, b], k_max=9, shared_budget=False)
    np.testing.assert_array_equal(fixed.selected[0], np.arange(4))
    np.testing.assert_array_equal(fixed.selected[1], [0, 2, 4, 6])


def test_cap_releases_budget_to_others():
    a, b = candidate(**CONFIDENT), candidate(**UNCONFIDENT)
    res = schedule_budget([a, b], k_max=9, per_request_cap=3)
    np.testing.assert_array_equal(res.selected[0], [0, 1, 2])
    np.testing.assert_array_equal(res.selected[1], [0, 2, 4])


def test_frontier_is_enforced_even_for_non_monotone_scores():
    # A child scored above its parent (not a log-prob path, but S is caller data).
    tree = CandidateTree(np.array([1, 2, 3]), np.array([-1, 0, -1]),
                         np.array([-3.0, -0.1, -1.0]), np.array([1, 2, 1]), 2, True)
    res = schedule_budget([tree], k_max=1)
    np.testing.assert_array_equal(res.selected[0], [2])
    res = schedule_budget([tree], k_max=2)
    np.testing.assert_array_equal(res.selected[0], [0, 2])


def test_empty_inputs():
    empty = CandidateTree(np.array([], int), np.array([], int), np.array([]),
                          np.array([], int), 0, True)
    res = schedule_budget([empty, candidate(**CONFIDENT)], k_max=3)
    assert res.selected[0].size == 0 and res.selected[1].size == 3
    assert schedule_budget([], k_max=5).used == 0
    assert schedule_budget([candidate(**CONFIDENT)], k_max=0).used == 0


def test_candidate_tree_validation():
    with pytest.raises(ValueError, match="depths"):
        CandidateTree(np.array([1, 2]), np.array([-1, 0]), np.zeros(2), np.array([1, 1]), 2,
                      True)
    with pytest.raises(ValueError, match="shape"):
        CandidateTree(np.array([1, 2]), np.array([-1, 0]), np.zeros(1), np.array([1, 2]), 2,
                      True)
    with pytest.raises(ValueError, match="parents"):
        CandidateTree(np.array([1, 2]), np.array([-1, 1]), np.zeros(2), np.array([1, 2]), 2,
                      True)
    with pytest.raises(ValueError, match="k_max"):
        schedule_budget([], k_max=-1)
    with pytest.raises(ValueError, match="CandidateTree"):
        schedule_budget([([1], [-1])], k_max=1)


def random_forest(rng, n_max=25):
    n = int(rng.integers(0, n_max))
    parents = np.array([int(rng.integers(-1, j)) if j else -1 for j in range(n)], dtype=np.int64)
    logp = np.log(rng.uniform(0.05, 1.0, size=n))
    # Coarse scores create ties, which the tie-break must settle deterministically.
    logp = np.round(logp, 1)
    logp = np.minimum(logp, 0.0)
    depths = tree_depths(parents)
    scores = path_scores(parents, logp)
    confident = bool(rng.random() < 0.5)
    trunc = int(depths.max()) if n and confident else int(rng.integers(0, 5))
    return CandidateTree(rng.integers(0, 1000, size=n), parents, scores, depths, trunc,
                         confident)


def check_invariants(trees, res, k_max, cap, shared):
    assert res.used <= k_max
    if not shared and trees:
        assert all(s.size <= k_max // len(trees) for s in res.selected)
    for tree, sel in zip(trees, res.selected):
        assert np.all(np.diff(sel) > 0)
        chosen = np.zeros(tree.size, dtype=bool)
        chosen[sel] = True
        par = tree.parents[sel]
        assert np.all((par == -1) | chosen[np.maximum(par, 0)])  # ancestor-closed
        assert np.all(tree.depths[sel] <= tree.trunc_depth)
        if cap is not None:
            assert sel.size <= cap
    if shared:
        # Work-conserving: the budget is used up unless every request is out of
        # eligible nodes or at its cap.
        avail = sum(min(int((t.depths <= t.trunc_depth).sum()), cap if cap is not None else 10**9)
                    for t in trees)
        assert res.used == min(k_max, avail)


@pytest.mark.parametrize("seed", range(40))
def test_random_forests_properties(seed):
    rng = np.random.default_rng(seed)
    trees = [random_forest(rng) for _ in range(int(rng.integers(1, 7)))]
    k_max = int(rng.integers(0, 60))
    cap = None if rng.random() < 0.5 else int(rng.integers(0, 15))
    core = None if rng.random() < 0.3 else int(rng.integers(1, 3))
    for shared in (True, False):
        kwargs = dict(k_max=k_max, per_request_cap=cap, shared_budget=shared, core_width=core)
        res = schedule_budget(trees, **kwargs)
        check_invariants(trees, res, k_max, cap, shared)
        again = schedule_budget(trees, **kwargs)
        assert all(np.array_equal(x, y) for x, y in zip(res.selected, again.selected))
        if shared and res.from_priority2.sum() > 0:
            # Width only after depth: every confident request below its cap got
            # all its nodes before any truncated request widened.
            for tree, sel in zip(trees, res.selected):
                if tree.confident and (cap is None or sel.size < cap):
                    assert sel.size == int((tree.depths <= tree.trunc_depth).sum())


@pytest.mark.parametrize("seed", range(20))
def test_random_forests_match_global_sort_without_core(seed):
    """With monotone S, no caps and no core, the frontier heap equals a global
    sort by (-S, depth, request, node) cut at k_max."""
    rng = np.random.default_rng(1000 + seed)
    trees = [random_forest(rng) for _ in range(int(rng.integers(1, 6)))]
    k_max = int(rng.integers(0, 50))
    res = schedule_budget(trees, k_max=k_max, core_width=None)
    keys = [(-t.scores[j], t.depths[j], i, j) for i, t in enumerate(trees)
            for j in range(t.size) if t.depths[j] <= t.trunc_depth]
    expected = [set() for _ in trees]
    for _, _, i, j in sorted(keys)[:k_max]:
        expected[i].add(j)
    assert [set(s.tolist()) for s in res.selected] == expected


@pytest.mark.parametrize("seed", range(60))
def test_compiled_selection_matches_the_heap_reference(seed):
    """Node for node, with caps, cores and scores that rise along a path."""
    rng = np.random.default_rng(2000 + seed)
    trees = [random_forest(rng, n_max=40) for _ in range(int(rng.integers(0, 9)))]
    if seed % 3 == 0:  # not monotone: the frontier alone keeps selections closed
        trees = [CandidateTree(t.token_ids, t.parents, rng.permutation(t.scores), t.depths,
                               t.trunc_depth, t.confident) for t in trees]
    k_max = int(rng.integers(0, 80))
    cap = None if rng.random() < 0.5 else int(rng.integers(0, 15))
    core = None if rng.random() < 0.3 else int(rng.integers(1, 4))
    got = schedule_budget(trees, k_max=k_max, per_request_cap=cap, core_width=core)
    want = schedule_shared(trees, k_max, float("inf") if cap is None else cap, core)
    assert [s.tolist() for s in got.selected] == [s.tolist() for s in want.selected]
    np.testing.assert_array_equal(got.from_priority1, want.from_priority1)
    np.testing.assert_array_equal(got.from_priority2, want.from_priority2)


@pytest.mark.parametrize("seed", range(60))
def test_one_call_budget_and_shape_match_the_references(seed):
    """The planner's compiled stages 3 and 4 (choose_nodes), node for node: the share
    is schedule_budget's (each request's equal share without a shared budget), the
    shape the plain transcription's, on random forests and step prices."""
    rng = np.random.default_rng(3000 + seed)
    trees = []
    while not any(t.size for t in trees):  # at least one request with candidates
        trees = [random_forest(rng, n_max=30) for _ in range(int(rng.integers(1, 7)))]
    k_max, cap = int(rng.integers(0, 60)), int(rng.integers(1, 15))
    prices = (0.03, float(rng.choice([0.0, 0.001, 0.004])), float(rng.integers(0, 12)),
              float(rng.choice([0.0, 0.002, 0.01])), float(rng.choice([0.0, 0.001])))
    step_requests = len(trees) + int(rng.integers(0, 4))
    for shared in (True, False):
        want = schedule_budget(trees, k_max=k_max, per_request_cap=cap, shared_budget=shared)
        for shape, priced in ((False, True), (True, True), (True, False)):
            selected, used_k, probing = choose_nodes(*concatenate(trees), k_max, 0, cap, 0,
                                                     shared, shape, priced, step_requests,
                                                     prices)
            assert used_k == k_max and not probing
            expected = want.selected if not shape else shape_selection(
                trees, want.selected, k_max, cap, shared, priced, step_requests, prices)
            got = split_selection(selected, concatenate(trees)[0])
            assert [g.tolist() for g in got] == [e.tolist() for e in expected]
            assert sum(g.size for g in got) <= k_max


def test_one_call_budget_chooses_by_the_cost_model_and_probes_when_nothing_pays():
    """k_max < 0: the best_budget of the candidates the gate allows; none paying and
    explore > 0: a probe of ``explore`` nodes, at most explore // trees each, each
    request's as one chain."""
    trees = [candidate([-1, 0, 1], path_probs=[0.9, 0.8, 0.7]),
             candidate([-1, 0], path_probs=[0.6, 0.5])]
    batch = concatenate(trees)
    free = (0.03, 0.0, 0.0, 0.0, 0.0)
    _, k_max, probing = choose_nodes(*batch, -1, 4, 8, 0, True, False, True, 2, free)
    assert (k_max, probing) == (4, False)  # free drafts: as many as allowed
    dear = (0.03, 0.03, 2.0, 0.0, 0.0)  # every draft doubles the step
    selected, k_max, probing = choose_nodes(*batch, -1, 4, 8, 0, True, False, True, 2, dear)
    assert (k_max, probing, selected.sum()) == (0, False, 0)
    selected, k_max, probing = choose_nodes(*batch, -1, 4, 8, 2, True, True, True, 2, dear)
    assert (k_max, probing) == (2, True)
    assert [s.tolist() for s in split_selection(selected, batch[0])] == [[0], [0]]
    # one request: its probe share of 4 covers the whole tree; verified as the root
    # path with the most expected tokens (0.5 + 0.4 against 0.45 + 0.1), not as a tree
    tree = concatenate([candidate([-1, 0, -1, 2], path_probs=[0.5, 0.4, 0.45, 0.1])])
    dear = (0.03, 0.03, 1.0, 0.0, 0.0)  # every draft doubles the step of one request
    selected, k_max, probing = choose_nodes(*tree, -1, 4, 8, 4, True, True, True, 1, dear)
    assert (k_max, probing) == (4, True)
    assert np.flatnonzero(selected).tolist() == [0, 1]


def test_subtree_reindexes_parent_first():
    tokens = np.array([10, 11, 12, 13, 14, 15], dtype=np.int32)
    parents = np.array([-1, 0, 1, -1, 3, 0], dtype=np.int32)
    sub_tokens, sub_parents = subtree(tokens, parents, [5, 0, 3])
    np.testing.assert_array_equal(sub_tokens, [10, 13, 15])
    np.testing.assert_array_equal(sub_parents, [-1, -1, 0])
    assert sub_tokens.dtype == np.int32 and sub_parents.dtype == np.int32
    validate_tree(sub_tokens, sub_parents)
    t, p = subtree(tokens, parents, [])
    assert t.size == 0 and p.size == 0
    with pytest.raises(ValueError, match="ancestor-closed"):
        subtree(tokens, parents, [0, 2])
    with pytest.raises(ValueError, match="distinct"):
        subtree(tokens, parents, [0, 0])
    with pytest.raises(ValueError, match="range|\\[0"):
        subtree(tokens, parents, [6])


@pytest.mark.parametrize("seed", range(10))
def test_subtree_of_schedule_is_valid_tree(seed):
    rng = np.random.default_rng(500 + seed)
    trees = [random_forest(rng) for _ in range(3)]
    res = schedule_budget(trees, k_max=20)
    for tree, sel in zip(trees, res.selected):
        t, p = subtree(tree.token_ids, tree.parents, sel)
        validate_tree(t, p)
        np.testing.assert_array_equal(t, tree.token_ids[sel])
        # Depths survive re-indexing.
        np.testing.assert_array_equal(tree_depths(p), tree.depths[sel])
