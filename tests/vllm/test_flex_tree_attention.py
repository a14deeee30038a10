# SPDX-License-Identifier: Apache-2.0
"""The GPU tree path, run on the CPU: ``"tree_attention": "flex"`` puts vLLM's
FLEX_ATTENTION backend under CPU_ATTN (vllm_echo/plugin/attention/cpu_flex_attention.py), so
the tree mask wrapper, its step tables and the slot compaction that CUDA users get
(flex_tree_attention.py) verify real trees here (fp32, greedy).

One engine per method, with a KV cache of 10 blocks: first 12 chats one at a time
(batch 1) and the longest of them again (its first block comes from the prefix
cache), then 16 chats at batch 8, whose 96-token outputs outgrow the cache together,
so requests are preempted and resumed with trees in flight.
"""

import pytest
import torch
from engine_helpers import REFERENCE_MAX_TOKENS, engine
from flat_cost_echo import KNEE
from flat_cost_echo import speculative_config as flat_cost_echo

from vllm_echo.engines import spec_decode_counters
from vllm_echo.plugin.proposers.logitspec import worker_stats

BATCH1_PROMPTS = 12  # the longest of them fills a KV block to share
BATCH1_MAX_TOKENS = 32
SPECS = {  # (small trees on flex, capacity 4: test_sampled_distribution.py)
    "logitspec-cap32": {"method": "logitspec", "capacity": 32},
    # trees asked for (ECHO verifies chains on the CPU by default), and default ECHO (no
    # k_max) under a step-cost curve flat up to a knee (tests/vllm/flat_cost_echo.py):
    # left to the curve it measures, ECHO rightly verifies few or no trees on this CPU
    "echo-flat-cost": {"method": "echo", "tree": True},
}


def _engine_config(name):
    """(speculative_config, extra engine kwargs) for SPECS[name] on the flex path."""
    spec = {**SPECS[name], "tree_attention": "flex"}
    if name == "echo-flat-cost":
        spec, additional = flat_cost_echo(spec)
        return spec, {"additional_config": additional}
    return spec, {}


def _greedy(max_tokens):
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens)


def _tokens(outs):
    return [list(o.outputs[0].token_ids) for o in outs]


def _metric(llm, name):
    return sum(m.value for m in llm.get_metrics() if m.name == name)


@pytest.mark.engine
@pytest.mark.parametrize("name", list(SPECS))
def test_flex_tree_attention_greedy_identical_to_no_speculation(
        model_path, spec_bench_16, greedy_reference, name):
    spec, extra = _engine_config(name)
    chats = [p.as_chat() for p in spec_bench_16]
    with engine(model_path, spec, max_num_seqs=8, kv_cache_memory_bytes=60 * 2**20,
                max_model_len=1024, **extra) as llm:
        single, prompt_lengths = [], []
        for chat in chats[:BATCH1_PROMPTS]:
            out = llm.chat([chat], _greedy(BATCH1_MAX_TOKENS), use_tqdm=False)[0]
            single.append(list(out.outputs[0].token_ids))
            prompt_lengths.append(len(out.prompt_token_ids))
        longest = max(range(BATCH1_PROMPTS), key=prompt_lengths.__getitem__)
        assert prompt_lengths[longest] > 128  # a full KV block to share
        hits_before = _metric(llm, "vllm:prefix_cache_hits")
        single += _tokens(llm.chat([chats[longest]], _greedy(BATCH1_MAX_TOKENS),
                                   use_tqdm=False))
        shared_prefix = _metric(llm, "vllm:prefix_cache_hits") - hits_before
        batched = _tokens(llm.chat(chats, _greedy(REFERENCE_MAX_TOKENS), use_tqdm=False))
        preemptions = _metric(llm, "vllm:num_preemptions")
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
        counters = spec_decode_counters(llm)
    one_at_a_time = [*range(BATCH1_PROMPTS), longest]
    expected = [greedy_reference[i][:BATCH1_MAX_TOKENS] for i in one_at_a_time]
    bad = [i for i, a, b in zip(one_at_a_time, single, expected) if a != b]
    assert not bad, f"batch 1: outputs differ from no-spec for chats {bad}"
    bad = [i for i, (a, b) in enumerate(zip(batched, greedy_reference)) if a != b]
    assert not bad, f"batch 8: outputs differ from no-spec for chats {bad}"
    assert shared_prefix >= 128, shared_prefix
    assert preemptions > 0, preemptions
    # Trees were verified under the flex mask, and accepted paths off the first
    # branch were moved into place by the slot compaction.
    assert stats["tree_verifications"] > 0 and stats["tree_compactions"] > 0, stats
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0
    faults = {k: n for k, n in stats["failures"].items() if k != "propose:TimeoutError"}
    assert not faults, stats["failures"]
    if name == "echo-flat-cost":
        # the default rule, priced by the injected curve, drafted trees and stopped at
        # the knee (its last budget: at most KNEE - 1 drafts, one request at the end)
        echo = stats["echo"]
        assert echo["trees"] and echo["k_max"] is None, echo
        assert echo["tree_requests"] > 0 and echo["last_budget"] <= KNEE - 1, echo
        assert stats["drafts_tree"] > 0 and stats["accepted_tree"] > 0, stats


def test_torch_cache_write_matches_the_layout_flex_attention_reads():
    from vllm_echo.plugin.attention.cpu_flex_attention import write_kv_cache

    num_blocks, heads, block_size, head_size = 3, 2, 16, 4
    stored = torch.zeros(num_blocks, block_size, heads, 2 * head_size)  # LBNHC in memory
    kv_cache = stored.transpose(1, 2)  # the [blocks, heads, block, 2 x head] view vLLM passes
    key, value = torch.randn(5, heads, head_size), torch.randn(5, heads, head_size)
    slots = torch.tensor([0, 17, -1, 40, 5])
    write_kv_cache(key, value, kv_cache, slots, head_size)
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(stored[slot // block_size, slot % block_size, :, :head_size], key[i])
            assert torch.equal(stored[slot // block_size, slot % block_size, :, head_size:],
                               value[i])
    assert int((stored != 0).any(-1).any(-1).sum()) == 4  # padding (-1) wrote nothing


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_fixed_shape_block_mask_attends_like_the_original():
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    from vllm_echo.plugin.attention.cpu_flex_attention import fixed_shape_block_mask

    block, num_blocks, q_len = 16, 6, 20
    torch.manual_seed(0)
    q = torch.randn(1, 2, q_len, 8)
    k, v = torch.randn(1, 2, num_blocks * block, 8), torch.randn(1, 2, num_blocks * block, 8)
    # two query tiles over blocks {2, 4} and {4}, a table of 2 columns as vLLM builds it
    kv_indices = torch.tensor([[[[2, 4], [4, -1]]]], dtype=torch.int32)
    kv_num_blocks = torch.tensor([[[2, 1]]], dtype=torch.int32)

    def odd_keys(b, h, q_idx, kv_idx):
        return kv_idx % 2 == 1

    mask = BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=(block, block),
                                    mask_mod=odd_keys, seq_lengths=(q_len, num_blocks * block),
                                    compute_q_blocks=False)
    fixed = fixed_shape_block_mask(mask, num_query_blocks=4, num_cache_blocks=num_blocks)
    assert fixed.kv_indices.shape[-2:] == (4, num_blocks)
    assert fixed.full_kv_num_blocks is not None and not fixed.full_kv_num_blocks.any()
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=fixed),
                               flex_attention(q, k, v, block_mask=mask))
