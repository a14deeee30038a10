# SPDX-License-Identifier: Apache-2.0
"""A step with trees on vLLM's CPU kernel (cpu_tree_attention.PathWaves): each row's
output equals attention over its request's context and its own root path (a plain row:
its causal prefix), computed in float64 from the same K/V; padding rows are left alone
and the paged cache ends as vLLM wrote it; compaction of a path off the first branch
writes just that path's K/V. Real vLLM CPU ops, no engine."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

from vllm_echo.algos.tree import ancestor_mask, causal_prefix_length, uncovered_paths
from vllm_echo.plugin.attention.cpu_tree_attention import PathWaves, compact_accepted_path
from vllm_echo.plugin.runner.tree_state import CpuStep, StepTrees, TreeDraft, tree_rows

HEADS, KV_HEADS, HEAD_SIZE, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 64, 32, 24


def test_uncovered_paths_cover_each_node_off_the_causal_prefix_once_at_its_depth():
    # chain 0-1-2 (the causal prefix), 3 under the root, 4 under 3, 5 under 1, 6 under 3
    parents = [-1, 0, 1, -1, 3, 1, 3]
    assert causal_prefix_length(parents) == 3
    assert uncovered_paths(parents) == [([3, 4], 2), ([0, 1, 5], 1), ([3, 6], 1)]
    assert uncovered_paths([-1, 0, 1]) == []
    assert uncovered_paths([-1, -1, -1]) == [([1], 1), ([2], 1)]


def _tree(req_idx, query_start, context_len, parents):
    parents = np.asarray(parents, dtype=np.int32)
    draft = TreeDraft(np.arange(100, 100 + len(parents), dtype=np.int32), parents)
    return tree_rows(f"r{req_idx}", req_idx, query_start, context_len, draft,
                     draft.token_ids.tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_rows_match_attention_over_context_and_root_path(dtype):
    gen = torch.Generator().manual_seed(0)
    isa = _get_attn_isa(dtype, BLOCK_SIZE, HEAD_SIZE, "auto")
    # request 0 decodes one token (no tree); requests 1 and 2 verify trees, over contexts
    # that end inside a block and right at a block's end
    contexts = [40, 45, 64]
    trees_parents = {1: [-1, 0, 1, -1, 3, 1, 3], 2: [-1, -1, 1, 0]}
    num_rows = [1, 8, 5]
    query_start = np.concatenate([[0], np.cumsum(num_rows)])
    block_ids = torch.randperm(NUM_BLOCKS - 1, generator=gen)[:12].view(3, 4) + 1
    tokens = int(query_start[-1])
    padded = tokens + 2  # rows past num_actual_tokens: vLLM's padding
    key = torch.randn(padded, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
    value = torch.randn(padded, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
    query = torch.randn(padded, HEADS, HEAD_SIZE, generator=gen).to(dtype)
    kv_cache = torch.zeros(NUM_BLOCKS, KV_HEADS, BLOCK_SIZE, 2 * HEAD_SIZE, dtype=dtype)
    key_cache, value_cache = kv_cache.view(
        NUM_BLOCKS, KV_HEADS, 2 * BLOCK_SIZE, HEAD_SIZE).chunk(2, dim=2)

    def slots(req, positions):
        positions = torch.as_tensor(positions)
        return block_ids[req, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE

    context_kv = []
    for req, ctx in enumerate(contexts):
        k = torch.randn(ctx, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
        v = torch.randn(ctx, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype)
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots(req, torch.arange(ctx)),
                                       isa)
        context_kv.append((k, v))
    slot_mapping = torch.cat([slots(req, contexts[req] + torch.arange(num_rows[req]))
                              for req in range(3)])
    ops.cpu_attn_reshape_and_cache(key[:tokens], value[:tokens], key_cache, value_cache,
                                   slot_mapping, isa)
    cache_as_written = kv_cache.clone()

    trees = [_tree(req, int(query_start[req]), contexts[req], p)
             for req, p in trees_parents.items()]
    metadata = SimpleNamespace(
        slot_mapping=slot_mapping, block_table=block_ids.to(torch.int32), causal=True,
        dynamic_causal=None, num_actual_tokens=tokens,
        query_start_loc=torch.from_numpy(query_start.astype(np.int32)),
        seq_lens=torch.tensor(contexts, dtype=torch.int32) + torch.tensor(num_rows,
                                                                          dtype=torch.int32))
    impl = SimpleNamespace(num_heads=HEADS, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE,
                           scale=HEAD_SIZE ** -0.5, kv_cache_dtype="auto")
    layer = SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0,
                            layer_name="layer0")
    out = torch.full((padded, HEADS, HEAD_SIZE), float("nan"), dtype=dtype)
    waves = PathWaves.build(trees, metadata)
    k_cap, v_cap = waves.run(impl, layer, query, key, value, key_cache, value_cache, out)

    assert torch.equal(kv_cache, cache_as_written)
    assert torch.isnan(out[tokens:].float()).all()
    ancestors = {0: torch.ones(1, 1, dtype=torch.bool)}
    ancestors.update({tree.req_idx: torch.from_numpy(ancestor_mask(tree.parents))
                      for tree in trees})
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    for req, anc in ancestors.items():
        k_ctx, v_ctx = context_kv[req]
        qs, n = int(query_start[req]), num_rows[req]
        for r in range(n):
            keys = torch.cat([k_ctx, key[qs:qs + n][anc[r]]]).double()
            values = torch.cat([v_ctx, value[qs:qs + n][anc[r]]]).double()
            keys = keys.repeat_interleave(HEADS // KV_HEADS, dim=1)
            values = values.repeat_interleave(HEADS // KV_HEADS, dim=1)
            q = query[qs + r].double()
            weights = torch.softmax(torch.einsum("hd,thd->ht", q, keys) * HEAD_SIZE ** -0.5, -1)
            expected = torch.einsum("ht,thd->hd", weights, values)
            torch.testing.assert_close(out[qs + r].double(), expected, atol=tolerance,
                                       rtol=tolerance, msg=f"request {req} row {r}")

    # request 1 accepts nodes 3 and 4 (off its first branch): compaction writes their
    # K/V from the capture to the slots of its rows 1 and 2, and nothing else
    step = StepTrees(trees, None, cpu=CpuStep(
        [layer], captured={"layer0": (layer, impl, k_cap, v_cap, kv_cache)}, waves=waves))
    compact_accepted_path(trees[0], 0, [3, 4], step)
    qs = int(query_start[1])
    want = cache_as_written.clone()
    want_key, want_value = want.view(
        NUM_BLOCKS, KV_HEADS, 2 * BLOCK_SIZE, HEAD_SIZE).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key[qs + 4:qs + 6], value[qs + 4:qs + 6], want_key,
                                   want_value, slot_mapping[qs + 1:qs + 3], isa)
    assert not torch.equal(want, cache_as_written)
    assert torch.equal(kv_cache, want)
