# SPDX-License-Identifier: Apache-2.0
"""ECHO's one decision rule, for one batch step.

Every candidate node of every request is pooled with its P(accepted)
(:class:`~vllm_echo.algos.echo.acceptance.AcceptanceModel`). Nodes are taken in order
of falling probability (a node only after its parent, at most ``max_drafts`` per
request), and the step verifies the prefix of that order with the most expected tokens
per second,

    (B + sum of p over the k nodes taken) / T(B + k),

B the requests in the step and T the step-cost curve
(:class:`~vllm_echo.algos.echo.cost.StepCost`; with k > 0 it includes what a step
with drafts costs beyond its tokens). That is the budget and the gate in
one: where verification is nearly free it admits most candidates, where every verified
token costs compute only the nodes likely enough to pay for themselves, down to none.

In chain mode each request offers only its best root path (the one with the largest
sum of p within the cap), so a selection is a prefix of it. In tree mode a request
whose taken nodes branch is verified as a tree. A fixed ``k_max`` replaces the rule by
the ``k_max`` best nodes. The only exploration device is a probe: after
``EchoTuning.probe_after`` steps in a row without a draft, a step verifies its
``probe_nodes`` best nodes anyway, so that low estimates can recover.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from vllm_echo.algos.echo.acceptance import KINDS, AcceptanceModel, Candidates, labels
from vllm_echo.algos.echo.cost import StepCost
from vllm_echo.algos.echo.tuning import EchoTuning
from vllm_echo.algos.tree import is_chain

_NO_DRAFT = (np.empty(0, np.int32), np.empty(0, np.int32))  # (token_ids, parents)


@dataclass
class Plan:
    """One request's verified draft and what its verdict needs to be learned from."""

    token_ids: np.ndarray  # the draft (int32)
    parents: np.ndarray  # its tree, re-indexed (int32)
    is_chain: bool  # one root path: vLLM verifies it natively
    expected: float  # sum of the drafted nodes' P(accepted)
    keep: np.ndarray  # each drafted node's index in the candidate forest
    cand_parents: np.ndarray  # the candidate forest (local parents)
    cand_tokens: np.ndarray
    cand_buckets: np.ndarray


@njit(cache=True)
def _best_chains(parents, probs, offsets, cap):
    """Mask of each forest's best root path: the one of at most ``cap`` nodes with the
    largest sum of probabilities (``parents`` global, parent-first)."""
    mask = np.zeros(parents.size, np.bool_)
    sums = np.empty(parents.size)
    depth = np.empty(parents.size, np.int64)
    for r in range(offsets.size - 1):
        best, best_sum = -1, 0.0
        for j in range(offsets[r], offsets[r + 1]):
            p = parents[j]
            sums[j] = probs[j] + (sums[p] if p >= 0 else 0.0)
            depth[j] = depth[p] + 1 if p >= 0 else 1
            if depth[j] <= cap and sums[j] > best_sum:
                best, best_sum = j, sums[j]
        while best >= 0:
            mask[best] = True
            best = parents[best]
    return mask


@njit(cache=True)
def _take_order(order, parents, request, cap):
    """Nodes of ``order`` in that order, skipping one whose parent was not taken or whose
    request already has ``cap`` nodes."""
    taken = np.zeros(parents.size, np.bool_)
    counts = np.zeros(request.max() + 1, np.int64)
    out = np.empty(order.size, np.int64)
    k = 0
    for j in order:
        p, r = parents[j], request[j]
        if counts[r] < cap and (p < 0 or taken[p]):
            taken[j] = True
            counts[r] += 1
            out[k] = j
            k += 1
    return out[:k]


class EchoPlanner:
    """Per-worker ECHO state: the acceptance model, the step-cost curve, the rule."""

    def __init__(self, tuning: EchoTuning | None = None, trees: bool = False,
                 k_max: int | None = None):
        self.tuning = tuning or EchoTuning()
        self.trees = trees
        self.k_max = k_max
        self.cost = StepCost(self.tuning)
        self.acceptance = AcceptanceModel(self.tuning)
        self._empty_steps = 0  # steps in a row without a draft
        self._probing = False
        self.last_budget = 0
        self.stats = dict.fromkeys(("steps", "drafted_steps", "probes", "drafted", "accepted",
                                    "verdicts", "tree_requests"), 0)
        self.stats["expected"] = 0.0
        self.accepted_by_kind = np.zeros(len(KINDS), np.int64)  # accepted drafts by family

    # -- the step ------------------------------------------------------------------------

    def drafting_mode(self, num_requests: int, max_drafts: int) -> str:
        """Asked once per step before any forest is built: "none" (no node can pay: build
        nothing), "retrieval" (no next-next head can pay: skip the target's top-k) or
        "all". A probe step is "all". ``max_drafts``: the most drafts a request may
        verify (vLLM's num_speculative_tokens)."""
        self._probing = False
        if self.k_max is not None:
            return "all"
        if not self.cost.ready or num_requests <= 0:
            return "none"  # nothing timed yet: one plain step prices the next
        if self._empty_steps >= self.tuning.probe_after:
            self._probing = True
            return "all"
        need = self.break_even(num_requests, max_drafts)
        best_retrieved, best_head = self.acceptance.best_first_rates()
        if max(best_retrieved, best_head) < need:
            self._empty_steps += 1
            self.stats["steps"] += 1
            return "none"
        return "all" if best_head >= need else "retrieval"

    def break_even(self, num_requests: int, max_drafts: int) -> float:
        """The least P(accepted) with which some number k of nodes pays in a step of
        ``num_requests``: min over the k the step can verify (up to ``max_drafts`` per
        request) of B (T(B + k) / T(B) - 1) / k. A node at depth 1 has its rate as
        probability and every node is at most its depth-1 ancestor's, so below it the
        rule takes nothing."""
        b = num_requests
        k = np.arange(1, max(1, max_drafts) * b + 1)
        times = self.cost.step_times(b, k.size)
        return float(np.min(b * (times[1:] / times[0] - 1.0) / k))

    def plan(self, candidates: list[Candidates | None], max_drafts: int, num_requests: int
             ) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[Plan | None]]:
        """Draft trees ``(token_ids, parents)`` per request (empty where None) and their
        plans. ``num_requests``: requests the step verifies, with or without candidates
        (each is a verified token)."""
        self.stats["steps"] += 1
        live = [i for i, c in enumerate(candidates) if c is not None and len(c.token_ids)]
        drafts, plans = [_NO_DRAFT] * len(candidates), [None] * len(candidates)
        taken = np.empty(0, np.int64)
        if live and max_drafts > 0 and (self.cost.ready or self.k_max is not None):
            pool = self.acceptance.pool([candidates[i] for i in live])
            taken = self._choose(pool, [candidates[i].chain_only for i in live], max_drafts,
                                 max(num_requests, len(live)))
        self.last_budget = taken.size
        self._probing = False  # a probe is one step
        self._empty_steps = 0 if taken.size else self._empty_steps + 1
        if not taken.size:
            return drafts, plans
        self.stats["drafted_steps"] += 1
        selected = np.zeros(pool.parents.size, np.bool_)
        selected[taken] = True
        for r, i in enumerate(live):
            lo, hi = pool.offsets[r], pool.offsets[r + 1]
            keep = np.flatnonzero(selected[lo:hi])
            if keep.size == 0:
                continue
            cand = candidates[i]
            index = np.full(hi - lo, -1, np.int64)
            index[keep] = np.arange(keep.size)
            local = np.asarray(cand.parents, dtype=np.int64)
            parents = np.where(local[keep] >= 0, index[np.maximum(local[keep], 0)], -1)
            parents = parents.astype(np.int32)
            chain = is_chain(parents)
            tokens = np.asarray(cand.token_ids)[keep].astype(np.int32)
            plans[i] = Plan(tokens, parents, chain, float(pool.probs[lo:hi][keep].sum()),
                            keep, local, pool.tokens[lo:hi], pool.buckets[lo:hi])
            drafts[i] = (tokens, parents)
            self.stats["drafted"] += keep.size
            self.stats["tree_requests"] += not chain
        return drafts, plans

    def _choose(self, pool, chain_only: list[bool], cap: int, num_requests: int) -> np.ndarray:
        """The nodes (global indices) the step verifies, in the order they were taken."""
        request = np.repeat(np.arange(len(chain_only)), np.diff(pool.offsets))
        eligible = np.ones(pool.probs.size, np.bool_)
        chains = np.asarray(chain_only) | (not self.trees)
        if chains.any():
            best = _best_chains(pool.parents, pool.probs, pool.offsets, cap)
            eligible = best | ~chains[request]
        nodes = np.flatnonzero(eligible)
        # Falling probability; ties in node order, so a parent comes before its children.
        order = nodes[np.argsort(-pool.probs[nodes], kind="stable")]
        seq = _take_order(order, pool.parents, request, cap)
        if self.k_max is not None:
            return seq[:self.k_max]
        gains = num_requests + np.concatenate(([0.0], np.cumsum(pool.probs[seq])))
        rates = gains / self.cost.step_times(num_requests, seq.size)
        k = int(np.argmax(rates))  # the first best: the smallest such prefix
        if k == 0 and self._probing:
            k = min(self.tuning.probe_nodes, seq.size)
            self.stats["probes"] += 1
        return seq[:k]

    # -- feedback --------------------------------------------------------------------------

    def observe(self, verdicts: list[tuple[Plan, list[int], int]]) -> None:
        """The previous step's verdicts: ``(plan, accepted_path, next_token)`` each, the
        path as indices into the plan's draft, root side first, and the token the target
        emitted after it."""
        if not verdicts:
            return
        buckets, trials, successes = [], [], []
        for plan, path, next_token in verdicts:
            accepted = plan.keep[np.asarray(path, dtype=np.int64)]
            trial, success = labels(plan.cand_parents, plan.cand_tokens, accepted,
                                    int(next_token), plan.keep)
            np.add.at(self.accepted_by_kind,
                      self.acceptance.kinds(plan.cand_buckets[accepted]), 1)
            buckets.append(plan.cand_buckets)
            trials.append(trial)
            successes.append(success)
            self.stats["accepted"] += len(path)
            self.stats["expected"] += plan.expected
            self.stats["verdicts"] += 1
        self.acceptance.observe(np.concatenate(buckets), np.concatenate(trials),
                                np.concatenate(successes))

    def snapshot(self) -> dict:
        """JSON-able state for logs, metrics and tests."""
        stats = dict(self.stats)
        stats["expected"] = round(stats["expected"], 2)
        stats["draft_utilization"] = (stats["accepted"] / stats["drafted"]
                                      if stats["drafted"] else 0.0)
        stats["accepted_by_kind"] = dict(zip(KINDS, self.accepted_by_kind.tolist()))
        return {**stats, "last_budget": self.last_budget, "trees": self.trees,
                "k_max": self.k_max, "rates": self.acceptance.table(),
                "cost_curve_ms": {n: round(1e3 * t, 3) for n, t in self.cost.points().items()},
                "cost_overhead_ms": round(1e3 * self.cost.overhead, 3),
                "cost_steps": self.cost.steps}


def warm_up() -> None:
    """Compile the kernels a step runs (numba caches them on disk), with the dtypes the
    proposer passes, so that no decode step pays for it."""
    for trees in (False, True):
        planner = EchoPlanner(trees=trees)
        planner.cost.set_curve([1, 64], [0.01, 0.01])
        forest = [np.array(v, np.int32) for v in ((5, 6, 7), (-1, 0, -1), (2, 2, 0), (-1, -1, 1))]
        _, plans = planner.plan([Candidates(*forest, head_logp=np.array([-0.5, -1.0],
                                                                         np.float32))], 4, 1)
        planner.observe([(plans[0], [0], 6)])
