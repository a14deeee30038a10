# SPDX-License-Identifier: Apache-2.0
"""The k most likely tokens of logits rows and their log-probabilities, compiled.

LogitSpec's next-next heads need, for each request, the top-k of the target's last
logits and their log-softmax. In torch that is a top-k and a log-sum-exp over the
vocabulary, two parallel reductions whose worker threads have gone idle while the
engine ran its Python between the forward and the proposer; waking them costs more
than the reductions. Here both run on the calling thread: a vectorised pass for the
maximum of each block of tokens, a bounded min-heap for the top-k over the few blocks
whose maximum can place a token in it, and a vectorised sum of exponentials.

No vectorised ``exp`` is at hand for numba without Intel's SVML, so the sum uses
exp(y) = exp(y / 256) ** 256: for y in [-60, 0] (a token 60 nats below the best adds
under 1e-26 of its mass, and is clamped there) y / 256 lies in [-0.24, 0], where
exp's Taylor polynomial of degree 6 is within 1e-8, and eight squarings give the
power. The log-sum-exp comes out within about 1e-5 of the exact one.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_CLAMP = np.float32(-60.0)
_SCALE = np.float32(1.0 / 256.0)
# What the sum may reorder (to vectorise it); not "no NaNs / infinities".
_SUM_FLAGS = {"reassoc", "contract", "nsz", "arcp"}


@njit(cache=True, nogil=True, fastmath=_SUM_FLAGS)
def _sum_exp_below(row, peak):
    """sum_j exp(row[j] - peak), for peak >= every row[j]."""
    c1, c2, c3 = np.float32(1.0 / 2), np.float32(1.0 / 6), np.float32(1.0 / 24)
    c4, c5 = np.float32(1.0 / 120), np.float32(1.0 / 720)
    one = np.float32(1.0)
    total = np.float32(0.0)
    for j in range(row.size):
        y = max(row[j] - peak, _CLAMP) * _SCALE
        e = one + y * (one + y * (c1 + y * (c2 + y * (c3 + y * (c4 + y * c5)))))
        for _ in range(8):  # exp(y / 256) ** 256
            e = e * e
        total += e
    return total


@njit(cache=True, nogil=True)
def _worse(value_a, index_a, value_b, index_b):
    """a ranks below b: a lower value, or the same value at a later index."""
    return value_a < value_b or (value_a == value_b and index_a > index_b)


@njit(cache=True, nogil=True)
def _sift_down(values, ids, size, pos):
    while True:
        child = 2 * pos + 1
        if child >= size:
            return
        if child + 1 < size and _worse(values[child + 1], ids[child + 1],
                                       values[child], ids[child]):
            child += 1
        if not _worse(values[child], ids[child], values[pos], ids[pos]):
            return
        values[pos], values[child] = values[child], values[pos]
        ids[pos], ids[child] = ids[child], ids[pos]
        pos = child


@njit(cache=True, nogil=True)
def _top_k_row(row, k, out_ids, out_values):
    """The k best (value, index) of ``row``, best first, ties to the lower index."""
    values = np.empty(k, np.float32)
    ids = np.empty(k, np.int32)
    for j in range(k):  # heapify the first k: the worst kept at the root
        values[j] = row[j]
        ids[j] = j
    for start in range(k // 2 - 1, -1, -1):
        _sift_down(values, ids, k, start)
    for j in range(k, row.size):
        if row[j] > values[0]:  # an equal value at a later index ranks below the root
            values[0] = row[j]
            ids[0] = j
            _sift_down(values, ids, k, 0)
    for size in range(k, 0, -1):  # heap sort: each popped root is the worst left
        out_values[size - 1] = values[0]
        out_ids[size - 1] = ids[0]
        values[0] = values[size - 1]
        ids[0] = ids[size - 1]
        _sift_down(values, ids, size - 1, 0)


_BLOCK = 64  # tokens per block of the top-k's first pass
_LANES = 16  # independent maxima per block, so that the pass vectorises


@njit(cache=True, nogil=True)
def _block_maxima(row, out):
    """``out[b]``: the largest value of ``row[b * _BLOCK:(b + 1) * _BLOCK]``, for every
    full block (NaNs skipped, as the heap skips them)."""
    lanes = np.empty(_LANES, np.float32)
    for b in range(out.size):
        base = b * _BLOCK
        lanes[:] = -np.inf
        for chunk in range(0, _BLOCK, _LANES):
            for lane in range(_LANES):
                value = row[base + chunk + lane]
                lanes[lane] = value if value > lanes[lane] else lanes[lane]
        best = lanes[0]
        for lane in range(1, _LANES):
            best = lanes[lane] if lanes[lane] > best else best
        out[b] = best


@njit(cache=True, nogil=True)
def _top_k_by_blocks(row, k, out_ids, out_values):
    """:func:`_top_k_row`'s result, with the heap fed only the blocks whose maximum
    reaches the k-th largest block maximum (and the last, partial block): at least k
    tokens reach it, so a token of any other block is below the k-th largest token."""
    blocks = row.size // _BLOCK
    if blocks < 2 * k:  # too few blocks to leave any out
        _top_k_row(row, k, out_ids, out_values)
        return
    maxima = np.empty(blocks, np.float32)
    _block_maxima(row, maxima)
    block_ids = np.empty(k, np.int32)
    block_values = np.empty(k, np.float32)
    _top_k_row(maxima, k, block_ids, block_values)
    threshold = block_values[k - 1]
    size = row.size - blocks * _BLOCK
    for b in range(blocks):
        if maxima[b] >= threshold:
            size += _BLOCK
    values = np.empty(size, np.float32)
    ids = np.empty(size, np.int64)
    size = 0
    for b in range(blocks + 1):  # ascending ids: the heap's ties still go to the lower
        if b == blocks or maxima[b] >= threshold:
            for j in range(b * _BLOCK, min((b + 1) * _BLOCK, row.size)):
                values[size] = row[j]
                ids[size] = j
                size += 1
    picked = np.empty(k, np.int32)
    _top_k_row(values, k, picked, out_values)
    for j in range(k):
        out_ids[j] = ids[picked[j]]


@njit(cache=True, nogil=True)
def _top_logprobs_row(row, k, out_ids, out_logp):
    _top_k_by_blocks(row, k, out_ids, out_logp)
    peak = out_logp[0]
    if np.isfinite(peak):
        norm = peak + np.log(_sum_exp_below(row, peak))
    else:  # every logit -inf (or a NaN): no distribution to normalise
        norm = np.float32(np.nan)
    for j in range(k):
        out_logp[j] -= norm


@njit(cache=True, nogil=True)
def _check_rows(rows, num_rows):
    for i in range(rows.size):
        if rows[i] < 0 or rows[i] >= num_rows:
            raise ValueError("rows must index the logits' rows")


@njit(cache=True, nogil=True)
def _top_logprobs(logits, rows, k, out_ids, out_logp):
    _check_rows(rows, logits.shape[0])
    for i in range(rows.size):
        _top_logprobs_row(logits[rows[i]], k, out_ids[i], out_logp[i])


@njit(cache=True, nogil=True)
def _top_logprobs_bfloat16(bits, rows, k, out_ids, out_logp):
    """:func:`_top_logprobs` of bfloat16 logits given as their 16-bit patterns: each
    row is widened to float32 (exactly: a bfloat16 is a float32's upper half)."""
    _check_rows(rows, bits.shape[0])
    widened = np.empty(bits.shape[1], np.uint32)
    row = widened.view(np.float32)
    for i in range(rows.size):
        source = bits[rows[i]]
        for j in range(source.size):
            widened[j] = np.uint32(source[j]) << 16
        _top_logprobs_row(row, k, out_ids[i], out_logp[i])


def top_logprobs(logits: np.ndarray, rows: np.ndarray, k: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """For each ``logits[rows[i]]`` (float32, 2-D): its ``k`` most likely token ids,
    best first (ties: the lower id), int32, and their log-softmax, float32; both of
    shape ``(len(rows), min(k, vocabulary))``."""
    if logits.ndim != 2 or logits.dtype != np.float32:
        raise ValueError(f"logits must be a 2-D float32 array, got {logits.ndim}-D "
                         f"{logits.dtype}")
    return _run(_top_logprobs, logits, rows, k)


def top_logprobs_bfloat16(bits: np.ndarray, rows: np.ndarray, k: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`top_logprobs` of bfloat16 logits, passed as their bit patterns (numpy has
    no bfloat16: torch's ``logits.view(torch.uint16).numpy()``, 2-D, C-contiguous).
    Same results as for the logits converted to float32, without that copy."""
    if bits.ndim != 2 or bits.dtype != np.uint16 or not bits.flags.c_contiguous:
        raise ValueError(f"bits must be a 2-D C-contiguous uint16 array (bfloat16 bit "
                         f"patterns), got {bits.ndim}-D {bits.dtype}")
    return _run(_top_logprobs_bfloat16, bits, rows, k)


def _run(kernel, logits: np.ndarray, rows: np.ndarray, k: int
         ) -> tuple[np.ndarray, np.ndarray]:
    rows = np.asarray(rows, dtype=np.int64)  # checked by the kernel
    k = min(int(k), logits.shape[1])
    if k < 1:
        raise ValueError(f"k must be >= 1 and the vocabulary not empty, got k={k}")
    ids = np.empty((rows.size, k), np.int32)
    logp = np.empty((rows.size, k), np.float32)
    kernel(logits, rows, k, ids, logp)
    return ids, logp


def warm_up() -> None:
    """Compile (or load from numba's cache) now, not inside the first decode step."""
    top_logprobs(np.zeros((1, 4), np.float32), np.zeros(1, np.int64), 2)
    top_logprobs_bfloat16(np.zeros((1, 4), np.uint16), np.zeros(1, np.int64), 2)
