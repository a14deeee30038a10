# SPDX-License-Identifier: Apache-2.0
"""Other requests' outputs as a draft source: a bounded, shared m-gram table.

What one request generated is often what the next one will (templates, repeated
questions, boilerplate code). The store counts, for every m-gram (m in
``orders``) of every request's tokens, which tokens followed it, and drafts a
chain by backoff: the longest order whose entry exists gives its most counted
continuation, which is appended, and so on. ``support`` (the chosen count over
the entry's total) is a confidence the caller can cut the chain on.

Isolation: every entry is keyed by (pool, m, m-gram), the pool being a tenant
(vLLM's ``cache_salt``, see algos/pools.py), so one tenant's outputs never draft
for another. The key is a 64-bit XXH64 of the m-gram seeded by a mix of pool
and m, stored in full in its slot, so entries of two pools (or orders) only
meet on a 64-bit collision.

Bounded: one open-addressing table sized from ``max_bytes`` once and never
grown. A slot holds its key and ``width`` (token, count) pairs. An insert probes
at most ``probe`` slots; when they are all taken by other keys it evicts the one
with the smallest total count. In a slot whose pairs are full, a new token
replaces the least counted one. Counts decay with a half-life in tokens added
(each increment is ``2 ** (tokens_added / half_life)``, rescaled before float32
overflows), so eviction prefers what is old and rare over what is recent or
frequent. Per token added: ``len(orders)`` hashes and probes, O(probe * width).
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

from vllm_echo.algos.hashing import xxh64_tokens
from vllm_echo.algos.pools import pool_id

_EMPTY_KEY = uint64(0)
_NO_TOKEN = -1
_GOLDEN = uint64(0x9E3779B97F4A7C15)
_RESCALE_AT = 2.0 ** 64  # increment that triggers rescaling every count by 1 / increment

# meta (int64): probe window, entries, evictions, then the orders, longest first
_META_PROBE, _META_ENTRIES, _META_EVICTIONS, _META_ORDERS = 0, 1, 2, 3
# clock (float64): current increment, growth per token added
_CLOCK_INC, _CLOCK_GROWTH = 0, 1


@njit(inline="always")
def _mix64(x):
    """splitmix64's finalizer: a bijective 64-bit mix."""
    x = (x ^ (x >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> uint64(27))) * uint64(0x94D049BB133111EB)
    return x ^ (x >> uint64(31))


@njit(cache=True)
def entry_key(pool, m, tokens, end):
    """64-bit key of (pool, m, tokens[end-m:end]); never 0 (the empty slot)."""
    seed = _mix64(uint64(pool) + uint64(m) * _GOLDEN)
    h = xxh64_tokens(tokens, end - m, m, seed)
    return h if h != _EMPTY_KEY else uint64(1)


@njit(inline="always")
def _home(key, slots):
    # Lemire's multiply-shift range reduction of the key's high 32 bits: any slot count.
    return np.int64(((key >> uint64(32)) * uint64(slots)) >> uint64(32))


@njit(cache=True)
def _find(keys, window, key):
    """Slot holding ``key``, or -1. Slots are never emptied, so an empty one ends the search."""
    slots = keys.shape[0]
    slot = _home(key, slots)
    for _ in range(window):
        k = keys[slot]
        if k == key:
            return slot
        if k == _EMPTY_KEY:
            return -1
        slot += 1
        if slot == slots:
            slot = 0
    return -1


@njit(cache=True)
def _claim(table, key):
    """Slot for ``key``: its own, else the first empty one, else the least counted of
    the probe window, cleared (an eviction)."""
    keys, toks, counts, meta, clock = table
    slots = keys.shape[0]
    slot = _home(key, slots)
    victim, victim_total = -1, np.inf
    for _ in range(meta[_META_PROBE]):
        k = keys[slot]
        if k == key:
            return slot
        if k == _EMPTY_KEY:
            keys[slot] = key
            meta[_META_ENTRIES] += 1
            return slot
        total = 0.0
        for c in range(counts.shape[1]):
            total += counts[slot, c]
        if total < victim_total:
            victim, victim_total = slot, total
        slot += 1
        if slot == slots:
            slot = 0
    keys[victim] = key
    toks[victim, :] = _NO_TOKEN
    counts[victim, :] = 0.0
    meta[_META_EVICTIONS] += 1
    return victim


@njit(cache=True)
def _count(table, slot, token):
    """Add the current increment to ``token``'s count in ``slot`` (taking the least
    counted pair if the token is new and the pairs are full)."""
    keys, toks, counts, meta, clock = table
    inc = np.float32(clock[_CLOCK_INC])
    low = 0
    for c in range(toks.shape[1]):
        t = toks[slot, c]
        if t == token:
            counts[slot, c] += inc
            return
        if t == _NO_TOKEN:
            toks[slot, c] = token
            counts[slot, c] = inc
            return
        if counts[slot, c] < counts[slot, low]:
            low = c
    toks[slot, low] = token
    counts[slot, low] = inc


@njit(cache=True)
def _rescale(counts, clock):
    scale = np.float32(1.0 / clock[_CLOCK_INC])
    flat = counts.reshape(-1)
    for i in range(flat.shape[0]):
        flat[i] *= scale
    clock[_CLOCK_INC] = 1.0


@njit(cache=True)
def store_add(table, pool, tokens, start):
    """Count ``tokens[j]`` (j >= max(start, 1)) after each of its m-grams ``tokens[j-m:j]``."""
    keys, toks, counts, meta, clock = table
    for j in range(max(start, 1), tokens.shape[0]):
        clock[_CLOCK_INC] *= clock[_CLOCK_GROWTH]
        if clock[_CLOCK_INC] >= _RESCALE_AT:
            _rescale(counts, clock)
        token = tokens[j]
        if token < 0:
            continue
        for o in range(_META_ORDERS, meta.shape[0]):
            m = meta[o]
            if m > j:
                continue
            slot = _claim(table, entry_key(pool, m, tokens, j))
            _count(table, slot, token)


@njit(cache=True)
def store_draft(table, pool, context, max_len):
    """Backoff chain after ``context``: ``(tokens int32, support float32)``, at most ``max_len``."""
    keys, toks, counts, meta, clock = table
    max_order = meta[_META_ORDERS]
    keep = min(max_order, context.shape[0])
    buf = np.empty(keep + max_len, dtype=np.int32)
    buf[:keep] = context[context.shape[0] - keep:]
    support = np.empty(max_len, dtype=np.float32)
    n = 0
    while n < max_len:
        end = keep + n
        slot = -1
        for o in range(_META_ORDERS, meta.shape[0]):
            m = meta[o]
            if m > end:
                continue
            slot = _find(keys, meta[_META_PROBE], entry_key(pool, m, buf, end))
            if slot >= 0:
                break
        if slot < 0:
            break
        best, total = 0, 0.0
        for c in range(toks.shape[1]):
            if toks[slot, c] == _NO_TOKEN:
                break
            total += counts[slot, c]
            if counts[slot, c] > counts[slot, best]:
                best = c
        if toks[slot, best] == _NO_TOKEN:
            break
        buf[end] = toks[slot, best]
        support[n] = counts[slot, best] / total if total > 0.0 else 0.0
        n += 1
    return buf[keep:keep + n].copy(), support[:n].copy()


class OutputStore:
    """Backoff m-gram continuations of every request's tokens, per pool, in fixed memory.

    Args:
        max_bytes: bound on the arrays' total size (``nbytes`` never exceeds it).
        orders: m-gram lengths counted and matched (tried longest first).
        width: continuations kept per entry.
        probe: slots an insert or lookup probes before evicting / missing.
        half_life: tokens added after which a count weighs half as much as a new one
            (default: the number of slots).
    """

    __slots__ = ("keys", "toks", "counts", "meta", "clock", "orders", "width", "_table")

    def __init__(self, max_bytes: int = 32 << 20, orders: tuple[int, ...] = (4, 3, 2),
                 width: int = 4, probe: int = 8, half_life: float | None = None):
        orders = tuple(sorted({int(m) for m in orders}, reverse=True))
        if not orders or orders[-1] < 1:
            raise ValueError(f"orders must be non-empty and >= 1, got {orders}")
        if width < 1 or probe < 1:
            raise ValueError(f"width and probe must be >= 1, got {width}, {probe}")
        self.orders, self.width = orders, int(width)
        self.meta = np.zeros(_META_ORDERS + len(orders), dtype=np.int64)
        self.meta[_META_ORDERS:] = orders
        self.clock = np.zeros(2, dtype=np.float64)
        slot_bytes = 8 + 8 * self.width  # key + width (int32 token, float32 count)
        slots = min((int(max_bytes) - self.meta.nbytes - self.clock.nbytes) // slot_bytes,
                    (1 << 32) - 1)
        if slots < 1:
            raise ValueError(f"max_bytes={max_bytes} holds no slot of {slot_bytes} bytes")
        self.meta[_META_PROBE] = min(int(probe), slots)
        self.clock[_CLOCK_INC] = 1.0
        self.clock[_CLOCK_GROWTH] = 2.0 ** (1.0 / float(half_life or slots))
        # Written now (not calloc'ed): the memory is taken at start, not as entries come.
        self.keys = np.full(slots, 0, dtype=np.uint64)
        self.toks = np.full((slots, self.width), _NO_TOKEN, dtype=np.int32)
        self.counts = np.full((slots, self.width), 0.0, dtype=np.float32)
        self._table = (self.keys, self.toks, self.counts, self.meta, self.clock)

    def add(self, pool: int, tokens: np.ndarray, start: int) -> None:
        """Count ``tokens[j]`` (j >= max(start, 1)) after each of its preceding m-grams.

        Called with a request's whole token row so far and ``start`` = its first new
        token, so the m-grams of the first new tokens reach back before ``start``.
        """
        store_add(self._table, int(pool), np.ascontiguousarray(tokens, dtype=np.int32),
                  int(start))

    def draft(self, pool: int, context: np.ndarray,
              max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Backoff chain after ``context``: ``(token_ids int32, support float32)``,
        ``support[j]`` = the chosen token's count / its entry's total count."""
        return store_draft(self._table, int(pool),
                           np.ascontiguousarray(context, dtype=np.int32), max(int(max_len), 0))

    @property
    def slots(self) -> int:
        return self.keys.shape[0]

    @property
    def entries(self) -> int:
        return int(self.meta[_META_ENTRIES])

    @property
    def evictions(self) -> int:
        return int(self.meta[_META_EVICTIONS])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._table)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels with the dtypes the methods pass."""
    store = OutputStore(max_bytes=4096)
    tokens = np.array([1, 2, 3, 4, 5, 1, 2, 3], np.int32)
    store.add(pool_id("warm-up"), tokens, 0)
    store.draft(pool_id("warm-up"), tokens[:3], 4)
