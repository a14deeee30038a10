# SPDX-License-Identifier: Apache-2.0
"""The planner's choices priced by the step cost model, compiled.

:func:`best_budget` chooses the step's budget (stage 3 of
:meth:`~vllm_echo.algos.echo.planner.EchoPlanner.plan`) and :func:`best_root_path` one
request's chain (stage 4), every step; :func:`break_even_probability` gives the least
acceptance rate a draft needs, once per refit. Compiled because in numpy each is a dozen
small calls per step or request, and once a forward has left the caches cold such calls
cost far more than their arithmetic. ``prices`` is :meth:`CostModel.prices`: (a, b,
knee, tree cost, draft cost), a step of N verified tokens, R tree requests and D (0 or
1) drafts costing a + b max(0, N - knee) + tree R + draft D.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def step_time(prices, num_tokens, num_trees, drafted):
    """The modelled time of a step (the one formula: :meth:`CostModel.time` calls it)."""
    a, b, knee, tree, draft = prices
    return a + b * max(num_tokens - knee, 0.0) + tree * num_trees + draft * drafted


@njit(cache=True)
def best_budget(probs, most, num_requests, prices):
    """The k in 0..min(``most``, candidates) maximising (B + sum of the k best ``probs``)
    / T(B + k), B = ``num_requests``; the smallest on ties."""
    ordered = np.sort(probs)[::-1]
    best_k, best_rate = 0, num_requests / step_time(prices, num_requests, 0, 0.0)
    total = 0.0
    for k in range(1, min(most, ordered.size) + 1):
        total += ordered[k - 1]
        rate = (num_requests + total) / step_time(prices, num_requests + k, 0, 1.0)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


@njit(cache=True)
def best_root_path(parents, scores, depths, max_len, trunc_depth, rest_tokens, rest_trees,
                   step_requests, rate, must_draft, prices):
    """One request's best chain in a step whose other requests verify ``rest_tokens``
    tokens (bonus tokens included) and ``rest_trees`` trees: no draft, or the root
    path to a node of depth <= ``max_len``, whichever adds the most expected tokens
    (the sum of exp(``scores``) along it) net of ``rate`` times the step's time.

    A path deeper than ``trunc_depth`` (the gate's cut) is allowed only if the step
    with it is no slower than with no draft: the gate releases budget, and such a path
    uses none. ``must_draft``: no draft is an option only if no path is (a fixed K
    per request). Returns (end node, -1 for no draft; its value)."""
    n = parents.size
    path_sum = np.empty(n)
    plain = step_time(prices, rest_tokens, rest_trees,
                       1.0 if rest_tokens > step_requests else 0.0)
    best_end, best_value = -1, -rate * plain
    found = False
    for j in range(n):  # parent-first order
        path_sum[j] = np.exp(scores[j])
        if parents[j] >= 0:
            path_sum[j] += path_sum[parents[j]]
        if depths[j] > max_len:
            continue
        time = step_time(prices, rest_tokens + depths[j], rest_trees, 1.0)
        if depths[j] > trunc_depth and time > plain:
            continue
        value = path_sum[j] - rate * time
        if value > best_value or (must_draft and not found):
            best_end, best_value = j, value
        found = True
    return best_end, best_value


@njit(cache=True)
def break_even_probability(prices, num_requests, max_drafts):
    """min over k in 1..``max_drafts`` of B (T(B + k) / T(B) - 1) / k, B =
    ``num_requests``: the acceptance probability a draft node needs, at the best draft
    size, to pay for itself."""
    plain = step_time(prices, num_requests, 0, 0.0)
    best = np.inf
    for k in range(1, max_drafts + 1):
        extra = step_time(prices, num_requests + k, 0, 1.0) / plain - 1.0
        best = min(best, num_requests * extra / k)
    return best


def warm_up() -> None:
    """Compile the kernels (a decode step should not pay for it)."""
    prices = (0.03, 0.001, 4.0, 0.01, 0.002)
    step_time(prices, 5.0, 1.0, 1.0)  # as CostModel.time calls it
    break_even_probability(prices, 1, 64)
    best_budget(np.array([0.5, 0.2]), 3, 1, prices)
    best_root_path(np.array([-1, 0], np.int64), np.array([-0.5, -1.0]),
                   np.array([1, 2], np.int64), 2, 1, 1, 0, 1, 30.0, False, prices)
