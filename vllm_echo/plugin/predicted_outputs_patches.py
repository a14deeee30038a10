# SPDX-License-Identifier: Apache-2.0
"""Predicted Outputs installed in vLLM (patches.py entries 12-14), with the request
format of predicted_outputs.py:

- **Server intake** (chat and completions): ``prediction`` is checked (HTTP 400 naming
  ``prediction`` otherwise), tokenized once off the event loop with the server's
  tokenizer, and put under PREDICTION_KEY as a PredictionIds. A value a client sends
  under that key through ``vllm_xargs`` is dropped (one warning per process).
- **Front end** (``InputProcessor.process_inputs``, offline and server): the value under
  PREDICTION_KEY becomes checked int32 bytes (transport_ids) on a clone of the params.
- **Usage**: the final response (and a stream's usage chunk) gets
  ``completion_tokens_details.accepted_prediction_tokens`` / ``rejected_prediction_tokens``
  (usage_details), summed over the choices.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from vllm_echo.plugin.predicted_outputs import (PREDICTION_KEY, PredictionError,
                                                PredictionIds, prediction_text,
                                                transport_ids, usage_details)

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

_MARK = "_vllm_echo_patched"
_USAGE_CHUNK_PREFIX = "data: "


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
