# SPDX-License-Identifier: Apache-2.0
"""A request's predicted output (OpenAI's ``prediction``) as a draft source.

The client sends the text it expects most of the answer to be (the file being edited,
the previous answer). It is indexed once, like the prompt (an NgramIndex over its
tokens, earliest occurrence of each m-gram), and drafted from in two ways:

- **following**: while the output keeps copying the prediction, the next draft is the
  prediction's text right after the copied part (a cursor, no lookup). An output that
  starts like the prediction follows it from its first token (no m-gram needed);
- **re-anchoring**: once the output departs from it (an edit), the request's last
  tokens are looked up in the prediction's index, longest m-gram first, at least
  ``min_match`` tokens, and drafting resumes after the match.

It holds token ids only, of one request, and never enters a cross-request store.
The usage counts OpenAI returns for a prediction are in algos/prediction_usage.py.
"""

from __future__ import annotations

import numpy as np

from vllm_echo.algos.ngram_index import index_lookup, NgramIndex

# Longest m-gram looked up to re-anchor: longer finds the right place in repetitive
# text (code), at an index of 2 x tokens x m entries.
PREDICTION_MAX_NGRAM = 6
# Shortest match that re-anchors: 1 would draft after any common token (" the", ","),
# the cost of a wrong prediction; more re-anchors later after an edit.
PREDICTION_MIN_MATCH = 2

_EMPTY = np.empty(0, dtype=np.int32)


class Prediction:
    """One request's prediction: its index and where the output stands in it."""

    __slots__ = ("index", "min_match", "start", "cursor", "seen", "match_len")

    def __init__(self, token_ids: np.ndarray, start: int | None = None,
                 max_ngram: int = PREDICTION_MAX_NGRAM, min_match: int = PREDICTION_MIN_MATCH):
        """``start``: the context position where the output begins (the prompt's
        length); None when unknown (then only m-gram anchors start drafting)."""
        ids = np.ascontiguousarray(token_ids, dtype=np.int32)
        # span = the whole prediction: every occurrence keeps the earliest position, and
        # a continuation runs to the prediction's end
        self.index = NgramIndex(max_ngram, max(len(ids), 1), capacity_hint=len(ids))
        self.index.extend(ids)
        self.min_match = min_match
        self.start = start
        self.cursor = -1  # position in the prediction the next output token should copy
        self.seen = 0  # context length the cursor refers to
        # tokens the output has copied from the prediction in a row, the anchor's m
        # included: the evidence behind the next draft (ECHO prices drafts by it)
        self.match_len = 0

    def __len__(self) -> int:
        return self.index.length

    @property
    def token_ids(self) -> np.ndarray:
        return self.index.tokens[:self.index.length]

    @property
    def nbytes(self) -> int:
        return self.index.nbytes

    def draft(self, context: np.ndarray, length: int, max_len: int) -> np.ndarray:
        """Up to ``max_len`` predicted tokens to follow ``context[:length]`` (a view)."""
        if max_len <= 0 or length == 0 or self.index.length == 0:
            return _EMPTY
        ids = self.token_ids
        if self.cursor >= 0 and length >= self.seen:
            new = length - self.seen
            end = self.cursor + new
            if end <= len(ids) and np.array_equal(ids[self.cursor:end],
                                                  context[self.seen:length]):
                self.cursor, self.seen = end, length  # still copying the prediction
                self.match_len += new
                return ids[end:end + max_len]
        self._anchor(context, length)
        if self.cursor < 0:
            return _EMPTY
        return ids[self.cursor:self.cursor + max_len]

    def _anchor(self, context: np.ndarray, length: int) -> None:
        self.seen = length
        copied = length - self.start if self.start is not None else 0
        if 0 < copied <= min(self.index.max_ngram, self.index.length) and np.array_equal(
                self.token_ids[:copied], context[self.start:length]):
            self.cursor = self.match_len = copied  # the output starts like the prediction
            return
        index = self.index
        qlen = min(index.max_ngram, length)
        query = np.ascontiguousarray(context[length - qlen:length], dtype=np.int32)
        e, m = index_lookup(index.tokens, index.length, query, index.max_ngram,
                            index.keys, index.vals)
        if e < 0 or m < self.min_match:
            self.cursor, self.match_len = -1, 0
        else:
            self.cursor, self.match_len = int(e), int(m)
