# SPDX-License-Identifier: Apache-2.0
"""Tree attention on vLLM's CPU backend.

The native CPU kernel (``ops.cpu_attention_with_kv_cache``) takes no mask. A tree row
attends to the context and its own root path, which is what a chain over that path
gets, so a subclass of the CPU_ATTN backend runs the kernel once as vLLM does (with
the tree rows causal attention would get wrong split off, and left for later), then
once per root path off the first branch, verified as a chain (``PathWaves``). Nothing
is read back from the paged cache, whose packing is the kernel's business. Steps
without a tree never leave vLLM's own call.
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

from vllm_echo.algos.tree import (causal_prefix_length, in_place_prefix, out_of_place,
                                  uncovered_paths)
from vllm_echo.plugin.runner import tree_state


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
            waves = step.cpu.waves
            if waves is None:
                waves = step.cpu.waves = PathWaves.build(step.trees, attn_metadata)
            k_cap, v_cap = waves.run(self, layer, query, key, value, key_cache, value_cache,
                                     output.view(output.shape[0], self.num_heads,
                                                 self.head_size))
            # after verification an accepted path off the first branch is re-written
            # from these to consecutive slots (compaction), with the same op
            step.cpu.captured[layer.layer_name] = (layer, self, k_cap, v_cap, kv_cache)
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
    block_table: torch.Tensor    # each sequence's request's row
    # The path nodes not in their chain slot yet (a slice of the captured rows), and
    # those slots: the tree's row at the node's depth. None: nothing to write.
    writes: slice | None = None
    write_slots: torch.Tensor | None = None
    scheduler_metadata: Any = None  # built by the step's first layer


@dataclass
class PathWaves:
    """The step's attention with tree rows computed by the native kernel itself, with
    no mask and nothing read back.

    A tree row's attention is a chain's: the context, then its root path. The first
    call (``causal``) is vLLM's own, except that in each tree the rows causal
    attention would get wrong (its nodes past its causal prefix) form a sequence of
    their own, over as many slots: their output is garbage the waves overwrite, and
    every row is written in place. Then each tree is split into root paths
    (``uncovered_paths``) and wave w verifies every tree's w-th path as one sequence
    of a native call: the path's K/V are written over the slots of the tree's rows 1,
    2, ... (the request's own, already allocated; only nodes not already there), and
    the path's new nodes are its queries, the last rows of that chain. Afterwards the
    overwritten slots get their rows' own K/V back, so the cache holds what vLLM wrote
    (compaction and the next step rely on it). The root row is never rewritten.

    Each layer copies the rows it writes (``captured_rows``: first the restored ones,
    then each wave's) once; the writes are slices of that copy, and compaction reads
    accepted nodes from it (``capture_position``)."""

    causal: _Wave
    waves: list[_Wave]
    captured_rows: torch.Tensor
    capture_position: dict[int, int]  # step row -> its first index in captured_rows
    slot_mapping: torch.Tensor         # the step's, for compaction's destinations
    restores: slice
    restore_slots: torch.Tensor

    @classmethod
    def build(cls, trees: list[tree_state.TreeRows], attn_metadata: Any) -> "PathWaves":
        if attn_metadata.causal is not True or attn_metadata.dynamic_causal is not None:
            raise NotImplementedError("tree rows need plain causal attention")
        slot_mapping = attn_metadata.slot_mapping
        members: list[list[tuple[tree_state.TreeRows, list[int], int]]] = []
        # per tree, the node each chain slot holds (slot d: the tree's row d)
        holds = [np.arange(-1, len(tree.token_ids)) for tree in trees]
        removed = np.zeros(len(attn_metadata.seq_lens), dtype=np.int64)
        for t, tree in enumerate(trees):
            removed[tree.req_idx] = len(tree.token_ids) - causal_prefix_length(tree.parents)
            for w, (path, num_new) in enumerate(uncovered_paths(tree.parents)):
                if w == len(members):
                    members.append([])
                members[w].append((t, path, num_new))
        # the waves' rows and writes, in capture order after the restored rows
        wave_rows, write_rows, write_slots = [], [], []
        for wave in members:
            queries, q_lens, seq_lens, requests, writes, slots = [], [], [], [], [], []
            for t, path, num_new in wave:
                tree = trees[t]
                nodes = np.asarray(path)
                depth_slots = np.arange(1, len(path) + 1)
                moved = holds[t][depth_slots] != nodes
                holds[t][depth_slots] = nodes
                writes.append(tree.query_start + 1 + nodes[moved])
                slots.append(tree.query_start + depth_slots[moved])
                queries.append(tree.query_start + 1 + nodes[len(path) - num_new:])
                q_lens.append(num_new)
                seq_lens.append(tree.context_len + 1 + len(path))
                requests.append(tree.req_idx)
            wave_rows.append((queries, q_lens, seq_lens, requests))
            write_rows.append(np.concatenate(writes))
            write_slots.append(np.concatenate(slots))
        restores = np.concatenate([tree.query_start + 1 + np.flatnonzero(
            out_of_place(held[1:])) for tree, held in zip(trees, holds)])
        captured = np.concatenate([restores, *write_rows]).astype(np.int64)
        slots = slot_mapping.index_select(0, torch.from_numpy(
            np.concatenate([restores, *write_slots]).astype(np.int64)))
        block_table = attn_metadata.block_table
        waves, at = [], len(restores)
        for (queries, q_lens, seq_lens, requests), writes in zip(wave_rows, write_rows):
            span = slice(at, at + len(writes))
            at = span.stop
            waves.append(_Wave(
                _Rows(np.concatenate(queries)), torch.from_numpy(_starts(q_lens)),
                torch.tensor(seq_lens, dtype=torch.int32),
                block_table.index_select(0, torch.tensor(requests)), span, slots[span]))
        position = {}
        for i, row in enumerate(captured.tolist()):
            position.setdefault(row, i)
        return cls(_causal_wave(attn_metadata, removed), waves, torch.from_numpy(captured),
                   position, slot_mapping, slice(0, len(restores)), slots[:len(restores)])

    def run(self, impl: CPUAttentionBackendImpl, layer, query, key, value, key_cache,
            value_cache, out_view) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's attention into ``out_view``; returns its captured K/V."""
        k_cap = key.index_select(0, self.captured_rows)
        v_cap = value.index_select(0, self.captured_rows)
        write = functools.partial(ops.cpu_attn_reshape_and_cache, key_cache=key_cache,
                                  value_cache=value_cache, isa=layer.isa,
                                  k_scale=layer._k_scale_float, v_scale=layer._v_scale_float,
                                  kv_cache_dtype=impl.kv_cache_dtype)
        # the causal call first: the waves overwrite slots its rows read
        _attend(self.causal, impl, layer, query, key_cache, value_cache, out_view)
        try:
            for wave in self.waves:
                if wave.writes is not None and wave.writes.stop > wave.writes.start:
                    write(k_cap[wave.writes], v_cap[wave.writes], slot_mapping=wave.write_slots)
                _attend(wave, impl, layer, query, key_cache, value_cache, out_view)
        finally:
            if self.restores.stop:
                write(k_cap[self.restores], v_cap[self.restores],
                      slot_mapping=self.restore_slots)
        return k_cap, v_cap


def _causal_wave(attn_metadata: Any, removed: np.ndarray) -> _Wave:
    """vLLM's own call over every row, each tree's ``removed`` last rows split off as a
    sequence over that many slots (row order is kept, so the output is written in
    place; those rows are recomputed by the waves)."""
    query_start_loc = attn_metadata.query_start_loc.numpy().astype(np.int64)
    seq_lens = attn_metadata.seq_lens.numpy().astype(np.int64)
    q_lens = np.diff(query_start_loc)
    split = removed > 0
    count = 1 + split  # sequences per request
    requests = np.repeat(np.arange(len(seq_lens)), count)
    first = np.cumsum(count) - count  # each request's first sequence
    new_q = np.repeat(q_lens, count)
    new_seq = np.repeat(seq_lens, count)
    new_q[first] -= removed
    new_seq[first] -= removed
    new_q[first[split] + 1] = removed[split]
    new_seq[first[split] + 1] = removed[split]
    return _Wave(_Rows(np.arange(int(query_start_loc[-1]))), torch.from_numpy(_starts(new_q)),
                 torch.from_numpy(new_seq.astype(np.int32)),
                 attn_metadata.block_table.index_select(0, torch.from_numpy(requests)))


def _starts(lengths) -> np.ndarray:
    """int32 start offsets of consecutive runs of these lengths, and their end."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _attend(wave: _Wave, impl: CPUAttentionBackendImpl, layer, query, key_cache, value_cache,
            out_view) -> None:
    """The native kernel over ``wave``'s sequences, into its query rows of ``out_view``."""
    if wave.scheduler_metadata is None:
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

    Node j was written at the slot of query row j+1; the k-th accepted node must sit
    at the slot of row k. Only nodes that are not already in place are rewritten, from
    the K/V each layer captured (every such node is one a wave wrote), with the
    backend's own writer, so no layout knowledge is needed here. Raises, before
    writing anything, unless every attention layer's K/V was captured.
    (``row_offset``, the tree's place among the step's tree rows, is the flex path's.)
    """
    moves = [(k + 1, path[k] + 1) for k in range(in_place_prefix(path), len(path))]
    if not moves:
        return
    cpu = step.cpu
    missing = [layer.layer_name for layer in cpu.attention_layers
               if layer.layer_name not in cpu.captured]
    if missing:
        raise RuntimeError(f"K/V of {len(missing)} attention layers not captured "
                           f"(first: {missing[0]}); cannot compact")
    waves = cpu.waves
    src = torch.tensor([waves.capture_position[tree.query_start + s] for _, s in moves])
    dst = waves.slot_mapping.index_select(
        0, torch.tensor([tree.query_start + d for d, _ in moves]))
    for layer, impl, k_cap, v_cap, kv_cache in cpu.captured.values():
        num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
        key_cache, value_cache = kv_cache.view(
            num_blocks, num_kv_heads, 2 * block_size, -1).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(
            k_cap.index_select(0, src), v_cap.index_select(0, src), key_cache, value_cache,
            dst, layer.isa, k_scale=layer._k_scale_float, v_scale=layer._v_scale_float,
            kv_cache_dtype=impl.kv_cache_dtype)
