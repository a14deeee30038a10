# SPDX-License-Identifier: Apache-2.0
"""Fault injection: a failing or slow drafter, or a failing tree step, costs speed,
never output."""

from engine_helpers import engine

from vllm_echo.config import ADDITIONAL_CONFIG_KEY
from vllm_echo.plugin.proposer import worker_stats


def _with_and_without(model_path, prompts, proposer_class, capacity, max_tokens):
    """(no-spec outputs, outputs with ``flaky_proposer.<proposer_class>``, its stats)."""
    from vllm import SamplingParams

    chats = [p.as_chat() for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    with engine(model_path) as llm:
        expected = [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]
    spec = {"method": "custom_class", "model": f"flaky_proposer.{proposer_class}",
            "num_speculative_tokens": capacity - 1}
    settings = {"method": "logitspec", "capacity": capacity,
                "num_speculative_tokens": capacity - 1}
    with engine(model_path, spec, additional_config={ADDITIONAL_CONFIG_KEY: settings}) as llm:
        got = [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
    return expected, got, stats


def test_failing_drafting_and_tree_verification_keep_outputs(model_path, spec_bench_16):
    expected, got, stats = _with_and_without(model_path, spec_bench_16[:6], "FlakyProposer",
                                             capacity=16, max_tokens=48)
    assert got == expected
    failures = stats["failures"]
    assert failures.get("propose:RuntimeError", 0) > 1, failures
    assert failures.get("tree verification:RuntimeError", 0) > 1, failures
    assert stats["accepted_tree"] > 0  # the steps between faults still speculated


def test_slow_drafting_times_out_and_keeps_outputs(model_path, spec_bench_16):
    """A step whose drafting runs past the deadline sends the rest of the batch
    without drafts; generation goes on with identical output."""
    expected, got, stats = _with_and_without(model_path, spec_bench_16[:6], "SlowProposer",
                                             capacity=8, max_tokens=24)
    assert got == expected
    assert stats["failures"].get("propose:TimeoutError", 0) > 1, stats["failures"]
    assert stats["accepted_tree"] > 0
