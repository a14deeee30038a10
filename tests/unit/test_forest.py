# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

import reference_logitspec as ref
from vllm_echo.algos.forest import (SOURCE_LOGITS, SOURCE_NONE, SOURCE_RETRIEVAL, build_forest,
                                     first_chain, rank_branch_length)
from vllm_echo.algos.ngram_index import NgramIndex


def _index(tokens, max_ngram=3, span=20):
    index = NgramIndex(max_ngram, span)
    index.extend(np.asarray(tokens, dtype=np.int32))
    return index


def _chains(token_ids, parents):
    chains = []
    for tok, par in zip(token_ids.tolist(), parents.tolist()):
        if par == -1:
            chains.append([tok])
        else:
            assert par == len(sum(chains, [])) - 1  # chains only: parent is the previous node
            chains[-1].append(tok)
    return chains


def test_rank_pruning_is_4_3_1():
    assert [rank_branch_length(i) for i in (0, 8, 9, 32, 33, 63)] == [4, 4, 3, 3, 1, 1]


def test_forest_shape_next_token_chain_then_ranked_branches():
    #         0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 5, 6, 1, 2, 3, 7, 8]
    index = _index(tokens)
    # root = 8; no occurrence of ...8 has a continuation -> no next-token chain
    candidates = np.array([8, 4, 7, 99], dtype=np.int32)
    token_ids, parents = build_forest(index, candidates, capacity=64)
    # rank 1 (t=4): [4] + cont of (7,8,4)->(4): 5 6 1 2 ... cut to 4
    # rank 2 (t=7): [7] + cont of (7): [8]; rank 3 (t=99): no hit -> [99]
    assert _chains(token_ids, parents) == [[4, 5, 6, 1], [7, 8], [99]]
    assert parents.tolist() == [-1, 0, 1, 2, -1, 4, -1]


def test_next_token_chain_is_first_and_not_rank_pruned():
    tokens = list(range(10, 40)) + [10, 11]
    index = _index(tokens)
    token_ids, parents = build_forest(index, np.array([5], dtype=np.int32), capacity=64)
    chains = _chains(token_ids, parents)
    assert chains[0] == list(range(12, 32))  # full 20-token span after (10, 11)
    assert chains[1] == [5]


def test_capacity_clips_the_crossing_branch():
    tokens = list(range(10, 40)) + [10, 11]
    index = _index(tokens)
    candidates = np.arange(100, 110, dtype=np.int32)
    token_ids, parents = build_forest(index, candidates, capacity=23)
    assert len(token_ids) == 22  # capacity counts the root
    chains = _chains(token_ids, parents)
    assert chains == [list(range(12, 32)), [100], [101]]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("capacity", [2, 8, 64])
def test_forest_equals_reference_transcription(seed, capacity):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 12, 200).tolist()
    candidates = rng.permutation(40)[:64 if capacity == 64 else 10].astype(np.int32)
    candidates[rng.integers(0, len(candidates))] = tokens[-1]  # root among the top-k
    token_ids, parents = build_forest(_index(tokens), candidates, capacity)
    expected = ref.forest(tokens, candidates.tolist(), 3, 20, capacity)
    assert _chains(token_ids, parents) == expected


def test_first_chain_prefers_retrieval_then_best_candidate():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    index = _index(tokens)
    chain, source = first_chain(index, np.array([9], np.int32), 3)
    assert (chain.tolist(), source) == ([3, 4, 5], SOURCE_RETRIEVAL)
    # no retrieval hit for the context: the best-ranked candidate that is not the root,
    # followed by its own retrieved continuation
    index = _index([1, 2, 3, 4, 5, 6, 7])
    chain, source = first_chain(index, np.array([7, 3, 9], np.int32), 3)
    assert (chain.tolist(), source) == ([3, 4, 5], SOURCE_LOGITS)
    chain, source = first_chain(index, np.array([7], np.int32), 3)
    assert (chain.tolist(), source) == ([], SOURCE_NONE)


def test_forest_nodes_record_rank_and_match_length():
    from vllm_echo.algos.forest import build_forest_nodes

    tokens = [1, 2, 3, 4, 5, 6, 1, 2, 3, 7, 8]
    nodes = build_forest_nodes(_index(tokens), np.array([8, 4, 7, 99], np.int32), 64)
    # chains [4,5,6,1] (rank 1, then m=1 retrieval), [7,8] (rank 2, m=1), [99] (rank 3)
    assert nodes.rank.tolist() == [1, -1, -1, -1, 2, -1, 3]
    assert nodes.match_len.tolist() == [0, 1, 1, 1, 0, 1, 0]
    tokens = list(range(10, 40)) + [10, 11]
    nodes = build_forest_nodes(_index(tokens), np.array([5], np.int32), 64)
    assert nodes.match_len[:20].tolist() == [2] * 20 and nodes.rank[:20].tolist() == [-1] * 20
