# SPDX-License-Identifier: Apache-2.0
"""Each request's drafting state, by request id, for as long as it is in the batch.

A request id the runner reuses for a new request (another owner: the runner's
CachedRequestState) starts afresh; a request that leaves the batch (finished or
preempted) is forgotten.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_echo.algos.draft_sources import OtherSources
from vllm_echo.algos.ngram_index import NgramIndex
from vllm_echo.algos.prediction import Prediction
from vllm_echo.plugin.predicted_outputs import prediction_ids
from vllm_echo.plugin.proposers.failures import FailureLog
from vllm_echo.plugin.proposers.stats import DraftStats
from vllm_echo.plugin.runner.tree_state import tree_unsafe_reason
from vllm_echo.plugin.tenancy import pool_of


class RequestState:
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


class _OutputCursor:
    """How far a request's outputs went into the shared store (no index needed)."""
    __slots__ = ("owner", "pool", "stored")

    def __init__(self, owner: Any, length: int, pool: int | None):
        self.owner = owner
        self.pool = pool  # its tenant's pool of the shared sources (None: no pool)
        prompt = _prompt_length(owner)  # the prompt is not an output
        self.stored = prompt if prompt is not None else length


class TrackedRequests:
    """The requests' m-gram indexes and predicted outputs (``states``), their pools of
    the shared sources (resolved once per request), and how far each one's outputs
    went into the shared store."""

    def __init__(self, settings: Any, sources: OtherSources, stats: DraftStats,
                 failures: FailureLog, max_model_len: int, vocab_size: int):
        self.settings = settings
        self.sources = sources
        self.stats = stats
        self.failures = failures
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.states: dict[str, RequestState] = {}
        self._cursors: dict[str, _OutputCursor] = {}  # shared store: outputs given so far
        # req_id -> (owner, pool): each request's pool, resolved once (see _pool)
        self._pools: dict[str, tuple[Any, int | None]] = {}

    def sync(self, req_id: str, owner: Any, row: np.ndarray, length: int,
             trees: bool) -> RequestState:
        """Bring the request's index up to ``row[:length]`` (only new tokens are indexed);
        ``trees``: whether the engine verifies trees now."""
        state = self.states.get(req_id)
        if state is None or state.owner is not owner or state.index.length > length:
            settings = self.settings
            state = RequestState(owner, NgramIndex(settings.max_ngram, settings.span,
                                                   capacity_hint=length + 256),
                                 trees and self._tree_allowed(owner), self._pool(req_id, owner),
                                 self._prediction(owner))
            self.states[req_id] = state
        index = state.index
        if index.length < length:
            index.extend(row[index.length:length])
        return state

    def learn_outputs(self, req_id: str, owner: Any, row: np.ndarray, length: int) -> None:
        """Give the shared store the request's outputs up to ``row[:length]``."""
        if self.sources.store is None:
            return
        cursor = self._cursors.get(req_id)
        if cursor is None or cursor.owner is not owner or cursor.stored > length:
            cursor = self._cursors[req_id] = _OutputCursor(owner, length,
                                                           self._pool(req_id, owner))
        if cursor.stored < length:
            self.sources.learn_outputs(cursor.pool, row, length, cursor.stored)
            cursor.stored = length

    def release_finished(self, live: dict[str, int]) -> list[str]:
        """Forget every request that left the batch; returns those that had a state."""
        gone = [r for r in self.states if r not in live]
        for req_id in gone:
            del self.states[req_id]
        for req_id in [r for r in self._cursors if r not in live]:
            del self._cursors[req_id]
        for req_id in [r for r in self._pools if r not in live]:
            del self._pools[req_id]
        return gone

    def _prediction(self, owner: Any) -> Prediction | None:
        """The request's predicted output (predicted_outputs.py), indexed; None without."""
        ids = prediction_ids(getattr(owner, "sampling_params", None), self.vocab_size)
        if ids is None:
            return None
        self.stats.prediction["requests"] += 1
        # where the output starts: an output that begins like the prediction follows it
        # from its first token
        return Prediction(ids[:self.max_model_len], start=_prompt_length(owner))

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
            self.failures.once("unmarked", "vllm-echo: requests arrived without the plugin's "
                               "pool mark (is patches.py entry 11 in effect in the "
                               "scheduler's process?); they draft from no shared pool and "
                               "teach none. Counted as unmarked_requests; logged once.")
        return pool

    def _tree_allowed(self, owner: Any) -> bool:
        reason = tree_unsafe_reason(getattr(owner, "sampling_params", None))
        if reason is not None:
            self.failures.once(f"chain:{reason}", "vllm-echo: requests with %s are verified "
                               "as a chain, not a tree (logged once).", reason)
        return reason is None


def _prompt_length(owner: Any) -> int | None:
    """Where the request's output starts in its token row (None: a prompt of embeddings)."""
    prompt = getattr(owner, "prompt_token_ids", None)
    return len(prompt) if prompt is not None else None
