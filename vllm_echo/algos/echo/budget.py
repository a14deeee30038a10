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

from vllm_echo.algos.tree import ROOT, validate_tree


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
        """Construct without the checks, for arrays valid by construction (the
        planner's, from the forest kernel): on a small tree the checks cost more
        than scheduling it, every step, for every request."""
        tree = object.__new__(cls)
        for name, value in (("token_ids", token_ids),
                            ("parents", parents.astype(np.int64, copy=False)),
                            ("scores", scores.astype(np.float64, copy=False)),
                            ("depths", depths.astype(np.int64, copy=False)),
                            ("trunc_depth", int(trunc_depth)), ("confident", bool(confident))):
            object.__setattr__(tree, name, value)
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


class _Request:
    """Mutable selection state of one request during scheduling."""

    def __init__(self, tree: CandidateTree, core_width: Optional[int]):
        self.tree = tree
        n = tree.size
        par = tree.parents
        # Children in CSR form: node j's children are child_order[lo:hi] with
        # lo, hi = child_start[j + 1], child_start[j + 2] (row 0 = the root).
        self.child_order = np.argsort(par, kind="stable")
        counts = np.bincount(par + 1, minlength=n + 1)
        self.child_start = np.concatenate([[0], np.cumsum(counts)])
        self.selected_rows = np.zeros(n + 1, dtype=bool)
        self.selected_rows[0] = True  # the root is always verified
        self.count = 0
        within = tree.depths <= tree.trunc_depth
        if tree.confident or core_width is None:
            depth_pool = within
        else:
            depth_pool = self._core(within, core_width)
        # Which nodes each phase may hand out.
        self.pools = {
            "priority1": depth_pool,
            "priority2": within & ~depth_pool,
        }
        self.scores = tree.scores.tolist()
        self.depths = tree.depths.tolist()

    def _core(self, within: np.ndarray, width: int) -> np.ndarray:
        """Ancestor closure of the ``width`` best nodes at the truncation depth."""
        tree = self.tree
        core = np.zeros(tree.size, dtype=bool)
        if not within.any():
            return core
        level = min(tree.trunc_depth, int(tree.depths[within].max()))
        at_level = np.flatnonzero(tree.depths == level)
        # Best S first, lower index on ties (stable sort).
        best = at_level[np.argsort(-tree.scores[at_level], kind="stable")[:width]]
        for j in best.tolist():
            while j != ROOT and not core[j]:
                core[j] = True
                j = int(tree.parents[j])
        return core

    def children(self, j: int) -> list[int]:
        return self.child_order[self.child_start[j + 1]:self.child_start[j + 2]].tolist()

    def frontier(self, pool: np.ndarray) -> list[int]:
        """Unselected pool nodes whose parent is selected (or is the root)."""
        rows = self.selected_rows
        ok = pool & ~rows[1:] & rows[self.tree.parents + 1]
        return np.flatnonzero(ok).tolist()

    def select(self, j: int) -> None:
        self.selected_rows[j + 1] = True
        self.count += 1


def _fill(requests: list[_Request], order: Sequence[int], phase: str, budget: int,
          cap: float) -> np.ndarray:
    """Select up to ``budget`` nodes of the phase's pools by descending S, frontier first.

    Returns how many nodes each request got. Heap keys are (-S, depth,
    request, node): unique, so the outcome is deterministic.
    """
    got = np.zeros(len(requests), dtype=np.int64)
    heap = []
    for i in order:
        req = requests[i]
        if req.count >= cap:
            continue
        for j in req.frontier(req.pools[phase]):
            heap.append((-req.scores[j], req.depths[j], i, j))
    heapq.heapify(heap)
    used = 0
    while heap and used < budget:
        _, _, i, j = heapq.heappop(heap)
        req = requests[i]
        if req.count >= cap:
            continue
        req.select(j)
        got[i] += 1
        used += 1
        pool = req.pools[phase]
        for c in req.children(j):
            if pool[c]:
                heapq.heappush(heap, (-req.scores[c], req.depths[c], i, c))
    return got


def _schedule_shared(trees: Sequence[CandidateTree], k_max: int, cap: float,
                     core_width: Optional[int]) -> BudgetResult:
    requests = [_Request(t, core_width) for t in trees]
    everyone = range(len(requests))
    budget = k_max
    from_p1 = _fill(requests, everyone, "priority1", budget, cap)
    budget -= int(from_p1.sum())
    from_p2 = _fill(requests, everyone, "priority2", budget, cap)
    selected = tuple(np.flatnonzero(r.selected_rows[1:]) for r in requests)
    return BudgetResult(selected, from_p1, from_p2)


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


def subtree(token_ids, parents, selected, check: bool = True
            ) -> tuple[np.ndarray, np.ndarray]:
    """Re-index an ancestor-closed node subset into a parent-first tree.

    ``selected`` holds distinct node indices (any order); the result keeps
    the original relative order, which is parent-first, and the input dtypes.
    ``check=False`` skips validating the tree and the indices (for a selection
    that schedule_budget made from a CandidateTree.trusted tree).
    """
    if check:
        validate_tree(token_ids, parents)
    tokens = np.asarray(token_ids)
    par = np.asarray(parents)
    sel = np.asarray(selected, dtype=np.int64).ravel()
    n = par.size
    sel = np.sort(sel)
    if check:
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
