# SPDX-License-Identifier: Apache-2.0
"""Predicted Outputs: OpenAI's ``prediction`` parameter, from the request to the worker
and back into the usage a client reads.

- **Server intake** (chat and completions): ``prediction`` in OpenAI's shape
  (``{"type": "content", "content": str | [{"type": "text", "text": str}, ...]}``) is
  checked (HTTP 400 naming ``prediction`` otherwise), tokenized once off the event loop
  with the server's tokenizer, and put under PREDICTION_KEY as a :class:`PredictionIds`.
  A value a client sends under that key through ``vllm_xargs`` is dropped (one warning
  per process): a client's JSON can make a list, never a PredictionIds.
- **Front end** (``InputProcessor.process_inputs``, offline and server): the value under
  PREDICTION_KEY (text, token ids, or the intake's ids) is checked against the
  vocabulary and the bound (the model's ``max_model_len`` tokens) and becomes int32
  bytes, the form that travels to the workers (msgpack, pickle) smallest.
- **Worker**: :func:`prediction_ids` reads it back (ids outside the vocabulary dropped).
- **Usage**: the final response (and a stream's usage chunk) gets
  ``completion_tokens_details.accepted_prediction_tokens`` / ``rejected_prediction_tokens``
  (algos/prediction.usage_counts), summed over the choices.

The install points and why are entries 12-14 of patches.py.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

import numpy as np

from vllm_echo.algos.prediction_usage import usage_counts

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

# Where a request's prediction travels in its sampling params' extra_args (offline
# callers set it themselves: text, or a list of token ids).
PREDICTION_KEY = "vllm_echo_prediction"
_MARK = "_vllm_echo_patched"
_USAGE_CHUNK_PREFIX = "data: "


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


# -- installing (patches.py entries 12-14) --------------------------------------------

def install() -> None:
    """Entries 12-14; each part that finds vLLM changed is left out with one log line
    (the others still work: without intake, offline predictions still draft)."""
    for name, part in (("InputProcessor.process_inputs", _install_front_end),
                       ("the OpenAI request models", _install_client_key_drop),
                       ("the OpenAI chat/completions serving", _install_intake_and_usage)):
        try:
            part()
        except Exception as exc:  # vLLM changed: this part is off
            logger.warning("vllm-echo: cannot install Predicted Outputs in %s (%s: %s); "
                           "predictions through it are ignored.", name, type(exc).__name__, exc)


def _wrap(owner: Any, name: str, make: Any) -> None:
    original = owner.__dict__[name]
    if getattr(original, _MARK, False):
        return
    wrapped = make(original)
    setattr(wrapped, _MARK, True)
    setattr(owner, name, wrapped)


def _install_front_end() -> None:
    """Entry 12: convert the value under the key to checked int32 bytes."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor

    def make(original):
        @functools.wraps(original)
        def process_inputs(self, request_id, prompt, params, *args, **kwargs):
            extra = getattr(params, "extra_args", None)
            if extra and PREDICTION_KEY in extra and not isinstance(extra[PREDICTION_KEY], bytes):
                model = self.model_config
                try:
                    ids = transport_ids(extra[PREDICTION_KEY], self.tokenizer,
                                        model.get_vocab_size(), model.max_model_len)
                except PredictionError as exc:
                    raise VLLMValidationError(str(exc), parameter="prediction") from None
                # a copy: the caller's params may serve other prompts (offline: one for all)
                params = params.clone()
                params.extra_args = {**extra, PREDICTION_KEY: ids}
            return original(self, request_id, prompt, params, *args, **kwargs)
        return process_inputs

    _wrap(InputProcessor, "process_inputs", make)


def _install_client_key_drop() -> None:
    """Entry 13: a client's value under the key (vllm_xargs) never reaches the engine."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    warned = []

    def make(original):
        @functools.wraps(original)
        def to_sampling_params(self, *args, **kwargs):
            params = original(self, *args, **kwargs)
            extra = getattr(params, "extra_args", None)
            if extra and PREDICTION_KEY in extra and not isinstance(extra[PREDICTION_KEY],
                                                                    PredictionIds):
                params.extra_args = {k: v for k, v in extra.items() if k != PREDICTION_KEY}
                if not warned:
                    warned.append(True)
                    logger.warning("vllm-echo: a client sent the plugin's reserved key %r "
                                   "in vllm_xargs; it is ignored (send `prediction`). "
                                   "Logged once.", PREDICTION_KEY)
            return params
        return to_sampling_params

    for cls in (ChatCompletionRequest, CompletionRequest):
        _wrap(cls, "to_sampling_params", make)


def _install_intake_and_usage() -> None:
    """Entry 14: intake on both routes; usage in chat's full and streamed responses
    and in completions' full responses."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.exceptions import VLLMValidationError
    from vllm.utils.async_utils import make_async

    def make_intake(original):
        @functools.wraps(original)
        async def create(self, request, *args, **kwargs):
            value = (getattr(request, "model_extra", None) or {}).get("prediction")
            if value is not None:
                try:
                    text = prediction_text(value)
                    if getattr(request, "use_beam_search", False):
                        raise PredictionError("prediction cannot be combined with "
                                              "use_beam_search")
                    tokenizer = self.renderer.tokenizer
                    if tokenizer is None:
                        raise PredictionError("prediction needs the server's tokenizer "
                                              "(the server runs with skip_tokenizer_init)")
                    ids = await make_async(tokenizer.encode)(text, add_special_tokens=False)
                    max_tokens = self.model_config.max_model_len
                    if len(ids) > max_tokens:
                        raise PredictionError(f"prediction is {len(ids)} tokens; at most "
                                              f"{max_tokens} (the model's max_model_len)")
                except PredictionError as exc:
                    raise VLLMValidationError(str(exc), parameter="prediction") from None
                request.vllm_xargs = {**(request.vllm_xargs or {}),
                                      PREDICTION_KEY: PredictionIds(ids)}
            return await original(self, request, *args, **kwargs)
        return create

    _wrap(OpenAIServingChat, "create_chat_completion", make_intake)
    _wrap(OpenAIServingCompletion, "create_completion", make_intake)
    _wrap(OpenAIServingChat, "chat_completion_full_generator", _full_usage)
    _wrap(OpenAIServingChat, "chat_completion_stream_generator", _stream_usage)
    _wrap(OpenAIServingCompletion, "request_output_to_completion_response", _completion_usage)


def _prediction_of(request: Any) -> PredictionIds | None:
    value = (getattr(request, "vllm_xargs", None) or {}).get(PREDICTION_KEY)
    return value if isinstance(value, PredictionIds) else None


def _set_details(usage: Any, details: dict[str, int]) -> None:
    from vllm.entrypoints.serve.engine.protocol import CompletionTokenUsageInfo

    if usage is None:
        return
    if usage.completion_tokens_details is None:
        usage.completion_tokens_details = CompletionTokenUsageInfo()
    for key, value in details.items():
        setattr(usage.completion_tokens_details, key, value)


class _LastOutputs:
    """Passes a request's outputs through and keeps each choice's token ids (final
    outputs whole; a stream's deltas appended)."""

    def __init__(self, source: Any, delta: bool):
        self._source, self._delta = source, delta
        self.token_ids: dict[int, list[int]] = {}

    def __aiter__(self):
        return self

    async def __anext__(self):
        res = await self._source.__anext__()
        for out in getattr(res, "outputs", None) or []:
            ids = list(out.token_ids)
            if self._delta:
                self.token_ids.setdefault(out.index, []).extend(ids)
            else:
                self.token_ids[out.index] = ids
        return res

    async def aclose(self):  # a client that disconnects aborts the request now
        close = getattr(self._source, "aclose", None)
        if close is not None:
            await close()

    def outputs(self) -> list[list[int]]:
        return [ids for _, ids in sorted(self.token_ids.items())]


def _full_usage(original):
    @functools.wraps(original)
    async def chat_completion_full_generator(self, request, result_generator, *args, **kwargs):
        prediction = _prediction_of(request)
        if prediction is None:
            return await original(self, request, result_generator, *args, **kwargs)
        seen = _LastOutputs(result_generator, delta=False)
        response = await original(self, request, seen, *args, **kwargs)
        _set_details(getattr(response, "usage", None), usage_details(prediction, seen.outputs()))
        return response
    return chat_completion_full_generator


def _stream_usage(original):
    @functools.wraps(original)
    async def chat_completion_stream_generator(self, request, result_generator, *args,
                                               **kwargs):
        prediction = _prediction_of(request)
        if prediction is None:
            async for chunk in original(self, request, result_generator, *args, **kwargs):
                yield chunk
            return
        seen = _LastOutputs(result_generator, delta=True)
        async for chunk in original(self, request, seen, *args, **kwargs):
            yield _with_stream_details(chunk, prediction, seen)
    return chat_completion_stream_generator


def _with_stream_details(chunk: str, prediction: PredictionIds, seen: _LastOutputs) -> str:
    """The stream's usage chunk (no choices, a usage) with the prediction fields added."""
    if not (chunk.startswith(_USAGE_CHUNK_PREFIX) and '"usage"' in chunk
            and '"choices":[]' in chunk):
        return chunk
    try:
        body = json.loads(chunk[len(_USAGE_CHUNK_PREFIX):])
    except ValueError:
        return chunk
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return chunk
    usage.setdefault("completion_tokens_details", {}).update(
        usage_details(prediction, seen.outputs()))
    return f"{_USAGE_CHUNK_PREFIX}{json.dumps(body, separators=(',', ':'))}\n\n"


def _completion_usage(original):
    @functools.wraps(original)
    def request_output_to_completion_response(self, final_res_batch, request, *args, **kwargs):
        response = original(self, final_res_batch, request, *args, **kwargs)
        prediction = _prediction_of(request)
        if prediction is not None:
            outputs = [list(out.token_ids) for res in final_res_batch for out in res.outputs]
            _set_details(getattr(response, "usage", None), usage_details(prediction, outputs))
        return response
    return request_output_to_completion_response
