# SPDX-License-Identifier: Apache-2.0
"""vLLM ``custom_class`` proposers for ``"method": "logitspec"`` and ``"echo"``.

Thin adapters: per-request state and the vLLM contract live here, the drafting
itself is in vllm_echo.algos (numpy/numba, engine-agnostic).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_echo.algos import recycled, shared_outputs, top_logprobs
from vllm_echo.algos.draft_sources import (ORIGIN_PREDICTION, ORIGIN_RECYCLED, ORIGIN_SHARED,
                                           OtherSources, prediction_first, with_branches)
from vllm_echo.algos.forest import (SOURCE_LOGITS, SOURCE_RETRIEVAL, build_forest,
                                    build_forest_nodes, first_chain)
from vllm_echo.algos.ngram_index import NgramIndex
from vllm_echo.algos.prediction import Prediction
from vllm_echo.algos.recycled import RecycledTables
from vllm_echo.algos.shared_outputs import OutputStore
from vllm_echo.algos.verify import verify_greedy_chains
from vllm_echo.config import DEFAULT_NUM_SPECULATIVE_TOKENS
from vllm_echo.plugin.attention import tree_support
from vllm_echo.plugin.attention.flex_tree_attention import attach_to_builders
from vllm_echo.plugin.config_shim import settings_from_vllm_config
from vllm_echo.plugin.metrics import publish_worker_stats
from vllm_echo.plugin.predicted_outputs import prediction_ids
from vllm_echo.plugin.proposers.tp_drafts import RankZeroDrafts, tensor_parallel_group
from vllm_echo.plugin.runner.access import find_runner, probe_runner
from vllm_echo.plugin.runner.last_logits import LastLogitsTopK
from vllm_echo.plugin.runner.prepare_hook import install_prepare_hook
from vllm_echo.plugin.runner.sample_hook import install_sample_hook
from vllm_echo.plugin.runner.sampler_fixes import install_sampler_fixes
from vllm_echo.plugin.runner.tree_state import TreeContext, TreeDraft, tree_unsafe_reason
from vllm_echo.plugin.tenancy import pool_of

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply


SOURCE_TREE = 3
SOURCE_CHAIN = 4  # ECHO: a root path its planner chose, verified natively as a chain
SOURCE_SHARED = 5  # other requests' outputs (chain mode's fallback)
SOURCE_RECYCLED = 6  # the recycled-candidates table (chain mode's fallback)
SOURCE_PREDICTION = 7  # the request's predicted output (chain mode: before all others)
# Nodes a forest keeps for branches from other requests' outputs and recycled candidates.
OTHER_SOURCES_ROOM = 16
# Candidates kept per token in the recycled table (Token Recycling keeps 8).
RECYCLED_K = 8
# Pools with a recycled table of their own (vocab x k x 4 bytes each, 1.5 MiB at 49k and
# k = 8): memory against tenants; one more evicts the least recently used pool's table.
MAX_RECYCLED_POOLS = 16
# Drafting is cooperative-timed: once a step's drafting has taken this long, the
# requests not drafted yet go without drafts this step (counted as a failure of
# kind "propose:TimeoutError", logged once). Normal drafting takes well under 10 ms
# even at batch 64 with 8k contexts (benchmarks/micro_proposer.py).
PROPOSE_DEADLINE_S = 0.1
_NO_TOKENS = np.empty(0, dtype=np.int32)
_SOURCE_NAMES = {SOURCE_RETRIEVAL: "retrieval", SOURCE_LOGITS: "logits", SOURCE_TREE: "tree",
                 SOURCE_CHAIN: "chain", SOURCE_SHARED: "shared", SOURCE_RECYCLED: "recycled",
                 SOURCE_PREDICTION: "prediction"}
_ORIGIN_SOURCE = {ORIGIN_SHARED: SOURCE_SHARED, ORIGIN_RECYCLED: SOURCE_RECYCLED}


@dataclass
class DraftStats:
    """Per-worker counters, readable with ``LLM.collective_rpc`` (see worker_stats).

    Drafts are counted by source: "retrieval" (chain from the m-gram index),
    "logits" (chain led by a next-next candidate: the index found nothing),
    "shared" / "recycled" (chain from other requests' outputs / the recycled table),
    "prediction" (chain from the request's predicted output), "tree" (a forest verified
    as a tree), "chain" (ECHO: a root path of the forest, verified natively). Accepted
    tokens are attributed to the source of the draft they came from (ECHO's planner
    also counts them by node family). ``prediction`` counts, in every mode, requests
    with a prediction, request-steps whose draft held predicted tokens, those tokens
    and how many of them were accepted.
    """

    steps: int = 0
    drafts: dict = field(default_factory=lambda: dict.fromkeys(_SOURCE_NAMES.values(), 0))
    tokens: dict = field(default_factory=lambda: dict.fromkeys(_SOURCE_NAMES.values(), 0))
    accepted: dict = field(default_factory=lambda: dict.fromkeys(_SOURCE_NAMES.values(), 0))
    peak_tracked_requests: int = 0  # most requests holding retrieval state at once
    # Requests without the scheduler's pool mark (patches.py entry 11) while shared
    # sources are on: they drafted from no shared pool.
    unmarked_requests: int = 0
    prediction: dict = field(default_factory=lambda: dict.fromkeys(
        ("requests", "drafts", "tokens", "accepted"), 0))

    def flat(self) -> dict[str, int]:
        out = {"steps": self.steps, "peak_tracked_requests": self.peak_tracked_requests,
               "unmarked_requests": self.unmarked_requests,
               **{f"prediction_{k}": v for k, v in self.prediction.items()}}
        for kind in ("drafts", "tokens", "accepted"):
            for source, value in getattr(self, kind).items():
                out[f"{kind}_{source}"] = value
        return out


class _OutputCursor:
    """How far a request's outputs went into the shared store (no index needed)."""
    __slots__ = ("owner", "pool", "stored")

    def __init__(self, owner: Any, length: int, pool: int | None):
        self.owner = owner
        self.pool = pool  # its tenant's pool of the shared sources (None: no pool)
        prompt = getattr(owner, "prompt_token_ids", None)  # the prompt is not an output
        self.stored = len(prompt) if prompt is not None else length


class _RequestState:
    __slots__ = ("owner", "index", "tree_ok", "last_len", "last_source", "pool",
                 "prediction", "last_predicted")

    def __init__(self, owner: Any, index: NgramIndex, tree_ok: bool, pool: int | None,
                 prediction: Prediction | None):
        self.owner = owner  # the runner's CachedRequestState: detects a reused request id
        self.index = index
        self.tree_ok = tree_ok  # sampling params allow tree verification
        self.last_len = 0  # the draft proposed last step, to attribute acceptances
        self.last_source = 0
        self.pool = pool  # its tenant's pool of the shared sources (None: no pool)
        self.prediction = prediction  # its predicted output (None: the client sent none)
        self.last_predicted = 0  # leading predicted nodes of last step's draft


class LogitSpecProposer:
    """LogitSpec drafts: m-gram retrieval plus next-next tokens from the last logits.

    Tree mode (default where tree verification is available): the whole LogitSpec
    forest, verified as a token tree. Chain mode (``"tree": false``, or a request
    whose features need chain verification): one chain per request (rule in
    ``vllm_echo.algos.forest.first_chain``).
    """

    method = "logitspec"

    def __init__(self, vllm_config: Any):
        self.settings = settings_from_vllm_config(vllm_config, self.method)
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        self._states: dict[str, _RequestState] = {}
        self._cursors: dict[str, _OutputCursor] = {}  # shared store: outputs given so far
        # req_id -> (owner, pool): each request's pool, resolved once (see _pool)
        self._pools: dict[str, tuple[Any, int | None]] = {}
        self._last_logits = LastLogitsTopK(self.settings.topk)
        self.sources = _other_sources(self.settings, vllm_config)
        self._no_spec: str | None = None  # why load_model found nothing to draft with
        self._failures_logged: set[str] = set()
        self.failures: dict[str, int] = {}  # kind of failure -> how often (logged once each)
        self.stats = DraftStats()
        # This engine's trees, step in flight and verdicts, shared with the runner
        # hooks and attention layers that load_model ties to it.
        self.tree_context = TreeContext(engine_seed=_engine_seed(vllm_config))
        # accepted tree paths: ECHO learns from them; both count accepted predicted tokens
        self.tree_context.record_paths = True
        self._runner: Any = _runner_creating_us()  # None: load_model looks again
        if self.settings.tree and self._runner is None:
            logger.warning("vllm-echo: tree verification unavailable (the proposer was not "
                           "created by a vLLM model runner); using chain mode.")
        self.tree_enabled = (self.settings.tree and self._runner is not None
                             and tree_support.prepare(self.tree_context, vllm_config,
                                                      self.settings.tree_attention,
                                                      self._runner))
        self._timer: Any = None  # step_timer.StepTimer, for proposers that cost steps
        self._vllm_config = vllm_config
        self._rank_zero: RankZeroDrafts | None = None  # tensor parallel: rank 0 drafts
        self._publisher = publish_worker_stats(self, vllm_config)  # for the server's /metrics
        install_sampler_fixes()
        # Shows in the worker's log (Ray: the replica's log) what the drafter runs with.
        logger.info("vllm-echo: %s drafter in pid %d, engine %s, settings %s", self.method,
                    os.getpid(), getattr(vllm_config, "instance_id", "") or "-",
                    json.dumps(self.settings.to_dict(), sort_keys=True))

    # -- vLLM contract -------------------------------------------------------------

    def load_model(self, model: Any) -> None:  # mandatory on CPU (called without hasattr)
        tree_support.end_cpu_route(self.tree_context)  # the attention layers exist now
        try:
            runner = find_runner()
        except Exception as exc:
            self._no_spec = str(exc)
            self._hook_unavailable("model runner", self._no_spec, "no speculation")
            return
        if runner is not self._runner:  # not found in __init__: no CPU tree backend
            self._runner, self.tree_enabled = runner, False
        if self.tree_context.mode is None:  # tree_support found no tree attention
            self.tree_enabled = False
        problems = probe_runner(self._runner,
                                flex=self.tree_context.compacts_by_slot)
        if "runner state" in problems:
            self._no_spec = problems["runner state"]
            self._hook_unavailable("runner state", self._no_spec, "no speculation")
            return
        try:
            group = tensor_parallel_group(self._vllm_config)
            if group is not None:
                self._rank_zero = RankZeroDrafts(group, self.tree_context)
                self.tree_context.agree = self._rank_zero.agree
        except Exception as exc:  # vLLM changed: ranks cannot agree on trees, chains are safe
            self._log_failure("tensor parallel group", exc)
            self.tree_enabled = False
        if self.tree_enabled:
            self.tree_enabled = tree_support.check_model(self.tree_context, model)
        # Trees need both hooks; without _sample there are no next-next candidates
        # either, but retrieval chains still work.
        if "_sample" in problems:
            self._hook_unavailable("_sample", problems["_sample"],
                                   "chain mode without next-next candidates")
            self.tree_enabled = False
        if "_prepare_inputs" in problems:
            self._hook_unavailable("_prepare_inputs", problems["_prepare_inputs"],
                                   "chain mode, no step timing")
            self.tree_enabled = False
            self._timer = None
        if self.tree_enabled or self._timer is not None:
            on_first_step = self._attach_flex_mask if (
                self.tree_enabled and self.tree_context.compacts_by_slot) else None
            install_prepare_hook(self._runner, self.tree_context, self._log_failure,
                                 self._hook_drifted, self._timer, on_first_step)
        if "_sample" not in problems:
            compact = tree_support.compactor(self.tree_context) if self.tree_enabled else None
            install_sample_hook(self._runner, self.tree_context, self._last_logits,
                                self._log_failure, self._hook_drifted, compact=compact)
        self._warm_up()

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
            self._log_failure("propose", exc)
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

    def _attach_flex_mask(self) -> None:
        """The runner's first step: its FLEX_ATTENTION builders exist now (they are
        made with the KV cache, after load_model); tie their metadata to our trees."""
        try:
            reason = attach_to_builders(self._runner, self.tree_context)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if reason is not None:
            self._hook_unavailable("FLEX_ATTENTION metadata", reason, "chain mode")
            self.tree_enabled = False
            self.tree_context.trees.clear()

    def _propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu):
        """One loop over the batch for both methods: :meth:`_begin_step` once, then
        :meth:`_draft_request` per request (a request that fails goes without drafts
        this step, the others keep theirs), then :meth:`_end_step` over the results."""
        batch = self._runner.input_batch
        req_ids = batch.req_ids
        self._release_finished(batch.req_id_to_index)
        self.stats.steps += 1
        trees = self.tree_context.trees
        step = self._begin_step(req_ids, sampled_token_ids)
        items: list[Any] = [None] * len(sampled_token_ids)
        deadline = StepDeadline(self._log_failure)
        for i, sampled in enumerate(sampled_token_ids):
            req_id = req_ids[i]
            trees.pop(req_id, None)  # a draft of this step sets it again
            length = int(num_tokens_no_spec[i])
            # Drafts must fit: the bonus token plus K drafts stay within max_model_len.
            max_len = min(self.num_speculative_tokens, self.max_model_len - length - 1)
            if not sampled or max_len <= 0 or deadline.passed():
                continue
            try:
                # the shared store learns every output, also on steps that draft nothing
                self._learn_outputs(req_id, token_ids_cpu[i], length)
                if step is None:
                    continue
                state = self._sync_state(req_id, token_ids_cpu[i], length)
                items[i] = self._draft_request(step, i, req_id, state, max_len, len(sampled) - 1)
            except Exception as exc:  # only this request goes without drafts this step
                self._log_failure("propose", exc)
                trees.pop(req_id, None)
                self._states.pop(req_id, None)  # rebuilt from the token row next step
                items[i] = None
        drafts = self._end_step(req_ids, items)
        self.stats.peak_tracked_requests = max(self.stats.peak_tracked_requests,
                                               len(self._states))
        return drafts

    def _begin_step(self, req_ids: list[str], sampled_token_ids: list[list[int]]
                    ) -> tuple[np.ndarray | None, np.ndarray | None] | None:
        """The step's input to :meth:`_draft_request`, or None if no request drafts:
        the top-k token ids of every request's last logits and their log-probabilities
        (either None when not captured)."""
        return self._last_logits.rows_for(req_ids), None

    def _draft_request(self, step: tuple, i: int, req_id: str, state: _RequestState,
                       max_len: int, accepted: int) -> Any:
        """Request ``i``'s draft (here its token ids; trees are recorded on the way)."""
        self._count_accepted(req_id, state, accepted)
        top_ids = None if step[0] is None else step[0][i]
        self.sources.learn_logits(state.pool, state.index.tokens, state.index.length, top_ids)
        tokens, source = self._draft(req_id, state, _NO_TOKENS if top_ids is None else top_ids,
                                     max_len)
        self._count_draft(state, len(tokens), source)
        return tokens

    def _end_step(self, req_ids: list[str], items: list[Any]) -> list[list[int]]:
        """The step's drafts for vLLM, from the per-request results (None: no draft)."""
        return [[] if tokens is None else tokens.tolist() for tokens in items]

    def _draft(self, req_id: str, state: _RequestState, candidates: np.ndarray,
               max_len: int) -> tuple[np.ndarray, int]:
        trees = self.tree_context.trees
        if self.tree_enabled and state.tree_ok:
            nodes, origin = self.forest(state, candidates,
                                        min(self.settings.capacity, max_len + 1))
            tokens = nodes.token_ids
            state.last_predicted = _leading_predicted(origin)
            if len(tokens):
                trees[req_id] = TreeDraft(tokens, nodes.parents)
                return tokens, SOURCE_TREE
            return tokens, 0
        if self.tree_enabled:  # a request that needs chain verification in tree mode
            max_len = min(max_len, DEFAULT_NUM_SPECULATIVE_TOKENS)
        if state.prediction is not None:  # the client's text first
            predicted = state.prediction.draft(state.index.tokens, state.index.length, max_len)
            state.last_predicted = len(predicted)
            if len(predicted):
                return predicted, SOURCE_PREDICTION
        tokens, source = first_chain(state.index, candidates, max_len)
        if source != SOURCE_RETRIEVAL and self.sources.enabled:
            # the request's own text has no continuation: other requests' outputs, then
            # recycled candidates, come before a next-next head
            other, origin = self.sources.chain(state.pool, state.index.tokens,
                                               state.index.length, max_len)
            if len(other):
                return other, _ORIGIN_SOURCE[origin]
        return tokens, source

    def forest(self, state: _RequestState, candidates: np.ndarray, capacity: int):
        """The request's candidate forest within ``capacity`` (counting the root): the
        continuation of its predicted output if it has one, LogitSpec's retrieved
        continuation, the other sources' branches (at most OTHER_SOURCES_ROOM nodes),
        then next-next branches in what is left (draft_sources.with_branches,
        prediction_first). Returns (ForestNodes, origin or None)."""
        index = state.index
        nodes = build_forest_nodes(index, candidates, capacity)
        origin = None
        if self.sources.enabled:
            extra = self.sources.branches(state.pool, index.tokens, index.length,
                                          min(OTHER_SOURCES_ROOM, capacity - 1))
            nodes, origin = with_branches(nodes, extra, capacity - 1)
        if state.prediction is not None:
            predicted = state.prediction.draft(index.tokens, index.length, capacity - 1)
            nodes, origin = prediction_first(nodes, origin, predicted,
                                             state.prediction.match_len, capacity - 1)
        return nodes, origin

    def _count_accepted(self, req_id: str, state: _RequestState, accepted: int) -> None:
        path = self.tree_context.last_paths.pop(req_id, None)
        if state.last_len and accepted > 0 and state.last_source in _SOURCE_NAMES:
            self.stats.accepted[_SOURCE_NAMES[state.last_source]] += accepted
        if state.last_predicted and accepted > 0:
            # predicted nodes lead the draft as a chain: a chain's first ones, or a
            # tree's accepted path while it stays on them
            if path is None:
                path = range(accepted)
            self.stats.prediction["accepted"] += next(
                (k for k, j in enumerate(path) if j >= state.last_predicted), len(path))

    def _count_draft(self, state: _RequestState, n: int, source: int) -> None:
        state.last_len, state.last_source = n, source
        if n and source in _SOURCE_NAMES:
            self.stats.drafts[_SOURCE_NAMES[source]] += 1
            self.stats.tokens[_SOURCE_NAMES[source]] += n
        if n and state.last_predicted:
            self.stats.prediction["drafts"] += 1
            self.stats.prediction["tokens"] += min(state.last_predicted, n)

    def _sync_state(self, req_id: str, row: np.ndarray, length: int) -> _RequestState:
        """Bring the request's index up to ``row[:length]`` (only new tokens are indexed)."""
        owner = self._runner.requests.get(req_id)
        state = self._states.get(req_id)
        if state is None or state.owner is not owner or state.index.length > length:
            state = _RequestState(owner, NgramIndex(self.settings.max_ngram, self.settings.span,
                                                    capacity_hint=length + 256),
                                  self._tree_allowed(owner), self._pool(req_id, owner),
                                  self._prediction(owner))
            self._states[req_id] = state
        index = state.index
        if index.length < length:
            index.extend(row[index.length:length])
        return state

    def _learn_outputs(self, req_id: str, row: np.ndarray, length: int) -> None:
        """Give the shared store the request's outputs up to ``row[:length]``."""
        if self.sources.store is None:
            return
        owner = self._runner.requests.get(req_id)
        cursor = self._cursors.get(req_id)
        if cursor is None or cursor.owner is not owner or cursor.stored > length:
            cursor = self._cursors[req_id] = _OutputCursor(owner, length,
                                                           self._pool(req_id, owner))
        if cursor.stored < length:
            self.sources.learn_outputs(cursor.pool, row, length, cursor.stored)
            cursor.stored = length

    def _release_finished(self, live: dict[str, int]) -> None:
        """Free the index of every request that left the batch (finished or preempted)."""
        for req_id in [r for r in self._states if r not in live]:
            del self._states[req_id]
            self.tree_context.trees.pop(req_id, None)
        for req_id in [r for r in self._cursors if r not in live]:
            del self._cursors[req_id]
        for req_id in [r for r in self._pools if r not in live]:
            del self._pools[req_id]
        last_paths = self.tree_context.last_paths
        for req_id in [r for r in last_paths if r not in live]:
            del last_paths[req_id]

    def _prediction(self, owner: Any) -> Prediction | None:
        """The request's predicted output (predicted_outputs.py), indexed; None without."""
        ids = prediction_ids(getattr(owner, "sampling_params", None), self.vocab_size)
        if ids is None:
            return None
        self.stats.prediction["requests"] += 1
        # where the output starts: an output that begins like the prediction follows it
        # from its first token
        return Prediction(ids[:self.max_model_len], start=getattr(owner, "num_prompt_tokens", None))

    def _pool(self, req_id: str, owner: Any) -> int | None:
        """The request's pool of the shared sources from the scheduler's mark (tenancy.py),
        resolved once per request; None (no mark) drafts from and teaches no pool."""
        known = self._pools.get(req_id)
        if known is not None and known[0] is owner:
            return known[1]
        pool = pool_of(getattr(owner, "sampling_params", None))
        self._pools[req_id] = (owner, pool)
        if pool is None and self.sources.enabled:
            self.stats.unmarked_requests += 1
            self._log_once("unmarked", "vllm-echo: requests arrived without the plugin's pool "
                           "mark (is patches.py entry 11 in effect in the scheduler's "
                           "process?); they draft from no shared pool and teach none. "
                           "Counted as unmarked_requests; logged once.")
        return pool

    def _tree_allowed(self, owner: Any) -> bool:
        if not self.tree_enabled:
            return False
        reason = tree_unsafe_reason(getattr(owner, "sampling_params", None))
        if reason is not None:
            self._log_once(f"chain:{reason}", "vllm-echo: requests with %s are verified as a "
                           "chain, not a tree (logged once).", reason)
        return reason is None

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

    def _log_failure(self, where: str, exc: BaseException) -> None:
        kind = f"{where}:{type(exc).__name__}"
        self.failures[kind] = self.failures.get(kind, 0) + 1
        self._log_once(kind,
                       "vllm-echo: %s failed (%s: %s); the affected requests fall back to "
                       "safe verification for this step. Logged once per kind of failure.",
                       where, type(exc).__name__, exc, exc_info=exc)

    def _hook_unavailable(self, hook: str, reason: str, consequence: str) -> None:
        """One log line (and one counted failure) for a hook point vLLM changed,
        found at start-up or by the hook itself at run time."""
        kind = f"hook {hook}:unavailable"
        self.failures[kind] = self.failures.get(kind, 0) + 1
        self._log_once(kind, "vllm-echo: cannot hook vLLM's %s (%s); running in %s.",
                       hook, reason, consequence)

    def _hook_drifted(self, hook: str, reason: str) -> None:
        """A hook found a call it does not understand and switched itself off."""
        self._hook_unavailable(hook, reason, "chain mode" if hook == "_prepare_inputs"
                               else "chain mode without next-next candidates")
        self.tree_enabled = False
        self.tree_context.trees.clear()

    def _log_once(self, kind: str, msg: str, *args, **kwargs) -> None:
        if kind not in self._failures_logged:
            self._failures_logged.add(kind)
            logger.warning(msg, *args, **kwargs)

    def snapshot(self) -> dict[str, Any]:
        """Counters, per-kind failure counts and the size of the per-request state."""
        return {**self.stats.flat(), **self.tree_context.counters,
                "tree_enabled": self.tree_enabled, "tracked_requests": len(self._states),
                "state_bytes": sum(s.index.nbytes for s in list(self._states.values())),
                "prediction_bytes": sum(s.prediction.nbytes for s in list(self._states.values())
                                        if s.prediction is not None),
                **self.sources.nbytes,
                "trees_held": len(self.tree_context.trees), "failures": dict(self.failures)}


def _leading_predicted(origin: np.ndarray | None) -> int:
    """How many nodes lead a forest as its predicted chain (prediction_first)."""
    if origin is None or not len(origin) or origin[0] != ORIGIN_PREDICTION:
        return 0
    other = np.flatnonzero(origin != ORIGIN_PREDICTION)
    return int(other[0]) if len(other) else len(origin)


def _other_sources(settings: Any, vllm_config: Any) -> OtherSources:
    """The engine's cross-request draft sources its settings switch on."""
    store = (OutputStore(settings.shared_outputs_mib << 20) if settings.shared_outputs
             else None)
    tables = None
    if settings.recycled:
        tables = RecycledTables(vllm_config.model_config.get_vocab_size(),
                                min(RECYCLED_K, settings.topk), MAX_RECYCLED_POOLS)
    return OtherSources(store, tables, settings.span)


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


class StepDeadline:
    """``passed()`` turns True once the step's drafting exceeded PROPOSE_DEADLINE_S;
    the first time, the timeout is reported as a failure (logged once per kind)."""

    def __init__(self, on_error: Any):
        self._end = time.perf_counter() + PROPOSE_DEADLINE_S
        self._on_error = on_error
        self._passed = False

    def passed(self) -> bool:
        if not self._passed and time.perf_counter() > self._end:
            self._passed = True
            self._on_error("propose", TimeoutError(
                f"drafting took over {PROPOSE_DEADLINE_S * 1e3:.0f} ms in one step; the "
                "requests not drafted yet go without drafts this step"))
        return self._passed


def worker_stats(worker: Any) -> dict[str, Any] | None:
    """For ``LLM.collective_rpc(worker_stats)``: the drafter's counters on that worker."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return drafter.snapshot() if isinstance(drafter, LogitSpecProposer) else None

