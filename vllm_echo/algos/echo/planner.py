# SPDX-License-Identifier: Apache-2.0
"""ECHO over LogitSpec forests for one batch step: score, gate, budget, shape.

Engine-agnostic: the vLLM glue hands in each request's candidate forest (with how
every node was drafted) and gets back the draft tree to verify; after the step it
reports what was accepted, which feeds the acceptance priors, the gate calibration,
the realised share of expected tokens and the step statistics.

The stages of :meth:`EchoPlanner.plan`:

1. **Score** (:meth:`EchoPlanner._score`). Node scores are acceptance probabilities
   learned online, so that the budget can weigh them against measured cost: a
   retrieved token gets the acceptance rate of its (depth, m-gram match length)
   bucket; a next-next head t gets the rate of its bucket of p(t) under the softmax of
   the target's last logits (LogitSpec's premise: t is likely next-next when it was
   likely next). S = sum of node log-probs along the path, c_d = exp(max S at depth d).
2. **Gate**, in the same compiled pass: the tree is cut at the first sweet spot d with
   c_d <= tau_d (ECHO Eq. 7; sweet spots and taus calibrated from uncensored labels,
   :meth:`Plan.calibration_label`).
3. **Budget** (:meth:`EchoPlanner._budget_bounds`, then ``select_nodes``). With ``k_max``
   unset, the step's budget is the k that maximises expected tokens per second
   (B + sum of the k best p) / T(B + k), T from the measured time of decode steps
   (:class:`~vllm_echo.algos.echo.cost.CostModel`). Where verification is nearly free
   that admits most candidates; where every verified token costs compute it admits
   only nodes likely enough to pay for themselves, down to none.
4. **Shape** (``pricing._shape_requests``). Verifying a request as a tree rather than a
   chain has its own measured cost; each request keeps its selection only if it pays
   better than its best root path of any length within the budget, which vLLM
   verifies natively.

When no draft can pay at all, :meth:`EchoPlanner.step_explore` says so before any
forest is built, and probes now and then so that the rates can recover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_echo.algos.echo.budget import CandidateTree, concatenate, select_plan_nodes
from vllm_echo.algos.echo.calibration import Calibrator, GateConfig
from vllm_echo.algos.echo.cost import CostModel
from vllm_echo.algos.echo.forest_scoring import has_child_token, score_forest
from vllm_echo.algos.echo.gate import gate_checks
from vllm_echo.algos.echo.pricing import break_even_probability, choose_nodes
from vllm_echo.algos.echo.scores import (AcceptancePrior, AcceptedOverExpected,
                                         observe_retrieved_and_heads)
from vllm_echo.algos.echo.stats import EchoStepStats

MAX_DEPTH = 32
# Gate used until calibration succeeds. The reference literals (0.2, 0.2, 0.3; see
# calibration.DEFAULT_GATE) are for EAGLE draft-model probabilities; our node scores
# are acceptance rates of retrieved / next-next tokens, lower on the whole (a
# calibration at batch 24 on the embedded model put depth 1 at tau = 0.071), and the
# reference values truncated 63% of trees at depth 1 at batch 1.
FOREST_DEFAULT_GATE = GateConfig(sweet_spots=(1, 3, 6), taus=(0.05, 0.05, 0.05),
                                 source="default")
_LOGP_FLOOR = -30.0
_MAX_DRAFTS_PER_REQUEST = 64  # how far nothing_can_pay looks for a paying draft size
_WARMUP_FACTORS = (1, 2, 4, 8)  # warm-up budgets, in eighths of a node per request
# Depth-1 rates are scored this many posterior standard deviations above their mean
# (AcceptancePrior's optimism): without it, a bucket that a few early drafts pushed
# below break-even was never verified again; at batch 1 in bf16 that stopped all
# drafting for good in 2 of 3 runs. (Raising every depth slowed batch 8 in fp32 from
# 148 to 126-134 tok/s: long chains of rarely seen depths looked better than they were.)
_OPTIMISM = 1.0
# Buckets of a head's last-logit probability (bucket b+1 holds p >= edge b).
_HEAD_P_EDGES = np.array([0.3, 0.1, 0.03, 0.01, 0.003])
# A step that follows PROBE_EVERY - 1 steps without a draft plans with explore =
# PROBE_NODES: it verifies that many nodes even if none looks worth it. Acceptance
# rates and the price of drafting are learned from drafted steps only, so without
# drafts they could never recover.
PROBE_EVERY = 16
PROBE_NODES = 4
# While the cost model cannot price drafting itself (too few timed steps without any
# draft: at batch 1 ECHO drafts in nearly every step), every PLAIN_EVERY-th step drafts
# nothing, so that it can. Priced as free, a draft of a few tokens would always look
# worth verifying, where on the CPU any draft makes a step dearer.
PLAIN_EVERY = 8
# Retrieved-token rates are kept per depth up to this one (deeper depths share it).
_PRIOR_DEPTHS = 16
# A next-next head's rate before any verdict: LogitSpec's heads are the target's own
# runner-up tokens, accepted far less often than retrieved continuations.
_HEAD_PRIOR_MEAN = 0.1
# Trees per class (reached depth d / did not) a depth needs to be calibrated.
_MIN_CALIBRATION_SAMPLES = 10
_NO_DRAFT = (np.empty(0, np.int32), np.empty(0, np.int32))  # (token_ids, parents)
# Prices passed while the cost model has no fit (warm-up: a fixed budget, no shape).
_UNPRICED = (1.0, 0.0, 0.0, 0.0, 0.0)


def head_bucket(logp: np.ndarray) -> np.ndarray:
    """1-based bucket of each head's last-logit probability (1 = most likely)."""
    return 1 + np.searchsorted(-_HEAD_P_EDGES, -np.exp(logp), side="right")


@dataclass
class Candidates:
    """One request's candidate forest (see vllm_echo.algos.forest.ForestNodes)."""

    token_ids: np.ndarray
    parents: np.ndarray
    match_len: np.ndarray
    rank: np.ndarray
    head_logp: np.ndarray  # log p of the top-k next-next candidates, by rank


@dataclass
class Plan:
    """What was proposed for one request, kept until its verdict arrives."""

    token_ids: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    match_len: np.ndarray
    retrieved: np.ndarray
    head_bucket: np.ndarray  # for next-next heads (1-based), 1 elsewhere
    confidence: np.ndarray  # c_d over the whole candidate forest (calibration input)
    truncated_at: int
    expected: float = 0.0  # accepted tokens the raw node scores expect
    # The candidate forest the plan was cut from and each kept node's index in it:
    # they tell how deep the whole forest would have been accepted.
    candidates: Candidates | None = None
    keep: np.ndarray | None = None
    is_chain: bool = True  # the nodes form one root path (vLLM verifies it natively)

    def calibration_label(self, path: list[int], next_token: int) -> tuple[int, int]:
        """``(reached, known)`` for the calibrator: the depth the accepted ``path`` reached
        in the candidate forest, and the deepest depth at which that label holds for
        the whole forest. The verified plan may have been cut by the gate or the budget
        just where the target went on: the target's token after the accepted path
        (``next_token``) is then a candidate child that was not verified. The whole
        forest would have accepted that child, and how far past it is unknown;
        otherwise it would have stopped where the plan did."""
        reached = len(path)
        if self.keep is None:
            return reached, MAX_DEPTH
        end = int(self.keep[path[reached - 1]]) if reached else -1
        went_on = has_child_token(self.candidates.parents, self.candidates.token_ids, end,
                                  int(next_token))
        return (reached + 1, reached + 1) if went_on else (reached, MAX_DEPTH)


@dataclass
class EchoPlanner:
    """Per-worker ECHO state. ``settings`` is a vllm_echo.config.EchoSettings."""

    settings: Any
    stats: EchoStepStats = field(default_factory=lambda: EchoStepStats(max_depth=MAX_DEPTH))
    cost: CostModel = field(default_factory=CostModel)

    def __post_init__(self) -> None:
        s = self.settings
        self.prior = AcceptancePrior(max_ngram=s.max_ngram, max_depth=_PRIOR_DEPTHS,
                                     optimism=_OPTIMISM)
        # Heads are always at depth 1; "match length" is their probability bucket.
        self.head_prior = AcceptancePrior(max_ngram=len(_HEAD_P_EDGES) + 1, max_depth=1,
                                          prior_mean=_HEAD_PRIOR_MEAN, optimism=_OPTIMISM)
        self.realized = AcceptedOverExpected()
        self.calibrator = Calibrator(max_depth=MAX_DEPTH, delta=s.delta,
                                     max_sweet_spots=s.max_sweet_spots,
                                     warmup_steps=s.calibration_steps,
                                     min_samples_per_class=_MIN_CALIBRATION_SAMPLES)
        self.gate = FOREST_DEFAULT_GATE
        self.calibration_report: str | None = None
        self.last_k_max = 0
        self._warmup_steps = 0
        self._unpriced_tree_steps = 0
        self._steps = 0  # steps seen by step_explore (PLAIN_EVERY counts them)
        self._steps_since_draft = 0  # since the last that drafted or probed
        self._break_even: tuple[Any, float] = (None, 0.0)  # ((cost fit, B), probability)
        self._checks: tuple[Any, Any] = (None, None)  # (gate, mode, ...), gate_checks

    # -- planning ----------------------------------------------------------------------

    def plan(self, batch: list[Candidates | None], per_request_cap: int, explore: int = 0,
             num_requests: int | None = None
             ) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[Plan | None]]:
        """Draft trees ``(token_ids, parents)`` per request (empty where None), in four
        stages: score and gate every forest (:meth:`_score`), then in one compiled call
        (:meth:`_choose`) choose the step's budget, share it, and shape each request's
        share into the tree or chain whose step pays best.

        ``num_requests``: requests the step decodes, with or without candidates (default
        ``len(batch)``). Every one of them is a verified token, so the cost model prices
        the step at that many plus the drafts: at batch 8 with 3 requests drafting, a
        step of 3 + k tokens (below this CPU's knee) is really one of 8 + k (past it).

        ``explore``: if the budget admits no node, verify up to this many anyway, one
        per request (a chain of them where fewer requests draft), best scored first.
        Acceptance rates are learned only from verified drafts, so without this a few
        unlucky early steps (rates pushed below break-even) would stop all drafting, and
        all learning, for good."""
        live = sum(1 for cand in batch if cand is not None and len(cand.token_ids))
        step_requests = max(len(batch) if num_requests is None else num_requests, live)
        # A request whose best first node cannot pay for itself gets no plan (no
        # scheduling work for it).
        floor = 0.0 if explore else self._break_even_probability(step_requests)
        scored = self._score(batch, floor)
        trees = [s.tree for s in scored if s is not None]
        if not trees:  # nothing to schedule: no budget, no shape, no plan
            self.last_k_max = 0
            return [_NO_DRAFT] * len(batch), [None] * len(batch)
        shaped, self.last_k_max = self._choose(trees, per_request_cap, step_requests, explore)
        if self.last_k_max:
            self._steps_since_draft = 0
        shaped_iter = iter(shaped)
        drafts, plans = [], []
        for item in scored:
            if item is None:
                drafts.append(_NO_DRAFT)
                plans.append(None)
                continue
            plan = item.plan(next(shaped_iter))
            drafts.append((plan.token_ids.astype(np.int32, copy=False),
                           plan.parents.astype(np.int32, copy=False)))
            plans.append(plan)
        return drafts, plans

    def _score(self, batch: list[Candidates | None], floor: float) -> list[ScoredForest | None]:
        """Stage 1, score and gate: every request's forest scored (acceptance
        probabilities from the priors, scaled to what recent plans realised) and
        truncated by the gate, in one compiled pass. None where there are no
        candidates, or where even the best first node is below ``floor``."""
        mode = "dense" if self.settings.gating == "dense" else (
            "fixed" if self.settings.fixed_tau_value is not None else "sparse")
        prior_table, head_table = self.prior.prob_table(), self.head_prior.prob_table()
        check_depths, check_taus = self._gate_checks(mode, batch)
        # The budget prices nodes at their score scaled to what recent plans realised.
        log_ratio = math.log(self.realized.ratio)
        out: list[ScoredForest | None] = []
        for cand in batch:
            if cand is None or len(cand.token_ids) == 0:
                out.append(None)
                continue
            # The forest's own dtypes go in as they are (int32 from the forest kernel;
            # the kernels are compiled for them by warm_up).
            (depths, buckets, scores, confidence, trunc_depth, truncated,
             best_root_logp) = score_forest(cand.parents, cand.rank, cand.match_len,
                                            np.asarray(cand.head_logp, dtype=np.float64),
                                            prior_table, head_table, _HEAD_P_EDGES,
                                            _LOGP_FLOOR, MAX_DEPTH, check_depths, check_taus)
            if floor > 0 and math.exp(best_root_logp + log_ratio) < floor:
                out.append(None)
                continue
            tree = CandidateTree.trusted(cand.token_ids, cand.parents, scores + log_ratio,
                                         depths, trunc_depth, not truncated)
            out.append(ScoredForest(cand, tree, buckets, scores, confidence[:MAX_DEPTH],
                                    trunc_depth if truncated else 0))
        return out

    def _gate_checks(self, mode: str, batch: list[Candidates | None]
                     ) -> tuple[np.ndarray, np.ndarray]:
        """(depths, taus) the gate tests, for trees as deep as the batch's largest (only
        dense gating checks every depth; the sparse and fixed checks do not depend on it)."""
        deepest = 0
        if mode == "dense":
            deepest = max((len(c.token_ids) for c in batch if c is not None), default=0)
        key = (self.gate, mode, self.settings.fixed_tau_value, deepest)
        if self._checks[0] != key:
            self._checks = (key, gate_checks(self.gate, mode, max(deepest, 1),
                                             fixed_tau=self.settings.fixed_tau_value or 0.2))
        return self._checks[1]

    def _choose(self, trees: list[CandidateTree], per_request_cap: int, step_requests: int,
                explore: int = 0, k_max: int | None = None) -> tuple[tuple[np.ndarray, ...], int]:
        """Stages 3 and 4, budget and shape, in one compiled call
        (:func:`~vllm_echo.algos.echo.pricing.choose_nodes`): the step's budget
        (``k_max``, else :meth:`_budget_bounds`) shared among the trees, then each
        request's share kept as a tree or replaced by the root path, of any length
        within the budget, whose step pays best. Returns the nodes per request (a mask
        over its candidates) and the budget. Shaped only once the cost model is fitted
        and without a fixed budget; while trees are not yet priced, every other step
        verifies its selection as chosen, so that the cost model sees steps with and
        without trees (else it never learns their cost)."""
        most = 0
        if k_max is None:
            k_max, most = self._budget_bounds(len(trees), per_request_cap, step_requests)
        shape = self.cost.coef is not None and self.settings.k_max is None
        unpriced = self._unpriced_tree_steps
        if shape and self.cost.tree_cost is None:
            unpriced += 1
            shape = unpriced % 2 == 0
        batch = concatenate(trees)
        selected, k_max, probing = choose_nodes(
            *batch, k_max, most, per_request_cap, explore, self.settings.shared_budget, shape,
            self.cost.tree_cost is not None, step_requests,
            self.cost.prices() if self.cost.coef is not None else _UNPRICED)
        if not probing:  # a probe is never shaped: the alternation counts shaped steps
            self._unpriced_tree_steps = unpriced
        if len(trees) == 1:
            return (selected, ), int(k_max)
        bounds = batch[0].tolist()
        return tuple(selected[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])), int(k_max)

    def _budget_bounds(self, num_trees: int, per_request_cap: int,
                       step_requests: int) -> tuple[int, int]:
        """Stage 3's bounds: (the step's fixed budget, or -1 for the cost model's
        choice; the most that choice may be)."""
        if self.settings.k_max is not None:
            return self.settings.k_max, 0
        if not self.settings.shared_budget:
            # Ablation: a fixed K per request, whatever the step costs and whoever else
            # drafts (each request gets k_max // len(trees)).
            return per_request_cap * num_trees, 0
        if self.cost.coef is None:
            # Warm-up (until the cost model has its first fit, ~8 steps): budgets of
            # B/8, B/4, B/2 and B nodes in turn (at least 2, 4, 8, 16), so that the fit
            # sees distinct step sizes, on both sides of the knee at batch 1, without
            # doubling the step at large batch.
            factor = _WARMUP_FACTORS[self._warmup_steps % len(_WARMUP_FACTORS)]
            self._warmup_steps += 1
            return _warmup_budget(step_requests, factor), 0
        most = per_request_cap * num_trees
        trusted = self.cost.trusted_size()
        if trusted is not None:
            # No step far past the cost model's data, but always as far as the warm-up
            # explores: the warm-up's steps may have verified fewer tokens than their
            # budget (few candidates), and a cap below the sizes that pay would leave
            # the budget at 0 with nothing measured that could raise it.
            floor = _warmup_budget(step_requests, _WARMUP_FACTORS[-1])
            most = min(most, max(trusted - step_requests, floor))
        return -1, most

    def step_explore(self, num_requests: int) -> int | None:
        """How this step drafts, asked once per step before any forest is built: None
        to draft nothing (no draft can pay, or a plain step is timed to price
        drafting), else the ``explore`` to pass to :meth:`plan`: PROBE_NODES after
        PROBE_EVERY - 1 steps without a draft, 0 otherwise.

        The probe does not wait for :meth:`nothing_can_pay`: that test is optimistic
        (a match length never seen at depth 1 keeps its prior's rate), while plan()
        drops every forest whose own best node cannot pay. With drafting priced high
        by a bad early fit, that gap stopped drafting for the rest of a run."""
        step, self._steps = self._steps, self._steps + 1
        self._steps_since_draft += 1
        if self._steps_since_draft >= PROBE_EVERY:
            self._steps_since_draft = 0
            return PROBE_NODES
        if self.nothing_can_pay(num_requests):
            return None
        return None if self._pricing_drafts() and step % PLAIN_EVERY == 0 else 0

    def _pricing_drafts(self) -> bool:
        """Whether plain steps are needed to price drafting (see PLAIN_EVERY)."""
        cost = self.cost
        return (cost.coef is not None and cost.draft_cost is None
                and self.settings.k_max is None and self.settings.shared_budget)

    def nothing_can_pay(self, num_requests: int) -> bool:
        """True when, by the cost model, no candidate could be worth verifying this step:
        even the best learned acceptance rate is below the break-even probability
        of every draft size. Then the step needs no forests at all (saves the drafting
        work at high load); callers still plan now and then to keep learning."""
        if self.settings.k_max is not None or self.cost.coef is None or num_requests == 0:
            return False
        # Every draft tree starts at depth 1 and S only falls along a path, so the best
        # depth-1 rate p bounds every node's acceptance probability, and k drafts add
        # at most k p tokens. They pay if (B + k p) / T(B + k) > B / T(B) for some k.
        # (p priced as plan() prices it: times the realised share.)
        best = max(self.prior.best_first_rate(), self.head_prior.best_first_rate())
        return best * self.realized.ratio < self._break_even_probability(num_requests)

    def heads_can_pay(self, num_requests: int) -> bool:
        """Whether a next-next head (drafted from the last logits) may be worth verifying
        in a step of ``num_requests``: its best learned rate reaches the break-even."""
        return (self.head_prior.best_first_rate() * self.realized.ratio
                >= self._break_even_probability(num_requests))

    def _break_even_probability(self, num_requests: int) -> float:
        """Acceptance probability a draft node needs, at best draft size, to pay for
        itself in a step of ``num_requests``: min over k of B (T(B + k) / T(B) - 1) / k
        (0 before the model is fitted, with a fixed budget or a fixed K per request, or
        with no request: then every candidate may be drafted, heads and forests too)."""
        if (self.settings.k_max is not None or not self.settings.shared_budget
                or self.cost.coef is None or num_requests == 0):
            return 0.0
        key = (self.cost.fits, num_requests)
        if self._break_even[0] != key:  # changes only when the model is refitted
            self._break_even = (key, break_even_probability(
                self.cost.prices(), num_requests, _MAX_DRAFTS_PER_REQUEST * num_requests))
        return self._break_even[1]

    # -- feedback ----------------------------------------------------------------------

    def observe(self, plans: list[tuple[Plan, list[int], int]]) -> None:
        """Verdicts of the previous step: ``(plan, accepted_path, next_token)`` each."""
        if not plans:
            return
        drafted, accepted, truncated = [], [], []
        calibrated = self.calibrator.finalized
        for plan, path, next_token in plans:
            # (Heads are at depth 1, the head prior's only depth; their "match length"
            # is their probability bucket.)
            cand = plan.candidates
            forest = None if plan.keep is None else (
                plan.keep, cand.parents, cand.token_ids, cand.match_len, cand.rank)
            observe_retrieved_and_heads(self.prior, self.head_prior, plan.parents,
                                        plan.depths, plan.match_len, plan.head_bucket,
                                        plan.retrieved, path, plan.token_ids, next_token,
                                        forest)
            if not calibrated:
                self.calibrator.observe(plan.confidence,
                                        *plan.calibration_label(path, next_token))
            self.realized.observe(plan.expected, len(path))
            drafted.append(plan.depths)
            accepted.append(len(path))
            truncated.append(plan.truncated_at)
        self.stats.record_step(drafted, accepted, truncated, self.last_k_max)
        if self.calibrator.ready:
            gate, self.calibration_report = self.calibrator.finalize()
            if gate.source == "calibrated":
                self.gate = gate
            else:  # the calibrator's fallback is the reference literals; ours applies
                self.calibration_report += (
                    f"\n  -> keeping the forest gate {self.gate.sweet_spots} taus {self.gate.taus}")


@dataclass
class ScoredForest:
    """One request's candidate forest after stage 1 (scores and gate)."""

    candidates: Candidates
    tree: CandidateTree  # what the budget schedules: scores scaled by the realised share
    buckets: np.ndarray
    raw_scores: np.ndarray  # log acceptance probabilities as the priors give them
    confidence: np.ndarray
    truncated_at: int  # gated depth, 0 when no gate fired

    def plan(self, selected: np.ndarray) -> Plan:
        """The plan verifying the candidate nodes ``selected`` (a mask)."""
        cand = self.candidates
        (keep, tokens, parents, depths, match_len, retrieved, buckets, expected,
         is_chain) = select_plan_nodes(selected, cand.token_ids, cand.parents, self.tree.depths,
                                       cand.match_len, cand.rank, self.buckets,
                                       self.raw_scores)
        return Plan(tokens, parents, depths, match_len, retrieved, buckets, self.confidence,
                    self.truncated_at, expected, cand, keep, is_chain)


def _warmup_budget(num_requests: int, factor: int) -> int:
    """Warm-up budget: B * factor / 8 nodes (rounded up), at least 2 * factor."""
    return max(2 * factor, -(-num_requests * factor // 8))


def warm_up() -> None:
    """One plan and its verdict on a small forest of the proposer's dtypes, so that
    every kernel signature a decode step uses is compiled before the first one."""
    from vllm_echo.config import EchoSettings

    planner = EchoPlanner(EchoSettings.from_dict({"method": "echo"}))
    forest = [np.array(values, np.int32) for values in
              ((5, 6, 7), (-1, 0, -1), (2, 2, 0), (-1, -1, 0))]  # tokens, parents, m, rank
    _, plans = planner.plan([Candidates(*forest, head_logp=np.array([-0.5], np.float32))], 4)
    planner.observe([(plans[0], [0], 6)])
