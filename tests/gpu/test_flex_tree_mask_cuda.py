# SPDX-License-Identifier: Apache-2.0
"""The FLEX_ATTENTION tree mask on CUDA, without vLLM: the step's tables built on the
device (by the csrc op when compiled) and compiled flex_attention over a packed batch
of tree and plain requests, against dense attention with the ancestor mask."""

import numpy as np
import pytest
import torch

from test_flex_tree_mask import random_tree_rows  # tests/unit (tests/conftest.py)
from vllm_echo.algos.tree import ancestor_mask
from vllm_echo.plugin.attention.flex_tree_attention import step_mask_tables, tree_mask_mod

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _packed_step(rng):
    """Three requests packed as vLLM lays them out: a tree, three plain query tokens,
    a wider tree. Returns the trees, per-query (request, logical position), per-key
    (request, logical position) and the dense mask vLLM's composition must give (block
    diagonal: each request's queries see its own keys only)."""
    q_req, q_pos, kv_req, kv_pos, trees, blocks = [], [], [], [], [], []
    for req, (kind, size, context_len) in enumerate(
            [("tree", 40, 37), ("plain", 3, 20), ("tree", 70, 130)]):
        if kind == "tree":  # the root (the last verified token) and its drafts
            tree = random_tree_rows(rng, size, len(q_req), context_len)
            trees.append(tree)
            n_q = tree.num_rows
            block = np.ones((n_q, context_len + n_q), dtype=bool)
            block[:, context_len:] = ancestor_mask(tree.parents)
        else:
            n_q = size
            block = np.arange(context_len + n_q)[None, :] <= (context_len + np.arange(n_q))[:, None]
        q_req += [req] * n_q
        q_pos += list(range(context_len, context_len + n_q))
        kv_req += [req] * (context_len + n_q)
        kv_pos += list(range(context_len + n_q))
        blocks.append(torch.from_numpy(block))
    as_cuda = lambda xs: torch.tensor(xs, dtype=torch.int64, device="cuda")  # noqa: E731
    return (trees, as_cuda(q_req), as_cuda(q_pos), as_cuda(kv_req), as_cuda(kv_pos),
            torch.block_diag(*blocks))


def test_tables_built_on_cuda_equal_the_cpu_tables():
    trees, q_req, *_ = _packed_step(np.random.default_rng(0))
    rows = int(q_req.shape[0]) + 5  # persistent buffers are longer than the step
    on_cuda = step_mask_tables(trees, rows, "cuda")
    on_cpu = step_mask_tables(trees, rows, "cpu")
    for got, want in zip(on_cuda, on_cpu):
        assert got.device.type == "cuda"
        assert torch.equal(got.cpu(), want)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_flex_attention_with_the_tree_mask_equals_dense_attention(dtype):
    from torch.nn.attention import flex_attention as flex

    trees, q_req, q_pos, kv_req, kv_pos, dense = _packed_step(np.random.default_rng(1))
    n_q, n_kv = dense.shape
    tree_start, anc_words = step_mask_tables(trees, n_q, "cuda")

    def same_request_causal(b, h, q_idx, kv_idx):
        return (q_req[q_idx] == kv_req[kv_idx]) & (kv_pos[kv_idx] <= q_pos[q_idx])

    mask_mod = flex.and_masks(
        same_request_causal,
        tree_mask_mod(lambda q_idx, kv_idx: kv_pos[kv_idx], tree_start, anc_words))
    block_mask = flex.create_block_mask(mask_mod, None, None, n_q, n_kv, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    heads, dim = 4, 64
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen, device="cuda", dtype=dtype)
               for n in (n_q, n_kv, n_kv))
    got = torch.compile(flex.flex_attention)(q, k, v, block_mask=block_mask)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=dense.cuda())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
