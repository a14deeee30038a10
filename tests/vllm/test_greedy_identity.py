# SPDX-License-Identifier: Apache-2.0
"""LogitSpec chain mode inside vLLM: greedy text identical to no speculation."""

import pytest
from engine_helpers import engine, spec_counters

from vllm_echo.plugin.proposers.logitspec import worker_stats

MAX_TOKENS = 64


@pytest.fixture(scope="module")
def reference(greedy_reference):
    return [tokens[:MAX_TOKENS] for tokens in greedy_reference]


def _run(model_path, prompts, spec):
    from vllm import SamplingParams

    with engine(model_path, spec) as llm:
        outs = llm.chat([p.as_chat() for p in prompts],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
        counters = spec_counters(llm)
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
    return [o.outputs[0].token_ids for o in outs], counters, stats


def _assert_identical(got, reference):
    mismatched = [i for i, (a, b) in enumerate(zip(got, reference)) if list(a) != list(b)]
    assert not mismatched, f"outputs differ from no-spec for prompts {mismatched}"


def test_logitspec_chain_mode_greedy_identical(model_path, spec_bench_16, reference):
    got, counters, stats = _run(model_path, spec_bench_16,
                                {"method": "logitspec", "tree": False, "num_speculative_tokens": 4})
    _assert_identical(got, reference)
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0
    # The next-next branch (drafts led by a top-k candidate of the last logits, used when
    # the m-gram lookup found nothing) is proposed and some of it is accepted.
    assert stats["drafts_logits"] > 0 and stats["accepted_logits"] > 0, stats
    assert stats["accepted_retrieval"] > 0, stats
    # verified without vLLM's rejection sampler (greedy, nothing changes the draft rows)
    assert stats["greedy_verified_steps"] > 0, stats


def test_echo_greedy_identical_and_reports_statistics(model_path, spec_bench_16, reference):
    got, counters, stats = _run(model_path, spec_bench_16, {"method": "echo"})
    _assert_identical(got, reference)
    echo = stats["echo"]
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0
    assert echo["accepted"] > 0 and echo["drafted"] >= echo["accepted"], echo
    assert 0 < echo["draft_utilization"] <= 1
    # the rule priced steps with a curve the timed decode steps corrected
    assert echo["cost_steps"] > 0 and echo["cost_curve_ms"], echo
    # acceptance rates learned from verdicts (some bucket has trials)
    assert max(echo["rates"]["trials"]) > 0, echo
