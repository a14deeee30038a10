# SPDX-License-Identifier: Apache-2.0
"""Predicted Outputs' request format: OpenAI's ``prediction`` parameter and the value
under PREDICTION_KEY that carries it from the request to the worker and back into the
usage a client reads.

- :func:`prediction_text`: the text of a ``prediction`` in OpenAI's shape
  (``{"type": "content", "content": str | [{"type": "text", "text": str}, ...]}``), or a
  PredictionError naming the part that is wrong. The server's intake tokenizes it and
  puts the ids under PREDICTION_KEY as a :class:`PredictionIds`: a client's JSON can
  make a list, never a PredictionIds.
- :func:`transport_ids`: the value under PREDICTION_KEY (text, token ids, or the
  intake's ids) checked against the vocabulary and the bound (the model's
  ``max_model_len`` tokens), as int32 bytes, the form that travels to the workers
  (msgpack, pickle) smallest.
- :func:`prediction_ids`: the worker reads it back (ids outside the vocabulary dropped).
- :func:`usage_details`: ``accepted_prediction_tokens`` / ``rejected_prediction_tokens``
  (algos/prediction_usage.usage_counts), summed over the choices.

vLLM is patched to use them in predicted_outputs_patches.py (patches.py entries 12-14).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_echo.algos.prediction_usage import usage_counts

# Where a request's prediction travels in its sampling params' extra_args (offline
# callers set it themselves: text, or a list of token ids).
PREDICTION_KEY = "vllm_echo_prediction"


class PredictionIds(list):
    """Token ids the server's intake made from a request's ``prediction``."""


class PredictionError(ValueError):
    """A prediction that cannot be used; the message names the field."""


def prediction_text(value: Any) -> str:
    """The text of an OpenAI ``prediction`` object, or PredictionError naming the part."""
    if not isinstance(value, dict):
        raise PredictionError("prediction must be an object {\"type\": \"content\", "
                              f"\"content\": ...}}, got {type(value).__name__}")
    if value.get("type") != "content":
        raise PredictionError(f"prediction.type must be \"content\", got {value.get('type')!r}")
    extra = sorted(set(value) - {"type", "content"})
    if extra:
        raise PredictionError(f"prediction has unknown fields {extra}; allowed: type, content")
    content = value.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list) and content:
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise PredictionError(f"prediction.content[{i}] must be "
                                      "{\"type\": \"text\", \"text\": str}")
            parts.append(part["text"])
        text = "".join(parts)  # OpenAI's parts of one text, as for message content
    else:
        raise PredictionError("prediction.content must be a string or a non-empty list of "
                              "{\"type\": \"text\", \"text\": str} parts")
    if not text:
        raise PredictionError("prediction.content is empty")
    return text


def transport_ids(value: Any, tokenizer: Any, vocab_size: int, max_tokens: int) -> bytes:
    """The value under PREDICTION_KEY as int32 bytes: text is tokenized (no special
    tokens), ids are checked. PredictionError names what is wrong."""
    if isinstance(value, bytes):  # already converted (a request re-submitted)
        ids = np.frombuffer(value, dtype=np.int32)
    elif isinstance(value, str):
        if not value:
            raise PredictionError(f"{PREDICTION_KEY} is an empty text")
        if tokenizer is None:
            raise PredictionError(f"{PREDICTION_KEY}: a text prediction needs the tokenizer "
                                  "(the engine runs with skip_tokenizer_init); pass token ids")
        ids = np.asarray(tokenizer.encode(value, add_special_tokens=False), dtype=np.int64)
    elif isinstance(value, (list, tuple, np.ndarray)):
        if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in value):
            raise PredictionError(f"{PREDICTION_KEY} must be a text or a list of token ids "
                                  "(integers)")
        ids = np.asarray(value, dtype=np.int64)
    else:
        raise PredictionError(f"{PREDICTION_KEY} must be a text or a list of token ids, got "
                              f"{type(value).__name__}")
    if ids.size == 0:
        raise PredictionError(f"{PREDICTION_KEY} holds no tokens")
    if ids.size > max_tokens:
        raise PredictionError(f"prediction is {ids.size} tokens; at most {max_tokens} (the "
                              "model's max_model_len)")
    bad = (ids < 0) | (ids >= vocab_size)
    if bad.any():
        raise PredictionError(f"{PREDICTION_KEY} holds token id {int(ids[bad][0])}, outside "
                              f"the vocabulary [0, {vocab_size})")
    return ids.astype(np.int32).tobytes()


def prediction_ids(sampling_params: Any, vocab_size: int) -> np.ndarray | None:
    """The worker's view: the request's predicted token ids, or None. Ids outside the
    vocabulary are dropped (the front end refuses them; this guards the worker)."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    value = extra.get(PREDICTION_KEY)
    if isinstance(value, bytes):
        ids = np.frombuffer(value, dtype=np.int32)
    elif isinstance(value, (list, tuple, np.ndarray)) and len(value):
        try:
            ids = np.asarray(value, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            return None
    else:
        return None
    ids = ids[(ids >= 0) & (ids < vocab_size)].astype(np.int32)
    return ids if ids.size else None


def usage_details(prediction: Any, outputs: list[list[int]]) -> dict[str, int]:
    """OpenAI's prediction usage fields, summed over the choices' token ids."""
    ids = prediction if isinstance(prediction, list) else (
        np.frombuffer(prediction, np.int32) if isinstance(prediction, bytes) else [])
    accepted = rejected = 0
    for out in outputs:
        a, r = usage_counts(ids, out)
        accepted, rejected = accepted + a, rejected + r
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": rejected}
