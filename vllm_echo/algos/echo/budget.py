# SPDX-License-Identifier: Apache-2.0
"""ECHO's elastic batch budget (the paper's Alg. 1, reconstructed).

The batch's draft trees are verified in one target forward, so they share
one budget ``k_max`` of draft nodes (each request's root/bonus token is
verified anyway and is not counted). Nodes are handed out in two phases,
each by descending path score S across the whole batch and always from the
frontier (a node becomes eligible once its parent is selected), so every
request's selection stays ancestor-closed even if S were not monotone:

1. priority 1, depth: confident requests (no gate fired) offer their whole
   tree; truncated requests offer only their *core*, the paths to their
   ``core_width`` best nodes at the truncation depth (the beam that the
   gate judged). Truncated requests thereby yield budget to deeper
   extension of confident ones;
2. priority 2, width: only once priority 1 is exhausted (no request can
   deepen) and budget remains, truncated requests widen with their other
   nodes at depth <= truncation depth (lower-ranked siblings and branches).

At low load (one request, or ample budget) this is the reference's local
truncate-and-widen: the core, then everything up to the truncation depth.
At high load priority 1 consumes the budget and width of unconfident
requests is what gets dropped. ``core_width=None`` puts all nodes up to the
truncation depth into priority 1 (priority 2 is then empty): the literal
"everything up to the truncation depth competes by S" reading.

``shared_budget=False`` is the fixed-K baseline: each request is scheduled
alone with ``k_max // num_requests`` nodes, nothing is pooled.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from numba import njit

from vllm_echo.algos.tree import ROOT, validate_tree

_NO_CAP = 1 << 62  # per_request_cap None


@dataclass(frozen=True, eq=False)
class CandidateTree:
    """One request's candidates: tree, path scores S, depths and gate decision.

    ``trunc_depth`` is the deepest depth that may be selected (the tree's max
    depth when ``confident``); ``confident`` is False when a gate fired.
    """

    token_ids: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    depths: np.ndarray
    trunc_depth: int
    confident: bool

    def __post_init__(self):
        validate_tree(self.token_ids, self.parents)
        parents = np.asarray(self.parents, dtype=np.int64)
        scores = np.asarray(self.scores, dtype=np.float64)
        depths = np.asarray(self.depths, dtype=np.int64)
        n = parents.size
        if scores.shape != (n, ) or depths.shape != (n, ):
            raise ValueError(f"scores {scores.shape} and depths {depths.shape} "
                             f"must have shape ({n},)")
        if np.isnan(scores).any():
            raise ValueError("scores contain NaN")
        is_root_child = parents == ROOT
        expected = np.where(is_root_child, 1, depths[np.maximum(parents, 0)] + 1)
        if n and not np.array_equal(depths, expected):
            j = int(np.flatnonzero(depths != expected)[0])
            raise ValueError(f"depths[{j}] = {int(depths[j])} does not match the "
                             f"tree (expected {int(expected[j])})")
        if int(self.trunc_depth) < 0:
            raise ValueError(f"trunc_depth must be >= 0, got {self.trunc_depth}")
        object.__setattr__(self, "token_ids", np.asarray(self.token_ids))
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "depths", depths)
        object.__setattr__(self, "trunc_depth", int(self.trunc_depth))
        object.__setattr__(self, "confident", bool(self.confident))

    @classmethod
    def trusted(cls, token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray,
                depths: np.ndarray, trunc_depth: int, confident: bool) -> "CandidateTree":
        """Construct without the checks or dtype conversions, for arrays valid by
        construction (the planner's, from the forest kernel: int32 parents): on a small
        tree they cost more than scheduling it, every step, for every request."""
        tree = object.__new__(cls)
        tree.__dict__.update(token_ids=token_ids, parents=parents, scores=scores,
                             depths=depths, trunc_depth=int(trunc_depth),
                             confident=bool(confident))
        return tree

    @property
    def size(self) -> int:
        return int(self.parents.size)


@dataclass(frozen=True, eq=False)
class BudgetResult:
    """Per request: selected node indices (ascending, i.e. parent-first order)
    and how many nodes each phase gave it."""

    selected: tuple[np.ndarray, ...]
    from_priority1: np.ndarray
    from_priority2: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        return np.array([s.size for s in self.selected], dtype=np.int64)

    @property
    def used(self) -> int:
        return int(self.counts.sum())


@njit(cache=True)
def select_nodes(offsets, parents, scores, depths, trunc_depths, confident, core_width,
                 k_max, cap):
    """The two phases over the batch's concatenated trees (``parents`` local to each
    tree, ``offsets`` where each starts; ``core_width`` < 0 for None). Returns the
    selected mask and the nodes each phase gave each request."""
    num_requests = offsets.size - 1
    n = parents.size
    owner = np.empty(n, np.int64)
    parent_at = np.empty(n, np.int64)  # parent's index among the concatenated nodes
    pool1 = np.zeros(n, np.bool_)
    pool2 = np.zeros(n, np.bool_)
    core = np.zeros(n, np.bool_)  # truncated requests' priority-1 nodes
    for r in range(num_requests):
        lo, hi = offsets[r], offsets[r + 1]
        deepest = 0
        for j in range(lo, hi):
            owner[j] = r
            parent_at[j] = ROOT if parents[j] == ROOT else lo + parents[j]
            if depths[j] <= trunc_depths[r]:
                pool1[j] = True
                deepest = max(deepest, depths[j])
        if confident[r] or core_width < 0 or deepest == 0:
            continue
        # Truncated: priority 1 is the ancestor closure of its core_width best nodes
        # at the truncation level, the deepest the gate allows (best S first, lower
        # index on ties); priority 2 the rest of what the gate allows.
        for _ in range(core_width):
            best = -1
            for j in range(lo, hi):
                if depths[j] == deepest and not core[j] and (
                        best < 0 or scores[j] > scores[best]):
                    best = j
            if best < 0:
                break
            j = best
            while j != ROOT and not core[j]:
                core[j] = True
                j = parent_at[j]
        for j in range(lo, hi):
            pool2[j] = pool1[j] and not core[j]
            pool1[j] = core[j]
    # Children in CSR form over the concatenated nodes, in index order.
    child_count = np.zeros(n + 1, np.int64)
    for j in range(n):
        if parent_at[j] != ROOT:
            child_count[parent_at[j] + 1] += 1
    child_start = np.cumsum(child_count)
    children = np.empty(n, np.int64)
    filled = child_start[:-1].copy()
    for j in range(n):
        parent = parent_at[j]
        if parent != ROOT:
            children[filled[parent]] = j
            filled[parent] += 1
    selected = np.zeros(n, np.bool_)
    count = np.zeros(num_requests, np.int64)
    got = np.zeros((2, num_requests), np.int64)
    budget = k_max
    for phase in range(2):
        pool = pool1 if phase == 0 else pool2
        # Heap keys (-S, depth, request, node): unique, so the outcome is deterministic.
        heap = [(0.0, 0, 0, 0)]
        heap.pop()
        for j in range(n):
            r = owner[j]
            parent_in = parent_at[j] == ROOT or selected[parent_at[j]]
            if pool[j] and not selected[j] and parent_in and count[r] < cap:
                heap.append((-scores[j], depths[j], r, j))
        heapq.heapify(heap)
        used = 0
        while len(heap) and used < budget:
            _, _, r, j = heapq.heappop(heap)
            if count[r] >= cap:
                continue
            selected[j] = True
            count[r] += 1
            got[phase, r] += 1
            used += 1
            for c in children[child_start[j]:child_start[j + 1]]:
                if pool[c]:
                    heapq.heappush(heap, (-scores[c], depths[c], r, c))
        budget -= used
    return selected, got[0], got[1]


def _schedule_shared(trees: Sequence[CandidateTree], k_max: int, cap: float,
                     core_width: Optional[int]) -> BudgetResult:
    if not trees:
        empty = np.zeros(0, dtype=np.int64)
        return BudgetResult((), empty, empty)
    batch = concatenate(trees)
    selected, from_p1, from_p2 = select_nodes(
        *batch, -1 if core_width is None else int(core_width), int(k_max),
        _NO_CAP if cap == float("inf") else int(cap))
    return BudgetResult(split_selection(selected, batch[0]), from_p1, from_p2)


def concatenate(trees: Sequence[CandidateTree]) -> tuple[np.ndarray, ...]:
    """The batch's trees as the compiled kernels take them: (offsets, parents, scores,
    depths, truncation depths, confident), ``offsets`` where each tree starts (and the
    end), parents local to each tree."""
    if len(trees) == 1:  # batch 1: the tree's own arrays, no copies
        tree = trees[0]
        return (np.array((0, tree.size), np.int64), tree.parents, tree.scores, tree.depths,
                np.array((tree.trunc_depth, ), np.int64), np.array((tree.confident, ), np.bool_))
    offsets = np.zeros(len(trees) + 1, np.int64)
    np.cumsum([t.size for t in trees], out=offsets[1:])
    parents = np.concatenate([t.parents for t in trees])
    scores = np.concatenate([t.scores for t in trees])
    depths = np.concatenate([t.depths for t in trees])
    return (offsets, parents, scores, depths,
            np.array([t.trunc_depth for t in trees], dtype=np.int64),
            np.array([t.confident for t in trees], dtype=np.bool_))


def split_selection(selected: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per tree, the indices of its selected nodes (a mask over the concatenation)."""
    if offsets.size == 2:
        return (np.flatnonzero(selected), )
    return tuple(np.flatnonzero(selected[lo:hi]) for lo, hi in zip(offsets[:-1], offsets[1:]))


@njit(cache=True)
def reindex_selection(parents, selected):
    """:func:`subtree`'s parents, unchecked and compiled, for a selection known to be
    ascending and ancestor-closed (schedule_budget's, or a root path): the planner
    re-indexes one per request and step. Also says whether it is one root path."""
    new_index = np.empty(parents.size, np.int64)
    out = np.empty(selected.size, parents.dtype)
    is_chain = True
    for i in range(selected.size):
        new_index[selected[i]] = i
        parent = parents[selected[i]]
        out[i] = ROOT if parent == ROOT else new_index[parent]
        is_chain = is_chain and out[i] == i - 1
    return out, is_chain


@njit(cache=True)
def select_plan_nodes(selected, token_ids, parents, depths, match_len, rank, buckets,
                      log_probs):
    """The planner's plan of one request in one compiled call: for the candidate nodes
    ``selected`` (a mask, ancestor-closed), their indices, token ids, re-indexed
    parents (:func:`reindex_selection`), depths, match lengths, whether each was
    retrieved (rank < 0), score buckets, the accepted tokens they expect (the sum of
    exp(log_probs)) and whether they form one root path."""
    keep = np.flatnonzero(selected)
    new_parents, is_chain = reindex_selection(parents, keep)
    n = keep.size
    tokens = np.empty(n, token_ids.dtype)
    kept_depths = np.empty(n, depths.dtype)
    kept_match = np.empty(n, match_len.dtype)
    retrieved = np.empty(n, np.bool_)
    kept_buckets = np.empty(n, buckets.dtype)
    expected = 0.0
    for i in range(n):
        j = keep[i]
        tokens[i] = token_ids[j]
        kept_depths[i] = depths[j]
        kept_match[i] = match_len[j]
        retrieved[i] = rank[j] < 0
        kept_buckets[i] = buckets[j]
        expected += np.exp(log_probs[j])
    return (keep, tokens, new_parents, kept_depths, kept_match, retrieved, kept_buckets,
            expected, is_chain)


def schedule_budget(trees: Sequence[CandidateTree], k_max: int,
                    per_request_cap: Optional[int] = None, shared_budget: bool = True,
                    core_width: Optional[int] = 1) -> BudgetResult:
    """Choose which candidate nodes of each request are verified this step.

    ``k_max``: draft nodes for the whole batch (roots excluded);
    ``per_request_cap``: most nodes per request (None: no cap);
    ``core_width``: best truncation-depth paths a truncated
    request keeps in priority 1 (None: all its nodes up to that depth).
    """
    if k_max < 0:
        raise ValueError(f"k_max must be >= 0, got {k_max}")
    if per_request_cap is not None and per_request_cap < 0:
        raise ValueError(f"per_request_cap must be >= 0 or None, got {per_request_cap}")
    if core_width is not None and core_width < 1:
        raise ValueError(f"core_width must be >= 1 or None, got {core_width}")
    for i, t in enumerate(trees):
        if not isinstance(t, CandidateTree):
            raise ValueError(f"trees[{i}] is a {type(t).__name__}, not a CandidateTree")
    cap = float("inf") if per_request_cap is None else per_request_cap
    if shared_budget or not trees:
        return _schedule_shared(trees, int(k_max), cap, core_width)
    # Fixed-K baseline: every request alone with its equal share.
    share = int(k_max) // len(trees)
    parts = [_schedule_shared([t], share, cap, core_width)
             for t in trees]
    return BudgetResult(tuple(p.selected[0] for p in parts),
                        np.concatenate([p.from_priority1 for p in parts]),
                        np.concatenate([p.from_priority2 for p in parts]))


def subtree(token_ids, parents, selected) -> tuple[np.ndarray, np.ndarray]:
    """Re-index an ancestor-closed node subset into a parent-first tree.

    ``selected`` holds distinct node indices (any order); the result keeps
    the original relative order, which is parent-first, and the input dtypes.
    (The planner's own selections go through :func:`reindex_selection`.)
    """
    validate_tree(token_ids, parents)
    tokens = np.asarray(token_ids)
    par = np.asarray(parents)
    sel = np.asarray(selected, dtype=np.int64).ravel()
    n = par.size
    sel = np.sort(sel)
    if sel.size and (sel[0] < 0 or sel[-1] >= n):
        raise ValueError(f"selected indices must be in [0, {n})")
    if sel.size > 1 and (np.diff(sel) == 0).any():
        raise ValueError("selected indices must be distinct")
    new_index = np.full(n, -2, dtype=np.int64)
    new_index[sel] = np.arange(sel.size)
    old_par = par[sel].astype(np.int64)
    new_par = np.where(old_par == ROOT, ROOT, new_index[np.maximum(old_par, 0)])
    if (new_par == -2).any():
        j = int(sel[np.flatnonzero(new_par == -2)[0]])
        raise ValueError(f"selection is not ancestor-closed: node {j} is selected "
                         f"but its parent {int(par[j])} is not")
    return tokens[sel], new_par.astype(par.dtype if par.size else np.int64)
