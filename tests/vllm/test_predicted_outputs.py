# SPDX-License-Identifier: Apache-2.0
"""Predicted Outputs end to end: OpenAI's ``prediction`` through `vllm serve` (the
OpenAI client, HTTP 400s, usage fields, streams) and ``extra_args`` offline, always
identical to no speculation (greedy, fp32), and drafting from the prediction."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import requests
from engine_helpers import drafter_stats, since
from server_helpers import openai_server, post

from vllm_echo.plugin.predicted_outputs import PREDICTION_KEY

MAX_MODEL_LEN = 1024
MAX_TOKENS = 48
QUESTION = "Write three sentences about how bees make honey."
# the edit case: the prompt holds a text, the prediction is that text
ORIGINAL = ("def area(width, height):\n    return width * height\n\n\n"
            "def perimeter(width, height):\n    return 2 * (width + height)\n")
EDIT = f"Rename the parameter width to w everywhere in this code. Reply with code only.\n\n{ORIGINAL}"


def _messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _prediction(text: str) -> dict:
    return {"type": "content", "content": text}


@pytest.fixture(scope="module")
def reference(no_spec_llm) -> dict[str, str]:
    """No speculation's greedy answers (the session's in-process engine)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    outs = no_spec_llm.chat([_messages(QUESTION), _messages(EDIT)], params, use_tqdm=False)
    return {"question": outs[0].outputs[0].text, "edit": outs[1].outputs[0].text}


@pytest.fixture(scope="module")
def server(model_path):
    with openai_server(model_path, {"method": "echo"}, max_model_len=MAX_MODEL_LEN) as server:
        yield server


def _chat(server, text: str, **body) -> dict:
    return post(server, "chat/completions", {"messages": _messages(text), "temperature": 0,
                                             "max_tokens": MAX_TOKENS, **body})


def _tokens(server, text: str) -> list[int]:
    reply = requests.post(f"{server.url}/tokenize", timeout=60, json={
        "model": server.model, "prompt": text, "add_special_tokens": False})
    reply.raise_for_status()
    return reply.json()["tokens"]


def _metric(server, name: str) -> float:
    return server.metric_sum(name + "{")


@pytest.mark.server
def test_predictions_draft_and_keep_outputs_and_usage(server, reference):
    answer = reference["question"]
    before = _metric(server, "vllm_echo:prediction_accepted_tokens_total")
    # the exact answer as the prediction (an oracle): identical text, every token used
    oracle = _chat(server, QUESTION, prediction=_prediction(answer))
    assert oracle["choices"][0]["message"]["content"] == answer
    n = oracle["usage"]["completion_tokens"]
    details = oracle["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] == len(_tokens(server, answer)) == n
    assert details["rejected_prediction_tokens"] == 0
    # hand-computed: the answer plus a tail the model does not write
    tail = " Zebra quantum harmonica."
    padded = _chat(server, QUESTION, prediction=_prediction(answer + tail))
    assert padded["choices"][0]["message"]["content"] == answer
    pad_details = padded["usage"]["completion_tokens_details"]
    extra = len(_tokens(server, answer + tail)) - n
    assert (pad_details["accepted_prediction_tokens"],
            pad_details["rejected_prediction_tokens"]) == (n, extra)
    # the edit: the original is in the prompt and the prediction
    edit = _chat(server, EDIT, prediction=_prediction(ORIGINAL))
    assert edit["choices"][0]["message"]["content"] == reference["edit"]
    # a prediction in text parts; an unrelated one (the cost of a bad hint): same text
    parts = [{"type": "text", "text": answer[:20]}, {"type": "text", "text": answer[20:]}]
    assert _chat(server, QUESTION, prediction={"type": "content", "content": parts}
                 )["choices"][0]["message"]["content"] == answer
    wrong = _chat(server, QUESTION, prediction=_prediction(ORIGINAL * 3))
    assert wrong["choices"][0]["message"]["content"] == answer
    # a stream's final usage chunk carries the same fields
    body = {"model": server.model, "messages": _messages(QUESTION), "temperature": 0,
            "max_tokens": MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True},
            "prediction": _prediction(answer + tail)}
    text, usage = [], None
    with requests.post(f"{server.url}/v1/chat/completions", json=body, stream=True,
                       timeout=600) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                for choice in chunk["choices"]:
                    text.append(choice["delta"].get("content") or "")
                usage = chunk.get("usage") or usage
    assert "".join(text) == answer
    streamed = usage["completion_tokens_details"]
    assert {k: streamed[k] for k in pad_details if "prediction" in k} == \
        {k: v for k, v in pad_details.items() if "prediction" in k}
    # completions accept it too
    completion = post(server, "completions", {"prompt": QUESTION, "temperature": 0,
                                              "max_tokens": 16,
                                              "prediction": _prediction(answer)})
    assert "accepted_prediction_tokens" in completion["usage"]["completion_tokens_details"]
    time.sleep(1.5)  # the worker publishes its statistics twice a second
    assert _metric(server, "vllm_echo:prediction_requests_total") >= 7
    assert _metric(server, "vllm_echo:prediction_accepted_tokens_total") - before >= n


@pytest.mark.server
def test_the_openai_client_round_trip(server, reference):
    import openai  # the test extra (setup.py)

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    reply = client.chat.completions.create(
        model=server.model, messages=_messages(QUESTION), temperature=0,
        max_tokens=MAX_TOKENS, seed=0, prediction=_prediction(reference["question"]))
    assert reply.choices[0].message.content == reference["question"]
    assert reply.usage.completion_tokens_details.accepted_prediction_tokens == \
        reply.usage.completion_tokens
    assert reply.usage.completion_tokens_details.rejected_prediction_tokens == 0


@pytest.mark.server
def test_predictions_with_n2_logprobs_structured_output_and_stop(server, reference):
    answer = reference["question"]
    cases = {
        # vLLM refuses n > 1 with greedy; top_p this small keeps only the top token
        "n2": {"temperature": 1.0, "top_p": 0.001, "n": 2},
        "logprobs": {"logprobs": True, "top_logprobs": 2},
        "stop": {"stop": [".", "\n"]},
        "structured": {"response_format": {"type": "json_schema", "json_schema": {
            "name": "facts", "schema": {"type": "object", "properties": {
                "fact": {"type": "string"}}, "required": ["fact"]}}}},
    }
    for name, extra in cases.items():
        plain = _chat(server, QUESTION, **extra)
        predicted = _chat(server, QUESTION, prediction=_prediction(answer), **extra)
        assert [c["message"]["content"] for c in predicted["choices"]] == \
            [c["message"]["content"] for c in plain["choices"]], name
        if name == "logprobs":  # the same tokens; values computed in other batch shapes
            got, want = (r["choices"][0]["logprobs"]["content"] for r in (predicted, plain))
            assert [[e["token"], [x["token"] for x in e["top_logprobs"]]] for e in got] == \
                [[e["token"], [x["token"] for x in e["top_logprobs"]]] for e in want]
            assert [e["logprob"] for e in got] == pytest.approx([e["logprob"] for e in want],
                                                                abs=1e-3)
    # the no-prediction echo answers are no speculation's (test_serve checks them widely)
    assert _chat(server, QUESTION)["choices"][0]["message"]["content"] == answer


@pytest.mark.server
@pytest.mark.parametrize("prediction, words", [
    ({"type": "text", "content": "x"}, 'prediction.type must be "content"'),
    ({"type": "content", "content": 5}, "prediction.content must be a string"),
    ({"type": "content", "content": [{"type": "image_url"}]}, "prediction.content[0] must be"),
    ({"type": "content", "content": "word " * 1200}, "at most 1024"),
    ("just text", "prediction must be an object"),
])
def test_bad_predictions_get_a_400_naming_the_field(server, reference, prediction, words):
    for stream in (False, True):
        reply = requests.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": server.model, "messages": _messages(QUESTION), "max_tokens": 4,
            "stream": stream, "prediction": prediction})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert words in error["message"] and error["param"] == "prediction", error
    # a client's own ids under the reserved key are dropped, not drafted from
    time.sleep(1.5)  # the worker publishes its statistics twice a second
    before = _metric(server, "vllm_echo:prediction_requests_total")
    spoofed = _chat(server, QUESTION, vllm_xargs={PREDICTION_KEY: [1, 2, 3]})
    assert spoofed["choices"][0]["message"]["content"] == reference["question"]
    time.sleep(1.5)
    assert _metric(server, "vllm_echo:prediction_requests_total") == before


@pytest.mark.engine
@pytest.mark.parametrize("name", ["echo", "logitspec-chain"])
def test_offline_predictions_as_text_or_ids(shared_engine, no_spec_llm, name):
    from vllm import SamplingParams

    llm = shared_engine(name)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    want = [o.outputs[0] for o in no_spec_llm.chat([_messages(QUESTION), _messages(EDIT)],
                                                   greedy, use_tqdm=False)]
    answer_ids = list(want[0].token_ids)
    tokenizer = llm.get_tokenizer()
    before = drafter_stats(llm)
    as_text = SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                             extra_args={PREDICTION_KEY: want[0].text})
    as_ids = SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                            extra_args={PREDICTION_KEY: answer_ids})
    edit = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, extra_args={
        PREDICTION_KEY: tokenizer.encode(ORIGINAL, add_special_tokens=False)})
    outs = llm.chat([_messages(QUESTION)] * 2 + [_messages(EDIT)], [as_text, as_ids, edit],
                    use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == \
        [answer_ids, answer_ids, list(want[1].token_ids)]
    assert as_text.extra_args[PREDICTION_KEY] == want[0].text  # the caller's params untouched
    # one request more: the finished ones leave the batch and free their predictions
    llm.chat([_messages("Hi")], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    got = since(before, drafter_stats(llm))
    assert got["prediction_requests"] == 3
    assert got["prediction_accepted"] >= len(answer_ids), got
    assert got["prediction_bytes"] == 0
    with pytest.raises(Exception, match="outside the vocabulary"):
        llm.generate(["Hi"], SamplingParams(max_tokens=2, extra_args={
            PREDICTION_KEY: [int(np.iinfo(np.int32).max)]}), use_tqdm=False)
