# SPDX-License-Identifier: Apache-2.0
"""The planner's choices priced by the step cost model, compiled.

:func:`choose_nodes` is stages 3 and 4 of
:meth:`~vllm_echo.algos.echo.planner.EchoPlanner.plan` in one call over the batch's
concatenated trees, every step: the step's budget (:func:`best_budget`), its share
(:func:`~vllm_echo.algos.echo.budget.select_nodes`) and each request's shape (tree or
chain, :func:`best_root_path`). :func:`break_even_probability` gives the least
acceptance rate a draft needs, once per refit. Compiled, and in one call, because in
numpy each is a dozen small calls per step or request, and once a forward has left the
caches cold every such call, and every call into a kernel, costs far more than its
arithmetic. ``prices`` is :meth:`CostModel.prices`: (a, b, knee, tree cost, draft
cost), a step of N verified tokens, R tree requests and D (0 or 1) drafts costing
a + b max(0, N - knee) + tree R + draft D.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vllm_echo.algos.echo.budget import select_nodes


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
def choose_nodes(offsets, parents, scores, depths, trunc_depths, confident, k_max, most,
                 cap, explore, shared, shape, trees_priced, step_requests, prices):
    """Stages 3 and 4 over the batch's trees (``offsets`` where each starts, ``parents``
    local to each; :func:`~vllm_echo.algos.echo.budget.concatenate`).

    Budget: ``k_max`` nodes, or with ``k_max`` < 0 the :func:`best_budget` of the
    candidates the gate allows, up to ``most``. If that is none and ``explore`` > 0,
    a probe: ``explore`` nodes, at most ``explore // trees`` per request, each
    request's share verified as the root path with the most expected tokens it holds
    (:func:`_probe_chains`). Share: ``select_nodes`` with at most ``cap`` nodes per
    request (and with ``shared`` False each request's equal share of ``k_max``, nothing
    pooled). Shape (if ``shape``): :func:`_shape_requests`. Returns (selected mask,
    k_max, probing)."""
    num_trees = offsets.size - 1
    if k_max < 0:
        probs = np.empty(parents.size)
        count = 0
        for r in range(num_trees):
            for j in range(offsets[r], offsets[r + 1]):
                if depths[j] <= trunc_depths[r]:
                    probs[count] = np.exp(scores[j])
                    count += 1
        k_max = best_budget(probs[:count], most, step_requests, prices)
    probing = k_max == 0 and explore > 0
    if probing:
        k_max, cap = explore, max(1, explore // num_trees)
    share_cap = cap if shared else min(cap, k_max // num_trees)
    selected, _, _ = select_nodes(offsets, parents, scores, depths, trunc_depths, confident,
                                  1, k_max, share_cap)
    if probing:
        _probe_chains(offsets, parents, scores, depths, trunc_depths, selected, prices)
    elif shape:
        _shape_requests(offsets, parents, scores, depths, trunc_depths, selected, k_max, cap,
                        shared, trees_priced, step_requests, prices)
    return selected, k_max, probing


@njit(cache=True)
def _probe_chains(offsets, parents, scores, depths, trunc_depths, selected, prices):
    """A probe's selection, in place: each request's share becomes the root path of at
    most as many nodes with the most expected tokens. Probes are there to learn
    acceptance rates, and a chain teaches them at a chain's price: probed as a tree (on
    the CPU a tree costs a fixed price per request, growing with its context) a probe
    step costs what the model then reads as the price of drafting at all, and while
    only probes draft, that price keeps them the only drafts."""
    for r in range(offsets.size - 1):
        lo, hi = offsets[r], offsets[r + 1]
        count = 0
        for j in range(lo, hi):
            count += selected[j]
        if count == 0:
            continue
        end, _ = best_root_path(parents[lo:hi], scores[lo:hi], depths[lo:hi], count,
                                trunc_depths[r], 0, 0, 0, 0.0, True, prices)
        _select_path(selected, parents, lo, hi, end)


@njit(cache=True)
def _select_path(selected, parents, lo, hi, end):
    """Select, of the tree at ``lo:hi``, only the root path to its node ``end`` (none
    for -1); returns the path's length."""
    selected[lo:hi] = False
    length = 0
    while end >= 0:
        selected[lo + end] = True
        length += 1
        end = parents[lo + end]
    return length


@njit(cache=True)
def _shape_requests(offsets, parents, scores, depths, trunc_depths, selected, k_max, cap,
                    shared, trees_priced, step_requests, prices):
    """Stage 4 in place on the ``selected`` mask: request by request, keep its selection
    or replace it by one root path (:func:`best_root_path`, at most ``cap`` nodes and
    the budget the requests before it left), whichever adds more expected tokens net
    of its price in step time, at the step's expected tokens per second. A tree is an
    option only once ``trees_priced``: a chain verifies natively, without the tree
    cost. Σ K_i <= k_max still holds (and each request's equal share without a
    ``shared`` budget; such a request always drafts if it can)."""
    num_trees = offsets.size - 1
    counts = np.zeros(num_trees, np.int64)
    expected = np.zeros(num_trees)
    branched = np.zeros(num_trees, np.bool_)  # its selection is not one root path
    for r in range(num_trees):
        previous = -1
        for j in range(offsets[r], offsets[r + 1]):
            if selected[j]:
                counts[r] += 1
                expected[r] += np.exp(scores[j])
                branched[r] = branched[r] or parents[j] != previous
                previous = j - offsets[r]
    num_tokens = step_requests + counts.sum()
    num_branched = branched.sum()
    total_expected = 0.0
    for r in range(num_trees):
        total_expected += expected[r]
    rate = (step_requests + total_expected) / step_time(prices, num_tokens, num_branched, 1.0)
    spare = k_max - (num_tokens - step_requests)
    share = k_max // max(num_trees, 1)
    for r in range(num_trees):
        lo, hi = offsets[r], offsets[r + 1]
        kept = counts[r]
        limit = min(kept + spare if shared else share, cap)
        rest_tokens, rest_trees = num_tokens - kept, num_branched - branched[r]
        end, value = best_root_path(parents[lo:hi], scores[lo:hi], depths[lo:hi], limit,
                                    trunc_depths[r], rest_tokens, rest_trees, step_requests,
                                    rate, not shared, prices)
        if branched[r] and trees_priced:
            as_tree = expected[r] - rate * step_time(prices, rest_tokens + kept,
                                                     rest_trees + 1, 1.0)
            if as_tree >= value:
                continue
        length = _select_path(selected, parents, lo, hi, end)
        spare += kept - length
        num_tokens, num_branched = rest_tokens + length, rest_trees


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
    """Compile the pricing kernels a fitted cost model calls (choose_nodes is compiled
    by planner.warm_up, with the dtypes a step passes)."""
    prices = (0.03, 0.001, 4.0, 0.01, 0.002)
    step_time(prices, 5.0, 1.0, 1.0)  # as CostModel.time calls it
    break_even_probability(prices, 1, 64)
