# SPDX-License-Identifier: Apache-2.0
"""Fault injection: a failing or slow drafter, a failing tree step or KV compaction,
or a vLLM whose runner hook points changed, costs speed, never output."""

import pytest
from engine_helpers import engine

from vllm_echo.config import ADDITIONAL_CONFIG_KEY
from vllm_echo.plugin.proposers.logitspec import worker_stats

pytestmark = pytest.mark.engine

MAX_TOKENS = 32


def _chats(spec_bench_16):
    return [p.as_chat() for p in spec_bench_16[:4]]


def _generate(llm, chats, max_tokens):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference(greedy_reference):
    return [tokens[:MAX_TOKENS] for tokens in greedy_reference[:4]]


def _run(model_path, spec_bench_16, proposer_class, capacity, max_tokens=MAX_TOKENS,
         tree_attention="native"):
    """Outputs with ``flaky_proposer.<proposer_class>`` and its stats."""
    spec = {"method": "custom_class", "model": f"flaky_proposer.{proposer_class}",
            "num_speculative_tokens": capacity - 1}
    settings = {"method": "logitspec", "capacity": capacity,
                "num_speculative_tokens": capacity - 1, "tree_attention": tree_attention}
    with engine(model_path, spec, additional_config={ADDITIONAL_CONFIG_KEY: settings}) as llm:
        got = _generate(llm, _chats(spec_bench_16), max_tokens)
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
    return got, stats


def test_failing_or_slow_drafting_tree_verification_and_compaction_keep_outputs(
        model_path, spec_bench_16, reference):
    """Drafting that raises, or runs past the step's deadline (the rest of the batch
    then goes without drafts that step), failing tree verdicts and a compaction that
    misses a layer's K/V: generation goes on with identical output."""
    got, stats = _run(model_path, spec_bench_16, "FlakyProposer", capacity=16)
    assert got == reference
    failures = stats["failures"]
    assert failures.get("propose:RuntimeError", 0) > 1, failures
    assert failures.get("propose:TimeoutError", 0) > 1, failures
    assert failures.get("tree verification:RuntimeError", 0) > 1, failures
    # a layer's K/V missing from the capture: compaction refuses, in-place nodes stay
    assert failures.get("KV compaction:RuntimeError", 0) > 0, failures
    assert stats["accepted_tree"] > 0  # the steps between faults still speculated


def test_changed_runner_signatures_degrade_to_chains(model_path, spec_bench_16, reference):
    """A renamed ``_prepare_inputs`` parameter turns trees off (one counted, logged
    failure); ``_sample``'s new keyword-only parameter is passed through, so chains
    keep their next-next candidates."""
    got, stats = _run(model_path, spec_bench_16, "DriftedRunnerProposer", capacity=16)
    assert got == reference
    hooks = {k: v for k, v in stats["failures"].items() if k.startswith("hook ")}
    assert hooks == {"hook _prepare_inputs:unavailable": 1}, stats["failures"]
    assert stats["drafts_tree"] == 0 and stats["tree_verifications"] == 0, stats
    assert stats["accepted_retrieval"] + stats["accepted_logits"] > 0, stats


def test_flex_missing_masks_and_failing_slot_compactions_keep_outputs(
        model_path, spec_bench_16, reference):
    """FLEX_ATTENTION trees: a step whose mask was never built, or whose tables failed
    to build, accepts no draft; a failed slot compaction keeps the nodes in place."""
    got, stats = _run(model_path, spec_bench_16, "FlexFaultsProposer", capacity=16,
                      tree_attention="flex")
    assert got == reference
    failures = stats["failures"]
    assert failures.get("tree step:RuntimeError", 0) > 1, failures
    assert failures.get("KV compaction:RuntimeError", 0) > 0, failures
    assert stats["tree_steps_failed"] > 1 and stats["tree_paths_cut"] > 0, stats
    assert stats["accepted_tree"] > 0  # the steps between faults still speculated


def test_a_registry_that_refuses_the_backend_override_runs_chains(
        model_path, spec_bench_16, reference):
    """A failing attention-registry call puts the engine in chain mode (one log line),
    and CPU_ATTN stays vLLM's."""
    got, stats = _run(model_path, spec_bench_16, "BrokenRegistryProposer", capacity=16,
                      max_tokens=16)
    assert got == [tokens[:16] for tokens in reference]
    assert stats["tree_enabled"] is False and stats["tree_verifications"] == 0, stats
    assert stats["accepted_retrieval"] + stats["accepted_logits"] > 0, stats
