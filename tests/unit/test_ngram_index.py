# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from reference_logitspec import build_pool, lookup
from vllm_echo.algos.ngram_index import NgramIndex


def _index(tokens, max_ngram=3, span=20, chunks=None):
    index = NgramIndex(max_ngram, span, capacity_hint=4)
    tokens = np.asarray(tokens, dtype=np.int32)
    bounds = chunks or [len(tokens)]
    start = 0
    for end in bounds:
        index.extend(tokens[start:end])
        start = end
    return index


def test_lookup_returns_continuation_positions_exactly():
    #          0  1  2  3  4  5  6  7  8
    tokens = [5, 6, 7, 8, 9, 5, 6, 7, 1]
    index = _index(tokens, span=3)
    # (5,6,7) occurs at e=3 (cont 8,9,5: full) and e=8 (cont 1: partial) -> e=3
    assert index.lookup(np.array([5, 6, 7])).tolist() == [8, 9, 5]
    assert index.lookup(np.array([0, 9])).tolist() == [5, 6, 7]  # falls back to m=1 (9)
    assert index.lookup(np.array([42])).tolist() == []  # miss


def test_latest_full_length_occurrence_wins():
    span = 2
    tokens = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2, 30]
    index = _index(tokens, span=span)
    # occurrences of (1,2): e=2 (full), e=6 (full), e=10 (partial [30]) -> e=6
    assert index.lookup(np.array([1, 2])).tolist() == [20, 21]
    index.extend(np.array([31], dtype=np.int32))  # e=10 becomes full-length
    assert index.lookup(np.array([1, 2])).tolist() == [30, 31]


def test_partial_only_occurrences_keep_the_earliest():
    tokens = [3, 4, 1, 3, 4, 2]
    index = _index(tokens, span=20)
    assert index.lookup(np.array([3, 4])).tolist() == [1, 3, 4, 2]


def test_m_falls_back_from_3_to_2_to_1():
    tokens = [7, 1, 2, 3, 50, 9, 2, 3, 60, 8, 3, 70, 0]
    index = _index(tokens, span=1)
    assert index.lookup(np.array([1, 2, 3])).tolist() == [50]   # m=3
    assert index.lookup(np.array([5, 2, 3])).tolist() == [60]   # m=2 (2,3): latest full e=8
    assert index.lookup(np.array([5, 6, 3])).tolist() == [70]   # m=1 (3): latest full e=11
    assert index.lookup(np.array([5, 6, 99])).tolist() == []


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_ngram,span", [(3, 20), (1, 1), (4, 5), (8, 7)])
def test_incremental_index_equals_reference_pool_for_every_query(seed, max_ngram, span):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 6, 300).tolist()  # small alphabet: many repeats
    # feed in uneven chunks, as decode steps would (1 to 21 tokens at a time)
    cuts = np.cumsum(rng.integers(1, 22, 60))
    cuts = [int(c) for c in cuts if c < len(tokens)] + [len(tokens)]
    index = _index(tokens, max_ngram, span, chunks=cuts)
    for length in (len(tokens),):
        pool = build_pool(tokens[:length], max_ngram, span)
        for q in range(1, length + 1):
            for m in range(1, max_ngram + 1):
                query = tokens[max(0, q - m):q]
                assert index.lookup(np.array(query)).tolist() == lookup(pool, query, max_ngram)


def test_per_step_work_does_not_grow_with_context():
    # Indexing one more token touches O(max_ngram) entries regardless of context length.
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 1000, 9000).astype(np.int32)
    for context in (1000, 8000):
        index = _index(tokens[:context])
        before = index.used
        index.extend(tokens[context:context + 1])
        assert index.used - before <= index.max_ngram
