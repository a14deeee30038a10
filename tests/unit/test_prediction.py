# SPDX-License-Identifier: Apache-2.0
"""The predicted-output draft source and its usage counts (algos/prediction.py), and
how a prediction leads a forest (draft_sources.prediction_first)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_echo.algos.draft_sources import (ORIGIN_OWN, ORIGIN_PREDICTION, ORIGIN_SHARED,
                                           prediction_first)
from vllm_echo.algos.forest import ForestNodes
from vllm_echo.algos.prediction import Prediction
from vllm_echo.algos.prediction_usage import usage_counts


def _ids(*xs):
    return np.asarray(xs, dtype=np.int32)


def test_follows_the_prediction_while_the_output_copies_it():
    pred = Prediction(_ids(10, 11, 12, 13, 14, 15, 16))
    context = _ids(1, 2, 10, 11)  # the output has started copying the prediction
    assert pred.draft(context, 4, 3).tolist() == [12, 13, 14]
    # two of the drafts accepted plus the bonus token 14: still copying
    context = _ids(1, 2, 10, 11, 12, 13, 14)
    assert pred.draft(context, 7, 10).tolist() == [15, 16]
    assert pred.match_len == 5  # the 2-gram anchor and the 3 tokens copied since
    context = _ids(1, 2, 10, 11, 12, 13, 14, 15, 16)
    assert pred.draft(context, 9, 4).tolist() == []  # the prediction is used up


def test_an_output_that_starts_like_the_prediction_follows_it_from_its_first_token():
    prompt = _ids(1, 2, 3)
    pred = Prediction(_ids(10, 11, 12, 13), start=len(prompt))
    # one output token, equal to the prediction's first: no m-gram needed
    assert pred.draft(np.concatenate((prompt, _ids(10))), 4, 2).tolist() == [11, 12]
    assert pred.match_len == 1
    # without knowing where the output starts, one common token does not anchor
    assert Prediction(_ids(10, 11, 12, 13)).draft(
        np.concatenate((prompt, _ids(10))), 4, 2).tolist() == []
    # an output that starts otherwise: nothing until an m-gram matches
    other = Prediction(_ids(10, 11, 12, 13), start=len(prompt))
    assert other.draft(np.concatenate((prompt, _ids(11))), 4, 2).tolist() == []


def test_reanchors_after_an_edit():
    original = _ids(*range(100, 130))
    pred = Prediction(original)
    context = np.concatenate((_ids(1, 2), original[:10]))
    assert pred.draft(context, len(context), 3).tolist() == [110, 111, 112]
    # the output departs (an edit: 7, 8, 9 instead of 110-112), then rejoins at 113, 114
    context = np.concatenate((context, _ids(7, 8, 9)))
    assert pred.draft(context, len(context), 3).tolist() == []  # no 2-gram of it matches
    context = np.concatenate((context, _ids(113, 114)))
    assert pred.draft(context, len(context), 3).tolist() == [115, 116, 117]
    assert pred.match_len == 2


def test_a_single_common_token_does_not_anchor():
    pred = Prediction(_ids(5, 6, 7, 8))
    # the context shares only its last token with the prediction: below min_match
    assert pred.draft(_ids(1, 2, 3, 5), 4, 3).tolist() == []
    assert pred.draft(_ids(1, 2, 5, 6), 4, 3).tolist() == [7, 8]


def test_repeated_text_anchors_at_the_earliest_match_and_then_follows():
    pred = Prediction(_ids(1, 2, 3, 9, 1, 2, 3, 8))
    assert pred.draft(_ids(0, 1, 2, 3), 4, 2).tolist() == [9, 1]
    assert pred.draft(_ids(0, 1, 2, 3, 9, 1, 2, 3), 8, 2).tolist() == [8]


def test_usage_counts_by_alignment():
    # the completion keeps 1 2 3, replaces 4 5 by 9, keeps 6 7, adds 10
    assert usage_counts([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 9, 6, 7, 10]) == (5, 2)
    assert usage_counts([1, 2, 3], [1, 2, 3]) == (3, 0)
    assert usage_counts([1, 2, 3], [7, 8]) == (0, 3)
    assert usage_counts([], [1, 2]) == (0, 0)
    # order matters: a reversed completion keeps only one block
    assert usage_counts([1, 2, 3, 4], [3, 4, 1, 2]) == (2, 2)


def _forest(tokens, parents, match, rank):
    return ForestNodes(*(np.asarray(a, dtype=np.int32) for a in (tokens, parents, match, rank)))


def test_prediction_first_merges_the_forests_leading_chain():
    # own forest: retrieved chain 20 21 22, then a head 30 with its child 31
    nodes = _forest([20, 21, 22, 30, 31], [-1, 0, 1, -1, 3], [3, 3, 3, 0, 2],
                    [-1, -1, -1, 1, -1])
    merged, origin = prediction_first(nodes, None, _ids(20, 21, 40, 41), 6, limit=10)
    # 20, 21 repeat the prediction: dropped, 22 hangs under the predicted 21
    assert merged.token_ids.tolist() == [20, 21, 40, 41, 22, 30, 31]
    assert merged.parents.tolist() == [-1, 0, 1, 2, 1, -1, 5]
    assert origin.tolist() == [ORIGIN_PREDICTION] * 4 + [ORIGIN_OWN] * 3
    assert merged.match_len.tolist()[:4] == [6] * 4
    assert merged.rank.tolist() == [-1, -1, -1, -1, -1, 1, -1]


def test_prediction_first_keeps_a_parent_first_prefix_within_the_limit():
    nodes = _forest([20, 21, 30], [-1, 0, -1], [3, 3, 0], [-1, -1, 0])
    extra_origin = np.asarray([ORIGIN_OWN, ORIGIN_OWN, ORIGIN_SHARED], np.int8)
    merged, origin = prediction_first(nodes, extra_origin, _ids(50, 51, 52), 2, limit=4)
    assert merged.token_ids.tolist() == [50, 51, 52, 20]
    assert merged.parents.tolist() == [-1, 0, 1, -1]
    assert origin.tolist() == [ORIGIN_PREDICTION] * 3 + [ORIGIN_OWN]
    # nothing predicted: the forest as it was
    same, none = prediction_first(nodes, None, _ids(), 2, limit=4)
    assert same is nodes and none is None


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 8])
def test_prediction_first_is_always_a_forest(limit):
    rng = np.random.default_rng(limit)
    nodes = _forest([7, 8, 9, 7, 5, 6], [-1, 0, 1, -1, 3, -1], [2, 2, 2, 0, 1, 0],
                    [-1, -1, -1, 0, -1, 3])
    merged, origin = prediction_first(nodes, None, rng.integers(5, 10, 4).astype(np.int32),
                                      3, limit)
    assert len(merged.token_ids) <= limit and len(origin) == len(merged.token_ids)
    assert all(p < j for j, p in enumerate(merged.parents.tolist()))
