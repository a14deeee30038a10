# SPDX-License-Identifier: Apache-2.0
"""The FLEX_ATTENTION tree mask (GPU path), checked on CPU against the ancestor mask.

vLLM's metadata wrapper and KV compaction need CUDA (tests/gpu); the tables and the
mask_mod they feed are plain torch and are checked here.
"""

import numpy as np
import pytest
import torch

from vllm_echo.algos.tree import ancestor_mask
from vllm_echo.plugin.runner import tree_state
from vllm_echo.plugin.attention.flex_tree_attention import step_mask_tables, tree_mask_mod


def random_tree_rows(rng, num_nodes, query_start, context_len):
    parents = np.array([-1] + [int(rng.integers(-1, j)) for j in range(1, num_nodes)], np.int32)
    draft = tree_state.TreeDraft(np.arange(num_nodes, dtype=np.int32) + 100, parents)
    rows = tree_state.tree_rows("r", 0, query_start, context_len, draft, draft.token_ids.tolist())
    assert rows is not None  # random trees of this size are not chains
    return rows


@pytest.mark.parametrize("num_nodes", [3, 31, 40, 70])  # 1, 2 and 3 words of 32 columns
def test_mask_mod_gives_prefix_plus_ancestors(num_nodes):
    rng = np.random.default_rng(num_nodes)
    before, context_len = 3, 11  # 3 query tokens of a request without a tree come first
    tree = random_tree_rows(rng, num_nodes, before, context_len)
    total = before + tree.num_rows
    tree_start, anc_words = step_mask_tables([tree], total)
    mask_mod = tree_mask_mod(lambda q, kv: kv, tree_start, anc_words)
    q = torch.arange(total).view(-1, 1)
    kv = torch.arange(context_len + tree.num_rows).view(1, -1)
    got = mask_mod(None, None, q, kv)
    assert got[:before].all()  # no tree: only causality (ANDed by vLLM) applies
    want = np.ones((tree.num_rows, context_len + tree.num_rows), dtype=bool)
    want[:, context_len:] = ancestor_mask(tree.parents)
    assert np.array_equal(got[before:].numpy(), want)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_with_the_tree_mask_equals_dense_attention():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    rng = np.random.default_rng(0)
    context_len, heads, dim = 20, 2, 16
    tree = random_tree_rows(rng, 12, 0, context_len)
    n_q, n_kv = tree.num_rows, context_len + tree.num_rows
    tree_start, anc_words = step_mask_tables([tree], n_q)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + context_len

    mask_mod = flex.and_masks(causal, tree_mask_mod(lambda q, kv: kv, tree_start, anc_words))
    block_mask = flex.create_block_mask(mask_mod, None, None, n_q, n_kv, device="cpu")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen) for n in (n_q, n_kv, n_kv))
    got = flex.flex_attention(q, k, v, block_mask=block_mask)
    dense = torch.ones(n_q, n_kv, dtype=torch.bool)
    dense[:, context_len:] = torch.from_numpy(ancestor_mask(tree.parents))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
