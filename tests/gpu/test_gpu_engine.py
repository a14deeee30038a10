# SPDX-License-Identifier: Apache-2.0
"""vLLM on CUDA with the plugin: greedy output identical to no speculation.

Skipped without a CUDA device. Tree verification has no CUDA attention path in
this release, so on GPU both methods run in chain mode (said once in the log);
this checks that the plugin, the logits capture and ECHO's budget work there.
"""

import gc

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _generate(model, spec):
    from vllm import LLM, SamplingParams

    from vllm_echo import prompts

    llm = LLM(model, speculative_config=spec, dtype="float32", max_model_len=2048,
              gpu_memory_utilization=0.3, seed=0)
    chats = [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=8)]
    outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("spec", [{"method": "logitspec", "tree": False},
                                  {"method": "logitspec"}, {"method": "echo"}])
def test_cuda_greedy_identical(spec):
    from vllm_echo.models import default_model_path

    model = default_model_path()
    assert _generate(model, spec) == _generate(model, None)
