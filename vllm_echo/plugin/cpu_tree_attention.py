# SPDX-License-Identifier: Apache-2.0
"""Tree attention on vLLM's CPU backend.

The native CPU kernel (``ops.cpu_attention_with_kv_cache``) takes no mask. A tree row
attends to the context and its own root path, which is what a chain over that path
gets, so a subclass of the CPU_ATTN backend runs the kernel once as vLLM does, less
the tree rows causal attention would get wrong, and then once per root path off the
first branch, verified as a chain (``PathWaves``). Nothing is read back from the
paged cache, whose packing is the kernel's business. Steps without a tree never
leave vLLM's own call.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm import _custom_ops as ops
from vllm import envs
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from vllm_echo.algos.tree import causal_prefix_length, uncovered_paths
from vllm_echo.plugin import tree_state


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
        step = self._tree_step()
        if attn_metadata is None or step is None or not step.trees or step.failed:
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
        key_cache, value_cache = kv_cache.view(
            num_blocks, num_kv_heads, 2 * block_size, -1).chunk(2, dim=2)
        try:
            waves = step.cpu_waves
            if waves is None:
                waves = step.cpu_waves = PathWaves.build(step.trees, attn_metadata)
            waves.run(self, layer, query, key, value, key_cache, value_cache, attn_metadata,
                      output.view(output.shape[0], self.num_heads, self.head_size))
        except Exception:
            # every row causal, as vLLM computes them: the step's trees accept nothing
            step.failed = True
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        return output


class _Rows:
    """Token rows of the step: taken as a slice (a view, no copy) when consecutive."""

    def __init__(self, rows: np.ndarray):
        self.index = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        consecutive = len(rows) and np.array_equal(rows, np.arange(rows[0], rows[0] + len(rows)))
        self.span = slice(int(rows[0]), int(rows[0]) + len(rows)) if consecutive else None

    def __len__(self) -> int:
        return len(self.index)

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor[self.span] if self.span is not None else tensor.index_select(0, self.index)


@dataclass
class _Wave:
    """One native call: some rows of the step as the last queries of their sequences."""

    queries: _Rows               # the rows this call computes
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    requests: torch.Tensor | None  # the sequences' requests (rows of the block table; None: all)
    writes: _Rows | None = None  # path nodes whose K/V are not in their chain slot yet
    write_slots: torch.Tensor | None = None  # those slots: the tree's row at the node's depth
    block_table: Any = None      # built by the step's first layer, as is:
    scheduler_metadata: Any = None


@dataclass
class PathWaves:
    """The step's attention with tree rows computed by the native kernel itself, with
    no mask and nothing read back.

    A tree row's attention is a chain's: the context, then its root path. The first
    call (``causal``) is vLLM's own, less the rows causal attention would get wrong
    (every tree's nodes past its causal prefix): the other requests' rows and each
    tree's root and first branch. Then each tree is split into root paths
    (``uncovered_paths``) and wave w verifies every tree's w-th path as one sequence
    of a native call: the path's K/V are written over the slots of the tree's rows 1,
    2, ... (the request's own, already allocated; only nodes not already there), and
    the path's new nodes are its queries, the last rows of that chain. Afterwards the
    overwritten slots get their rows' own K/V back, so the cache holds what vLLM wrote
    (compaction and the next step rely on it). The root row is never rewritten."""

    causal: _Wave
    waves: list[_Wave]
    restores: _Rows
    restore_slots: torch.Tensor

    @classmethod
    def build(cls, trees: list[tree_state.TreeRows], attn_metadata: Any) -> "PathWaves":
        if attn_metadata.causal is not True or attn_metadata.dynamic_causal is not None:
            raise NotImplementedError("tree rows need plain causal attention")
        slot_mapping = attn_metadata.slot_mapping
        members: list[list[tuple[tree_state.TreeRows, list[int], int]]] = []
        # per tree, the node each chain slot holds (slot d: the tree's row d)
        holds = [np.arange(-1, len(tree.token_ids)) for tree in trees]
        causal_rows = np.ones(attn_metadata.num_actual_tokens, dtype=bool)
        removed = np.zeros(len(attn_metadata.seq_lens), dtype=np.int32)
        for t, tree in enumerate(trees):
            prefix = causal_prefix_length(tree.parents)
            causal_rows[tree.query_start + 1 + prefix:tree.query_start + tree.num_rows] = False
            removed[tree.req_idx] = len(tree.token_ids) - prefix
            for w, (path, num_new) in enumerate(uncovered_paths(tree.parents)):
                if w == len(members):
                    members.append([])
                members[w].append((t, path, num_new))
        query_start_loc = attn_metadata.query_start_loc.numpy()
        causal = _Wave(
            _Rows(np.flatnonzero(causal_rows)),
            torch.from_numpy(query_start_loc - _starts(removed)),
            attn_metadata.seq_lens - torch.from_numpy(removed).to(attn_metadata.seq_lens.dtype),
            None)
        waves = []
        for wave in members:
            writes, write_slots, queries, q_lens, seq_lens, requests = [], [], [], [], [], []
            for t, path, num_new in wave:
                tree = trees[t]
                nodes = np.asarray(path)
                depth_slots = np.arange(1, len(path) + 1)
                moved = holds[t][depth_slots] != nodes
                holds[t][depth_slots] = nodes
                writes.append(tree.query_start + 1 + nodes[moved])
                write_slots.append(tree.query_start + depth_slots[moved])
                queries.append(tree.query_start + 1 + nodes[len(path) - num_new:])
                q_lens.append(num_new)
                seq_lens.append(tree.context_len + 1 + len(path))
                requests.append(tree.req_idx)
            waves.append(_Wave(
                _Rows(np.concatenate(queries)),
                torch.from_numpy(_starts(q_lens)),
                torch.tensor(seq_lens, dtype=torch.int32),
                torch.tensor(requests, dtype=torch.long),
                _Rows(np.concatenate(writes)),
                slot_mapping.index_select(0, torch.from_numpy(np.concatenate(write_slots)))))
        restores = np.concatenate([tree.query_start + np.flatnonzero(
            held != np.arange(-1, len(held) - 1)) for tree, held in zip(trees, holds)])
        return cls(causal, waves, _Rows(restores),
                   slot_mapping.index_select(0, torch.from_numpy(restores)))

    def run(self, impl: CPUAttentionBackendImpl, layer, query, key, value, key_cache,
            value_cache, attn_metadata, out_view) -> None:
        write = functools.partial(ops.cpu_attn_reshape_and_cache, key_cache=key_cache,
                                  value_cache=value_cache, isa=layer.isa,
                                  k_scale=layer._k_scale_float, v_scale=layer._v_scale_float,
                                  kv_cache_dtype=impl.kv_cache_dtype)
        # the causal call first: the waves overwrite slots its rows read
        _attend(self.causal, impl, layer, query, key_cache, value_cache, attn_metadata,
                out_view)
        try:
            for wave in self.waves:
                if len(wave.writes):
                    write(wave.writes.take(key), wave.writes.take(value),
                          slot_mapping=wave.write_slots)
                _attend(wave, impl, layer, query, key_cache, value_cache, attn_metadata,
                        out_view)
        finally:
            if len(self.restores):
                write(self.restores.take(key), self.restores.take(value),
                      slot_mapping=self.restore_slots)


def _starts(lengths) -> np.ndarray:
    """int32 start offsets of consecutive runs of these lengths, and their end."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _attend(wave: _Wave, impl: CPUAttentionBackendImpl, layer, query, key_cache, value_cache,
            attn_metadata, out_view) -> None:
    """The native kernel over ``wave``'s sequences, into its query rows of ``out_view``."""
    if wave.scheduler_metadata is None:
        wave.block_table = (attn_metadata.block_table if wave.requests is None
                            else attn_metadata.block_table.index_select(0, wave.requests))
        wave.scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(wave.seq_lens), num_heads=impl.num_heads,
            num_kv_heads=impl.num_kv_heads, head_dim=impl.head_size, seq_lens=wave.seq_lens,
            dtype=query.dtype, query_start_loc=wave.query_start_loc, causal=True,
            sliding_window_size=-1, isa=layer.isa, enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
            kv_cache_dtype=impl.kv_cache_dtype)
    # consecutive rows are written in place; others through a buffer
    queries = wave.queries
    wave_out = out_view[queries.span] if queries.span is not None else torch.empty(
        len(queries), impl.num_heads, impl.head_size, dtype=out_view.dtype)
    ops.cpu_attention_with_kv_cache(
        query=queries.take(query), key_cache=key_cache, value_cache=value_cache,
        output=wave_out, query_start_loc=wave.query_start_loc, seq_lens=wave.seq_lens,
        scale=impl.scale, causal=True, alibi_slopes=None, sliding_window=-1,
        block_table=wave.block_table, softcap=0, scheduler_metadata=wave.scheduler_metadata,
        s_aux=None, k_scale=layer._k_scale_float, v_scale=layer._v_scale_float,
        kv_cache_dtype=impl.kv_cache_dtype)
    if queries.span is None:
        out_view.index_copy_(0, queries.index, wave_out)


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
