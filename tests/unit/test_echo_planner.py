# SPDX-License-Identifier: Apache-2.0
"""EchoPlanner: the one decision rule on hand-made pools whose best answer is known,
chain and tree mode, the fixed budget, drafting modes, the probe, the feedback loop."""

import json

import numpy as np
import pytest

from vllm_echo.algos.echo import Candidates, EchoPlanner, EchoTuning

STRONG = 10**7  # prior strength that pins a rate whatever is observed


def _tuning(retrieved=0.9, head=0.1, **kwargs):
    """Pinned rates; a step with drafts costs its tokens only (no drafted-step share)
    unless ``drafted_share`` is given."""
    kwargs.setdefault("drafted_share", 0.0)
    return EchoTuning(retrieved_prior=(retrieved * STRONG, (1 - retrieved) * STRONG),
                      head_prior=(head * STRONG, (1 - head) * STRONG), match_edges=(1,),
                      **kwargs)


def _chain(tokens, first_parent=-1):
    n = len(tokens)
    parents = [first_parent] + list(range(n - 1)) if first_parent < 0 else None
    return Candidates(np.array(tokens, np.int32), np.array(parents, np.int32),
                      np.full(n, 3, np.int32), np.full(n, -1, np.int32), np.empty(0))


def _linear(planner, a, b, top=4096):
    planner.cost.set_curve([1, top], [a + b, a + b * top])


def test_rule_takes_the_prefix_with_the_most_tokens_per_second():
    # One request, a chain of rate 0.9: P = 0.9, 0.81, 0.729, 0.6561, 0.59049, 0.531441.
    # T(n) = 1 + 0.5 n, so k drafts give (1 + sum of P) / (1.5 + 0.5 k):
    #   k = 0..6: 0.667, 0.95, 1.084, 1.146, 1.170, 1.1715, 1.159 -> k = 5.
    planner = EchoPlanner(_tuning(0.9))
    _linear(planner, 1.0, 0.5)
    (tokens, parents), = planner.plan([_chain([11, 12, 13, 14, 15, 16])], 8, 1)[0]
    assert tokens.tolist() == [11, 12, 13, 14, 15]
    assert parents.tolist() == [-1, 0, 1, 2, 3]
    # Free verification: everything up to the cap; dear verification: nothing.
    _linear(planner, 1.0, 0.0)
    assert len(planner.plan([_chain([11, 12, 13, 14, 15, 16])], 4, 1)[0][0][0]) == 4
    _linear(planner, 1.0, 10.0)  # 1 / 11 = 0.0909 without a draft, 1.9 / 21 = 0.0905 with
    drafts, plans = planner.plan([_chain([11, 12, 13])], 8, 1)
    assert len(drafts[0][0]) == 0 and plans == [None]


def test_other_requests_in_the_step_raise_the_bar():
    # The same chain in a step of 10 requests, T(n) = 10 + n: (10 + sum) / (20 + k) for
    # k = 0..6 is 0.5, 0.519, 0.532, 0.541, 0.5456, 0.5474, 0.5468: k = 5, where one
    # request alone took 5 at a far dearer token (above) and takes all 10 here.
    planner = EchoPlanner(_tuning(0.9))
    _linear(planner, 10.0, 1.0)
    (tokens, _), = planner.plan([_chain(list(range(100, 110)))], 16, 10)[0]
    assert len(tokens) == 5
    (tokens, _), = planner.plan([_chain(list(range(100, 110)))], 16, 1)[0]
    assert len(tokens) == 10


def test_nodes_of_all_requests_are_pooled_by_probability():
    # Request A's chain has rate 0.9 per node, B's one node 0.5 (a head): with T flat up
    # to 4 tokens and steep after it, the 2 free slots go to A's 0.9 and 0.81, not B.
    planner = EchoPlanner(_tuning(0.9, head=0.5), trees=True)
    planner.cost.set_curve([1, 4, 5], [1.0, 1.0, 100.0])
    head = Candidates(np.array([7], np.int32), np.array([-1], np.int32),
                      np.array([0], np.int32), np.array([0], np.int32), np.array([-0.01]))
    drafts, plans = planner.plan([_chain([1, 2, 3]), head], 8, 2)
    assert drafts[0][0].tolist() == [1, 2] and plans[1] is None
    # The per-request cap: A may verify 1, so B's head takes the other slot.
    drafts, _ = planner.plan([_chain([1, 2, 3]), head], 1, 2)
    assert drafts[0][0].tolist() == [1] and drafts[1][0].tolist() == [7]


def _forest_with_head_chain():
    # root -> 1 -> 2 -> 3  (retrieved, rate 0.5: 0.5, 0.25, 0.125; sum 0.875)
    #      -> 9 -> 4       (a head of rate 0.9, then a retrieved child: 0.9, 0.45)
    return Candidates(np.array([1, 2, 3, 9, 4], np.int32), np.array([-1, 0, 1, -1, 3], np.int32),
                      np.array([3, 3, 3, 0, 3], np.int32), np.array([-1, -1, -1, 0, -1], np.int32),
                      np.array([-0.5]))


def test_chain_mode_offers_each_request_its_best_root_path():
    planner = EchoPlanner(_tuning(0.5, head=0.9), trees=False)
    _linear(planner, 1.0, 0.0)
    (tokens, parents), = planner.plan([_forest_with_head_chain()], 8, 1)[0]
    assert tokens.tolist() == [9, 4] and parents.tolist() == [-1, 0]  # 1.35 > 0.875
    # Within a cap of 1 the best path is the head alone; a cap of 3 still prefers the
    # head's chain (1.35 against 0.875).
    assert planner.plan([_forest_with_head_chain()], 1, 1)[0][0][0].tolist() == [9]
    # Trees: everything (free), verified as a tree.
    planner.trees = True
    (tokens, parents), = planner.plan([_forest_with_head_chain()], 8, 1)[0]
    assert tokens.tolist() == [1, 2, 3, 9, 4] and parents.tolist() == [-1, 0, 1, -1, 3]
    _, (plan,) = planner.plan([_forest_with_head_chain()], 8, 1)
    assert not plan.is_chain and plan.expected == pytest.approx(0.875 + 1.35)
    # A request that must be verified as a chain gets its best path in tree mode too.
    forest = _forest_with_head_chain()
    forest.chain_only = True
    assert planner.plan([forest], 8, 1)[0][0][0].tolist() == [9, 4]


def test_tree_selection_is_reindexed_parent_first():
    # T = 1 + 0.3 n at one request, nodes by P 0.9, 0.5, 0.45, 0.25, 0.125: k = 0..4 give
    # 0.769, 1.188, 1.263, 1.295, 1.24: the tree keeps 9, 1 and 4 (node order), not 2.
    planner = EchoPlanner(_tuning(0.5, head=0.9), trees=True)
    _linear(planner, 1.0, 0.3)
    (tokens, parents), = planner.plan([_forest_with_head_chain()], 8, 1)[0]
    assert tokens.tolist() == [1, 9, 4] and parents.tolist() == [-1, -1, 1]


def test_a_fixed_k_max_takes_the_best_nodes_whatever_they_cost():
    planner = EchoPlanner(_tuning(0.5, head=0.9), trees=True, k_max=3)
    assert planner.drafting_mode(1, 8) == "all"  # no cost curve needed
    (tokens, _), = planner.plan([_forest_with_head_chain()], 8, 1)[0]
    assert sorted(tokens.tolist()) == [1, 4, 9]  # 0.9, 0.5, 0.45


def test_drafting_mode_says_what_can_pay():
    # B = 4, T = 1 + b n: a node pays iff P > B b / (1 + 4 b) (the break-even).
    planner = EchoPlanner(_tuning(0.5, head=0.1))
    assert planner.drafting_mode(4, 8) == "none"  # nothing timed, no curve
    _linear(planner, 1.0, 0.02)  # break-even 0.074: retrieved and heads pay
    assert planner.break_even(4, 8) == pytest.approx(4 * 0.02 / 1.08)
    assert planner.drafting_mode(4, 8) == "all"
    _linear(planner, 1.0, 0.1)  # 0.286: retrieved only
    assert planner.drafting_mode(4, 8) == "retrieval"
    _linear(planner, 1.0, 1.0)  # 0.8: nothing
    assert planner.drafting_mode(4, 8) == "none"


def test_a_first_draft_pays_for_the_drafted_step_share():
    """A flat curve (drafts look free) at one request: a step with drafts costs
    ``drafted_share`` of a plain step more, so a lone node is drafted only if its P
    beats that share."""
    for p, drafted in ((0.04, False), (0.06, True)):
        planner = EchoPlanner(_tuning(p, drafted_share=0.05))
        _linear(planner, 1.0, 0.0)
        (tokens, _), = planner.plan([_chain([7])], 8, 1)[0]
        assert len(tokens) == drafted


def test_probe_after_steps_without_a_draft():
    planner = EchoPlanner(_tuning(0.5, probe_after=3, probe_nodes=2))
    _linear(planner, 1.0, 1.0)  # nothing can pay
    modes = [planner.drafting_mode(4, 8) for _ in range(3)]
    assert modes == ["none"] * 3
    assert planner.drafting_mode(4, 8) == "all"  # the 4th step probes
    (tokens, _), = planner.plan([_chain([1, 2, 3])], 8, 4)[0]
    assert tokens.tolist() == [1, 2]  # its 2 best nodes, though they do not pay
    assert planner.snapshot()["probes"] == 1
    # The count starts again; an empty plan counts as a step without a draft too.
    assert planner.plan([_chain([1])], 8, 4)[1] == [None]
    assert [planner.drafting_mode(4, 8) for _ in range(3)] == ["none", "none", "all"]


def test_low_rates_recover_through_probes():
    """Rates pushed below break-even by early rejections come back once probes see
    acceptances (the probe is the only way: no step drafts otherwise)."""
    planner = EchoPlanner(EchoTuning(probe_after=4, probe_nodes=1, match_edges=(1,)))
    _linear(planner, 1.0, 0.3)  # break-even at one request: 0.3 / 1.3 = 0.23
    for _ in range(20):  # early drafts are all rejected
        planner.acceptance.observe(np.array([0]), np.array([True]), np.array([False]))
    assert planner.drafting_mode(1, 8) == "none"
    steps = 0
    while planner.drafting_mode(1, 8) != "retrieval" or planner._empty_steps:
        drafts, plans = planner.plan([_chain([1, 2])], 8, 1)
        if plans[0] is not None:
            planner.observe([(plans[0], list(range(len(drafts[0][0]))), 5)])
        steps += 1
        assert steps < 200
    assert planner.snapshot()["probes"] >= 1


def test_observe_learns_and_snapshot_is_json():
    planner = EchoPlanner(EchoTuning(match_edges=(1,)))
    _linear(planner, 1.0, 0.0)
    before = planner.acceptance.rates.copy()
    _, (plan,) = planner.plan([_chain([1, 2, 3])], 8, 1)
    planner.observe([(plan, [0, 1, 2], 4)])
    assert np.all(planner.acceptance.rates[:3] > before[:3])
    snap = json.loads(json.dumps(planner.snapshot()))
    assert snap["drafted"] == 3 and snap["accepted"] == 3 and snap["draft_utilization"] == 1
    assert snap["cost_curve_ms"]["1"] == pytest.approx(1000.0)
