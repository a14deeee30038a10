# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.shared_outputs import OutputStore, pool_id, warm_up


def _a(*tokens):
    return np.array(tokens, dtype=np.int32)


def test_pool_id():
    assert pool_id(None) == 0
    a, b = pool_id("tenant-a"), pool_id("tenant-b")
    assert a != 0 and b != 0 and a != b
    assert a == pool_id("tenant-a") and 0 < a < 2**63


def test_exact_continuation_after_a_known_sequence():
    store = OutputStore(max_bytes=1 << 16)
    seq = _a(10, 11, 12, 13, 14, 15, 16, 17, 18)
    store.add(0, seq, 0)
    tokens, support = store.draft(0, _a(99, 10, 11, 12, 13), 8)
    assert tokens.tolist() == [14, 15, 16, 17, 18]  # stops where nothing follows
    assert support.tolist() == [1.0] * 5 and support.dtype == np.float32
    assert store.draft(0, _a(10, 11, 12), 2)[0].tolist() == [13, 14]  # max_len
    assert store.draft(0, _a(10, 11, 12), 0)[0].size == 0
    assert store.draft(0, _a(50, 60), 8)[0].size == 0  # unseen context


def test_incremental_adds_reach_before_start():
    whole = OutputStore(max_bytes=1 << 16)
    steps = OutputStore(max_bytes=1 << 16)
    seq = _a(3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5)
    whole.add(0, seq, 0)
    for n in range(1, len(seq) + 1):  # one new token per step, the whole row each time
        steps.add(0, seq[:n], n - 1)
    assert steps.entries == whole.entries
    for end in range(2, len(seq)):
        assert (steps.draft(0, seq[:end], 6)[0].tolist()
                == whole.draft(0, seq[:end], 6)[0].tolist())


def test_most_counted_continuation_wins():
    store = OutputStore(max_bytes=1 << 16)
    for _ in range(3):
        store.add(0, _a(1, 2, 3, 4, 7), 0)
    store.add(0, _a(1, 2, 3, 4, 8), 0)
    store.add(0, _a(1, 2, 3, 4, 9), 0)
    tokens, support = store.draft(0, _a(1, 2, 3, 4), 1)
    assert tokens.tolist() == [7]
    assert support[0] == pytest.approx(3 / 5, rel=1e-2)  # decay: later counts weigh a bit more


def test_backoff_to_a_shorter_order():
    store = OutputStore(max_bytes=1 << 16, orders=(4, 3, 2))
    store.add(0, _a(1, 2, 3, 4, 5, 6), 0)
    # (9, 3, 4) is unseen at orders 4 and 3; the 2-gram (3, 4) gives 5, then (4, 5) gives 6
    assert store.draft(0, _a(8, 9, 3, 4), 4)[0].tolist() == [5, 6]
    # a longer match beats a shorter one: the 4-gram (0, 1, 2, 3) -> 20 outranks the
    # 2-gram (2, 3), where 4 is counted three times and 20 once
    store.add(0, _a(7, 2, 3, 4), 0)
    store.add(0, _a(7, 2, 3, 4), 0)
    store.add(0, _a(0, 1, 2, 3, 20), 0)
    assert store.draft(0, _a(0, 1, 2, 3), 1)[0].tolist() == [20]
    assert store.draft(0, _a(7, 2, 3), 1)[0].tolist() == [4]
    tokens, support = store.draft(0, _a(9, 9, 2, 3), 1)
    assert tokens.tolist() == [4] and support[0] == pytest.approx(3 / 4, rel=1e-3)


def test_pools_are_isolated():
    rng = np.random.default_rng(0)
    store = OutputStore(max_bytes=1 << 20)
    pa, pb = pool_id("a"), pool_id("b")
    vocab = 40
    # Same contexts in both pools; pool A continues with tokens < 20, pool B with >= 20,
    # and both share a "prompt" prefix drawn from the whole vocabulary.
    only_b = set(range(20, vocab))
    for _ in range(200):
        prompt = rng.integers(0, vocab, 6, dtype=np.int32)
        out_a = rng.integers(0, 20, 10, dtype=np.int32)
        out_b = rng.integers(20, vocab, 10, dtype=np.int32)
        store.add(pa, np.concatenate([prompt, out_a]), 6)
        store.add(pb, np.concatenate([prompt, out_b]), 6)
    hits = 0
    for _ in range(2000):
        context = rng.integers(0, vocab, 5, dtype=np.int32)
        tokens_a, _ = store.draft(pa, context, 8)
        assert not set(tokens_a.tolist()) & only_b
        hits += tokens_a.size > 0
        assert not set(store.draft(pb, context, 8)[0].tolist()) & set(range(20))
    assert hits > 100  # the check saw real drafts
    assert store.draft(0, context, 8)[0].size == 0  # the shared pool got nothing


@pytest.mark.parametrize("decay", [True, False])
def test_eviction_keeps_the_bound_and_recent_and_frequent_entries(decay):
    max_bytes = 8 << 10
    # decay: counts halve every `slots` tokens (default), so the frequent sequence must
    # recur; no decay (pure frequency): 20 early occurrences must outlive the junk.
    store = OutputStore(max_bytes=max_bytes, orders=(3, 2), width=2,
                        half_life=None if decay else 1e12)
    rng = np.random.default_rng(1)
    frequent = _a(900, 901, 902, 903, 904, 905)
    for _ in range(20):
        store.add(0, frequent, 0)
    slots = store.slots
    for i in range(50):  # 2 * 200 * 50 m-grams, about 60x the slots
        store.add(0, rng.integers(0, 800, 200, dtype=np.int32), 0)
        if decay and i % 5 == 4:
            store.add(0, frequent, 0)
    recent = _a(950, 951, 952, 953, 954, 955)
    store.add(0, recent, 0)
    assert store.nbytes <= max_bytes and store.slots == slots
    assert store.entries == slots
    assert store.evictions > 10 * slots
    assert store.draft(0, _a(950, 951), 8)[0].tolist() == [952, 953, 954, 955]
    assert store.draft(0, _a(900, 901), 8)[0].tolist() == [902, 903, 904, 905]


def test_decay_lets_recent_outweigh_old_counts():
    store = OutputStore(max_bytes=1 << 16, orders=(2,), half_life=10)
    for _ in range(3):
        store.add(0, _a(1, 2, 3), 0)  # (1, 2) -> 3, three times
    store.add(0, np.zeros(100, np.int32), 0)  # 100 tokens: old counts weigh 2^-10
    store.add(0, _a(1, 2, 4), 0)
    assert store.draft(0, _a(1, 2), 1)[0].tolist() == [4]
    plain = OutputStore(max_bytes=1 << 16, orders=(2,), half_life=1e12)
    for seq in [_a(1, 2, 3)] * 3 + [np.zeros(100, np.int32), _a(1, 2, 4)]:
        plain.add(0, seq, 0)
    assert plain.draft(0, _a(1, 2), 1)[0].tolist() == [3]


def test_rescaling_keeps_the_ranking():
    store = OutputStore(max_bytes=1 << 16, orders=(1,), half_life=1)  # rescales every 64
    store.add(0, _a(5, 6, 5, 6, 5, 7), 0)
    store.add(0, np.zeros(200, np.int32), 0)
    store.add(0, _a(5, 8, 5, 8), 0)
    assert store.draft(0, _a(5), 1)[0].tolist() == [8]
    assert store.draft(0, _a(0), 1)[0].tolist() == [0]
    assert np.isfinite(store.counts).all()


def test_tiny_bounds():
    with pytest.raises(ValueError):
        OutputStore(max_bytes=16)
    store = OutputStore(max_bytes=256, orders=(2,), width=1)
    for i in range(100):
        store.add(0, _a(i, i + 1, i + 2), 0)
    assert store.nbytes <= 256 and store.evictions > 0
    assert store.draft(0, _a(99, 100), 1)[0].tolist() == [101]


def test_warm_up_runs():
    warm_up()
