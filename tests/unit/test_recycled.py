# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.draft_sources import ORIGIN_OWN, ORIGIN_RECYCLED, OtherSources
from vllm_echo.algos.recycled import RecycledTable, RecycledTables, warm_up


def _topk(logits, k):
    """Hand reference: indices of the k largest logits, best first (stable on ties)."""
    return np.argsort(-logits, axis=1, kind="stable")[:, :k].astype(np.int32)


def test_table_rows_are_the_topk_of_known_logits():
    rng = np.random.default_rng(0)
    vocab, k = 50, 4
    logits = rng.standard_normal((3, vocab)).astype(np.float32)
    prev = np.array([7, 0, 49], np.int32)
    table = RecycledTable(vocab, k)
    table.update(prev, _topk(logits, 10))  # wider top-k: only the first k are kept
    for i, t in enumerate(prev):
        expected = np.argsort(logits[i])[::-1][:k]
        assert table.table[t].tolist() == expected.tolist()
    untouched = np.setdiff1d(np.arange(vocab), prev)
    assert (table.table[untouched] == -1).all()
    assert table.nbytes == vocab * k * 4


def test_update_overwrites_ignores_out_of_range_and_keeps_empty_entries():
    table = RecycledTable(10, 3)
    table.update(np.array([2], np.int32), np.array([[5, 6, 7]]))
    table.update(np.array([2, -1, 10], np.int32), np.array([[8, -1, 9], [1, 1, 1], [1, 1, 1]]))
    assert table.table[2].tolist() == [8, -1, 9]
    assert (np.delete(table.table, 2, axis=0) == -1).all()
    with pytest.raises(ValueError):
        table.update(np.array([1], np.int32), np.array([[1, 2]]))  # fewer than k columns


def _hand_table():
    t = RecycledTable(20, 3)
    rows = {1: [2, 3, 4], 2: [5, -1, 6], 3: [7, 8, 9], 5: [10, 11, 12], 7: [13, 14, 15],
            8: [1, 16, 17]}
    for r, v in rows.items():
        t.update(np.array([r], np.int32), np.array([v]))
    return t


def test_draft_tree_shape_and_parents():
    t = _hand_table()
    tokens, parents = t.draft(1, (2, 2, 1), 16)
    # depth 1: row 1[:2] = 2, 3; depth 2: row 2[:2] = 5 (skip -1), row 3[:2] = 7, 8;
    # depth 3: row 5[:1] = 10, row 7[:1] = 13, row 8[:1] = 1 (a token may repeat)
    assert tokens.tolist() == [2, 3, 5, 7, 8, 10, 13, 1]
    assert parents.tolist() == [-1, -1, 0, 1, 1, 2, 3, 4]
    assert tokens.dtype == np.int32 and parents.dtype == np.int32
    assert all(p < j for j, p in enumerate(parents))  # parent first


def test_draft_stops_at_max_nodes_and_when_widths_run_out():
    t = _hand_table()
    tokens, parents = t.draft(1, (2, 2, 1), 4)
    assert tokens.tolist() == [2, 3, 5, 7] and parents.tolist() == [-1, -1, 0, 1]
    tokens, parents = t.draft(1, (3,), 16)
    assert tokens.tolist() == [2, 3, 4] and parents.tolist() == [-1, -1, -1]
    assert t.draft(1, (), 16)[0].size == 0
    assert t.draft(4, (3, 3), 16)[0].size == 0  # empty row
    assert t.draft(99, (3, 3), 16)[0].size == 0  # root outside the vocabulary
    assert t.draft(1, (3, 3), 0)[0].size == 0
    tokens, _ = t.draft(1, (9, 9), 64)  # widths above k read whole rows
    assert tokens.tolist() == [2, 3, 4, 5, 6, 7, 8, 9]


def test_tables_are_made_per_pool_and_bounded_least_recently_used_first():
    tables = RecycledTables(vocab_size=20, k=3, max_pools=2)
    assert tables.nbytes == 0 and tables.get(1) is None  # nothing is made before learning
    one = tables.get_or_create(1)
    assert tables.get_or_create(1) is one
    tables.get_or_create(2)
    assert tables.get(1) is one  # a draft counts as use: pool 2 is now the oldest
    tables.get_or_create(3)
    assert tables.pools == [1, 3]
    assert tables.get(2) is None
    assert tables.nbytes == 2 * 20 * 3 * 4
    with pytest.raises(ValueError):
        RecycledTables(20, 3, max_pools=0)


def _sources(max_pools=4):
    return OtherSources(None, RecycledTables(20, 3, max_pools), span=4,
                        recycled_widths=(2, 1, 1), room=16)


def _learn(sources, pool, prev, top):
    """Pool ``pool`` saw ``top`` (best first) as the target's top-k after ``prev``."""
    sources.learn_logits(pool, np.array([prev, 0], np.int32), 2, np.array(top, np.int32))


def test_a_pools_observations_never_draft_for_another_pool():
    sources = _sources()
    _learn(sources, 1, 5, [6, 7, 8])
    row = np.array([5], np.int32)
    tokens, origin = sources.chain(1, row, 1, 3)
    assert origin == ORIGIN_RECYCLED and tokens.tolist()[0] == 6
    assert sources.branches(1, row, 1, 4).token_ids.tolist()[:2] == [6, 7]
    for pool in (2, 0, None):
        tokens, origin = sources.chain(pool, row, 1, 3)
        assert len(tokens) == 0 and origin == ORIGIN_OWN, pool
        assert len(sources.branches(pool, row, 1, 4).token_ids) == 0
    assert sources.recycled.pools == [1]


def test_a_request_without_a_pool_teaches_no_table():
    sources = _sources()
    _learn(sources, None, 5, [6, 7, 8])
    assert sources.recycled.pools == [] and sources.nbytes["recycled_bytes"] == 0


def test_the_sources_memory_is_the_sum_of_the_pools_tables_within_the_bound():
    sources = _sources(max_pools=3)
    for pool in range(5):
        _learn(sources, pool, 5, [6, 7, 8])
    assert sources.recycled.pools == [2, 3, 4]
    assert sources.nbytes["recycled_bytes"] == 3 * 20 * 3 * 4


def test_warm_up_runs():
    warm_up()
