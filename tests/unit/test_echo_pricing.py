# SPDX-License-Identifier: Apache-2.0
"""The compiled budget and chain choices on steps whose best answer is worked out by hand."""
import numpy as np
import pytest

from vllm_echo.algos.echo.cost import CostModel
from vllm_echo.algos.echo.pricing import best_budget, best_root_path


def _prices(**kwargs):
    return CostModel.fixed(**kwargs).prices()


def _budget(probs, num_requests, most=None, **cost):
    probs = np.asarray(probs, dtype=np.float64)
    return best_budget(probs, probs.size if most is None else most, num_requests,
                       _prices(**cost))


def test_best_budget_known_answers():
    probs = [0.9, 0.8, 0.3, 0.05]
    # free verification: take everything
    assert _budget(probs, 1, a=1.0, b=0.0) == 4
    # a token costs as much as the fixed part: 1/2, 1.9/3, 2.7/4 (best), 3.0/5, 3.05/6
    assert _budget(probs, 1, a=1.0, b=1.0) == 2
    # batch 64, T = 1 + 0.05 N: a draft pays off only if p > 0.05 * 64 / 4.2 = 0.76
    assert _budget(probs, 64, a=1.0, b=0.05) == 2
    assert _budget([0.5, 0.3, 0.1], 64, a=1.0, b=0.05) == 0
    assert _budget([], 4, a=1.0, b=0.1) == 0
    # below the knee tokens are free: with T = 1 + max(0, N - 4), the first 3 drafts
    # (N = 2..4) cost nothing, the 4th (p = 0.05) would double the step
    assert _budget(probs, 1, a=1.0, b=1.0, knee=4) == 3
    # a step with any draft pays d once: d = 0.5 is worth it for 2.05 expected tokens
    # (3.05 / 1.5 > 1 / 1), d = 3 is not (3.05 / 4 < 1)
    assert _budget(probs, 1, a=1.0, b=0.0, draft_cost=0.5) == 4
    assert _budget(probs, 1, a=1.0, b=0.0, draft_cost=3.0) == 0


def test_best_budget_sorts_and_caps():
    # unsorted input: the best ones count first (0.9 + 0.8 for k = 2, as above)
    assert _budget([0.05, 0.3, 0.9, 0.8], 1, a=1.0, b=1.0) == 2
    # at most `most` nodes, whatever would pay
    assert _budget([0.9, 0.8, 0.3], 1, most=1, a=1.0, b=0.0) == 1
    # at most the candidates, whatever `most` allows
    assert _budget([0.9], 1, most=6, a=1.0, b=0.0) == 1


def _chain_choice(parents, probs, max_len, trunc_depth, rest_tokens=1, rest_trees=0,
                  step_requests=1, rate=1.0, must_draft=False, **cost):
    parents = np.asarray(parents, dtype=np.int64)
    scores = np.zeros(len(parents))
    depths = np.zeros(len(parents), dtype=np.int64)
    for j, p in enumerate(parents):  # path score: sum of log-probs along the path
        scores[j] = np.log(probs[j]) + (scores[p] if p >= 0 else 0.0)
        depths[j] = 1 + (depths[p] if p >= 0 else 0)
    return best_root_path(parents, scores, depths, max_len, trunc_depth, rest_tokens,
                          rest_trees, step_requests, rate, must_draft, _prices(**cost))


def test_best_root_path_known_answers():
    # two root paths: 0 -> 1 (p 0.6, then 0.6 * 0.5) and 2 -> 3 -> 4 (p 0.5, 0.2, 0.06)
    parents = [-1, 0, -1, 2, 3]
    probs = [0.6, 0.5, 0.5, 0.4, 0.3]
    # T(N) = 1 + b max(0, N - 1): the bonus token alone costs 1
    # free tokens: the path with the most expected tokens, 0 -> 1 (0.9 > 0.5 + 0.2 + 0.06)
    end, value = _chain_choice(parents, probs, 5, 5, a=1.0, b=0.0, knee=1)
    assert end == 1 and value == pytest.approx(0.9 - 1.0)
    # b = 0.35 at rate 1: node 0 alone (0.6 - 1.35) beats 0 -> 1 (0.9 - 1.7)
    end, value = _chain_choice(parents, probs, 5, 5, a=1.0, b=0.35, knee=1)
    assert end == 0 and value == pytest.approx(0.6 - 1.35)
    # b = 0.7: every path costs more than it brings; no draft (value -T(1))
    end, value = _chain_choice(parents, probs, 5, 5, a=1.0, b=0.7, knee=1)
    assert end == -1 and value == pytest.approx(-1.0)
    # ... unless the request must draft (a fixed K): its best path then
    end, _ = _chain_choice(parents, probs, 5, 5, must_draft=True, a=1.0, b=0.7, knee=1)
    assert end == 0
    # max_len 1: only depth-1 nodes
    end, _ = _chain_choice(parents, probs, 1, 5, a=1.0, b=0.0, knee=1)
    assert end == 0


def test_best_root_path_runs_past_the_gate_only_where_it_is_free():
    parents = [-1, 0, 1]
    probs = [0.9, 0.9, 0.9]
    # the gate cut at depth 1; below the knee a deeper path costs nothing, so it may go on
    end, _ = _chain_choice(parents, probs, 3, 1, a=1.0, b=1.0, knee=4)
    assert end == 2
    # past the knee, deeper steps cost more than no draft: the cut holds
    end, _ = _chain_choice(parents, probs, 3, 1, a=1.0, b=0.01)
    assert end == 0
    # a draft at all costs d: every path is dearer than no draft, so none runs past the
    # cut; depth 1 still pays
    end, _ = _chain_choice(parents, probs, 3, 1, a=1.0, b=0.0, draft_cost=0.1)
    assert end == 0
