# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.echo.planner import Candidates, CostModel, EchoPlanner, Plan
from vllm_echo.algos.forest import build_forest_nodes
from vllm_echo.algos.ngram_index import NgramIndex
from vllm_echo.algos.tree import validate_parents
from vllm_echo.config import EchoSettings


def test_cost_model_fits_linear_time():
    model = CostModel(min_samples=6, min_distinct=3)
    for n in [1, 5, 17, 33, 1, 5, 17, 33, 65, 65]:
        model.add(n, 0.05 + 0.001 * n)
    # a line is a hinge whose knee is the smallest N
    assert model.knee == 1
    assert model.time(1) == pytest.approx(0.051) and model.time(65) == pytest.approx(0.115)
    assert model.coef[1] == pytest.approx(0.001, abs=1e-7)


def test_cost_model_finds_the_knee_and_follows_new_samples():
    model = CostModel(min_samples=8, min_distinct=3, window=32, refit_every=8)
    flat_then_linear = [(n, 0.03 + 0.001 * max(0, n - 6)) for n in (1, 2, 3, 4, 6, 8, 17, 33)]
    for n, t in flat_then_linear * 2:
        model.add(n, t)
    assert model.knee == 6
    assert model.coef == pytest.approx((0.03, 0.001))
    assert model.time(5) == pytest.approx(0.03) and model.time(16) == pytest.approx(0.04)
    # the load changes (say a batch joins): the window forgets the old curve
    for n, t in [(n, 0.06 + 0.002 * n) for n in (8, 9, 10, 12, 16, 20, 24, 32)] * 4:
        model.add(n, t)
    assert model.knee == 8
    assert model.time(16) == pytest.approx(0.092)


def test_cost_model_prices_a_step_that_has_drafts():
    model = CostModel(min_samples=6, min_distinct=3, refit_every=1)
    steps = [(4, False), (4, True), (6, True), (8, True), (4, False), (5, True), (4, False),
             (12, True), (4, False)]
    for n, drafted in steps:
        model.add(n, 0.05 + 0.001 * n + 0.004 * drafted, 0, drafted)
    assert model.draft_cost == pytest.approx(0.004, abs=1e-7)
    assert model.time(4) == pytest.approx(0.054)
    assert model.time(8, drafted=True) == pytest.approx(0.062)


def test_cost_model_separates_the_cost_of_tree_requests():
    model = CostModel(min_samples=6, min_distinct=3, refit_every=1)
    for n, r in [(1, 0), (5, 0), (17, 0), (33, 0), (5, 1), (17, 1), (33, 2), (65, 1)]:
        model.add(n, 0.04 + 0.001 * n + 0.008 * r, r)
    assert model.tree_cost == pytest.approx(0.008, abs=1e-7)
    assert model.time(33, 2) == pytest.approx(0.04 + 0.033 + 0.016)
    chains_only = CostModel(min_samples=4, min_distinct=3)
    for n in (1, 5, 17, 33):
        chains_only.add(n, 0.04 + 0.001 * n)
    assert chains_only.tree_cost is None  # trees never timed: unknown, not zero


def test_budget_grows_only_as_fast_as_steps_are_priced():
    """Fitted on flat steps only (a GPU below its knee), the model would call every
    candidate free; the budget stops at twice the largest step it saw, and a larger
    step is refitted at once, so the next budget follows the new data."""
    planner = EchoPlanner(EchoSettings(method="echo"))
    planner.cost = CostModel(min_samples=8, min_distinct=3, refit_every=16)
    for n in (8, 12, 16, 20) * 2:
        planner.cost.add(n, 0.05)
    assert planner.cost.coef[1] == 0.0 and planner.cost.trusted_size() == 40
    trees = [_tree([-1, 0, 1, 2, 3, 4, 5, 6], [0.9] * 8) for _ in range(8)]  # 64 candidates
    assert planner._choose(trees, per_request_cap=8, step_requests=8)[1] == 40 - 8
    planner.cost.add(40, 0.05)  # past the fitted range: refitted now, not 16 steps later
    assert planner.cost.trusted_size() == 80
    assert planner._choose(trees, per_request_cap=8, step_requests=8)[1] == 64
    assert CostModel.fixed(a=1.0, b=0.0).trusted_size() is None


def test_budget_cap_never_falls_below_the_warm_up_sizes():
    """Warm-up steps that verified only 1-3 tokens (few candidates) must not cap the
    budget below what the warm-up explores (16 nodes at batch 1): else a cap at sizes
    that do not pay keeps it at 0, and nothing larger is ever measured."""
    planner = EchoPlanner(EchoSettings(method="echo"))
    planner.cost = CostModel(min_samples=8, min_distinct=3)
    for n in (1, 2, 3, 1, 2, 3, 1, 2):
        planner.cost.add(n, 0.05)
    assert planner.cost.trusted_size() == 6
    tree = _tree(list(range(-1, 19)), [0.99] * 20)  # a 20-node chain
    assert planner._choose([tree], per_request_cap=20, step_requests=1)[1] == 16


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
    (keep,), _ = planner._choose([tree], per_request_cap=8, step_requests=1, k_max=4)
    assert np.flatnonzero(keep).tolist() == expected


@pytest.mark.parametrize("times,expected", [
    # drafts are free (below the knee, and drafting costs nothing): the gate's cut
    # releases nothing, so the chain runs past it
    ({1: 30.0, 2: 30.0, 3: 30.0, 4: 30.0, 5: 30.0}, [0, 1, 2]),
    # every draft costs 0.5 ms: the cut holds although the chain would pay for itself
    ({1: 30.0, 2: 30.5, 3: 31.0, 4: 31.5, 5: 32.0}, [0]),
])
def test_gate_truncation_holds_unless_the_longer_chain_is_free(times, expected):
    from dataclasses import replace

    from vllm_echo.algos.echo.cost import CostModel

    planner = EchoPlanner(EchoSettings(method="echo"))
    model = CostModel(min_samples=8, min_distinct=3, refit_every=1)
    for n, ms in list(times.items()) * 4:
        model.add(n, ms / 1e3, 0, n > 1)
    model.tree_cost = 0.009  # priced: no "chains only every other step"
    planner.cost = model
    tree = replace(_tree([-1, 0, 1], [0.05, 0.9, 0.9]), trunc_depth=1)  # gate cut at depth 1
    (keep,), _ = planner._choose([tree], per_request_cap=8, step_requests=1, k_max=3)
    assert np.flatnonzero(keep).tolist() == expected


def test_budget_prices_the_step_with_every_decoding_request():
    """T = 30 ms flat up to 8 tokens, then 3 ms per token. One request has candidates
    (p ~ 0.5): alone in the step its 4 drafts are free; in a step that also decodes 7
    requests without candidates each would cost 3 ms, worth 8 requests / 30 ms x 3 ms =
    0.8 tokens, more than it brings, so none is verified."""
    planner = EchoPlanner(EchoSettings(method="echo"))
    planner.cost = CostModel.fixed(a=0.030, b=0.003, knee=8)
    planner.cost.tree_cost = 0.01
    planner.prior.update(np.ones(40, np.int64), np.full(40, 3), np.arange(40) % 2 == 0)
    cand = _candidates([1, 2, 3, 4, 5, 6, 1, 2, 3], [9])  # the chain 4, 5, 6, 1, 2 ...
    assert planner.prior.prob(1, 3) == pytest.approx(0.5, abs=0.1)
    drafts, _ = planner.plan([cand], per_request_cap=4, num_requests=1)
    assert len(drafts[0][0]) == 4
    drafts, _ = planner.plan([cand] + [None] * 7, per_request_cap=4)  # 8 decoding
    assert len(drafts[0][0]) == 0
    drafts, _ = planner.plan([cand], per_request_cap=4, num_requests=8)  # the same step
    assert len(drafts[0][0]) == 0


def test_without_a_shared_budget_every_request_drafts_its_fixed_k():
    """The step of the test above at batch 8, where no draft pays: the shared budget
    verifies none; the fixed-K ablation (shared_budget=false) drafts for every request
    with candidates all the same, each at most its cap, and never skips the forests."""
    def planner_for(shared):
        planner = EchoPlanner(EchoSettings(method="echo", shared_budget=shared))
        planner.cost = CostModel.fixed(a=0.030, b=0.003, knee=8)
        planner.cost.tree_cost = 0.01
        planner.prior.update(np.ones(40, np.int64), np.full(40, 3), np.arange(40) % 2 == 0)
        return planner

    batch = [_candidates([1, 2, 3, 4, 5, 6, 1, 2, 3], [9]),
             _candidates([7, 8, 9, 7, 8], [9]), None]
    drafts, _ = planner_for(True).plan(batch, per_request_cap=4, num_requests=8)
    assert [len(t) for t, _ in drafts] == [0, 0, 0]
    fixed = planner_for(False)
    drafts, _ = fixed.plan(batch, per_request_cap=4, num_requests=8)
    sizes = [len(t) for t, _ in drafts]
    assert sizes[0] >= 1 and sizes[1] >= 1 and sizes[2] == 0 and max(sizes) <= 4
    assert drafts[0][0][0] == 4 and drafts[1][0][0] == 9  # each request's best path
    assert not fixed.nothing_can_pay(8) and fixed.heads_can_pay(8)


def test_budget_prices_candidates_at_the_realised_share_of_their_score():
    """Same step as above at batch 8 (break-even 0.8): a depth-1 rate of 0.95 pays
    while plans realise what they expect, not once they realise half of it."""
    planner = EchoPlanner(EchoSettings(method="echo"))
    planner.cost = CostModel.fixed(a=0.030, b=0.003, knee=8)
    planner.cost.tree_cost = 0.01
    planner.prior.update(np.ones(400, np.int64), np.full(400, 3), np.arange(400) % 20 != 0)
    cand = _candidates([1, 2, 3, 4, 5, 6, 1, 2, 3], [9])
    drafts, plans = planner.plan([cand], per_request_cap=4, num_requests=8)
    assert len(drafts[0][0]) >= 1 and plans[0].expected > 0.9
    for _ in range(20):
        planner.realized.observe(2.0, 1)
    assert planner.realized.ratio < 0.6
    drafts, _ = planner.plan([cand], per_request_cap=4, num_requests=8)
    assert len(drafts[0][0]) == 0
    assert planner.nothing_can_pay(8) and not planner.heads_can_pay(8)


def test_reindex_selection():
    from vllm_echo.algos.echo.budget import reindex_selection

    parents = np.array([-1, 0, -1, 2, 3])
    new_parents, chain = reindex_selection(parents, np.array([2, 3, 4]))
    assert new_parents.tolist() == [-1, 0, 1] and chain
    new_parents, chain = reindex_selection(parents, np.array([0, 1, 2]))
    assert new_parents.tolist() == [-1, 0, -1] and not chain


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


def test_step_explore_probes_every_so_often_when_nothing_can_pay():
    from vllm_echo.algos.echo.planner import PROBE_EVERY, PROBE_NODES

    planner = EchoPlanner(EchoSettings(method="echo"))
    for n in (1, 10, 1, 30, 1, 60, 1, 10):
        planner.cost.add(n, 0.05 + 0.002 * n, 0, n > 1)
    assert [planner.step_explore(1) for _ in range(3)] == [0, 0, 0]  # drafts can pay
    # nothing can pay at batch 512: the step after PROBE_EVERY - 1 without a draft plans
    # with PROBE_NODES nodes to explore (these three steps planned nothing); the others
    # draft nothing
    got = []
    for _ in range(3 * PROBE_EVERY):
        got.append(planner.step_explore(512))
        if got[-1] is not None:
            planner.plan([None], per_request_cap=4, explore=got[-1])
    probing = [i + 3 for i, explore in enumerate(got) if explore is not None]
    assert probing == [PROBE_EVERY - 1, 2 * PROBE_EVERY - 1, 3 * PROBE_EVERY - 1]
    assert {got[i - 3] for i in probing} == {PROBE_NODES}


def test_probes_restart_drafting_that_a_dear_fit_and_bad_first_drafts_stopped():
    """A fit that prices drafting high (break-even 0.06 at batch 1) after first drafts
    that were all rejected: the forests' own buckets are below break-even, so plan()
    drops them, while a match length never seen keeps the prior's rate and nothing_can_pay
    says no. Probes must still come, and once their drafts are accepted drafting resumes."""
    from vllm_echo.algos.echo.planner import PROBE_EVERY

    planner = EchoPlanner(EchoSettings(method="echo"))
    planner.cost = CostModel.fixed(0.028, 0.0187, knee=4, draft_cost=0.005)
    planner.prior.update(np.ones(30, np.int64), np.ones(30, np.int64), np.zeros(30, bool))
    chain = Candidates(np.array([5, 6, 7, 8], np.int32), np.array([-1, 0, 1, 2], np.int32),
                       np.ones(4, np.int32), np.full(4, -1, np.int32), head_logp=np.empty(0))
    assert not planner.nothing_can_pay(1)
    drafts, _ = planner.plan([chain], per_request_cap=4)
    assert len(drafts[0][0]) == 0  # the stall: no draft, and nothing to learn from
    drafted_steps = []
    for step in range(6 * PROBE_EVERY):
        explore = planner.step_explore(1)
        if explore is None:
            continue
        drafts, plans = planner.plan([chain], per_request_cap=4, explore=explore)
        if len(drafts[0][0]):
            drafted_steps.append(step)
            planner.observe([(plans[0], list(range(len(drafts[0][0]))), 9)])  # all accepted
    assert drafted_steps[0] == PROBE_EVERY - 1
    assert drafted_steps[-PROBE_EVERY:] == list(range(5 * PROBE_EVERY, 6 * PROBE_EVERY))


def test_depths_past_the_budget_are_learned_from_fully_accepted_plans():
    """Chains the target always follows, at batch 8 where a node must be accepted more
    often than about half the time to pay. Depth 1 is verified and learned at once; a
    deeper depth, never verified, would keep its prior rate (0.5, its path score
    halved), too low to be verified. The target's token after a fully accepted plan
    tells whether the next candidate would have been accepted, so each depth is learned
    once the one before it is, and the chains grow to what pays."""
    planner = EchoPlanner(EchoSettings(method="echo", calibration_steps=10**6))
    planner.cost = CostModel.fixed(0.020, 0.001, knee=8)
    tokens = np.arange(100, 112, dtype=np.int32)
    chain = Candidates(tokens, np.arange(-1, 11, dtype=np.int32), np.full(12, 3, np.int32),
                       np.full(12, -1, np.int32), head_logp=np.empty(0))
    depths = []
    for _ in range(40):
        drafts, plans = planner.plan([chain] * 8, per_request_cap=12)
        depths.append(max(len(t) for t, _ in drafts))
        # every drafted token accepted; the target goes on with the chain's next token
        planner.observe([(p, list(range(len(t))), int(tokens[min(len(t), 11)]))
                         for (t, _), p in zip(drafts, plans) if p is not None and len(t)])
    assert depths[0] == 1
    assert min(depths[-10:]) >= 4
    assert planner.prior.prob(4, 3) > 0.8


def test_plain_steps_are_timed_until_drafting_is_priced():
    """At batch 1 ECHO drafts in nearly every step: without plain steps the cost model
    cannot tell what drafting at all costs, and would price a few draft tokens as free."""
    from vllm_echo.algos.echo.planner import PLAIN_EVERY

    planner = EchoPlanner(EchoSettings(method="echo"))
    for n in (2, 5, 9, 3, 5, 9, 2, 4):  # every timed step had drafts
        planner.cost.add(n, 0.05 + 0.002 * n + 0.004, 0, True)
    assert planner.cost.coef is not None and planner.cost.draft_cost is None
    got = [planner.step_explore(1) for _ in range(2 * PLAIN_EVERY)]
    assert [i for i, explore in enumerate(got) if explore is None] == [0, PLAIN_EVERY]
    for n in (1, 5, 1, 9, 1, 3, 1, 4) * 2:  # plain steps timed; the refit prices drafting
        planner.cost.add(n, 0.05 + 0.002 * n + 0.004 * (n > 1), 0, n > 1)
    assert planner.cost.draft_cost == pytest.approx(0.004, rel=1e-3)
    assert all(planner.step_explore(1) is not None for _ in range(2 * PLAIN_EVERY))


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


def test_calibration_label_uncensors_a_cut_plan():
    """Candidates 5 -> {6 -> 8, 7}; the plan verified 5 and 7 only (6 was cut)."""
    from vllm_echo.algos.echo.planner import MAX_DEPTH

    cand_tokens, cand_parents = np.array([5, 6, 7, 8]), np.array([-1, 0, 0, 1])
    keep = np.array([0, 2])
    forest = Candidates(cand_tokens, cand_parents, np.ones(4, int), np.full(4, -1),
                        head_logp=np.empty(0))
    plan = Plan(cand_tokens[keep], np.array([-1, 0]), np.array([1, 2]), np.zeros(2, int),
                np.ones(2, bool), np.ones(2, int), np.r_[0.5, 0.4, 0.2, np.zeros(29)], 0,
                0.0, forest, keep)
    # the target went on with the cut child 6: the whole forest reaches >= 2, deeper unknown
    assert plan.calibration_label([0], 6) == (2, 2)
    # the target's next token is no candidate child: the whole forest stops where the plan did
    assert plan.calibration_label([0], 9) == (1, MAX_DEPTH)
    assert plan.calibration_label([0, 1], 3) == (2, MAX_DEPTH)
    assert plan.calibration_label([], 4) == (0, MAX_DEPTH)


@pytest.mark.parametrize("seed", range(8))
def test_cost_model_is_not_tilted_by_bursts_of_slow_steps(seed):
    # A shared machine slows a few steps at a time; a least-squares line through
    # them trades intercept for slope. Steps of one size are fitted by their median.
    rng = np.random.default_rng(seed)
    model = CostModel()
    for _ in range(400):
        n = int(rng.choice([1, 1, 1, 2, 4, 5, 5, 5, 6, 8, 12, 16]))
        seconds = (0.02 + 0.001 * max(n - 4, 0)) * (1 + rng.normal(0, 0.03))
        if rng.random() < 0.1:
            seconds *= 1.5
        model.add(n, seconds, 0, n > 1)
    assert model.knee == 4
    assert model.coef[1] == pytest.approx(0.001, rel=0.05)


@pytest.mark.parametrize("seed", range(8))
def test_cost_model_is_not_fooled_by_slow_stretches(seed):
    """The machine's speed changes in stretches (0.8x to 1.4x, lasting ~150 steps) and the
    planner's step sizes come in stretches too (60 steps from one range of sizes): the
    shape is fitted on ratios of adjacent steps, which do not see the speed. (A fit on
    absolute times put the knee anywhere from 3 to 17 on these seeds.)"""
    rng = np.random.default_rng(seed)
    model = CostModel()
    regimes = [[1, 2, 3, 5], [5, 6, 9, 12], [9, 12, 17, 20], [1, 1, 3]]
    speed, regime = 1.0, regimes[0]
    for i in range(1500):
        if i % 60 == 0:
            regime = regimes[rng.integers(len(regimes))]
        if rng.random() < 1 / 150:
            speed = float(rng.choice([0.8, 1.0, 1.25, 1.4]))
        n = int(rng.choice(regime))
        seconds = (0.025 * (1 + 0.04 * max(0, n - 5)) + 0.0015 * (n > 1)) * speed
        seconds *= 1 + rng.normal(0, 0.04)
        if rng.random() < 0.05:  # a stalled step
            seconds *= 1.6
        model.add(n, seconds, 0, n > 1)
    a, b = model.coef
    assert model.knee in (5, 6)
    assert b / a == pytest.approx(0.04, rel=0.1)
    assert model.draft_cost / a == pytest.approx(0.06, rel=0.25)


def test_draft_price_is_kept_while_every_step_drafts():
    """Once both cases were timed, the price of drafting outlives the plain steps in the
    window: the shape is refitted with it held, and no plain step is needed again."""
    model = CostModel(min_samples=8, min_distinct=3, window=32, refit_every=8)
    for n in (1, 4, 1, 7, 1, 10, 1, 13) * 4:
        model.add(n, 0.05 + 0.001 * n + 0.004 * (n > 1), 0, n > 1)
    assert model.draft_cost == pytest.approx(0.004, rel=1e-3)
    for n in (2, 4, 7, 10, 13) * 8:  # drafts in every step; the plain ones leave the window
        model.add(n, 0.05 + 0.001 * n + 0.004, 0, True)
    assert all(model._d)
    # held relative to the level a, which the new knee (2, not 1) moves a little
    assert model.draft_cost == pytest.approx(0.004, rel=0.05)
    assert model.time(13, drafted=True) == pytest.approx(0.05 + 0.013 + 0.004)


def test_steps_after_a_gap_pair_with_nothing():
    """A step timed after a prefill or idle time (cold caches, another engine's turn)
    is not compared with the step before the gap: the slow first step after each gap,
    here always a long draft, does not make long drafts look dear."""
    rng = np.random.default_rng(0)
    model = CostModel()
    for i in range(600):
        n = int(rng.choice([1, 2, 3, 4, 5, 9, 13]))
        gap = i % 20 == 0
        if gap:
            n = 17  # the first step of a new request: long copy, slow caches
        seconds = (0.04 + 0.001 * max(n - 5, 0)) * (1.5 if gap else 1.0)
        model.add(n, seconds, 0, False, adjacent=not gap)
    a, b = model.coef
    assert b / a == pytest.approx(0.025, rel=0.05)
