# SPDX-License-Identifier: Apache-2.0
"""LogitSpec chain mode inside vLLM: greedy text identical to no speculation."""

import pytest
from engine_helpers import engine, spec_counters

from vllm_echo.plugin.proposer import worker_stats

MAX_TOKENS = 96


@pytest.fixture(scope="module")
def reference(model_path, spec_bench_16):
    from vllm import SamplingParams

    with engine(model_path) as llm:
        outs = llm.chat([p.as_chat() for p in spec_bench_16],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("method", ["logitspec", "echo"])
def test_greedy_output_identical_to_no_speculation(model_path, spec_bench_16, reference, method):
    from vllm import SamplingParams

    with engine(model_path, {"method": method, "num_speculative_tokens": 4}) as llm:
        outs = llm.chat([p.as_chat() for p in spec_bench_16],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
        counters = spec_counters(llm)
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
    got = [o.outputs[0].token_ids for o in outs]
    mismatched = [i for i, (a, b) in enumerate(zip(got, reference)) if list(a) != list(b)]
    assert not mismatched, f"outputs differ from no-spec for prompts {mismatched}"
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0
    # The next-next branch (drafts led by a top-k candidate of the last logits, used when
    # the m-gram lookup found nothing) is proposed and some of it is accepted.
    assert stats["drafts_logits"] > 0 and stats["accepted_logits"] > 0, stats
    assert stats["accepted_retrieval"] > 0, stats
