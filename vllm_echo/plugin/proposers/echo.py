# SPDX-License-Identifier: Apache-2.0
"""``"method": "echo"``: LogitSpec forests under ECHO's gate and shared batch budget.

The batch-level work (scores, gate, budget, calibration) is in
vllm_echo.algos.echo.planner; this adapter feeds it each request's candidate
forest and the previous step's verdicts, and times decode steps for the
cost model that sets the budget.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from vllm_echo.algos import echo
from vllm_echo.algos.echo.planner import Candidates, EchoPlanner, Plan
from vllm_echo.algos.forest import build_forest_nodes
from vllm_echo.plugin.proposers.logitspec import LogitSpecProposer, StepDeadline
from vllm_echo.plugin.runner.step_timer import StepTimer
from vllm_echo.plugin.runner.tree_state import TreeDraft

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

_EMPTY = np.empty(0, dtype=np.int32)
_STATS_LOG_EVERY = 500  # steps between ECHO statistics log lines


class EchoProposer(LogitSpecProposer):
    method = "echo"

    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        self.planner = EchoPlanner(self.settings)
        self._plans: dict[str, Plan] = {}
        self._reported_gate: Any = None
        self._reported_cost = False
        self._timer = StepTimer(self.planner.cost.add)  # feeds the budget's cost model
        self.tree_context.record_paths = True  # the planner learns from tree verdicts

    def _warm_up(self) -> None:
        super()._warm_up()
        echo.warm_up()

    def _propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu):
        batch = self._runner.input_batch
        req_ids = batch.req_ids
        self._release_finished(batch.req_id_to_index)
        self._observe(req_ids, sampled_token_ids)
        live = sum(1 for s in sampled_token_ids if s)
        explore = self.planner.step_explore(live)
        if explore is None:
            self.stats.steps += 1
            for req_id in req_ids[:len(sampled_token_ids)]:
                self.tree_context.trees.pop(req_id, None)
            return [[] for _ in sampled_token_ids]
        # Next-next heads need the top-k of every request's last logits (a top-k and a
        # log-sum-exp over the vocabulary per request); skipped when no head can pay.
        heads = self.planner.heads_can_pay(live)
        top_ids = self._last_logits.rows_for(req_ids) if heads else None
        top_logp = self._last_logits.logprobs if top_ids is not None else None
        self.stats.steps += 1
        candidates: list[Candidates | None] = []
        tree_mode: list[bool] = []
        deadline = StepDeadline(self._log_failure)
        for i, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[i])
            max_len = min(self.num_speculative_tokens, self.max_model_len - length - 1)
            if not sampled or max_len <= 0 or deadline.passed():
                candidates.append(None)
                tree_mode.append(False)
                continue
            state = self._sync_state(req_ids[i], token_ids_cpu[i], length)
            use_tree = self.tree_enabled and state.tree_ok
            nodes = build_forest_nodes(
                state.index, top_ids[i] if top_ids is not None else _EMPTY,
                min(self.settings.capacity, max_len + 1), max_chains=(1 << 30) if use_tree else 1)
            head_logp = top_logp[i] if top_logp is not None else np.empty(0)
            candidates.append(Candidates(*nodes, head_logp=head_logp))
            tree_mode.append(use_tree)
        drafts, plans = self.planner.plan(candidates, self.num_speculative_tokens,
                                          explore=explore,
                                          num_requests=live)
        trees = self.tree_context.trees
        out: list[list[int]] = []
        for i, ((tokens, parents), plan) in enumerate(zip(drafts, plans)):
            req_id = req_ids[i]
            is_tree = tree_mode[i] and plan is not None and not plan.is_chain
            if is_tree:
                trees[req_id] = TreeDraft(tokens, parents)
            else:
                trees.pop(req_id, None)
            if plan is not None:
                self._plans[req_id] = plan
                if len(tokens):
                    source = "tree" if is_tree else "chain"
                    self.stats.drafts[source] += 1
                    self.stats.tokens[source] += len(tokens)
            out.append(tokens.tolist())
        self.stats.peak_tracked_requests = max(self.stats.peak_tracked_requests,
                                               len(self._states))
        self._log_progress()
        return out

    def _observe(self, req_ids: list[str], sampled_token_ids: list[list[int]]) -> None:
        """Turn last step's verdicts into (plan, accepted path, next token) for the planner."""
        verdicts = []
        for i, sampled in enumerate(sampled_token_ids):
            req_id = req_ids[i]
            plan = self._plans.pop(req_id, None)
            path = self.tree_context.last_paths.pop(req_id, None)
            if plan is None or not sampled:
                continue
            accepted = len(sampled) - 1
            source = "tree"
            if path is None:  # verified by vLLM as a chain: the first nodes, in order
                source = "chain"
                path = list(range(accepted))
                if not plan.is_chain and np.any(
                        plan.parents[:accepted] != np.arange(-1, accepted - 1)):
                    continue  # not a root path: nothing reliable to learn from
            if accepted:
                self.stats.accepted[source] += accepted
            verdicts.append((plan, path, int(sampled[-1])))
        self.planner.observe(verdicts)

    def _release_finished(self, live: dict[str, int]) -> None:
        super()._release_finished(live)
        for req_id in [r for r in self._plans if r not in live]:
            del self._plans[req_id]
        last_paths = self.tree_context.last_paths
        for req_id in [r for r in last_paths if r not in live]:
            del last_paths[req_id]

    def _log_progress(self) -> None:
        planner = self.planner
        if planner.gate is not self._reported_gate and planner.calibration_report:
            self._reported_gate = planner.gate
            logger.info("vllm-echo: %s", planner.calibration_report)
        if not self._reported_cost and planner.cost.fits == 1:
            self._reported_cost = True
            a, b = planner.cost.coef
            c = planner.cost.tree_cost
            logger.info("vllm-echo: decode step cost model T = %.4f s + %.6f s x tokens past "
                        "%d + %s s x tree requests (refitted as steps come); ECHO budget "
                        "now follows it", a, b, planner.cost.knee,
                        "unmeasured" if c is None else f"{c:.4f}")
        if self.stats.steps % _STATS_LOG_EVERY == 0:
            logger.info("vllm-echo: ECHO stats %s", self.echo_snapshot())

    def echo_snapshot(self) -> dict[str, Any]:
        planner = self.planner
        gate = planner.gate
        return {
            **planner.stats.as_dict(),
            "k_max": planner.last_k_max,
            "accepted_over_expected": round(planner.realized.ratio, 4),
            "sweet_spots": list(gate.sweet_spots),
            "taus": [round(t, 4) for t in gate.taus],
            "gate_source": gate.source,
            "cost_model": planner.cost.coef,
            "cost_knee": planner.cost.knee,
            "tree_cost": planner.cost.tree_cost,
            "draft_cost": planner.cost.draft_cost,
        }

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "echo": self.echo_snapshot()}
