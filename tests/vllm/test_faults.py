# SPDX-License-Identifier: Apache-2.0
"""Fault injection: a failing drafter or tree step costs speed, never output."""

import itertools
import logging

import pytest
from engine_helpers import engine

from vllm_echo.plugin import proposer as proposer_module
from vllm_echo.plugin import tree_runner

MAX_TOKENS = 48


def _every_third(fn):
    calls = itertools.count()

    def flaky(*args, **kwargs):
        if next(calls) % 3 == 1:
            raise RuntimeError("injected fault")
        return fn(*args, **kwargs)
    return flaky


@pytest.fixture
def in_process(monkeypatch):
    # Engine core and worker in this process, so the patches below reach them.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_failing_drafting_and_tree_verification_keep_outputs(model_path, spec_bench_16,
                                                             in_process, monkeypatch):
    from vllm import SamplingParams

    chats = [p.as_chat() for p in spec_bench_16[:6]]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    with engine(model_path) as llm:
        expected = [o.outputs[0].token_ids for o in llm.chat(chats, params, use_tqdm=False)]

    monkeypatch.setattr(proposer_module, "build_forest", _every_third(proposer_module.build_forest))
    monkeypatch.setattr(tree_runner, "verify_greedy", _every_third(tree_runner.verify_greedy))
    records = _Records()
    logging.getLogger("vllm.vllm_echo").addHandler(records)
    try:
        with engine(model_path, {"method": "logitspec", "capacity": 16}) as llm:
            got = [o.outputs[0].token_ids for o in llm.chat(chats, params, use_tqdm=False)]
    finally:
        logging.getLogger("vllm.vllm_echo").removeHandler(records)
    assert [list(t) for t in got] == [list(t) for t in expected]
    warnings = [m for m in records.messages if "injected fault" in m]
    # one warning per kind of failure, not one per step
    assert any("propose failed" in w for w in warnings)
    assert any("tree verification failed" in w for w in warnings)
    assert len(warnings) == 2, warnings
