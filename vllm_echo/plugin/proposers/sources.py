# SPDX-License-Identifier: Apache-2.0
"""A request's candidate forest from every draft source: its predicted output, its own
text (LogitSpec's forest), other requests' outputs and recycled candidates."""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_echo.algos.draft_sources import (ORIGIN_PREDICTION, OtherSources, prediction_first,
                                           with_branches)
from vllm_echo.algos.echo.tuning import EchoTuning
from vllm_echo.algos.forest import build_forest_nodes
from vllm_echo.algos.recycled import RecycledTables
from vllm_echo.algos.shared_outputs import OutputStore
from vllm_echo.plugin.proposers.request_state import RequestState

# Pools with a recycled table of their own (vocab x k x 4 bytes each, 1.5 MiB at 49k and
# k = 8): memory against tenants; one more evicts the least recently used pool's table.
MAX_RECYCLED_POOLS = 16


def other_sources(settings: Any, vocab_size: int, tuning: EchoTuning) -> OtherSources:
    """The engine's cross-request draft sources its settings switch on, sized by
    ``tuning`` (recycled_k, recycled_widths, other_sources_room)."""
    store = (OutputStore(settings.shared_outputs_mib << 20) if settings.shared_outputs
             else None)
    tables = None
    if settings.recycled:
        tables = RecycledTables(vocab_size, min(tuning.recycled_k, settings.topk),
                                MAX_RECYCLED_POOLS)
    return OtherSources(store, tables, settings.span, tuning.recycled_widths,
                        tuning.other_sources_room)


def candidate_forest(state: RequestState, sources: OtherSources, candidates: np.ndarray,
                     capacity: int):
    """The request's candidate forest within ``capacity`` (counting the root): the
    continuation of its predicted output if it has one, LogitSpec's retrieved
    continuation, the other sources' branches (at most ``sources.room`` nodes),
    then next-next branches in what is left (draft_sources.with_branches,
    prediction_first). Returns (ForestNodes, origin or None)."""
    index = state.index
    nodes = build_forest_nodes(index, candidates, capacity)
    origin = None
    if sources.enabled:
        extra = sources.branches(state.pool, index.tokens, index.length,
                                 min(sources.room, capacity - 1))
        nodes, origin = with_branches(nodes, extra, capacity - 1)
    if state.prediction is not None:
        predicted = state.prediction.draft(index.tokens, index.length, capacity - 1)
        nodes, origin = prediction_first(nodes, origin, predicted,
                                         state.prediction.match_len, capacity - 1)
    return nodes, origin


def leading_predicted(origin: np.ndarray | None) -> int:
    """How many nodes lead a forest as its predicted chain (prediction_first)."""
    if origin is None or not len(origin) or origin[0] != ORIGIN_PREDICTION:
        return 0
    other = np.flatnonzero(origin != ORIGIN_PREDICTION)
    return int(other[0]) if len(other) else len(origin)
