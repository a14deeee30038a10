# SPDX-License-Identifier: Apache-2.0
"""LogitSpec chain mode inside vLLM: greedy text identical to no speculation."""

import pytest
from engine_helpers import accepted_tokens, drafter_stats, since

pytestmark = pytest.mark.engine

MAX_TOKENS = 64


@pytest.fixture(scope="module")
def reference(greedy_reference):
    return [tokens[:MAX_TOKENS] for tokens in greedy_reference]


def _run(llm, prompts):
    from vllm import SamplingParams

    before = drafter_stats(llm)
    outs = llm.chat([p.as_chat() for p in prompts],
                    SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], since(before, drafter_stats(llm))


def _assert_identical(got, reference):
    mismatched = [i for i, (a, b) in enumerate(zip(got, reference)) if list(a) != list(b)]
    assert not mismatched, f"outputs differ from no-spec for prompts {mismatched}"


def test_logitspec_chain_mode_greedy_identical(shared_engine, spec_bench_16, reference):
    got, stats = _run(shared_engine("logitspec-chain"), spec_bench_16)
    _assert_identical(got, reference)
    assert accepted_tokens(stats) > 0, stats
    # The next-next branch (drafts led by a top-k candidate of the last logits, used when
    # the m-gram lookup found nothing) is proposed and some of it is accepted.
    assert stats["drafts_logits"] > 0 and stats["accepted_logits"] > 0, stats
    assert stats["accepted_retrieval"] > 0, stats
    # verified without vLLM's rejection sampler (greedy, nothing changes the draft rows)
    assert stats["greedy_verified_steps"] > 0, stats


def test_echo_greedy_identical_and_reports_statistics(shared_engine, spec_bench_16, reference):
    llm = shared_engine("echo")
    got, stats = _run(llm, spec_bench_16)
    _assert_identical(got, reference)
    echo = stats["echo"]
    assert accepted_tokens(stats) > 0, stats
    assert echo["accepted"] > 0 and echo["drafted"] >= echo["accepted"], echo
    # (a ratio of the engine's totals, read as it reports it)
    assert 0 < drafter_stats(llm)["echo"]["draft_utilization"] <= 1
    # the rule priced steps with a curve the timed decode steps corrected
    assert echo["cost_steps"] > 0 and echo["cost_curve_ms"], echo
    # acceptance rates learned from verdicts (some bucket has trials)
    assert max(echo["rates"]["trials"]) > 0, echo
