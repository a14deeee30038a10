# SPDX-License-Identifier: Apache-2.0
"""Drafts from beyond a request's own text, as branches under its forest's root.

- **Other requests' outputs** (SuffixDecoding's idea): an OutputStore of every
  request's generated tokens, queried with the request's last tokens for a chain.
- **Recycled candidates** (Token Recycling, arXiv 2408.08696): a RecycledTable from
  each token to the top-k tokens the target put after it, read as a small tree under
  the root. It holds token ids only, from the model's own logits.

Both are engine-wide and split by pool (a tenant: vLLM's ``cache_salt``, algos/pools.py):
a request learns into and drafts from its own pool only, and a request with no pool
(None) neither learns nor drafts. Both are bounded (the store by bytes, the recycled
tables by vocabulary x k each and by their number).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from vllm_echo.algos.forest import ForestNodes
from vllm_echo.algos.recycled import RecycledTables
from vllm_echo.algos.shared_outputs import OutputStore

# Where a node came from, for acceptance statistics (ECHO) and counters.
ORIGIN_OWN = 0  # the request's own text: an m-gram continuation or a next-next head
ORIGIN_SHARED = 1
ORIGIN_RECYCLED = 2
ORIGIN_PREDICTION = 3  # the request's predicted output (algos/prediction.py)
ORIGIN_NAMES = ("own", "shared", "recycled", "prediction")

_EMPTY = np.empty(0, dtype=np.int32)


class Branches(NamedTuple):
    token_ids: np.ndarray  # int32, parent-first
    parents: np.ndarray  # int32, -1 under the root
    origin: np.ndarray  # int8, ORIGIN_SHARED or ORIGIN_RECYCLED


class OtherSources:
    """The engine's cross-request sources (either may be None: switched off).

    ``recycled_widths``: children per node by depth in the recycled tree (Token
    Recycling's static tree, cut to what a CPU step can verify); ``room``: the most
    nodes a request's forest keeps for these sources. Every method takes the request's
    pool; None (no pool) learns and drafts nothing.
    """

    def __init__(self, store: OutputStore | None, recycled: RecycledTables | None,
                 span: int, recycled_widths: tuple[int, ...], room: int):
        self.store = store
        self.recycled = recycled
        self.span = span
        self.recycled_widths = recycled_widths
        self.room = room

    @property
    def enabled(self) -> bool:
        return self.store is not None or self.recycled is not None

    @property
    def nbytes(self) -> dict[str, int]:
        return {"shared_outputs_bytes": self.store.nbytes if self.store is not None else 0,
                "recycled_bytes": self.recycled.nbytes if self.recycled is not None else 0}

    def learn_outputs(self, pool: int | None, row: np.ndarray, length: int,
                      start: int) -> None:
        """The request's generated tokens ``row[start:length]`` are new (its m-grams
        may reach back before ``start``)."""
        if self.store is not None and pool is not None and start < length:
            self.store.add(pool, row[:length], start)

    def learn_logits(self, pool: int | None, row: np.ndarray, length: int,
                     top_ids: np.ndarray | None) -> None:
        """``top_ids``: the top-k of the logits that produced ``row[length - 1]``, whose
        input was ``row[length - 2]``."""
        if (self.recycled is None or pool is None or length < 2 or top_ids is None
                or top_ids.shape[-1] < self.recycled.k):
            return
        k = self.recycled.k
        self.recycled.get_or_create(pool).update(
            row[length - 2:length - 1].astype(np.int32),
            np.ascontiguousarray(top_ids[None, :k], np.int32))

    def branches(self, pool: int | None, row: np.ndarray, length: int, room: int
                 ) -> Branches:
        """Up to ``room`` nodes: the store's chain, then the recycled tree."""
        parts_tokens, parts_parents, parts_origin = [], [], []
        n = 0
        if pool is None or room <= 0:
            return _no_branches()
        if self.store is not None:
            chain, _ = self.store.draft(pool, row[:length], min(self.span, room))
            if len(chain):
                parts_tokens.append(chain)
                parts_parents.append(np.arange(-1, len(chain) - 1, dtype=np.int32))
                parts_origin.append(np.full(len(chain), ORIGIN_SHARED, np.int8))
                n = len(chain)
        table = self.recycled.get(pool) if self.recycled is not None and room - n > 0 else None
        if table is not None and length:
            tokens, parents = table.draft(int(row[length - 1]), self.recycled_widths, room - n)
            if len(tokens):
                parts_tokens.append(tokens)
                parts_parents.append(np.where(parents >= 0, parents + n, -1).astype(np.int32))
                parts_origin.append(np.full(len(tokens), ORIGIN_RECYCLED, np.int8))
        if not parts_tokens:
            return _no_branches()
        return Branches(*(np.concatenate(p) for p in (parts_tokens, parts_parents,
                                                      parts_origin)))

    def chain(self, pool: int | None, row: np.ndarray, length: int, max_len: int
              ) -> tuple[np.ndarray, int]:
        """Chain mode's fallback when the request's own text has no continuation: the
        store's chain, else the recycled table's greedy path. Returns (tokens, origin)."""
        if pool is None or max_len <= 0:
            return _EMPTY, ORIGIN_OWN
        if self.store is not None:
            chain, _ = self.store.draft(pool, row[:length], max_len)
            if len(chain):
                return chain, ORIGIN_SHARED
        table = self.recycled.get(pool) if self.recycled is not None else None
        if table is not None and length:
            tokens, _ = table.draft(int(row[length - 1]), (1,) * max_len, max_len)
            if len(tokens):
                return tokens, ORIGIN_RECYCLED
        return _EMPTY, ORIGIN_OWN


def _no_branches() -> Branches:
    return Branches(_EMPTY, _EMPTY, np.empty(0, np.int8))


def with_branches(nodes: ForestNodes, extra: Branches, limit: int
                  ) -> tuple[ForestNodes, np.ndarray]:
    """At most ``limit`` nodes: ``nodes``' leading retrieved chain first, then ``extra``
    (re-indexed), then as many of ``nodes``' next-next branches as fit (their worst
    ranks go first; both parts are parent-first, so a cut prefix stays a forest).
    Returns the forest and every node's origin."""
    n_own = len(nodes.token_ids)
    chain = 0  # the retrieved continuation: leading nodes that are not heads
    while chain < n_own and nodes.rank[chain] < 0:
        chain += 1
    chain = min(chain, limit)
    size = min(len(extra.token_ids), limit - chain)
    keep = min(n_own, max(chain, limit - size))
    origin = np.zeros(keep + size, np.int8)
    if size == 0:
        return ForestNodes(*(a[:keep] for a in nodes)), origin
    origin[keep:] = extra.origin[:size]
    parents = extra.parents[:size]
    return ForestNodes(
        np.concatenate((nodes.token_ids[:keep], extra.token_ids[:size])).astype(np.int32),
        np.concatenate((nodes.parents[:keep], np.where(parents >= 0, parents + keep, -1)
                        )).astype(np.int32),
        np.concatenate((nodes.match_len[:keep], np.zeros(size, np.int32))).astype(np.int32),
        np.concatenate((nodes.rank[:keep], np.full(size, -1, np.int32))).astype(np.int32)), origin


def prediction_first(nodes: ForestNodes, origin: np.ndarray | None, predicted: np.ndarray,
                     match_len: int, limit: int) -> tuple[ForestNodes, np.ndarray | None]:
    """``predicted`` (a chain under the root) first, then ``nodes``, at most ``limit``.

    The forest's leading chain, when it starts like the prediction, is merged into it:
    its nodes that repeat the prediction's are dropped and the rest hang under the
    last shared one (the prompt often holds the same text as the prediction). Returns
    the forest and every node's origin (None when nothing was predicted)."""
    n_pred = min(len(predicted), limit)
    if n_pred == 0:
        return nodes, origin
    own = len(nodes.token_ids)
    own_origin = origin if origin is not None else np.zeros(own, np.int8)
    chain = 0  # the forest's leading chain: a retrieved continuation, node j under j - 1
    while (chain < own and nodes.rank[chain] < 0 and own_origin[chain] == ORIGIN_OWN
           and nodes.parents[chain] == chain - 1):
        chain += 1
    common = 0
    while common < min(chain, n_pred) and nodes.token_ids[common] == predicted[common]:
        common += 1
    keep = np.arange(common, own)[:max(limit - n_pred, 0)]
    # new index of every kept node; dropped ones map to the prediction node they repeat
    new_index = np.arange(own, dtype=np.int64) - common + n_pred
    new_index[:common] = np.arange(common)
    old_parents = nodes.parents[keep].astype(np.int64)
    parents = np.where(old_parents >= 0, new_index[np.maximum(old_parents, 0)], -1)
    tokens = np.concatenate((predicted[:n_pred], nodes.token_ids[keep]))
    return ForestNodes(
        tokens.astype(np.int32),
        np.concatenate((np.arange(-1, n_pred - 1), parents)).astype(np.int32),
        np.concatenate((np.full(n_pred, match_len), nodes.match_len[keep])).astype(np.int32),
        np.concatenate((np.full(n_pred, -1), nodes.rank[keep])).astype(np.int32),
    ), np.concatenate((np.full(n_pred, ORIGIN_PREDICTION, np.int8), own_origin[keep]))
