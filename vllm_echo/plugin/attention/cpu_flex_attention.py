# SPDX-License-Identifier: Apache-2.0
"""vLLM's FLEX_ATTENTION on the CPU platform, so the GPU tree path runs here too.

vLLM's CPU platform always selects CPU_ATTN, and the CPU wheel has no
``reshape_and_cache_flash``. With ``"tree_attention": "flex"`` tree_support registers
this backend under CPU_ATTN: vLLM's FlexAttention backend unchanged (its metadata,
block masks, compiled ``flex_attention`` and LBNHC cache layout), with a torch cache
write where the C op is missing. The tree mask, the step tables and the KV
compaction are flex_tree_attention's, the same code that runs on CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask
from vllm.v1.attention.backends.flex_attention import FlexAttentionBackend, FlexAttentionImpl


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, head_size: int) -> None:
    """Torch stand-in for ``reshape_and_cache_flash`` (dtype "auto"): token i's K/V go
    to slot ``slot_mapping[i]`` of ``kv_cache`` ``[num_blocks, H, block_size, 2*head]``
    (FLEX_ATTENTION's LBNHC view); slots < 0 are padding and are skipped."""
    num_tokens = slot_mapping.shape[0]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    # [blocks * block_size, H, 2*head]: the view FlexAttentionImpl.forward reads from
    by_slot = kv_cache.transpose(1, 2).flatten(0, 1)
    by_slot[slots, :, :head_size] = key[:num_tokens][keep].to(kv_cache.dtype)
    by_slot[slots, :, head_size:] = value[:num_tokens][keep].to(kv_cache.dtype)


def fixed_shape_block_mask(block_mask: BlockMask, num_query_blocks: int,
                           num_cache_blocks: int) -> BlockMask:
    """The block mask with its tables padded to ``num_query_blocks`` query tiles by
    ``num_cache_blocks`` KV blocks, whatever the step.

    vLLM's direct build sizes ``kv_indices`` by the blocks the batch uses while the
    keys it passes are the whole cache: the GPU kernel accepts that, inductor's CPU
    lowering asserts KV length <= table width x block. Fixed shapes also keep the
    compiled CPU kernel from being re-specialised step after step (some of those
    specialisations fail to compile). Padded tiles hold no block and padded columns
    lie past ``kv_num_blocks``: neither is read.
    """
    kv_num_blocks, kv_indices = block_mask.kv_num_blocks, block_mask.kv_indices
    extra_tiles = num_query_blocks - kv_indices.shape[-2]
    if block_mask.full_kv_num_blocks is not None or extra_tiles < 0:
        return block_mask
    # a tile's distinct blocks are left-packed: columns past the cache's block count
    # are padding, and dropping them loses nothing
    kv_indices = kv_indices[..., :num_cache_blocks]
    extra_columns = num_cache_blocks - kv_indices.shape[-1]
    kv_num_blocks = F.pad(kv_num_blocks, (0, extra_tiles))
    kv_indices = F.pad(kv_indices, (0, extra_columns, 0, extra_tiles))
    # No block is "full" (mask skipped), as vLLM builds it, but said with empty
    # tables rather than None: the CPU decode kernel (one query row) reads them
    # unconditionally and fails to compile without them.
    return BlockMask.from_kv_blocks(
        kv_num_blocks, kv_indices, torch.zeros_like(kv_num_blocks), torch.zeros_like(kv_indices),
        BLOCK_SIZE=block_mask.BLOCK_SIZE, mask_mod=block_mask.mask_mod,
        seq_lengths=block_mask.seq_lengths, compute_q_blocks=False)


class CPUFlexAttentionImpl(FlexAttentionImpl):
    """FlexAttentionImpl whose cache write falls back to torch without the C op, and
    whose block masks have one shape (fixed_shape_block_mask)."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if attn_metadata is not None and attn_metadata.block_mask is not None:
            # the metadata (and its mask) is shared by every layer: padded once
            max_tokens = getattr(attn_metadata, "persistent_doc_ids",
                                 attn_metadata.doc_ids).shape[0]
            attn_metadata.block_mask = fixed_shape_block_mask(
                attn_metadata.block_mask, -(-max_tokens // attn_metadata.q_block_size),
                attn_metadata.num_blocks)
        return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                               output_scale, output_block_scale)

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        if hasattr(torch.ops._C_cache_ops, "reshape_and_cache_flash"):
            super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        elif kv_cache.numel():  # the profiling run's cache is empty
            write_kv_cache(key, value, kv_cache, slot_mapping, self.head_size)


class CPUFlexAttentionBackend(FlexAttentionBackend):
    @staticmethod
    def get_impl_cls():
        return CPUFlexAttentionImpl
