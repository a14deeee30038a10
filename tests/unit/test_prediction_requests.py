# SPDX-License-Identifier: Apache-2.0
"""Predicted Outputs' request checks and transport (plugin/predicted_outputs.py), and
the prediction family of ECHO's acceptance model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vllm_echo.algos.draft_sources import ORIGIN_PREDICTION
from vllm_echo.algos.echo.acceptance import KINDS, AcceptanceModel, Candidates
from vllm_echo.algos.echo.tuning import EchoTuning
from vllm_echo.plugin.predicted_outputs import (PREDICTION_KEY, PredictionError,
                                                PredictionIds, prediction_ids,
                                                prediction_text, transport_ids,
                                                usage_details)


class _Tokenizer:
    """Characters as token ids; records the special-token flag."""

    def __init__(self):
        self.calls = []

    def encode(self, text, add_special_tokens=True):
        self.calls.append(add_special_tokens)
        return [ord(c) for c in text]


def test_openai_prediction_shapes():
    assert prediction_text({"type": "content", "content": "abc"}) == "abc"
    parts = [{"type": "text", "text": "ab"}, {"type": "text", "text": "c"}]
    assert prediction_text({"type": "content", "content": parts}) == "abc"


@pytest.mark.parametrize("value, words", [
    ("abc", "must be an object"),
    ({"type": "text", "content": "abc"}, "prediction.type must be \"content\""),
    ({"content": "abc"}, "prediction.type must be \"content\""),
    ({"type": "content"}, "prediction.content must be a string"),
    ({"type": "content", "content": 5}, "prediction.content must be a string"),
    ({"type": "content", "content": []}, "prediction.content must be a string"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": "x"}]},
     "prediction.content[0] must be"),
    ({"type": "content", "content": [{"type": "text", "text": 3}]}, "prediction.content[0]"),
    ({"type": "content", "content": ""}, "prediction.content is empty"),
    ({"type": "content", "content": "a", "extra": 1}, "unknown fields ['extra']"),
])
def test_bad_predictions_name_the_field(value, words):
    with pytest.raises(PredictionError) as err:
        prediction_text(value)
    assert words in str(err.value)


def test_transport_tokenizes_text_without_special_tokens_and_checks_ids():
    tok = _Tokenizer()
    raw = transport_ids("hi", tok, vocab_size=1000, max_tokens=10)
    assert np.frombuffer(raw, np.int32).tolist() == [104, 105] and tok.calls == [False]
    assert np.frombuffer(transport_ids([3, 4], None, 1000, 10), np.int32).tolist() == [3, 4]
    assert transport_ids(raw, None, 1000, 10) == raw  # already converted: unchanged
    ids = PredictionIds([5, 6])
    assert np.frombuffer(transport_ids(ids, None, 1000, 10), np.int32).tolist() == [5, 6]


@pytest.mark.parametrize("value, words", [
    ([1, 2000], "outside the vocabulary [0, 1000)"),
    ([-1], "outside the vocabulary"),
    ([1.5], "list of token ids"),
    ([True], "list of token ids"),
    (list(range(11)), "11 tokens; at most 10"),
    ([], "holds no tokens"),
    ("", "empty text"),
    ({"a": 1}, "got dict"),
])
def test_transport_refuses_bad_values(value, words):
    with pytest.raises(PredictionError) as err:
        transport_ids(value, _Tokenizer(), vocab_size=1000, max_tokens=10)
    assert words in str(err.value)


def test_text_without_a_tokenizer_is_refused():
    with pytest.raises(PredictionError, match="skip_tokenizer_init"):
        transport_ids("abc", None, 1000, 10)


def test_the_worker_reads_ids_and_drops_out_of_vocabulary_ones():
    def params(value):
        return SimpleNamespace(extra_args={PREDICTION_KEY: value})

    raw = np.asarray([1, 2, 3], np.int32).tobytes()
    assert prediction_ids(params(raw), 1000).tolist() == [1, 2, 3]
    assert prediction_ids(params([1, 5000, 2, -4]), 1000).tolist() == [1, 2]
    assert prediction_ids(params([5000]), 1000) is None
    assert prediction_ids(params("text"), 1000) is None  # the front end converts text
    assert prediction_ids(SimpleNamespace(extra_args=None), 1000) is None
    assert prediction_ids(None, 1000) is None


def test_usage_details_sum_over_choices():
    details = usage_details(PredictionIds([1, 2, 3, 4]), [[1, 2, 9, 4], [1, 2, 3, 4]])
    assert details == {"accepted_prediction_tokens": 3 + 4, "rejected_prediction_tokens": 1}


def test_prediction_nodes_have_their_own_confident_family():
    tuning = EchoTuning()
    model = AcceptanceModel(tuning)
    nodes = Candidates(np.asarray([5, 6, 7], np.int32), np.asarray([-1, 0, 1], np.int32),
                       np.asarray([6, 6, 6], np.int32), np.asarray([-1, -1, -1], np.int32),
                       np.empty(0), origin=np.full(3, ORIGIN_PREDICTION, np.int8))
    pool = model.pool([nodes])
    assert set(model.kinds(pool.buckets).tolist()) == {KINDS.index("prediction")}
    a, b = tuning.prediction_prior
    assert pool.probs[0] == pytest.approx(a / (a + b))
    assert model.table()["prediction"][0][0] == pytest.approx(a / (a + b), abs=1e-4)
    # the prior counts only while the predicted source is offered
    model.other_origins = (ORIGIN_PREDICTION,)
    assert model.best_first_rates()[0] == pytest.approx(a / (a + b))
    # wrong predictions lower it within a few steps
    for _ in range(5):
        model.observe(pool.buckets[:1], np.ones(1, bool), np.zeros(1, bool))
    assert model.node_probabilities(nodes)[0] < 0.6


def test_prediction_rates_are_learned_apart_by_how_long_the_output_has_copied_it():
    model = AcceptanceModel(EchoTuning())

    def predicted(copied):
        return Candidates(np.asarray([5, 6], np.int32), np.asarray([-1, 0], np.int32),
                          np.full(2, copied, np.int32), np.full(2, -1, np.int32),
                          np.empty(0), origin=np.full(2, ORIGIN_PREDICTION, np.int8))

    reanchored, followed = predicted(2), predicted(20)
    for _ in range(10):  # drafts right after a 2-gram re-anchor are rejected
        model.observe(model.pool([reanchored]).buckets[:1], np.ones(1, bool), np.zeros(1, bool))
    assert model.node_probabilities(reanchored)[0] < 0.4
    # a prediction the output has followed for 20 tokens keeps its confident prior
    a, b = EchoTuning().prediction_prior
    assert model.node_probabilities(followed)[0] == pytest.approx(a / (a + b))
    kinds = model.kinds(model.pool([reanchored, followed]).buckets)
    assert set(kinds.tolist()) == {KINDS.index("prediction")}
