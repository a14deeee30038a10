# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.echo.planner import Candidates, CostModel, EchoPlanner, throughput_budget
from vllm_echo.algos.forest import build_forest_nodes
from vllm_echo.algos.ngram_index import NgramIndex
from vllm_echo.algos.tree import validate_parents
from vllm_echo.config import EchoSettings


def test_throughput_budget_known_answers():
    probs = np.array([0.9, 0.8, 0.3, 0.05])
    # free verification: take everything
    assert throughput_budget(probs, 1, a=1.0, b=0.0) == 4
    # a token costs as much as the fixed part: 1/2, 1.9/3, 2.7/4 (best), 3.0/5, 3.05/6
    assert throughput_budget(probs, 1, a=1.0, b=1.0) == 2
    # batch 64, T = 1 + 0.05 N: a draft pays off only if p > 0.05 * 64 / 4.2 = 0.76
    assert throughput_budget(probs, 64, a=1.0, b=0.05) == 2
    assert throughput_budget(np.array([0.5, 0.3, 0.1]), 64, a=1.0, b=0.05) == 0
    assert throughput_budget(np.empty(0), 4, a=1.0, b=0.1) == 0


def test_cost_model_fits_linear_time_and_freezes():
    model = CostModel(min_samples=6, min_distinct=3, freeze_after=10)
    for n in [1, 5, 17, 33, 1, 5, 17, 33, 65, 65]:
        model.add(n, 0.05 + 0.001 * n)
    a, b = model.coef
    assert a == pytest.approx(0.05, abs=1e-6) and b == pytest.approx(0.001, abs=1e-7)
    assert model.frozen
    model.add(1000, 99.0)  # ignored once frozen
    assert model.coef == (a, b)


def test_cost_model_separates_the_cost_of_tree_requests():
    model = CostModel(min_samples=6, min_distinct=3, freeze_after=100)
    for n, r in [(1, 0), (5, 0), (17, 0), (33, 0), (5, 1), (17, 1), (33, 2), (65, 1)]:
        model.add(n, 0.04 + 0.001 * n + 0.008 * r, r)
    a, b = model.coef
    assert (a, b, model.tree_cost) == pytest.approx((0.04, 0.001, 0.008), abs=1e-7)
    chains_only = CostModel(min_samples=4, min_distinct=3)
    for n in (1, 5, 17, 33):
        chains_only.add(n, 0.04 + 0.001 * n)
    assert chains_only.tree_cost is None  # trees never timed: unknown, not zero


def _tree(parents, probs):
    from vllm_echo.algos.echo.budget import CandidateTree
    from vllm_echo.algos.tree import tree_depths

    parents = np.asarray(parents)
    path = np.zeros(len(parents))
    for i, p in enumerate(parents):  # path score: sum of log-probs along the path
        path[i] = np.log(probs[i]) + (path[p] if p >= 0 else 0.0)
    depths = tree_depths(parents)
    return CandidateTree(np.arange(len(parents), dtype=np.int32), parents, path, depths,
                         int(depths.max()), True)


@pytest.mark.parametrize("tree_cost,expected", [
    # cheap trees: the side branch (p = 0.4) pays for itself
    (0.0005, [0, 1, 2, 3]),
    # a tree request costs 10 ms: keep the best root path 0 -> 1 -> 2 (0.9 + 0.72 + 0.36)
    (0.010, [0, 1, 2]),
])
def test_selection_becomes_a_chain_when_the_tree_does_not_pay(tree_cost, expected):
    planner = EchoPlanner(EchoSettings(method="echo"))
    for n, r in [(1, 0), (5, 0), (17, 0), (33, 0), (5, 1), (17, 1), (33, 1), (9, 1)]:
        planner.cost.add(n, 0.04 + 0.001 * n + tree_cost * r, r)
    # node 3 is a sibling of node 1 (both under the root): a real tree
    tree = _tree([-1, 0, 1, -1], [0.9, 0.8, 0.5, 0.4])
    (keep,) = planner._prefer_chains([tree], [np.array([0, 1, 2, 3])])
    assert keep.tolist() == expected


def test_best_root_path_and_chain_test():
    from vllm_echo.algos.echo.planner import _best_root_path, _is_chain

    parents = np.array([-1, 0, -1, 2, 3])
    keep = np.arange(5)
    # path 2 -> 3 -> 4 sums 0.5 + 0.4 + 0.3 = 1.2 > path 0 -> 1 = 0.6 + 0.5
    assert _best_root_path(parents, keep, np.array([0.6, 0.5, 0.5, 0.4, 0.3])).tolist() == [2, 3, 4]
    assert _is_chain(parents, np.array([2, 3, 4])) and not _is_chain(parents, keep)
    assert not _is_chain(parents, np.array([0, 2]))


def _candidates(tokens, candidates, capacity=32):
    index = NgramIndex(3, 20)
    index.extend(np.asarray(tokens, dtype=np.int32))
    nodes = build_forest_nodes(index, np.asarray(candidates, dtype=np.int32), capacity)
    head_logp = np.log(np.linspace(0.3, 0.01, len(candidates)))
    return Candidates(*nodes, head_logp=head_logp)


def test_plan_respects_budget_cap_and_returns_valid_trees():
    rng = np.random.default_rng(0)
    batch = [_candidates(rng.integers(0, 8, 120).tolist(), rng.permutation(50)[:16])
             for _ in range(5)] + [None]
    planner = EchoPlanner(EchoSettings(method="echo", k_max=12))
    drafts, plans = planner.plan(batch, per_request_cap=6)
    assert len(drafts) == 6 and plans[-1] is None and len(drafts[-1][0]) == 0
    assert sum(len(t) for t, _ in drafts) <= 12
    for tokens, parents in drafts:
        assert len(tokens) <= 6
        validate_parents(parents)


def test_observe_learns_from_verdicts_and_calibrates_after_warmup():
    rng = np.random.default_rng(1)
    planner = EchoPlanner(EchoSettings(method="echo", k_max=64, calibration_steps=30))
    for _ in range(40):
        batch = [_candidates(rng.integers(0, 6, 80).tolist(), rng.permutation(30)[:8])]
        drafts, plans = planner.plan(batch, per_request_cap=16)
        tokens, parents = drafts[0]
        # accept the first root child if any (a path of length 1)
        path = [int(np.flatnonzero(parents == -1)[0])] if len(tokens) else []
        planner.observe([(plans[0], path, 0)])
    assert planner.prior.num_observations > 0
    assert planner.stats.as_dict()["steps"] == 40
    assert planner.calibration_report is not None  # finalized once, defaults or calibrated


def test_head_buckets_follow_last_logit_probability():
    from vllm_echo.algos.echo.planner import head_bucket

    p = np.array([0.5, 0.31, 0.2, 0.05, 0.02, 0.005, 0.0001])
    assert head_bucket(np.log(p)).tolist() == [1, 1, 2, 3, 4, 5, 6]


def test_head_acceptance_is_learned_per_bucket():
    planner = EchoPlanner(EchoSettings(method="echo", k_max=64, calibration_steps=10**6))
    # one head of bucket 1, always accepted; the prior moves from 0.1 towards 1
    tokens, parents = np.array([7], np.int32), np.array([-1], np.int32)
    cand = Candidates(tokens, parents, np.zeros(1, np.int32), np.zeros(1, np.int32),
                      head_logp=np.log(np.array([0.6])))
    before = planner.head_prior.prob(1, 1)
    for _ in range(20):
        drafts, plans = planner.plan([cand], per_request_cap=4)
        planner.observe([(plans[0], [0], 3)])
    assert planner.head_prior.prob(1, 1) > max(before, 0.8)


def test_nothing_can_pay_when_break_even_exceeds_every_learned_rate():
    planner = EchoPlanner(EchoSettings(method="echo"))
    assert not planner.nothing_can_pay(64)  # no cost model yet: keep drafting
    for n in (1, 10, 30, 60, 1, 10, 30, 60):
        planner.cost.add(n, 0.05 + 0.002 * n)
    # priors start at 0.5 (retrieved) / 0.1 (heads): break-even at B=1 is 0.04
    assert not planner.nothing_can_pay(1)
    assert planner.nothing_can_pay(512)  # 0.002*512/(0.05+1.024) = 0.95 > 0.5


def test_probe_steps_explore_so_drafting_can_resume():
    # Cost model where verifying is dear (break-even 0.5 at B=8) and early drafts all
    # rejected: every learned rate is below break-even, so the budget admits nothing.
    planner = EchoPlanner(EchoSettings(method="echo"))
    for n in (1, 8, 16, 32) * 2:
        planner.cost.add(n, 0.016 + 0.002 * n)
    rng = np.random.default_rng(3)
    batch = [_candidates(rng.integers(0, 6, 80).tolist(), rng.permutation(30)[:8])
             for _ in range(8)]
    for _ in range(12):
        drafts, plans = planner.plan(batch, per_request_cap=8, explore=1)
        planner.observe([(p, [], 0) for p in plans if p is not None and len(p.token_ids)])
    assert planner.nothing_can_pay(8)
    drafts, _ = planner.plan(batch, per_request_cap=8)
    assert sum(len(t) for t, _ in drafts) == 0
    # A probe step verifies at most `explore` nodes, one per request, best first ...
    drafts, plans = planner.plan(batch, per_request_cap=8, explore=4)
    sizes = [len(t) for t, _ in drafts]
    assert sum(sizes) == 4 and max(sizes) == 1
    # ... and when those are accepted, rates recover and the budget opens again.
    for _ in range(20):
        drafts, plans = planner.plan(batch, per_request_cap=8, explore=4)
        planner.observe([(p, [0], 0) for p in plans if p is not None and len(p.token_ids)])
    assert not planner.nothing_can_pay(8)
