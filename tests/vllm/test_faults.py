# SPDX-License-Identifier: Apache-2.0
"""Fault injection: a failing drafter or tree step costs speed, never output."""

from engine_helpers import engine

from vllm_echo.config import ADDITIONAL_CONFIG_KEY
from vllm_echo.plugin.proposer import worker_stats

MAX_TOKENS = 48


def test_failing_drafting_and_tree_verification_keep_outputs(model_path, spec_bench_16):
    from vllm import SamplingParams

    chats = [p.as_chat() for p in spec_bench_16[:6]]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    with engine(model_path) as llm:
        expected = [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]

    spec = {"method": "custom_class", "model": "flaky_proposer.FlakyProposer",
            "num_speculative_tokens": 15}
    settings = {"method": "logitspec", "capacity": 16, "num_speculative_tokens": 15}
    with engine(model_path, spec, additional_config={ADDITIONAL_CONFIG_KEY: settings}) as llm:
        got = [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
    assert got == expected
    failures = stats["failures"]
    assert failures.get("propose:RuntimeError", 0) > 1, failures
    assert failures.get("tree verification:RuntimeError", 0) > 1, failures
    assert stats["accepted_tree"] > 0  # the steps between faults still speculated


def test_slow_drafting_times_out_and_keeps_outputs(model_path, spec_bench_16):
    """A step whose drafting runs past the deadline sends the rest of the batch
    without drafts; generation goes on with identical output."""
    from vllm import SamplingParams

    chats = [p.as_chat() for p in spec_bench_16[:6]]
    params = SamplingParams(temperature=0, max_tokens=24)
    with engine(model_path) as llm:
        expected = [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]
    spec = {"method": "custom_class", "model": "flaky_proposer.SlowProposer",
            "num_speculative_tokens": 7}
    settings = {"method": "logitspec", "capacity": 8, "num_speculative_tokens": 7}
    with engine(model_path, spec, additional_config={ADDITIONAL_CONFIG_KEY: settings}) as llm:
        got = [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
    assert got == expected
    assert stats["failures"].get("propose:TimeoutError", 0) > 1, stats["failures"]
    assert stats["accepted_tree"] > 0
