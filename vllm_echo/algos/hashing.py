# SPDX-License-Identifier: Apache-2.0
"""XXH64 of int32 token spans, in numba.

The m-gram index keys its hash table with a 64-bit hash of the m-gram's tokens,
read as little-endian int32 bytes: ``xxh64_tokens(t, s, m, seed)`` equals
``xxhash.xxh64_intdigest(t[s:s+m].astype('<i4').tobytes(), seed)`` bit for bit
(checked by tests/unit/test_hashing.py). numba integer arithmetic on uint64
wraps modulo 2**64, which is exactly what XXH64 needs; every constant and
intermediate is kept uint64 so numba never promotes to float.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

_P1 = uint64(0x9E3779B185EBCA87)
_P2 = uint64(0xC2B2AE3D27D4EB4F)
_P3 = uint64(0x165667B19E3779F9)
_P4 = uint64(0x85EBCA77C2B2AE63)
_P5 = uint64(0x27D4EB2F165667C5)
_MASK32 = uint64(0xFFFFFFFF)


@njit(inline="always")
def _rotl(x, r):
    return (x << uint64(r)) | (x >> uint64(64 - r))


@njit(inline="always")
def _round(acc, lane):
    acc = acc + lane * _P2
    return _rotl(acc, 31) * _P1


@njit(inline="always")
def _merge(acc, v):
    acc = acc ^ _round(uint64(0), v)
    return acc * _P1 + _P4


@njit(inline="always")
def _u32(tokens, i):
    return uint64(tokens[i]) & _MASK32


@njit(inline="always")
def _u64(tokens, i):
    # Two consecutive little-endian int32 tokens form one little-endian 64-bit lane.
    return _u32(tokens, i) | (_u32(tokens, i + 1) << uint64(32))


@njit(cache=True)
def xxh64_tokens(tokens, start, count, seed):
    """XXH64 of ``tokens[start:start+count]`` (int32) as little-endian bytes."""
    nbytes = uint64(4 * count)
    i = start
    end = start + count
    s = uint64(seed)
    if count >= 8:  # at least one 32-byte stripe (8 tokens)
        v1 = s + _P1 + _P2
        v2 = s + _P2
        v3 = s
        v4 = s - _P1
        while i + 8 <= end:
            v1 = _round(v1, _u64(tokens, i))
            v2 = _round(v2, _u64(tokens, i + 2))
            v3 = _round(v3, _u64(tokens, i + 4))
            v4 = _round(v4, _u64(tokens, i + 6))
            i += 8
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _merge(h, v1)
        h = _merge(h, v2)
        h = _merge(h, v3)
        h = _merge(h, v4)
    else:
        h = s + _P5
    h = h + nbytes
    while i + 2 <= end:  # 8-byte lanes
        h = h ^ _round(uint64(0), _u64(tokens, i))
        h = _rotl(h, 27) * _P1 + _P4
        i += 2
    if i < end:  # one 4-byte lane left
        h = h ^ (_u32(tokens, i) * _P1)
        h = _rotl(h, 23) * _P2 + _P3
    # Token spans are whole int32s, so XXH64's 1-byte tail loop never runs.
    h = h ^ (h >> uint64(33))
    h = h * _P2
    h = h ^ (h >> uint64(29))
    h = h * _P3
    h = h ^ (h >> uint64(32))
    return h


def xxh64_tokens_py(tokens: np.ndarray, seed: int = 0) -> int:
    """Convenience wrapper for tests and Python callers."""
    arr = np.ascontiguousarray(tokens, dtype=np.int32)
    return int(xxh64_tokens(arr, 0, arr.shape[0], np.uint64(seed)))
