# SPDX-License-Identifier: Apache-2.0
"""What both methods' proposers share: the engine wiring, the per-request loop, the
counters and the failure log.

vLLM creates the proposer in its model runner's ``__init__`` and calls ``load_model``
and, every step, ``propose``. Here the proposer finds that runner, probes it, joins the
tensor-parallel group, installs the runner hooks and hands the runner and attention
layers the callbacks they make at run time (``_install_hooks``). ``propose`` runs one
loop over the batch; what a method drafts is its own (``Proposer``'s interface):

- ``learn_verdicts``: what to learn from last step's verdicts, once per step;
- ``begin_step``: what the step drafts with, once per step (None: no request drafts);
- ``draft_request``: what to draft for one request;
- ``end_step``: what to do with the step's drafts (it returns vLLM's draft lists).

``logitspec.LogitSpecProposer`` and ``echo.EchoProposer`` are the two methods.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np

from vllm_echo.algos import recycled, shared_outputs, top_logprobs
from vllm_echo.algos.echo.tuning import EchoTuning
from vllm_echo.algos.forest import build_forest, first_chain
from vllm_echo.algos.ngram_index import NgramIndex
from vllm_echo.algos.verify import verify_greedy_chains
from vllm_echo.plugin.attention import tree_support
from vllm_echo.plugin.attention.flex_tree_attention import attach_to_builders
from vllm_echo.plugin.config_shim import settings_from_vllm_config
from vllm_echo.plugin.metrics import publish_worker_stats
from vllm_echo.plugin.proposers.failures import FailureLog, StepDeadline
from vllm_echo.plugin.proposers.request_state import RequestState, TrackedRequests
from vllm_echo.plugin.proposers.sources import other_sources
from vllm_echo.plugin.proposers.stats import DraftStats
from vllm_echo.plugin.proposers.tp_drafts import RankZeroDrafts, tensor_parallel_group
from vllm_echo.plugin.runner.access import find_runner, probe_runner
from vllm_echo.plugin.runner.last_logits import LastLogitsTopK
from vllm_echo.plugin.runner.prepare_hook import install_prepare_hook
from vllm_echo.plugin.runner.sample_hook import install_sample_hook
from vllm_echo.plugin.runner.step_timer import StepTimer
from vllm_echo.plugin.runner.tree_state import TreeContext

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply


class Proposer:
    """A vLLM ``custom_class`` drafter; subclasses implement the four methods of the
    interface (module doc). ``times_steps``: whether the method learns from timed
    decode steps (``observe_step_cost``)."""

    method = ""
    times_steps = False

    def __init__(self, vllm_config: Any):
        self.settings = settings_from_vllm_config(vllm_config, self.method)
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        self._last_logits = LastLogitsTopK(self.settings.topk)
        # ECHO's numbers; the forest's room for other sources and the step timer's idle
        # gap apply to both methods
        self.tuning = EchoTuning()
        self.sources = other_sources(self.settings, self.vocab_size, self.tuning)
        self._no_spec: str | None = None  # why load_model found nothing to draft with
        self.failures = FailureLog()
        self.stats = DraftStats()
        self.requests = TrackedRequests(self.settings, self.sources, self.stats,
                                        self.failures, self.max_model_len, self.vocab_size)
        # This engine's trees, step in flight and verdicts, shared with the runner
        # hooks and attention layers that load_model ties to it.
        self.tree_context = TreeContext(engine_seed=_engine_seed(vllm_config))
        # accepted tree paths: ECHO learns from them; both count accepted predicted tokens
        self.tree_context.accepted_paths.record = True
        self._runner: Any = _runner_creating_us()  # None: load_model looks again
        if self.settings.tree and self._runner is None:
            logger.warning("vllm-echo: tree verification unavailable (the proposer was not "
                           "created by a vLLM model runner); using chain mode.")
        self.tree_enabled = (self.settings.tree and self._runner is not None
                             and tree_support.prepare(self.tree_context, vllm_config,
                                                      self.settings.tree_attention,
                                                      self._runner))
        self._timer: StepTimer | None = None  # set by _install_hooks where times_steps
        self._vllm_config = vllm_config
        self._rank_zero: RankZeroDrafts | None = None  # tensor parallel: rank 0 drafts
        self._publisher = publish_worker_stats(self, vllm_config)  # for the server's /metrics
        # Shows in the worker's log (Ray: the replica's log) what the drafter runs with.
        logger.info("vllm-echo: %s drafter in pid %d, engine %s, settings %s", self.method,
                    os.getpid(), getattr(vllm_config, "instance_id", "") or "-",
                    json.dumps(self.settings.to_dict(), sort_keys=True))

    # -- the interface of a method -----------------------------------------------------

    def learn_verdicts(self, req_ids: list[str], sampled_token_ids: list[list[int]]) -> None:
        """Learn from last step's verdicts (``sampled_token_ids``: what each request
        emitted); a failure here is logged and drafting goes on."""
        raise NotImplementedError

    def begin_step(self, req_ids: list[str], sampled_token_ids: list[list[int]]) -> Any:
        """What this step's requests draft with (passed to ``draft_request``), or None
        if no request drafts this step."""
        raise NotImplementedError

    def draft_request(self, step: Any, i: int, req_id: str, state: RequestState,
                      max_len: int, accepted: int) -> Any:
        """Request ``i``'s draft of at most ``max_len`` tokens, for ``end_step``;
        ``accepted``: how many of its drafts last step accepted."""
        raise NotImplementedError

    def end_step(self, req_ids: list[str], items: list[Any]) -> list[list[int]]:
        """The step's drafts for vLLM, from the per-request results (None: no draft)."""
        raise NotImplementedError

    def observe_step_cost(self, num_tokens: int, seconds: float, drafted: bool) -> None:
        """A timed decode step (only where ``times_steps``)."""
        raise NotImplementedError

    # -- vLLM contract -------------------------------------------------------------

    def load_model(self, model: Any) -> None:  # mandatory on CPU (called without hasattr)
        tree_support.end_cpu_route(self.tree_context)  # the attention layers exist now
        try:
            runner = find_runner()
        except Exception as exc:
            self._no_spec = str(exc)
            self.failures.unavailable("model runner", self._no_spec, "no speculation")
            return
        if runner is not self._runner:  # not found in __init__: no CPU tree backend
            self._runner, self.tree_enabled = runner, False
        if self.tree_context.attention.mode is None:  # tree_support found no tree attention
            self.tree_enabled = False
        problems = probe_runner(self._runner,
                                flex=self.tree_context.attention.compacts_by_slot)
        if "runner state" in problems:
            self._no_spec = problems["runner state"]
            self.failures.unavailable("runner state", self._no_spec, "no speculation")
            return
        try:
            group = tensor_parallel_group(self._vllm_config)
            if group is not None:
                self._rank_zero = RankZeroDrafts(group, self.tree_context)
        except Exception as exc:  # vLLM changed: ranks cannot agree on trees, chains are safe
            self.failures.failed("tensor parallel group", exc)
            self.tree_enabled = False
        if self.tree_enabled:
            self.tree_enabled = tree_support.check_model(self.tree_context, model)
        # Trees need both hooks; without _sample there are no next-next candidates
        # either, but retrieval chains still work.
        if "_sample" in problems:
            self.failures.unavailable("_sample", problems["_sample"],
                                      "chain mode without next-next candidates")
            self.tree_enabled = False
        if "_prepare_inputs" in problems:
            self.failures.unavailable("_prepare_inputs", problems["_prepare_inputs"],
                                      "chain mode, no step timing")
            self.tree_enabled = False
        self._install_hooks(sample_hook="_sample" not in problems,
                            prepare_hook="_prepare_inputs" not in problems)
        self._warm_up()

    def _install_hooks(self, sample_hook: bool, prepare_hook: bool) -> None:
        """The runner hooks, and every call that runs up from the runner and attention
        layers into the proposer at run time (they import nothing above them, so each
        is handed down here):

        - tree_verdicts -> ``agree``: under tensor parallel, each tree request's worst
          outcome over all ranks (tp_drafts.RankZeroDrafts.agree);
        - tree_verdicts -> ``compact``: the attention backend's KV compaction of an
          accepted path (tree_support.compactor);
        - prepare_hook -> ``on_first_step``: FLEX_ATTENTION's metadata tied to our trees
          (``_attach_flex_mask``);
        - step_timer -> ``observe_step_cost``: timed decode steps (ECHO's cost curve).
        """
        context = self.tree_context
        if self._rank_zero is not None:
            context.agree = self._rank_zero.agree
        if self.times_steps and prepare_hook:
            self._timer = StepTimer(self.observe_step_cost, self.tuning.idle_gap_ratio)
        if self.tree_enabled or self._timer is not None:
            on_first_step = self._attach_flex_mask if (
                self.tree_enabled and context.attention.compacts_by_slot) else None
            install_prepare_hook(self._runner, context, self.failures.failed,
                                 self._hook_drifted, self._timer, on_first_step)
        if sample_hook:
            compact = tree_support.compactor(context) if self.tree_enabled else None
            install_sample_hook(self._runner, context, self._last_logits,
                                self.failures.failed, self._hook_drifted, compact=compact)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        num_reqs = len(sampled_token_ids)
        if self._no_spec is not None:  # the runner is not what we know: draft nothing
            return [[] for _ in range(num_reqs)]
        drafts: list[list[int]] | None = None
        try:
            if self._rank_zero is None or self._rank_zero.leads:
                drafts = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        except Exception as exc:  # a drafting bug costs speed, never output or uptime
            self.failures.failed("propose", exc)
            self.tree_context.trees.clear()
            drafts = [[] for _ in range(num_reqs)]
        finally:
            self._last_logits.release()  # the step's logits are not kept past drafting
            if self._timer is not None:
                self._timer.stopped()
        if self._rank_zero is not None:  # outside the try: every rank takes part
            drafts = self._rank_zero.share(drafts)
        return drafts

    # -- internals -----------------------------------------------------------------

    def _propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu):
        """One loop over the batch for both methods: ``learn_verdicts`` and
        ``begin_step`` once, then ``draft_request`` per request (a request that fails
        goes without drafts this step, the others keep theirs), then ``end_step`` over
        the results."""
        batch = self._runner.input_batch
        req_ids = batch.req_ids
        self._release_finished(batch.req_id_to_index)
        self.stats.steps += 1
        trees = self.tree_context.trees
        try:
            self.learn_verdicts(req_ids, sampled_token_ids)
        except Exception as exc:  # this step's verdicts are not learned from; drafting goes on
            self.failures.failed("observe", exc)
        step = self.begin_step(req_ids, sampled_token_ids)
        items: list[Any] = [None] * len(sampled_token_ids)
        deadline = StepDeadline(self.failures.failed)
        requests = self.requests
        for i, sampled in enumerate(sampled_token_ids):
            req_id = req_ids[i]
            trees.pop(req_id, None)  # a draft of this step sets it again
            length = int(num_tokens_no_spec[i])
            # Drafts must fit: the bonus token plus K drafts stay within max_model_len.
            max_len = min(self.num_speculative_tokens, self.max_model_len - length - 1)
            if not sampled or max_len <= 0 or deadline.passed():
                continue
            try:
                owner = self._runner.requests.get(req_id)
                # the shared store learns every output, also on steps that draft nothing
                requests.learn_outputs(req_id, owner, token_ids_cpu[i], length)
                if step is None:
                    continue
                state = requests.sync(req_id, owner, token_ids_cpu[i], length,
                                      self.tree_enabled)
                items[i] = self.draft_request(step, i, req_id, state, max_len, len(sampled) - 1)
            except Exception as exc:  # only this request goes without drafts this step
                self.failures.failed("propose", exc)
                trees.pop(req_id, None)
                requests.states.pop(req_id, None)  # rebuilt from the token row next step
                items[i] = None
        drafts = self.end_step(req_ids, items)
        self.stats.peak_tracked_requests = max(self.stats.peak_tracked_requests,
                                               len(requests.states))
        return drafts

    def _release_finished(self, live: dict[str, int]) -> None:
        """Free the state of every request that left the batch (finished or preempted)."""
        for req_id in self.requests.release_finished(live):
            self.tree_context.trees.pop(req_id, None)
        paths = self.tree_context.accepted_paths.by_request
        for req_id in [r for r in paths if r not in live]:
            del paths[req_id]

    def _attach_flex_mask(self) -> None:
        """The runner's first step: its FLEX_ATTENTION builders exist now (they are
        made with the KV cache, after load_model); tie their metadata to our trees."""
        try:
            reason = attach_to_builders(self._runner, self.tree_context)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if reason is not None:
            self.failures.unavailable("FLEX_ATTENTION metadata", reason, "chain mode")
            self.tree_enabled = False
            self.tree_context.trees.clear()

    def _hook_drifted(self, hook: str, reason: str) -> None:
        """A hook found a call it does not understand and switched itself off."""
        self.failures.unavailable(hook, reason, "chain mode" if hook == "_prepare_inputs"
                                  else "chain mode without next-next candidates")
        self.tree_enabled = False
        self.tree_context.trees.clear()

    def _warm_up(self) -> None:
        """Compile the numba kernels now, not inside the first decode step."""
        index = NgramIndex(self.settings.max_ngram, self.settings.span)
        index.extend(np.arange(32, dtype=np.int32) % 7)
        candidates = np.arange(4, dtype=np.int32)
        first_chain(index, candidates, self.num_speculative_tokens)
        build_forest(index, candidates, self.settings.capacity)
        verify_greedy_chains(candidates, [4], candidates, [0], width=5)
        top_logprobs.warm_up()
        if self.sources.store is not None:
            shared_outputs.warm_up()
        if self.sources.recycled is not None:
            recycled.warm_up()

    def snapshot(self) -> dict[str, Any]:
        """Counters, per-kind failure counts and the size of the per-request state."""
        states = list(self.requests.states.values())
        return {**self.stats.flat(), **self.tree_context.counters,
                "tree_enabled": self.tree_enabled, "tracked_requests": len(states),
                "state_bytes": sum(s.index.nbytes for s in states),
                "prediction_bytes": sum(s.prediction.nbytes for s in states
                                        if s.prediction is not None),
                **self.sources.nbytes,
                "trees_held": len(self.tree_context.trees),
                "failures": dict(self.failures.counts)}


def _engine_seed(vllm_config: Any) -> int:
    """The engine's seed (0 without one), as the non-negative int numpy seeds need."""
    seed = getattr(vllm_config.model_config, "seed", None) or 0
    return seed & ((1 << 64) - 1)  # a negative seed keeps its 64 bits


def _runner_creating_us() -> Any | None:
    """The model runner whose __init__ creates this proposer (vLLM creates the drafter
    there), or None."""
    try:
        return find_runner()
    except Exception:
        return None


def worker_stats(worker: Any) -> dict[str, Any] | None:
    """For ``LLM.collective_rpc(worker_stats)``: the drafter's counters on that worker."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return drafter.snapshot() if isinstance(drafter, Proposer) else None
