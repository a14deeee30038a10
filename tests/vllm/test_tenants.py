# SPDX-License-Identifier: Apache-2.0
"""Tenants stay apart in the opt-in shared outputs: the pool a request drafts from and
teaches is the one its ``cache_salt`` names, as the plugin (server side) marks it. A
client cannot name another tenant's pool through ``vllm_xargs``, and when the mark
cannot be carried (vLLM changed under the patch), no request drafts from any pool.

The server runs LogitSpec's CPU default, chains, where a draft from another request's
output is counted on its own (source="shared": the request's own text had no
continuation, the pool had one). Greedy output stays no speculation's throughout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from server_helpers import openai_server, post

from vllm_echo.plugin.tenancy import CACHE_SALT_KEY

MAX_TOKENS = 48
# Questions whose answers their prompts do not contain (so an answer can only be
# drafted from an earlier answer in the pool).
QUESTION = "Write a short poem about a lighthouse keeper who counts the waves at night."
OTHER_QUESTION = "Explain in a few sentences how bread dough rises."
SPEC = {"method": "logitspec", "shared_outputs": True}


def _shared_drafts(server) -> float:
    return sum(v for k, v in server.metrics().items()
               if k.startswith("vllm_echo:draft_tokens_total") and 'source="shared"' in k)


def _ask(server, question: str, **body) -> tuple[str, float]:
    """The answer, and the tokens drafted from shared outputs while answering it."""
    before = _shared_drafts(server)
    reply = post(server, "chat/completions",
                 {"messages": [{"role": "user", "content": question}], "temperature": 0,
                  "max_tokens": MAX_TOKENS, **body})
    time.sleep(1.5)  # the worker publishes its statistics twice a second
    return reply["choices"][0]["message"]["content"], _shared_drafts(server) - before


@pytest.mark.server
def test_a_spoofed_salt_neither_reads_nor_writes_another_tenants_pool(model_path,
                                                                       no_spec_llm):
    from vllm import SamplingParams

    a, b = {"cache_salt": "tenant-a"}, {"cache_salt": "tenant-b"}
    spoof = {"vllm_xargs": {CACHE_SALT_KEY: "tenant-a"}}  # an unsalted client naming A
    questions = (QUESTION, OTHER_QUESTION)
    outs = no_spec_llm.chat([[{"role": "user", "content": q}] for q in questions],
                            SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                            use_tqdm=False)
    expected = {q: o.outputs[0].text for q, o in zip(questions, outs)}
    with openai_server(model_path, SPEC) as server:
        answers, drafted = {}, {}
        for name, question, body in (
                ("a", QUESTION, a),
                ("a again", QUESTION, a),  # drafts its own first answer: the store works
                ("b", QUESTION, b), ("b again", QUESTION, b),
                ("spoofer", QUESTION, spoof),  # pool 0 is empty: it must draft nothing
                ("spoofer writes", OTHER_QUESTION, spoof),  # into pool 0, not A's
                ("a other", OTHER_QUESTION, a), ("b other", OTHER_QUESTION, b)):
            answers[name], drafted[name] = _ask(server, question, **body)
        unmarked = server.metric_sum("vllm_echo:unmarked_requests_total")
    for name, answer in answers.items():
        question = OTHER_QUESTION if name.endswith(("other", "writes")) else QUESTION
        assert answer == expected[question], f"{name}: differs from no speculation"
    assert drafted["a again"] > 0 and drafted["b again"] > 0, drafted
    assert drafted["a"] == 0 and drafted["b"] == 0, drafted  # empty pools
    assert drafted["spoofer"] == 0, f"the spoofer drafted from A's pool: {drafted}"
    # A's pool and B's hold the same (their own answers to QUESTION): had the spoofer's
    # answer to OTHER_QUESTION entered A's pool, A would draft all of it and B not
    assert drafted["a other"] == drafted["b other"], drafted
    assert drafted["a other"] < drafted["a again"], drafted
    assert unmarked == 0  # every request carried the plugin's mark


@pytest.mark.engine
def test_a_broken_salt_carriage_shares_no_pool(model_path, spec_bench_16, greedy_reference):
    """The salt patch undone: no request reaches the worker with the plugin's mark, so
    none drafts from (or teaches) a shared pool, a client's extra_args included; each
    such request is counted."""
    script = Path(__file__).with_name("broken_carriage.py")
    chat = spec_bench_16[0].as_chat()
    done = subprocess.run([sys.executable, str(script), model_path, json.dumps(chat),
                           str(MAX_TOKENS)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["outputs"] == [greedy_reference[0][:MAX_TOKENS]] * 4
    stats = result["stats"]
    assert stats["drafts_shared"] == 0 and stats["accepted_shared"] == 0, stats
    assert stats["unmarked_requests"] == 4, stats
    assert stats["accepted_retrieval"] + stats["accepted_logits"] > 0, stats  # still speculated
