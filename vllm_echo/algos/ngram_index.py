# SPDX-License-Identifier: Apache-2.0
"""Incremental m-gram retrieval index over one request's tokens (LogitSpec's pool).

For every m-gram (m = 1..max_ngram) of the request's tokens that is followed by
at least one token, the index maps the m-gram to one occurrence, identified by
``e``: the position right after the m-gram, where its continuation starts. The
continuation is ``tokens[e : min(e + span, L)]`` — positions into the request's
own token array, never copies of spans.

Which occurrence (LogitSpec reference rule, `Pool` in smart-lty/LogitSpec): the
latest occurrence whose continuation is full-length (``L - e >= span``); while
no occurrence is full-length, the one with the longest continuation, i.e. the
earliest. As tokens arrive, an occurrence's continuation grows; the moment it
becomes full-length it replaces the stored one. So one update touches only the
positions whose continuation was born or became full in that update: per-step
cost is O(new tokens x max_ngram), independent of context length.

The table is open addressing with linear probing; keys are the XXH64 of the
m-gram's tokens (see hashing.py), values are ``e`` (-1 = empty slot). A lookup
re-checks the m-gram's tokens at ``e``, so a 64-bit hash collision can only
cause a miss, never a wrong continuation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vllm_echo.algos.hashing import xxh64_tokens

_EMPTY = -1
_MIN_TABLE = 64


@njit(cache=True)
def _probe(keys, vals, h):
    """Slot holding key ``h``, or the empty slot where it would go."""
    mask = keys.shape[0] - 1
    slot = np.int64(h & np.uint64(mask))
    while vals[slot] != _EMPTY and keys[slot] != h:
        slot = (slot + 1) & mask
    return slot


@njit(cache=True)
def _put(tokens, e, m, keys, vals, overwrite):
    """Store occurrence ``e`` for the m-gram ``tokens[e-m:e]``; returns 1 if a slot was taken."""
    h = xxh64_tokens(tokens, e - m, m, np.uint64(0))
    slot = _probe(keys, vals, h)
    if vals[slot] == _EMPTY:
        keys[slot] = h
        vals[slot] = e
        return 1
    if overwrite:
        vals[slot] = e
    return 0


@njit(cache=True)
def _store_position(tokens, e, max_ngram, keys, vals, overwrite):
    added = 0
    top = min(max_ngram, e)
    for m in range(1, top + 1):
        added += _put(tokens, e, m, keys, vals, overwrite)
    return added


@njit(cache=True)
def index_extend(tokens, old_len, new_len, max_ngram, span, keys, vals):
    """Bring the index from ``tokens[:old_len]`` to ``tokens[:new_len]``.

    Returns the number of newly occupied slots. The caller guarantees room for
    ``(new_len - old_len + span) * max_ngram`` more entries at its load factor.
    """
    added = 0
    # Occurrences that already had a continuation and become full-length now.
    lo = max(1, old_len - span + 1)
    hi = min(old_len - 1, new_len - span)
    for e in range(lo, hi + 1):
        added += _store_position(tokens, e, max_ngram, keys, vals, True)
    # Occurrences that get their first continuation token now; in increasing e,
    # so among full-length ones the latest wins and among partial ones the earliest.
    for e in range(max(1, old_len), new_len):
        full = new_len - e >= span
        added += _store_position(tokens, e, max_ngram, keys, vals, full)
    return added


@njit(cache=True)
def index_lookup(tokens, length, query, max_ngram, keys, vals):
    """Longest-first lookup of the suffix of ``query`` (m = max_ngram..1).

    ``query`` holds the tail of the context being matched (it may end with
    hypothetical tokens that are not in ``tokens``). Returns ``(e, m)``, the
    continuation start and the matched length, or ``(-1, 0)`` on a miss.
    """
    qlen = query.shape[0]
    for m in range(min(max_ngram, qlen), 0, -1):
        h = xxh64_tokens(query, qlen - m, m, np.uint64(0))
        slot = _probe(keys, vals, h)
        e = vals[slot]
        if e == _EMPTY or e >= length:
            continue
        same = True
        for j in range(m):
            if tokens[e - m + j] != query[qlen - m + j]:
                same = False
                break
        if same:
            return e, m
    return -1, 0


@njit(cache=True)
def _rehash(old_keys, old_vals, keys, vals):
    for i in range(old_vals.shape[0]):
        if old_vals[i] != _EMPTY:
            slot = _probe(keys, vals, old_keys[i])
            keys[slot] = old_keys[i]
            vals[slot] = old_vals[i]


class NgramIndex:
    """The retrieval index of one request: its token array plus the hash table.

    Args:
        max_ngram: longest m-gram indexed (LogitSpec default 3).
        span: continuation length stored and returned (LogitSpec default 20).
    """

    __slots__ = ("max_ngram", "span", "tokens", "length", "keys", "vals", "used")

    def __init__(self, max_ngram: int, span: int, capacity_hint: int = 256):
        self.max_ngram = max_ngram
        self.span = span
        self.tokens = np.empty(max(capacity_hint, 16), dtype=np.int32)
        self.length = 0
        size = _MIN_TABLE
        while size < 2 * capacity_hint * max_ngram:
            size *= 2
        self.keys = np.zeros(size, dtype=np.uint64)
        self.vals = np.full(size, _EMPTY, dtype=np.int32)
        self.used = 0

    def _reserve(self, new_len: int) -> None:
        if new_len > self.tokens.shape[0]:
            grown = np.empty(max(new_len, 2 * self.tokens.shape[0]), dtype=np.int32)
            grown[: self.length] = self.tokens[: self.length]
            self.tokens = grown
        # Keep the load factor <= 1/2 after the worst case of this update.
        need = self.used + (new_len - self.length + self.span) * self.max_ngram
        size = self.keys.shape[0]
        if 2 * need > size:
            while 2 * need > size:
                size *= 2
            keys = np.zeros(size, dtype=np.uint64)
            vals = np.full(size, _EMPTY, dtype=np.int32)
            _rehash(self.keys, self.vals, keys, vals)
            self.keys, self.vals = keys, vals

    def extend(self, new_tokens: np.ndarray) -> None:
        """Append tokens and index them (O(len(new_tokens) * max_ngram))."""
        n = new_tokens.shape[0]
        if n == 0:
            return
        new_len = self.length + n
        self._reserve(new_len)
        self.tokens[self.length:new_len] = new_tokens
        self.used += index_extend(self.tokens, self.length, new_len, self.max_ngram,
                                  self.span, self.keys, self.vals)
        self.length = new_len

    def lookup(self, query: np.ndarray) -> np.ndarray:
        """Continuation for the longest indexed suffix of ``query`` (empty on a miss)."""
        e, _ = index_lookup(self.tokens, self.length, np.ascontiguousarray(query, np.int32),
                            self.max_ngram, self.keys, self.vals)
        if e < 0:
            return self.tokens[:0]
        return self.tokens[e:min(e + self.span, self.length)]

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.keys.nbytes + self.vals.nbytes
