# SPDX-License-Identifier: Apache-2.0
"""Plain numpy references for ECHO's compiled scoring, gate, observation counting,
budget selection and shape.

Production runs the compiled passes in vllm_echo.algos.echo.forest_scoring,
vllm_echo.algos.echo.budget and vllm_echo.algos.echo.pricing; these are the same
equations written one step at a time (ECHO Eq. 5-7), with input checks, used as oracles
by the unit tests.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from vllm_echo.algos.echo.budget import BudgetResult, CandidateTree
from vllm_echo.algos.echo.calibration import GateConfig
from vllm_echo.algos.echo.gate import MODES, _checks
from vllm_echo.algos.echo.scores import AcceptancePrior, _int_array
from vllm_echo.algos.tree import ROOT, validate_parents

ArrayLike = Union[np.ndarray, Sequence[int], Sequence[float]]

# log-probs a little above 0 are float noise from a log-softmax; larger ones
# are a caller bug (S would grow along a path and exp(S) exceed 1).
_LOGP_TOLERANCE = 1e-6


def exclusive_sibling_logp(parents: ArrayLike, node_logp: ArrayLike) -> np.ndarray:
    """Node log-probs once siblings are counted as exclusive.

    ``node_logp`` holds each node's acceptance log-probability given its parent was
    accepted, estimated one node at a time (by depth and match length). Siblings
    carry distinct tokens, so at most one of them is accepted: taken in descending
    probability, sibling j is worth p_j times the chance that every better sibling
    was rejected, prod (1 - p_k). Without this, three retrieved continuations of one
    m-gram at p = 0.7 each promise 2.1 tokens where at most one can come, and the
    budget buys side branches (and tree verification) that do not pay.
    """
    par = validate_parents(parents)
    logp = np.asarray(node_logp, dtype=np.float64)
    if logp.shape != par.shape:
        raise ValueError(f"node_logp has shape {logp.shape}, expected {par.shape}")
    n = par.size
    if n < 2:
        return logp.copy()
    p = np.exp(np.minimum(logp, 0.0))
    order = np.lexsort((-p, par))  # grouped by parent, best first within a group
    log_miss = np.log1p(-np.minimum(p[order], 1.0 - 1e-12))
    before = np.cumsum(log_miss) - log_miss  # sum over everything earlier in ``order``
    group = par[order]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, n]))
    out = logp.copy()
    out[order] += before - before[first]  # only the better siblings' misses
    return out


def path_scores(parents: ArrayLike, node_logp: ArrayLike) -> np.ndarray:
    """Path score S (Eq. 5): ``S_j = S_parent(j) + logp_j``, the root scoring 0.

    ``node_logp`` must be log-probabilities (<= 0, no NaN), so S never grows
    along a path; tiny positive float noise is clipped to 0.
    """
    par = validate_parents(parents)
    logp = np.asarray(node_logp, dtype=np.float64)
    if logp.shape != par.shape:
        raise ValueError(f"node_logp has shape {logp.shape}, expected {par.shape}")
    if np.isnan(logp).any():
        raise ValueError("node_logp contains NaN")
    if (logp > _LOGP_TOLERANCE).any():
        raise ValueError(f"node_logp must be log-probabilities (<= 0), "
                         f"got max {float(logp.max())}")
    logp = np.minimum(logp, 0.0)
    scores = np.empty(par.size, dtype=np.float64)
    # Parent-first order: scores[p] is final before any child reads it.
    for j, p in enumerate(par.tolist()):
        scores[j] = logp[j] if p == ROOT else scores[p] + logp[j]
    return scores


def depth_confidence(scores: ArrayLike, depths: ArrayLike, max_depth: int) -> np.ndarray:
    """Confidence per depth (Eq. 6): ``c[d-1] = exp(max S over depth-d nodes)``.

    Depths with no node get 0 (nothing there to be confident about); nodes
    deeper than ``max_depth`` are ignored.
    """
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    s = np.asarray(scores, dtype=np.float64)
    d = _int_array(depths, "depths")
    if s.shape != d.shape or s.ndim != 1:
        raise ValueError(f"scores and depths must be 1-D of equal length, "
                         f"got {s.shape} and {d.shape}")
    if (d < 1).any():
        raise ValueError(f"depths must be >= 1, got {int(d.min())}")
    best = np.full(max_depth, -np.inf)
    keep = d <= max_depth
    np.maximum.at(best, d[keep] - 1, s[keep])
    return np.exp(best)  # exp(-inf) == 0 for empty depths


def observe_tree(prior: AcceptancePrior, parents: ArrayLike, depths: ArrayLike, match_lens: ArrayLike,
                 is_retrieved_mask: ArrayLike, accepted_path: Sequence[int],
                 token_ids: Optional[ArrayLike] = None,
                 next_token: Optional[int] = None) -> int:
    """Derive the observations of one verified tree and record them.

    An observation is a retrieved node whose parent was accepted (the root
    always is): only then did the node have a chance. Its label is whether
    it was accepted. ``accepted_path`` lists the accepted node indices root
    side first (as :func:`vllm_echo.algos.verify.verify_greedy` returns).

    The verifier keeps one path, but an unmerged forest can hold the same
    token twice under one accepted parent (e.g. the retrieved chain's head
    equals the top next-next candidate); the copy that lost the tie was
    correct all the same. Pass ``token_ids`` and ``next_token`` (the token
    the target emitted after the path) to label every such node by what
    the target actually produced after its parent. Without them the label
    is membership in ``accepted_path``.

    Returns the number of observations recorded.
    """
    par = validate_parents(parents)
    n = par.size
    dep = _int_array(depths, "depths")
    retrieved = np.asarray(is_retrieved_mask, dtype=bool)
    mlen = _int_array(match_lens, "match_lens")
    for name, arr in (("depths", dep), ("match_lens", mlen),
                      ("is_retrieved_mask", retrieved)):
        if arr.shape != (n, ):
            raise ValueError(f"{name} has shape {arr.shape}, expected ({n},)")
    path = [int(j) for j in accepted_path]
    expected_parent = ROOT
    for j in path:
        if not 0 <= j < n or par[j] != expected_parent:
            raise ValueError(f"accepted_path {path} is not a root-first path "
                             f"of the tree")
        expected_parent = j
    if (token_ids is None) != (next_token is None):
        raise ValueError("pass both token_ids and next_token, or neither")

    # Row-indexed (row = node + 1, row 0 = root) so the root needs no case.
    parent_accepted = np.zeros(n + 1, dtype=bool)
    parent_accepted[0] = True
    parent_accepted[np.asarray(path, dtype=np.int64) + 1] = True
    chance = retrieved & parent_accepted[par + 1]
    if token_ids is None:
        accepted = np.zeros(n, dtype=bool)
        accepted[path] = True
    else:
        tokens = _int_array(token_ids, "token_ids")
        if tokens.shape != (n, ):
            raise ValueError(f"token_ids has shape {tokens.shape}, expected ({n},)")
        # What the target produced after each accepted row: the next path
        # token, or next_token after the last accepted row.
        emitted = np.full(n + 1, -1, dtype=np.int64)
        rows = [0] + [j + 1 for j in path]
        for row, nxt in zip(rows, [tokens[j] for j in path] + [int(next_token)]):
            emitted[row] = nxt
        accepted = tokens == emitted[par + 1]
    if chance.any():
        prior.update(dep[chance], mlen[chance], accepted[chance])
    return int(chance.sum())


@dataclass(frozen=True)
class GateDecision:
    """``trunc_depth``: deepest depth kept (the tree's max depth if not
    truncated, 0 for an empty tree); ``truncated``: a gate fired."""

    trunc_depth: int
    truncated: bool


def truncation_depth(scores, depths, gate: GateConfig, mode: str = "sparse",
                     fixed_tau: float = 0.2,
                     dense_tau: Optional[float] = None) -> GateDecision:
    """Gate decision for one tree from its path scores S and node depths."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    for name, tau in (("fixed_tau", fixed_tau), ("dense_tau", dense_tau)):
        if tau is not None and not 0.0 <= tau <= 1.0:
            raise ValueError(f"{name} must be a probability in [0, 1], got {tau}")
    d = np.asarray(depths)
    if d.size == 0:
        return GateDecision(0, False)
    max_depth = int(d.max())
    conf = depth_confidence(scores, d, max_depth)
    for depth, tau in _checks(gate, mode, max_depth, fixed_tau, dense_tau):
        if depth > max_depth:
            # Nothing that deep: the tree ends before the gate, uncut.
            break
        if conf[depth - 1] <= tau:
            return GateDecision(int(depth), True)
    return GateDecision(max_depth, False)


def truncation_depths(scores_per_tree: Sequence, depths_per_tree: Sequence,
                      gate: GateConfig, mode: str = "sparse", fixed_tau: float = 0.2,
                      dense_tau: Optional[float] = None) -> tuple[np.ndarray, np.ndarray]:
    """Batch version: ``(trunc_depths int array, truncated bool array)``, one per tree."""
    if len(scores_per_tree) != len(depths_per_tree):
        raise ValueError(f"{len(scores_per_tree)} score arrays but "
                         f"{len(depths_per_tree)} depth arrays")
    decisions = [truncation_depth(s, d, gate, mode, fixed_tau, dense_tau)
                 for s, d in zip(scores_per_tree, depths_per_tree)]
    return (np.array([x.trunc_depth for x in decisions], dtype=np.int64),
            np.array([x.truncated for x in decisions], dtype=bool))


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


def schedule_shared(trees: Sequence[CandidateTree], k_max: int, cap: float,
                    core_width: Optional[int]) -> BudgetResult:
    """The shared budget's two phases, one heap of frontier nodes per phase (what
    vllm_echo.algos.echo.budget._select compiles)."""
    requests = [_Request(t, core_width) for t in trees]
    everyone = range(len(requests))
    budget = k_max
    from_p1 = _fill(requests, everyone, "priority1", budget, cap)
    budget -= int(from_p1.sum())
    from_p2 = _fill(requests, everyone, "priority2", budget, cap)
    selected = tuple(np.flatnonzero(r.selected_rows[1:]) for r in requests)
    return BudgetResult(selected, from_p1, from_p2)


def _step_time(prices, num_tokens: int, num_trees: int, drafted: bool) -> float:
    a, b, knee, tree, draft = prices
    return a + b * max(num_tokens - knee, 0.0) + tree * num_trees + draft * drafted


def _is_root_path(parents: np.ndarray, selected: np.ndarray) -> bool:
    return all(parents[node] == (selected[i - 1] if i else ROOT)
               for i, node in enumerate(selected))


def _best_root_path(tree: CandidateTree, max_len: int, rest_tokens: int, rest_trees: int,
                    step_requests: int, rate: float, must_draft: bool, prices
                    ) -> tuple[int, float]:
    """No draft, or the root path to a node within ``max_len`` (past the gate's cut only
    where the step is no slower than without a draft), by expected tokens net of
    ``rate`` times the step's time."""
    plain = _step_time(prices, rest_tokens, rest_trees, rest_tokens > step_requests)
    options = [] if must_draft else [(-1, -rate * plain)]
    for j in range(tree.size):
        depth = int(tree.depths[j])
        time = _step_time(prices, rest_tokens + depth, rest_trees, True)
        if depth > max_len or (depth > tree.trunc_depth and time > plain):
            continue
        path, node = [], j
        while node >= 0:
            path.append(node)
            node = int(tree.parents[node])
        options.append((j, sum(np.exp(tree.scores[path[::-1]]).tolist()) - rate * time))
    if not options:
        return -1, -rate * plain
    best = max(value for _, value in options)
    return next(option for option in options if option[1] == best)


def shape_selection(trees: Sequence[CandidateTree], selected: Sequence[np.ndarray],
                    k_max: int, cap: int, shared: bool, trees_priced: bool,
                    step_requests: int, prices) -> list[np.ndarray]:
    """Stage 4, request by request: keep the selection, or the best root path within
    the budget left (each request's equal share without a shared budget), whichever
    adds more expected tokens net of its price at the step's expected rate."""
    expected = [sum(np.exp(t.scores[s]).tolist()) for t, s in zip(trees, selected)]
    branched = [not _is_root_path(t.parents, s) for t, s in zip(trees, selected)]
    num_tokens = step_requests + sum(len(s) for s in selected)
    num_trees = sum(branched)
    rate = (step_requests + sum(expected)) / _step_time(prices, num_tokens, num_trees, True)
    spare = k_max - (num_tokens - step_requests)
    share = k_max // max(len(trees), 1)
    out = []
    for i, (tree, keep) in enumerate(zip(trees, selected)):
        limit = min(len(keep) + spare if shared else share, cap)
        rest_tokens, rest_trees = num_tokens - len(keep), num_trees - int(branched[i])
        end, value = _best_root_path(tree, limit, rest_tokens, rest_trees, step_requests,
                                     rate, not shared, prices)
        if branched[i] and trees_priced and expected[i] - rate * _step_time(
                prices, rest_tokens + len(keep), rest_trees + 1, True) >= value:
            out.append(keep)
            continue
        path = []
        while end >= 0:
            path.append(end)
            end = int(tree.parents[end])
        out.append(np.array(path[::-1], dtype=np.int64))
        spare += len(keep) - len(path)
        num_tokens, num_trees = rest_tokens + len(path), rest_trees
    return out
