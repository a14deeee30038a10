# SPDX-License-Identifier: Apache-2.0
"""Verification of a draft token tree (and, greedily, of a batch of chains) against
the target model's outputs.

Row layout follows :mod:`vllm_echo.algos.tree`: row 0 is the target's
prediction after the root, row ``j + 1`` the prediction after node ``j``.
Both verifiers return ``(path, next_token)`` where ``path`` lists accepted
node indices root side first and ``next_token`` is the token the target
emits after the last accepted node (the bonus token, or the correction when
nothing is accepted).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vllm_echo.algos.tree import (ArrayLike, ROOT, children_lists, path_to,
                                  tree_depths, validate_tree)


def verify_greedy(token_ids: ArrayLike, parents: ArrayLike,
                  target_argmax: ArrayLike) -> tuple[list[int], int]:
    """Accept the longest draft path that matches the target's argmax.

    A node is accepted when its token equals the argmax at its parent's row
    and its parent is accepted (or is the root). Among equally long accepted
    paths the one ending at the smallest node index wins, which makes the
    result independent of anything but the inputs. Runs in O(n).
    """
    validate_tree(token_ids, parents)
    tokens = np.asarray(token_ids, dtype=np.int64)
    par = np.asarray(parents, dtype=np.int64)
    argmax = np.asarray(target_argmax, dtype=np.int64)
    n = tokens.size
    if argmax.shape != (n + 1, ):
        raise ValueError(f"target_argmax must have shape ({n + 1},), "
                         f"got {argmax.shape}")
    if n == 0:
        return [], int(argmax[0])

    parent_rows = par + 1
    matches = tokens == argmax[parent_rows]
    # Row-indexed so the root (row 0) is accepted by definition; parent-first
    # order means a parent's flag is final before any child reads it.
    accepted_rows = np.zeros(n + 1, dtype=bool)
    accepted_rows[0] = True
    for j in range(n):
        accepted_rows[j + 1] = matches[j] and accepted_rows[parent_rows[j]]

    accepted = accepted_rows[1:]
    if not accepted.any():
        return [], int(argmax[0])
    depths = np.where(accepted, tree_depths(par), 0)
    # np.argmax returns the first maximum: the smallest-index tie-break.
    best = int(np.argmax(depths))
    return path_to(par, best), int(argmax[best + 1])


def verify_sampling(token_ids: ArrayLike, parents: ArrayLike,
                    target_probs: np.ndarray,
                    rng: np.random.Generator) -> tuple[list[int], int]:
    """Recursive rejection sampling of a deterministic draft tree.

    Walking down from the root, the distinct tokens among the current node's
    children are tried in node order. Token ``x`` is accepted with
    probability ``p'(x)``, where ``p'`` starts as the current row's target
    distribution; a rejection zeroes ``p'(x)`` and renormalises. Because the
    draft is deterministic (q = 1) this emits every token with exactly the
    target probability. Accepting ``x`` moves to the first child carrying
    ``x``; rejecting every child ends the walk with a sample from the
    residual, and reaching a leaf ends it with a sample from the leaf's row.

    ``target_probs`` has shape ``(n + 1, V)`` with rows already processed
    (temperature, top-k/top-p) and normalised.
    """
    validate_tree(token_ids, parents)
    tokens = np.asarray(token_ids, dtype=np.int64)
    probs = np.asarray(target_probs)
    n = tokens.size
    if probs.ndim != 2 or probs.shape[0] != n + 1:
        raise ValueError(f"target_probs must have shape ({n + 1}, V), "
                         f"got {probs.shape}")
    vocab_size = probs.shape[1]
    if n and tokens.max() >= vocab_size:
        raise ValueError(f"token id {int(tokens.max())} is outside the "
                         f"vocabulary of size {vocab_size}")

    children = children_lists(parents)
    path: list[int] = []
    node = ROOT
    while True:
        row = node + 1
        next_node, residual = _try_children(tokens, children[row],
                                            probs[row], rng)
        if next_node is None:
            return path, _sample(residual, rng)
        path.append(next_node)
        node = next_node


def _try_children(tokens: np.ndarray, children: list[int], row: np.ndarray,
                  rng: np.random.Generator) -> tuple[int | None, np.ndarray]:
    """Run the accept/reject trials at one node.

    Returns the accepted child, or ``None`` and the distribution to sample
    the emitted token from.
    """
    target = _normalised(row.astype(np.float64))
    if target is None:
        raise ValueError("a target_probs row has no probability mass")
    residual = target
    tried = set()
    for child in children:
        token = int(tokens[child])
        if token in tried:
            continue
        tried.add(token)
        # u is in [0, 1), so p'(x) == 1 always accepts and 0 never does.
        if rng.random() < residual[token]:
            return child, residual
        residual = residual.copy()
        residual[token] = 0.0
        renormalised = _normalised(residual)
        if renormalised is None:
            # Reachable only through rounding: the rejected tokens carried
            # all the mass, so any remaining trial has acceptance 0. Fall back
            # to the target row so the emitted token stays in its support.
            return None, target
        residual = renormalised
    return None, residual


def _normalised(p: np.ndarray) -> np.ndarray | None:
    total = p.sum()
    if not total > 0.0:
        return None
    return p / total


def _sample(p: np.ndarray, rng: np.random.Generator) -> int:
    # Inverse-CDF sampling; side="right" never lands on a zero-probability
    # entry because such an entry does not raise the CDF.
    cdf = np.cumsum(p)
    idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    if idx < p.size:
        return idx
    # u * cdf[-1] can round up to cdf[-1]; take the last token with mass.
    return int(np.flatnonzero(p)[-1])


def verify_greedy_chains(draft_ids: ArrayLike, num_drafts: ArrayLike, target_argmax: ArrayLike,
                         last_tokens: ArrayLike, width: int) -> np.ndarray:
    """Greedy verification of a batch of chains, one output row per request.

    ``draft_ids`` and ``target_argmax`` are flat, request after request
    (``num_drafts[i]`` entries each; ``target_argmax[j]`` is the target's argmax
    at the row before draft ``j``). A request keeps its drafts while each equals
    that argmax, then emits the first argmax that differs or, all drafts kept,
    ``last_tokens[i]`` (its token after the last draft). Rows are padded with -1
    to ``width`` (vLLM's rejection-sampler layout, width = longest chain + 1).
    """
    drafts = np.ascontiguousarray(draft_ids, dtype=np.int64)
    argmax = np.ascontiguousarray(target_argmax, dtype=np.int64)
    n = np.ascontiguousarray(num_drafts, dtype=np.int64)
    last = np.ascontiguousarray(last_tokens, dtype=np.int64)
    total = int(n.sum())
    if drafts.shape != (total, ) or argmax.shape != drafts.shape:
        raise ValueError(f"draft_ids and target_argmax need {total} entries, got "
                         f"{drafts.shape} and {argmax.shape}")
    if last.shape != n.shape or width < int(n.max(initial=0)) + 1:
        raise ValueError(f"last_tokens needs shape {n.shape} and width >= the longest chain "
                         f"+ 1, got {last.shape} and {width}")
    rows = np.full((n.size, width), -1, dtype=np.int64)
    _greedy_chain_rows(drafts, n, argmax, last, rows)
    return rows


@njit(cache=True)
def _greedy_chain_rows(drafts, num_drafts, argmax, last, rows):
    start = 0
    for i in range(num_drafts.size):
        k = 0
        while k < num_drafts[i] and drafts[start + k] == argmax[start + k]:
            rows[i, k] = drafts[start + k]
            k += 1
        rows[i, k] = argmax[start + k] if k < num_drafts[i] else last[i]
        start += num_drafts[i]
