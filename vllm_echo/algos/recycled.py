# SPDX-License-Identifier: Apache-2.0
"""Token Recycling's adjacency table (Luo et al., arXiv 2408.08696), engine-free.

The target model's top-k next tokens after a token ``t`` are a good guess at
what follows ``t`` the next time it appears, in any request. Token Recycling
keeps them in a ``[vocab_size, k]`` table (row ``t`` = the top-k the target put
after ``t``, best first; the latest observation overwrites the row) and drafts
a tree from it without any draft model: the root's row gives the depth-1
children, each child's row its own children, and so on, with a width per depth.

The table is one dense int32 array (``vocab_size * k * 4`` bytes: 1.5 MiB for a
49k vocabulary at k = 8); -1 marks an empty entry. Update and draft are numba
kernels: an update is a row copy per observed token, a draft a breadth-first
walk whose output array doubles as its queue, so both cost O(their output).

A row reflects the context of the request that last saw its token, so the engine keeps
one table per pool (tenant, algos/pools.py): ``RecycledTables``, bounded in number.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from numba import njit

_EMPTY = -1


@njit(cache=True)
def recycled_update(table, prev_tokens, topk):
    """``table[prev_tokens[i]] = topk[i, :k]``; out-of-range rows are skipped and
    out-of-range tokens in ``topk`` are stored as empty (-1)."""
    vocab, k = table.shape
    for i in range(prev_tokens.shape[0]):
        t = prev_tokens[i]
        if t < 0 or t >= vocab:
            continue
        for c in range(k):
            v = topk[i, c]
            table[t, c] = v if 0 <= v < vocab else _EMPTY


@njit(cache=True)
def recycled_draft(table, root, widths, max_nodes, out_tokens, out_parents):
    """Breadth-first tree under ``root`` into ``out_tokens/out_parents``; returns its size.

    Node ``j`` at depth ``d`` (1-based) gets the first ``widths[d]`` entries of its
    row as children (the root's children are its first ``widths[0]``); -1 entries
    are skipped. The output is its own queue: nodes are expanded in output order.
    """
    vocab, k = table.shape
    limit = min(max_nodes, out_tokens.shape[0])
    depth_count = widths.shape[0]
    if root < 0 or root >= vocab or limit <= 0 or depth_count == 0:
        return 0
    n = 0
    for c in range(min(widths[0], k)):
        if n >= limit:
            return n
        v = table[root, c]
        if v >= 0:
            out_tokens[n] = v
            out_parents[n] = -1
            n += 1
    # depth of node j: count of nodes on the previous levels, tracked by level bounds
    level_start, level_end, depth = 0, n, 1
    while level_start < level_end and depth < depth_count and n < limit:
        width = min(widths[depth], k)
        for j in range(level_start, level_end):
            t = out_tokens[j]
            for c in range(width):
                if n >= limit:
                    return n
                v = table[t, c]
                if v >= 0:
                    out_tokens[n] = v
                    out_parents[n] = j
                    n += 1
        level_start, level_end, depth = level_end, n, depth + 1
    return n


class RecycledTable:
    """The adjacency table shared by the requests of one pool.

    Args:
        vocab_size: rows (the target's vocabulary).
        k: candidates kept per row, best first.
    """

    __slots__ = ("table",)

    def __init__(self, vocab_size: int, k: int = 8):
        if vocab_size < 1 or k < 1:
            raise ValueError(f"vocab_size and k must be >= 1, got {vocab_size}, {k}")
        self.table = np.full((vocab_size, k), _EMPTY, dtype=np.int32)

    @property
    def k(self) -> int:
        return self.table.shape[1]

    def update(self, prev_tokens: np.ndarray, topk: np.ndarray) -> None:
        """Row ``i``: ``table[prev_tokens[i]] = topk[i, :k]`` (``topk`` best first)."""
        prev = np.ascontiguousarray(prev_tokens, dtype=np.int32).reshape(-1)
        top = np.asarray(topk)
        if top.ndim != 2 or top.shape[0] != prev.shape[0] or top.shape[1] < self.k:
            raise ValueError(f"topk must be [{prev.shape[0]}, >={self.k}], got {top.shape}")
        recycled_update(self.table, prev, np.ascontiguousarray(top[:, :self.k], np.int32))

    def draft(self, root: int, widths: tuple[int, ...],
              max_nodes: int) -> tuple[np.ndarray, np.ndarray]:
        """The tree read from the table as ``(token_ids, parents)`` (int32, parent first,
        ``parents[j] == -1`` for a child of the root)."""
        size = max(int(max_nodes), 0)
        out_tokens = np.empty(size, dtype=np.int32)
        out_parents = np.empty(size, dtype=np.int32)
        n = recycled_draft(self.table, int(root), np.asarray(widths, dtype=np.int64).reshape(-1),
                           size, out_tokens, out_parents)
        return out_tokens[:n], out_parents[:n]

    @property
    def nbytes(self) -> int:
        return self.table.nbytes


class RecycledTables:
    """One RecycledTable per pool, made when the pool first learns; at most
    ``max_pools`` of them: a new pool's table replaces the least recently used pool's
    (learning or drafting counts as use), whose candidates are lost.
    """

    __slots__ = ("vocab_size", "k", "max_pools", "_tables")

    def __init__(self, vocab_size: int, k: int, max_pools: int):
        if vocab_size < 1 or k < 1 or max_pools < 1:
            raise ValueError(f"vocab_size, k and max_pools must be >= 1, got {vocab_size}, "
                             f"{k}, {max_pools}")
        self.vocab_size = vocab_size
        self.k = k
        self.max_pools = max_pools
        self._tables: OrderedDict[int, RecycledTable] = OrderedDict()  # oldest use first

    def get(self, pool: int) -> RecycledTable | None:
        """The pool's table, or None when it has learned nothing (kept or not)."""
        table = self._tables.get(pool)
        if table is not None:
            self._tables.move_to_end(pool)
        return table

    def get_or_create(self, pool: int) -> RecycledTable:
        """The pool's table, made empty if it has none (evicting the least recently
        used pool's at the bound)."""
        table = self.get(pool)
        if table is None:
            if len(self._tables) >= self.max_pools:
                self._tables.popitem(last=False)
            table = self._tables[pool] = RecycledTable(self.vocab_size, self.k)
        return table

    @property
    def pools(self) -> list[int]:
        """The pools that have a table, least recently used first."""
        return list(self._tables)

    @property
    def nbytes(self) -> int:
        # list() first: the stats thread reads this while the drafting thread adds tables
        return sum(table.nbytes for table in list(self._tables.values()))


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels with the dtypes the methods pass."""
    table = RecycledTable(4, 2)
    table.update(np.array([0, 1], np.int32), np.array([[1, 2], [3, -1]], np.int32))
    table.draft(0, (2, 1), 4)
