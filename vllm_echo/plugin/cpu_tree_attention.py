# SPDX-License-Identifier: Apache-2.0
"""Tree attention on vLLM's CPU backend.

The native CPU kernel (``ops.cpu_attention_with_kv_cache``) takes no mask, so a
subclass of the CPU_ATTN backend runs it as usual and then recomputes, in torch,
only the query rows of tree requests that causal attention gets wrong: each
such row attends to the whole context, the root and its own ancestors. Requests
without a tree never leave the native kernel.

The context K/V is read back from the paged cache, whose packing depends on the
kernel ISA picked for the dtype ("vec"/"vec16": K stored [head_dim][block] per
block and head, V [block][head_dim]; "amx": VNNI tiles). ``probe_layout`` checks
the reader against the backend's own writer once per ISA before trees are used.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from vllm_echo.plugin import tree_state

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

SUPPORTED_ISAS = ("vec", "vec16", "amx")


def read_kv_blocks(key_cache: torch.Tensor, value_cache: torch.Tensor, blocks: torch.Tensor,
                   isa: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-major K, V ``[len(blocks) * block_size, H_kv, D]`` of the given blocks.

    ``key_cache``/``value_cache`` are the backend's halves, each
    ``[num_blocks, H_kv, block_size, D]`` as a view (the bytes are packed per ISA).
    """
    k = key_cache[blocks]
    v = value_cache[blocks]
    n, h, bs, d = k.shape
    if isa in ("vec", "vec16"):
        k = k.reshape(n, h, d, bs).transpose(2, 3)
    elif isa == "amx":
        k = k.reshape(n, h, bs // 16, d // 2, 16, 2).permute(0, 1, 2, 4, 3, 5).reshape(n, h, bs, d)
        v = v.reshape(n, h, d // 16, bs // 2, 16, 2).permute(0, 1, 3, 5, 2, 4).reshape(n, h, bs, d)
    else:
        raise NotImplementedError(f"no KV reader for CPU attention ISA {isa!r}")
    return (k.permute(0, 2, 1, 3).reshape(n * bs, h, d),
            v.permute(0, 2, 1, 3).reshape(n * bs, h, d))


def probe_layout(isa: str, dtype: torch.dtype, num_kv_heads: int, head_size: int,
                 block_size: int) -> bool:
    """Write known K/V with the backend's own op and check ``read_kv_blocks`` decodes it."""
    if isa not in SUPPORTED_ISAS:
        return False
    try:
        num_blocks = 2
        cache = torch.zeros(num_blocks, num_kv_heads, block_size, 2 * head_size, dtype=dtype)
        kc, vc = cache.view(num_blocks, num_kv_heads, 2 * block_size, head_size).chunk(2, dim=2)
        tokens = num_blocks * block_size
        # Small integers: exact in bf16/fp16, so any permutation error shows.
        k = (torch.arange(tokens * num_kv_heads * head_size) % 251).to(dtype)
        k = k.reshape(tokens, num_kv_heads, head_size)
        v = (k.float() * 2 % 253).to(dtype)
        ops.cpu_attn_reshape_and_cache(k, v, kc, vc, torch.arange(tokens), isa,
                                       k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
        rk, rv = read_kv_blocks(kc, vc, torch.arange(num_blocks), isa)
        return torch.equal(rk, k) and torch.equal(rv, v)
    except Exception as exc:  # an unknown layout disables trees, it never breaks decoding
        logger.warning("vllm-echo: KV layout probe for ISA %s failed: %s", isa, exc)
        return False


class TreeCPUAttentionImpl(CPUAttentionBackendImpl):
    """CPU attention that also honours per-request token trees (see module doc).

    The registry override is process-wide; ``tree_context`` (set by
    tree_support.check_model) ties an impl to its engine's steps. Without one it
    is plain CPU_ATTN.
    """

    tree_context: tree_state.TreeContext | None = None

    def _tree_step(self) -> tree_state.StepTrees | None:
        context = self.tree_context
        return context.step if context is not None else None

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        step = self._tree_step()
        if step is not None and step.trees:
            # Keep the tree rows' K/V: after verification the accepted path is
            # re-written to consecutive slots with the same op (compaction). A layer
            # that fails here is missing from the capture, so compaction refuses the
            # step and only accepted nodes already in place are kept.
            try:
                rows = step.all_rows
                step.captured[layer.layer_name] = (layer, self, key.index_select(0, rows),
                                                   value.index_select(0, rows), kv_cache,
                                                   slot_mapping.index_select(0, rows))
            except Exception:
                pass

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        out = super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                              output_scale, output_block_scale)
        step = self._tree_step()
        if attn_metadata is None or step is None or not step.trees:
            return out
        num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
        key_cache, value_cache = kv_cache.view(
            num_blocks, num_kv_heads, 2 * block_size, -1).chunk(2, dim=2)
        try:
            out_view = output.view(output.shape[0], self.num_heads, self.head_size)
            for tree in step.trees:
                if tree.recompute.numel():
                    self._recompute_rows(tree, query, key, value, key_cache, value_cache,
                                         attn_metadata.block_table, block_size, layer.isa,
                                         out_view)
        except Exception:  # tree rows keep causal attention: the step's trees accept nothing
            step.failed = True
        return out

    def _recompute_rows(self, tree, query, key, value, key_cache, value_cache, block_table,
                        block_size, isa, out_view) -> None:
        qs, n_rows, ctx = tree.query_start, tree.num_rows, tree.context_len
        num_ctx_blocks = -(-ctx // block_size)
        blocks = block_table[tree.req_idx, :num_ctx_blocks].long()
        k_ctx, v_ctx = read_kv_blocks(key_cache, value_cache, blocks, isa)
        keys = torch.cat([k_ctx[:ctx], key[qs:qs + n_rows]]).float()
        values = torch.cat([v_ctx[:ctx], value[qs:qs + n_rows]]).float()
        rows = tree.recompute
        mask = torch.cat([torch.ones(len(rows), ctx, dtype=torch.bool),
                          tree.ancestors.index_select(0, rows)], dim=1)
        q = query[qs:qs + n_rows].index_select(0, rows).float()
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
            attn_mask=mask, scale=self.scale, enable_gqa=True)
        out_view[qs + rows] = attn.transpose(0, 1).to(out_view.dtype)


class TreeCPUAttentionBackend(CPUAttentionBackend):
    """CPU_ATTN with tree rows; keeps the name so code keyed on it still matches."""

    @staticmethod
    def get_impl_cls():
        return TreeCPUAttentionImpl


def compact_accepted_path(tree: tree_state.TreeRows, row_offset: int, path: list[int],
                          step: tree_state.StepTrees) -> None:
    """Move the accepted nodes' K/V to the consecutive slots vLLM assumes.

    ``row_offset`` is the tree's first row inside the captured rows. Node j was
    written at the slot of query row j+1; the k-th accepted node must sit at the
    slot of row k. Only nodes that are not already in place are rewritten, with the
    backend's own writer, so no layout knowledge is needed here. Raises, before
    writing anything, unless every attention layer's K/V was captured.
    """
    moves = [(k + 1, j + 1) for k, j in enumerate(path) if j != k]
    if not moves:
        return
    missing = [layer.layer_name for layer in step.attention_layers
               if layer.layer_name not in step.captured]
    if missing:
        raise RuntimeError(f"K/V of {len(missing)} attention layers not captured "
                           f"(first: {missing[0]}); cannot compact")
    dst = torch.tensor([row_offset + d for d, _ in moves])
    src = torch.tensor([row_offset + s for _, s in moves])
    for layer, impl, k_cap, v_cap, kv_cache, slot_cap in step.captured.values():
        num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
        key_cache, value_cache = kv_cache.view(
            num_blocks, num_kv_heads, 2 * block_size, -1).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(
            k_cap.index_select(0, src), v_cap.index_select(0, src), key_cache, value_cache,
            slot_cap.index_select(0, dst), layer.isa, k_scale=layer._k_scale_float,
            v_scale=layer._v_scale_float, kv_cache_dtype=impl.kv_cache_dtype)
