# SPDX-License-Identifier: Apache-2.0
"""vLLM ``custom_class`` proposers for ``"method": "logitspec"`` and ``"echo"``.

Thin adapters: per-request state and the vLLM contract live here, the drafting
itself is in vllm_echo.algos (numpy/numba, engine-agnostic).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from vllm_echo.algos.forest import SOURCE_LOGITS, SOURCE_RETRIEVAL, first_chain
from vllm_echo.algos.ngram_index import NgramIndex
from vllm_echo.plugin.config_shim import settings_from_vllm_config
from vllm_echo.plugin.runner_hooks import LastLogitsTopK, find_runner, install_sample_capture

logger = logging.getLogger("vllm_echo")


@dataclass
class DraftStats:
    """Per-worker counters, readable with ``LLM.collective_rpc`` (see stats())."""

    steps: int = 0
    drafts_retrieval: int = 0   # drafts whose chain came from the m-gram index
    drafts_logits: int = 0      # drafts led by a next-next candidate (retrieval missed)
    tokens_retrieval: int = 0
    tokens_logits: int = 0
    accepted_retrieval: int = 0  # accepted draft tokens, by the draft's source
    accepted_logits: int = 0
    peak_tracked_requests: int = 0  # most requests holding retrieval state at once


class _RequestState:
    __slots__ = ("owner", "index", "last_len", "last_source")

    def __init__(self, owner: Any, index: NgramIndex):
        self.owner = owner  # the runner's CachedRequestState: detects a reused request id
        self.index = index
        self.last_len = 0  # the draft proposed last step, to attribute acceptances
        self.last_source = 0


class LogitSpecProposer:
    """LogitSpec drafts: m-gram retrieval plus next-next tokens from the last logits.

    Chain mode: one chain per request (rule in ``vllm_echo.algos.forest.first_chain``),
    clipped to ``num_speculative_tokens``.
    """

    method = "logitspec"

    def __init__(self, vllm_config: Any):
        self.settings = settings_from_vllm_config(vllm_config, self.method)
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self._states: dict[str, _RequestState] = {}
        self._last_logits = LastLogitsTopK(self.settings.topk)
        self._runner: Any = None
        self._failures_logged: set[str] = set()
        self.stats = DraftStats()

    # -- vLLM contract -------------------------------------------------------------

    def load_model(self, model: Any) -> None:  # mandatory on CPU (called without hasattr)
        self._runner = find_runner()
        install_sample_capture(self._runner, self._last_logits, self._log_failure)
        self._warm_up()

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        num_reqs = len(sampled_token_ids)
        try:
            return self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        except Exception as exc:  # a drafting bug costs speed, never output or uptime
            self._log_failure("propose", exc)
            return [[] for _ in range(num_reqs)]

    # -- internals -----------------------------------------------------------------

    def _propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu):
        batch = self._runner.input_batch
        req_ids = batch.req_ids
        self._release_finished(batch.req_id_to_index)
        candidates = self._last_logits.rows_for(req_ids)
        no_candidates = np.empty(0, dtype=np.int32)
        drafts: list[list[int]] = []
        self.stats.steps += 1
        for i, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[i])
            # Drafts must fit: the bonus token plus K drafts stay within max_model_len.
            max_len = min(self.num_speculative_tokens, self.max_model_len - length - 1)
            if not sampled or max_len <= 0:  # partial prefill or at the length limit
                drafts.append([])
                continue
            state = self._sync_state(req_ids[i], token_ids_cpu[i], length)
            self._count_accepted(state, len(sampled) - 1)
            cand = candidates[i] if candidates is not None else no_candidates
            chain, source = self._draft(state.index, cand, max_len)
            self._count_draft(state, len(chain), source)
            drafts.append(chain.tolist())
        self.stats.peak_tracked_requests = max(self.stats.peak_tracked_requests,
                                               len(self._states))
        return drafts

    def _draft(self, index: NgramIndex, candidates: np.ndarray,
               max_len: int) -> tuple[np.ndarray, int]:
        return first_chain(index, candidates, max_len)

    def _count_accepted(self, state: _RequestState, accepted: int) -> None:
        if state.last_len and accepted > 0:
            if state.last_source == SOURCE_RETRIEVAL:
                self.stats.accepted_retrieval += accepted
            elif state.last_source == SOURCE_LOGITS:
                self.stats.accepted_logits += accepted

    def _count_draft(self, state: _RequestState, n: int, source: int) -> None:
        state.last_len, state.last_source = n, source
        if source == SOURCE_RETRIEVAL:
            self.stats.drafts_retrieval += 1
            self.stats.tokens_retrieval += n
        elif source == SOURCE_LOGITS:
            self.stats.drafts_logits += 1
            self.stats.tokens_logits += n

    def _sync_state(self, req_id: str, row: np.ndarray, length: int) -> _RequestState:
        """Bring the request's index up to ``row[:length]`` (only new tokens are indexed)."""
        owner = self._runner.requests.get(req_id)
        state = self._states.get(req_id)
        if state is None or state.owner is not owner or state.index.length > length:
            state = _RequestState(owner, NgramIndex(self.settings.max_ngram, self.settings.span,
                                                    capacity_hint=length + 256))
            self._states[req_id] = state
        index = state.index
        if index.length < length:
            index.extend(row[index.length:length])
        return state

    def _release_finished(self, live: dict[str, int]) -> None:
        """Free the index of every request that left the batch (finished or preempted)."""
        for req_id in [r for r in self._states if r not in live]:
            del self._states[req_id]

    def _warm_up(self) -> None:
        """Compile the numba kernels now, not inside the first decode step."""
        index = NgramIndex(self.settings.max_ngram, self.settings.span)
        index.extend(np.arange(32, dtype=np.int32) % 7)
        self._draft(index, np.arange(4, dtype=np.int32), self.num_speculative_tokens)

    def _log_failure(self, where: str, exc: BaseException) -> None:
        kind = f"{where}:{type(exc).__name__}"
        if kind not in self._failures_logged:
            self._failures_logged.add(kind)
            logger.warning("vllm-echo: %s failed (%s: %s); this step runs without drafts for "
                           "the affected requests. Logged once per kind of failure.",
                           where, type(exc).__name__, exc, exc_info=exc)

    def snapshot(self) -> dict[str, int]:
        """Counters plus the number of requests holding retrieval state."""
        return {**asdict(self.stats), "tracked_requests": len(self._states)}


def worker_stats(worker: Any) -> dict[str, int] | None:
    """For ``LLM.collective_rpc(worker_stats)``: the drafter's counters on that worker."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return drafter.snapshot() if isinstance(drafter, LogitSpecProposer) else None


class EchoProposer(LogitSpecProposer):
    """``"method": "echo"``: the LogitSpec drafter under ECHO's batch budget.

    The sparse confidence gate and the elastic batch budget are not in this
    release yet; until they are, echo drafts exactly like logitspec chain mode and
    says so once at start-up.
    """

    method = "echo"

    def __init__(self, vllm_config: Any):
        super().__init__(vllm_config)
        logger.warning("vllm-echo: method 'echo' currently runs LogitSpec chain drafting "
                       "without ECHO's gate and shared budget (not implemented yet).")
