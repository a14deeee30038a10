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

from vllm_echo import prompts
from vllm_echo.plugin.proposers.logitspec import worker_stats

MAX_TOKENS = 48
NUM_PROMPTS = 3


@pytest.fixture(scope="module")
def chats():
    return [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=NUM_PROMPTS)]


def _one_at_a_time(llm, chats) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    return [list(llm.chat([c], params, use_tqdm=False)[0].outputs[0].token_ids) for c in chats]


@pytest.fixture(scope="module")
def reference(model_path, chats):
    with engine(model_path) as llm:
        return _one_at_a_time(llm, chats)


@pytest.fixture
def three_ranks(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1|1")
    return {"tensor_parallel_size": 3}


@pytest.mark.parametrize("spec", [
    # ECHO's plans depend on each process's step timing: what corrupted output before
    # rank 0 drafted and planned for every rank
    {"method": "echo", "calibration_steps": 32},
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
    assert len(verified) == 1 and verified.pop() > 0, stats
    assert len({s["tree_compactions"] for s in stats}) == 1, stats
