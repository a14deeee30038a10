# SPDX-License-Identifier: Apache-2.0
"""``"method": "echo"``: LogitSpec forests under ECHO's one decision rule.

The batch-level work (per-node acceptance probabilities, the step-cost curve, the
rule) is in vllm_echo.algos.echo; this adapter builds each request's candidate forest
in base.Proposer's per-request loop, plans the batch after it, turns last step's
verdicts into observations, and learns the step-cost curve from a start-up probe and
timed decode steps.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from vllm_echo.algos import echo
from vllm_echo.algos.draft_sources import ORIGIN_PREDICTION, ORIGIN_RECYCLED, ORIGIN_SHARED
from vllm_echo.algos.echo import Candidates, EchoPlanner, Plan
from vllm_echo.algos.echo.acceptance import KINDS
from vllm_echo.algos.tree import is_chain
from vllm_echo.plugin.proposers.base import Proposer
from vllm_echo.plugin.proposers.request_state import RequestState
from vllm_echo.plugin.proposers.sources import candidate_forest
from vllm_echo.plugin.runner.cost_probe import accepts, install_cost_probe, probe_sizes
from vllm_echo.plugin.runner.tree_state import TreeDraft

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

_EMPTY = np.empty(0, dtype=np.int32)
_NO_LOGP = np.empty(0, dtype=np.float32)
_STATS_LOG_EVERY = 500  # steps between ECHO statistics log lines
_PREDICTION_KIND = KINDS.index("prediction")


class EchoProposer(Proposer):
    method = "echo"
    times_steps = True  # timed decode steps correct the step-cost curve

    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        self.planner = EchoPlanner(self.tuning, trees=self.tree_enabled,
                                   k_max=self.settings.k_max)
        self._engine_origins = tuple(
            origin for origin, on in ((ORIGIN_SHARED, self.sources.store is not None),
                                      (ORIGIN_RECYCLED, self.sources.recycled is not None))
            if on)
        self.planner.acceptance.other_origins = self._engine_origins
        self._plans: dict[str, Plan] = {}
        self._reported_cost = False
        self._step_requests = 0  # requests decoding in the step being drafted
        self._drafting = False  # whether this step drafts at all
        # whether a request with a predicted output drafted last step or is in the batch:
        # only then are the prediction family and its counters looked at
        self._predicting = False

    def load_model(self, model: Any) -> None:
        super().load_model(model)
        runner = self._runner
        if self._no_spec is not None or runner is None:
            return
        if not (callable(getattr(runner, "initialize_kv_cache", None))
                and accepts(getattr(runner, "_dummy_run", None), "force_attention")):
            self.failures.unavailable("initialize_kv_cache", "the runner has no "
                                      "initialize_kv_cache, or no _dummy_run(force_attention=)",
                                      "a step-cost curve learned from real steps")
            return
        scheduler = self._vllm_config.scheduler_config
        max_tokens = min(scheduler.max_num_batched_tokens,
                         scheduler.max_num_seqs * (1 + self.num_speculative_tokens))
        tuning = self.planner.tuning
        largest = tuning.probe_largest_cpu if _on_cpu() else max_tokens
        install_cost_probe(
            runner, probe_sizes(max_tokens, largest), tuning.probe_repeats,
            self._set_cost_curve, self.failures.failed,
            lambda hook, reason: self.failures.unavailable(
                hook, reason, "a step-cost curve learned from real steps"))

    def _set_cost_curve(self, sizes: np.ndarray, seconds: np.ndarray, took: float) -> None:
        """The curve the start-up probe measured (runner/cost_probe.py)."""
        self.planner.cost.set_curve(sizes, seconds)
        logger.info("vllm-echo: ECHO measured the step cost at start-up in %.2f s: %s",
                    took, self.planner.cost.describe())

    def _warm_up(self) -> None:
        super()._warm_up()
        echo.warm_up()

    def observe_step_cost(self, num_tokens: int, seconds: float, drafted: bool) -> None:
        self.planner.cost.observe(num_tokens, seconds, drafted)

    # -- a step: base.Proposer's per-request loop --------------------------------------

    def begin_step(self, req_ids: list[str], sampled_token_ids: list[list[int]]
                   ) -> tuple[np.ndarray | None, np.ndarray | None] | None:
        """The top-k token ids of every request's last logits and their log-probabilities
        (either None when not needed), or None when the step drafts nothing."""
        self.planner.trees = self.tree_enabled  # load_model or a drifted hook may turn it off
        # predicted outputs count among the sources a step can draft from while a
        # request that has one is in the batch (as of last step's states)
        self._predicting = any(s.prediction is not None for s in self.requests.states.values())
        self.planner.acceptance.other_origins = self._engine_origins + (
            (ORIGIN_PREDICTION,) if self._predicting else ())
        # Every request that decodes this step is a verified token, drafted or not.
        self._step_requests = sum(1 for s in sampled_token_ids if s)
        mode = self.planner.drafting_mode(self._step_requests, self.num_speculative_tokens)
        self._drafting = mode != "none"
        if not self._drafting:
            return None
        # Next-next heads need the top-k of every request's last logits (a top-k and a
        # log-sum-exp over the vocabulary per request): only when a head can pay, or
        # when the recycled table learns from it.
        heads = mode == "all"
        top_ids = (self._last_logits.rows_for(req_ids)
                   if heads or self.sources.recycled is not None else None)
        top_logp = self._last_logits.logprobs if heads and top_ids is not None else None
        return top_ids, top_logp

    def draft_request(self, step: tuple, i: int, req_id: str, state: RequestState,
                      max_len: int, accepted: int) -> Candidates:
        """Request ``i``'s candidate forest, for the planner."""
        top_ids, top_logp = step
        row_top = None if top_ids is None else top_ids[i]
        self.sources.learn_logits(state.pool, state.index.tokens, state.index.length, row_top)
        self._predicting |= state.prediction is not None
        nodes, origin = candidate_forest(state, self.sources,
                                         _EMPTY if top_logp is None else row_top,
                                         min(self.settings.capacity, max_len + 1))
        return Candidates(*nodes, head_logp=_NO_LOGP if top_logp is None else top_logp[i],
                          chain_only=not (self.tree_enabled and state.tree_ok), origin=origin)

    def end_step(self, req_ids: list[str], items: list[Any]) -> list[list[int]]:
        """The batch's plan: each request's verified nodes, as vLLM's draft lists."""
        if not self._drafting:
            return [[] for _ in items]
        drafts, plans = self.planner.plan(items, self.num_speculative_tokens,
                                          self._step_requests)
        trees = self.tree_context.trees
        out: list[list[int]] = []
        for req_id, (tokens, parents), plan in zip(req_ids, drafts, plans):
            if plan is not None:
                self._plans[req_id] = plan
                source = "chain" if plan.is_chain else "tree"
                if not plan.is_chain:
                    trees[req_id] = TreeDraft(tokens, parents)
                self.stats.drafts[source] += 1
                self.stats.tokens[source] += len(tokens)
                predicted = (int(np.count_nonzero(self._kinds(plan) == _PREDICTION_KIND))
                             if self._predicting else 0)
                if predicted:
                    self.stats.prediction["drafts"] += 1
                    self.stats.prediction["tokens"] += predicted
            out.append(tokens.tolist())
        self._log_progress()
        return out

    def learn_verdicts(self, req_ids: list[str], sampled_token_ids: list[list[int]]) -> None:
        """Turn last step's verdicts into (plan, accepted path, next token) for the planner."""
        verdicts = []
        for i, sampled in enumerate(sampled_token_ids):
            req_id = req_ids[i]
            plan = self._plans.pop(req_id, None)
            path = self.tree_context.accepted_paths.by_request.pop(req_id, None)
            if plan is None or not sampled:
                continue
            accepted = len(sampled) - 1
            source = "tree"
            if path is None:  # verified by vLLM as a chain: the first nodes, in order
                source = "chain"
                path = list(range(accepted))
                if not plan.is_chain and not is_chain(plan.parents[:accepted]):
                    continue  # not a root path: nothing reliable to learn from
            if accepted:
                self.stats.accepted[source] += accepted
            if accepted and self._predicting:  # last step's flag: begin_step sets it after
                self.stats.prediction["accepted"] += int(np.count_nonzero(
                    self._kinds(plan)[np.asarray(path, dtype=np.int64)] == _PREDICTION_KIND))
            verdicts.append((plan, path, int(sampled[-1])))
        self.planner.observe(verdicts)

    def _kinds(self, plan: Plan) -> np.ndarray:
        """The bucket family (acceptance.KINDS) of each drafted node of ``plan``."""
        return self.planner.acceptance.kinds(plan.cand_buckets[plan.keep])

    def _release_finished(self, live: dict[str, int]) -> None:
        super()._release_finished(live)
        for req_id in [r for r in self._plans if r not in live]:
            del self._plans[req_id]

    def _log_progress(self) -> None:
        if not self._reported_cost and self.planner.cost.steps:
            self._reported_cost = True
            logger.info("vllm-echo: ECHO %s (corrected as steps come)",
                        self.planner.cost.describe())
        if self.stats.steps % _STATS_LOG_EVERY == 0:
            logger.info("vllm-echo: ECHO stats %s; %s", self.echo_snapshot(),
                        self.planner.cost.describe())

    def echo_snapshot(self) -> dict[str, Any]:
        return self.planner.snapshot()

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "echo": self.echo_snapshot()}


def _on_cpu() -> bool:
    from vllm.platforms import current_platform  # not at import: the module loads without vLLM

    return current_platform.is_cpu()
