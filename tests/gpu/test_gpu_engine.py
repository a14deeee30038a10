# SPDX-License-Identifier: Apache-2.0
"""vLLM on CUDA with the plugin: greedy output identical to no speculation.

Skipped without a CUDA device. With the default attention backend (or CUDA graphs)
both methods run in chain mode (said once in the log); with FLEX_ATTENTION in eager
mode trees are verified (vllm_echo/plugin/attention/flex_tree_attention.py).
"""

import gc
import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _generate(model, spec, with_stats=False, **engine_kwargs):
    from vllm import SamplingParams

    from vllm_echo import prompts
    from vllm_echo.engines import build_llm, drafter_stats

    llm = build_llm(spec, model=model, **engine_kwargs)
    chats = [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=8)]
    outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    stats = drafter_stats(llm) if with_stats else None
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    return (tokens, stats) if with_stats else tokens


@pytest.mark.parametrize("spec", [{"method": "logitspec", "tree": False},
                                  {"method": "logitspec"}, {"method": "echo"}])
def test_cuda_greedy_identical(spec):
    from vllm_echo.models import default_model_path

    model = default_model_path()
    assert _generate(model, spec) == _generate(model, None)


@pytest.mark.parametrize("spec", [{"method": "logitspec", "capacity": 32}, {"method": "echo"}])
def test_cuda_tree_verification_with_flex_attention(spec, monkeypatch):
    """Trees on CUDA: depth positions, the FLEX_ATTENTION tree mask (built by the
    csrc op when compiled) and KV compaction by slot must keep greedy text identical."""
    from vllm_echo.models import default_model_path

    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(function)
    model = default_model_path()
    flex = dict(attention_backend="FLEX_ATTENTION", enforce_eager=True)
    got, stats = _generate(model, spec, with_stats=True, **flex)
    assert got == _generate(model, None, **flex)
    if spec["method"] == "logitspec":  # ECHO may rightly prefer chains
        assert stats["tree_verifications"] > 0 and stats["tree_compactions"] > 0, stats
    assert not stats["failures"], stats["failures"]


def test_cuda_seeded_sampled_trees_accept_and_reproduce(monkeypatch):
    """Seeded sampled requests on FLEX_ATTENTION trees: vLLM keeps their generators on
    the GPU, and the tree verdicts derive their random numbers from the generator's
    seed without drawing from it (tree_verdicts.request_rng), so trees accept drafts
    (nothing fails on the device generator) and the same seeds give the same text."""
    from vllm import SamplingParams

    from vllm_echo import prompts
    from vllm_echo.engines import build_llm, drafter_stats

    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(function)
    llm = build_llm({"method": "logitspec", "capacity": 16},
                    attention_backend="FLEX_ATTENTION", enforce_eager=True)
    chats = [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=8)]
    params = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=64, seed=i)
              for i in range(len(chats))]
    first = [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]
    again = [list(o.outputs[0].token_ids) for o in llm.chat(chats, params, use_tqdm=False)]
    stats = drafter_stats(llm)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    assert first == again
    assert stats["tree_verifications"] > 0 and stats["accepted_tree"] > 0, stats
    assert not stats["failures"], stats["failures"]


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_ray_executor_greedy_identical():
    """The plugin loads in Ray executor workers and its settings reach them through
    vLLM's config. SmolLM2-135M has 9 attention heads and 3 KV heads, so it runs
    tensor-parallel over 3 GPUs where there are 3, else on one Ray worker."""
    from vllm_echo.models import default_model_path

    model = default_model_path()
    tp = 3 if torch.cuda.device_count() >= 3 else 1
    got = _generate(model, {"method": "echo", "max_ngram": 2},
                    distributed_executor_backend="ray", tensor_parallel_size=tp)
    assert got == _generate(model, None)


@pytest.mark.skipif(torch.cuda.device_count() < 3,
                    reason="SmolLM2-135M's 9 attention heads split over 3 GPUs (not 2)")
@pytest.mark.parametrize("spec", [{"method": "logitspec", "capacity": 32}, {"method": "echo"}])
def test_cuda_trees_under_tensor_parallel(spec, monkeypatch):
    """Every TP rank verifies rank 0's trees (vllm_echo/plugin/proposers/tp_drafts.py): FLEX_ATTENTION
    trees at TP=3 keep greedy text identical to no speculation on one GPU."""
    from vllm_echo.models import default_model_path

    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(function)
    model = default_model_path()
    flex = dict(attention_backend="FLEX_ATTENTION", enforce_eager=True)
    got, stats = _generate(model, spec, with_stats=True, tensor_parallel_size=3, **flex)
    assert got == _generate(model, None, **flex)
    assert not stats["failures"], stats["failures"]
