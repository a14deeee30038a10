# SPDX-License-Identifier: Apache-2.0
"""``"method": "logitspec"``: each request drafts its own LogitSpec forest or chain.

Thin adapter: the engine wiring and the per-request loop are base.Proposer's, the
drafting itself is in vllm_echo.algos (numpy/numba, engine-agnostic).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_echo.algos.draft_sources import ORIGIN_RECYCLED, ORIGIN_SHARED
from vllm_echo.algos.forest import SOURCE_RETRIEVAL, first_chain
from vllm_echo.config import DEFAULT_NUM_SPECULATIVE_TOKENS
from vllm_echo.plugin.proposers.base import Proposer, worker_stats
from vllm_echo.plugin.proposers.request_state import RequestState
from vllm_echo.plugin.proposers.sources import candidate_forest, leading_predicted
from vllm_echo.plugin.proposers.stats import (SOURCE_NAMES, SOURCE_PREDICTION, SOURCE_RECYCLED,
                                              SOURCE_SHARED, SOURCE_TREE)
from vllm_echo.plugin.runner.tree_state import TreeDraft

# worker_stats: the documented path of the function that reads every method's counters
__all__ = ["LogitSpecProposer", "worker_stats"]

_NO_TOKENS = np.empty(0, dtype=np.int32)
_ORIGIN_SOURCE = {ORIGIN_SHARED: SOURCE_SHARED, ORIGIN_RECYCLED: SOURCE_RECYCLED}


class LogitSpecProposer(Proposer):
    """LogitSpec drafts: m-gram retrieval plus next-next tokens from the last logits.

    Tree mode (default where tree verification is available): the whole LogitSpec
    forest, verified as a token tree. Chain mode (``"tree": false``, or a request
    whose features need chain verification): one chain per request (rule in
    ``vllm_echo.algos.forest.first_chain``).
    """

    method = "logitspec"

    def learn_verdicts(self, req_ids: list[str], sampled_token_ids: list[list[int]]) -> None:
        """Nothing to learn per step: each request's accepted tokens are counted as it
        drafts (``draft_request``), where its state is at hand."""

    def begin_step(self, req_ids: list[str], sampled_token_ids: list[list[int]]
                   ) -> tuple[np.ndarray | None, None]:
        """The top-k token ids of every request's last logits (None when not captured)."""
        return self._last_logits.rows_for(req_ids), None

    def draft_request(self, step: tuple, i: int, req_id: str, state: RequestState,
                      max_len: int, accepted: int) -> np.ndarray:
        """Request ``i``'s draft token ids (a tree is recorded on the way)."""
        self._count_accepted(req_id, state, accepted)
        top_ids = None if step[0] is None else step[0][i]
        self.sources.learn_logits(state.pool, state.index.tokens, state.index.length, top_ids)
        tokens, source = self._draft(req_id, state, _NO_TOKENS if top_ids is None else top_ids,
                                     max_len)
        self._count_draft(state, len(tokens), source)
        return tokens

    def end_step(self, req_ids: list[str], items: list[Any]) -> list[list[int]]:
        return [[] if tokens is None else tokens.tolist() for tokens in items]

    def _draft(self, req_id: str, state: RequestState, candidates: np.ndarray,
               max_len: int) -> tuple[np.ndarray, int]:
        trees = self.tree_context.trees
        if self.tree_enabled and state.tree_ok:
            nodes, origin = candidate_forest(state, self.sources, candidates,
                                             min(self.settings.capacity, max_len + 1))
            tokens = nodes.token_ids
            state.last_predicted = leading_predicted(origin)
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

    def _count_accepted(self, req_id: str, state: RequestState, accepted: int) -> None:
        path = self.tree_context.accepted_paths.by_request.pop(req_id, None)
        if state.last_len and accepted > 0 and state.last_source in SOURCE_NAMES:
            self.stats.accepted[SOURCE_NAMES[state.last_source]] += accepted
        if state.last_predicted and accepted > 0:
            # predicted nodes lead the draft as a chain: a chain's first ones, or a
            # tree's accepted path while it stays on them
            if path is None:
                path = range(accepted)
            self.stats.prediction["accepted"] += next(
                (k for k, j in enumerate(path) if j >= state.last_predicted), len(path))

    def _count_draft(self, state: RequestState, n: int, source: int) -> None:
        state.last_len, state.last_source = n, source
        if n and source in SOURCE_NAMES:
            self.stats.drafts[SOURCE_NAMES[source]] += 1
            self.stats.tokens[SOURCE_NAMES[source]] += n
        if n and state.last_predicted:
            self.stats.prediction["drafts"] += 1
            self.stats.prediction["tokens"] += min(state.last_predicted, n)
