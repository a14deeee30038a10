# SPDX-License-Identifier: Apache-2.0
"""Tensor parallelism on CPU: trees verified by every rank give no-spec's greedy text.

The embedded model has 9 attention heads, so TP=3 is the smallest TP it allows; the
three ranks share this machine's two cores (VLLM_CPU_OMP_THREADS_BIND). Each prompt
runs alone (batch 1), where ECHO plans the deepest trees and where rank-dependent
plans once corrupted output.
"""

from __future__ import annotations

import pytest
from engine_helpers import engine

from vllm_echo.config import ADDITIONAL_CONFIG_KEY
from vllm_echo.plugin.proposers.logitspec import worker_stats

pytestmark = pytest.mark.tp

MAX_TOKENS = 48
NUM_PROMPTS = 3


@pytest.fixture(scope="module")
def chats(spec_bench_16):
    return [p.as_chat() for p in spec_bench_16[:NUM_PROMPTS]]


def _one_at_a_time(llm, chats) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    return [list(llm.chat([c], params, use_tqdm=False)[0].outputs[0].token_ids) for c in chats]


@pytest.fixture(scope="module")
def reference(greedy_reference):
    """No speculation at TP=1 (the session's reference: one at a time or batched, fp32
    greedy gives the same tokens on this backend, which the flex test checks)."""
    return [tokens[:MAX_TOKENS] for tokens in greedy_reference[:NUM_PROMPTS]]


@pytest.fixture
def three_ranks(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1|1")
    return {"tensor_parallel_size": 3}


@pytest.mark.parametrize("spec", [
    # ECHO's plans depend on each process's step timing: what corrupted output before
    # rank 0 drafted and planned for every rank
    {"method": "echo", "tree": True},
    # LogitSpec's trees: the same forests, without a timing-dependent plan
    {"method": "logitspec", "capacity": 16},
], ids=["echo", "logitspec"])
def test_trees_under_tensor_parallel_are_greedy_identical(model_path, chats, reference,
                                                          three_ranks, spec):
    with engine(model_path, spec, **three_ranks) as llm:
        got = _one_at_a_time(llm, chats)
        stats = [s for s in llm.collective_rpc(worker_stats) if s]
    mismatched = [i for i, (a, b) in enumerate(zip(got, reference)) if a != b]
    assert not mismatched, f"TP=3 outputs differ from no-spec TP=1 for prompts {mismatched}"
    assert len(stats) == 3, stats  # every rank runs the proposer and verifies
    # Every rank verified the same trees (rank 0's), and trees were verified.
    verified = {s["tree_verifications"] for s in stats}
    assert len(verified) == 1, stats
    if spec["method"] == "logitspec":
        assert verified.pop() > 0, stats
    else:  # ECHO's rule verifies a tree only where branching pays on this CPU: maybe never
        assert stats[0]["echo"]["accepted"] > 0, stats[0]["echo"]
    assert len({s["tree_compactions"] for s in stats}) == 1, stats


def _sampled(llm, chats) -> list[list[int]]:
    """Sampled at temperature 0.8, seeded and unseeded requests in one batch."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.8, max_tokens=MAX_TOKENS, ignore_eos=True,
                             seed=i if i % 2 == 0 else None) for i in range(2 * len(chats))]
    outs = llm.chat(chats * 2, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_a_failure_on_one_rank_is_every_ranks_fallback(model_path, chats, reference,
                                                       three_ranks):
    """FLEX_ATTENTION trees at TP=3, with mask-table and slot-compaction faults on
    rank 1 only (flaky_proposer.OneRankFlexFaultsProposer): the ranks agree on each
    step's outcome, so every rank takes rank 1's fallback, counts it, and the output
    stays no-spec's. Sampled requests (seeded and not) then run through the same
    faults: a tree step that failed on one rank consumes the same random numbers as
    on the others, so every rank samples the same tokens (a digest per rank of every
    step's sampled tokens)."""
    capacity = 16
    spec = {"method": "custom_class", "model": "flaky_proposer.OneRankFlexFaultsProposer",
            "num_speculative_tokens": capacity - 1}
    settings = {"method": "logitspec", "capacity": capacity, "tree_attention": "flex",
                "num_speculative_tokens": capacity - 1}
    with engine(model_path, spec, additional_config={ADDITIONAL_CONFIG_KEY: settings},
                **three_ranks) as llm:
        got = _one_at_a_time(llm, chats)
        greedy_stats = [s for s in llm.collective_rpc(worker_stats) if s]
        sampled = _sampled(llm, chats)
        stats = [s for s in llm.collective_rpc(worker_stats) if s]
    mismatched = [i for i, (a, b) in enumerate(zip(got, reference)) if a != b]
    assert not mismatched, f"TP=3 outputs differ from no-spec TP=1 for prompts {mismatched}"
    assert len(stats) == 3, stats
    for counter in ("tree_steps_failed", "tree_paths_cut", "tree_verifications"):
        counts = {s[counter] for s in greedy_stats}
        assert len(counts) == 1 and counts.pop() > 0, (counter, greedy_stats)
    # only rank 1 failed; ranks 0 and 2 took its outcomes
    assert stats[1]["failures"].get("KV compaction:RuntimeError", 0) > 0, stats[1]
    assert not any(k.startswith("KV compaction") for k in stats[0]["failures"]), stats[0]
    assert stats[0]["tree_outcomes_from_other_ranks"] > 0, stats[0]
    # the sampled requests verified trees too, with rank 1's faults among them
    assert all(len(t) == MAX_TOKENS for t in sampled)
    assert stats[0]["tree_verifications"] > greedy_stats[0]["tree_verifications"], stats[0]
    assert stats[0]["tree_steps_failed"] > greedy_stats[0]["tree_steps_failed"], stats[0]
    assert len({s["sampled_digest"] for s in stats}) == 1, "the ranks sampled different tokens"
