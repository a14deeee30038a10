# SPDX-License-Identifier: Apache-2.0
"""Tree verification in vLLM's FLEX_ATTENTION: a per-request tree mask (CUDA, and the
CPU through cpu_flex_attention.py).

FlexAttention builds every step's mask from one composition point,
``FlexAttentionMetadata.get_mask_mod`` (flex_attention.py:615-636; the block mask
built in ``__post_init__`` and every forward-time rebuild go through it). We AND a
tree mask into it: a query row of a tree request may see key position k iff k is
before the request's root (the prefix) or k is the root, one of the row's
ancestors or the row itself. A tree mask is a subset of causal, so vLLM's causal
block pruning stays valid; the direct block-mask builder marks no block "full"
(flex_attention.py:797-798), so the mask is evaluated on every block it keeps.

The patch is process-wide. The metadata has no reference to its engine, but it
holds its builder's persistent query-to-request buffer (``persistent_doc_ids``), and
each engine's builders are this engine's: ``attach_to_builders`` maps those buffers
to the engine's TreeContext before its first step, so other engines' metadata is
left as vLLM builds it. A tree step whose mask was never built accepts no draft.
Per query token the mask reads two tables built once per step from that step
(after ``_prepare_inputs``, before the metadata is built):
``tree_start[q]`` = the logical position of its request's root (a huge value for
tokens of requests without a tree, so only causality applies) and
``anc_words[q]`` = the ancestor bits of its row, from the tree-mask op in csrc/
(``vllm_echo.ops.tree_mask.build_tree_mask``: the CUDA kernel on the GPU). KV
compaction is an indexed copy in the paged cache
``[num_blocks, num_kv_heads, block_size, 2 * head_size]``.

On CUDA, eager mode only (tree_support.prepare checks): under CUDA graphs the tables
would have to live in persistent buffers (their shape is already fixed).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np
import torch

from vllm_echo.algos.tree import in_place_prefix
from vllm_echo.ops.tree_mask import BITS_PER_WORD, build_tree_mask, num_mask_words
from vllm_echo.plugin.runner import tree_state
from vllm_echo.plugin.runner.tree_state import TreeContext

_NO_TREE = torch.iinfo(torch.int64).max // 2
_MARK = "_vllm_echo_tree_mask"


# Mask rows are this wide whatever the step's trees: with the query dimension sized
# to the metadata's persistent buffers, the tables keep one shape across steps, so
# the compiled flex_attention is not re-specialised on them (inductor's CPU template
# failed to compile such a re-specialisation). 160 bits hold the largest tree vLLM
# lets us verify (128 drafts and the root).
MASK_WORDS = num_mask_words(160)


def step_mask_tables(trees: list[tree_state.TreeRows], num_query_tokens: int,
                     device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(tree_start [T] int64, anc_words [T, MASK_WORDS] int32)`` for the step's
    flattened query tokens (T >= the step's tokens); rows of tokens outside trees
    see no tree (start = huge)."""
    tree_start = torch.full((num_query_tokens,), _NO_TREE, dtype=torch.int64, device=device)
    anc_words = torch.zeros(num_query_tokens, MASK_WORDS, dtype=torch.int32, device=device)
    if not trees:
        return tree_start, anc_words
    # the op's trees include the root as local node 0 (parent -1)
    parents = np.concatenate([np.concatenate([[-1], t.parents.astype(np.int64) + 1])
                              for t in trees]).astype(np.int32)
    num_rows = [t.num_rows for t in trees]
    cu = np.cumsum([0] + num_rows).astype(np.int32)
    base = torch.tensor([t.context_len for t in trees], dtype=torch.int64)
    _, words = build_tree_mask(torch.from_numpy(parents).to(device), torch.from_numpy(cu).to(device),
                               base.to(device), MASK_WORDS * BITS_PER_WORD, validate=False)
    rows = torch.from_numpy(np.concatenate(
        [np.arange(t.query_start, t.query_start + t.num_rows) for t in trees])).to(device)
    tree_start[rows] = torch.repeat_interleave(base, torch.tensor(num_rows)).to(device)
    anc_words[rows] = words
    return tree_start, anc_words


def tree_mask_mod(logical_kv: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  tree_start: torch.Tensor, anc_words: torch.Tensor) -> Callable:
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` for the tables above;
    ``logical_kv(q_idx, kv_idx)`` gives the key's position in its request."""
    num_words = anc_words.shape[1]

    def mask_mod(b, h, q_idx, kv_idx):
        rel = logical_kv(q_idx, kv_idx) - tree_start[q_idx]
        col = rel.clamp(min=0)
        word = anc_words[q_idx, (col // BITS_PER_WORD).clamp(max=num_words - 1)]
        is_ancestor = ((word >> (col % BITS_PER_WORD)) & 1) == 1
        in_tree = col < num_words * BITS_PER_WORD  # keys past it fail causality anyway
        return (rel < 0) | (is_ancestor & in_tree)

    return mask_mod


# What the wrapper reads from FlexAttentionMetadata (vLLM 0.32 names).
_METADATA_ATTRIBUTES = ("get_mask_mod", "_convert_physical_to_logical")
# Instance fields it reads: ``doc_ids`` (query token -> request), ``uses_paged_kv``,
# and the buffer doc_ids is a view of, which sizes the tables.
_PERSISTENT_DOC_IDS = "persistent_doc_ids"
# id(a FlexAttention builder's persistent_doc_ids) -> (a weak reference to that
# buffer, the TreeContext of its engine); an entry goes with its buffer. (Tensors
# compare element-wise, so they cannot be the keys of a WeakKeyDictionary.)
_CONTEXT_OF_BUFFER: dict[int, tuple[weakref.ref, TreeContext]] = {}


def attach_to_builders(runner: Any, tree_context: TreeContext) -> str | None:
    """Tie the FLEX_ATTENTION metadata built by ``runner``'s builders to
    ``tree_context``, through each builder's persistent ``persistent_doc_ids``
    (which every metadata it builds holds). Call once the builders exist (the
    runner's first step). Returns why it cannot (None: attached)."""
    from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadataBuilder

    builders = [builder for groups in getattr(runner, "attn_groups", None) or []
                for group in groups for builder in getattr(group, "metadata_builders", [])]
    flex = [b for b in builders if isinstance(b, FlexAttentionMetadataBuilder)]
    if not flex:
        return "the runner has no FLEX_ATTENTION metadata builders (attn_groups)"
    for builder in flex:
        buffer = getattr(builder, _PERSISTENT_DOC_IDS, None)
        if not isinstance(buffer, torch.Tensor):
            return f"FlexAttentionMetadataBuilder has no {_PERSISTENT_DOC_IDS}"
        key = id(buffer)
        _CONTEXT_OF_BUFFER[key] = (
            weakref.ref(buffer, lambda _, key=key: _CONTEXT_OF_BUFFER.pop(key, None)),
            tree_context)
    return None


def _context_of(metadata: Any) -> TreeContext | None:
    entry = _CONTEXT_OF_BUFFER.get(id(getattr(metadata, _PERSISTENT_DOC_IDS, None)))
    if entry is None or entry[0]() is not getattr(metadata, _PERSISTENT_DOC_IDS):
        return None
    return entry[1]


def install_flex_tree_mask() -> str | None:
    """Wrap ``FlexAttentionMetadata.get_mask_mod`` (idempotent; inert without trees).
    Returns why it cannot (None: installed)."""
    from torch.nn.attention.flex_attention import and_masks
    from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadata

    missing = [a for a in _METADATA_ATTRIBUTES if not hasattr(FlexAttentionMetadata, a)]
    if missing:
        return f"FlexAttentionMetadata has no {', '.join(missing)}"
    original = FlexAttentionMetadata.get_mask_mod
    if getattr(original, _MARK, False):
        return None

    def get_mask_mod(self, *args, **kwargs):
        mask_mod = original(self, *args, **kwargs)
        try:
            tree_context = _context_of(self)
        except Exception:  # a step left without its mask accepts no draft (tree_verdicts)
            return mask_mod
        if tree_context is None or tree_context.attention.mode != "flex":
            return mask_mod
        step = tree_context.step
        if step is not None and step.failed:
            return mask_mod
        # Steps without trees get the tree mask too, with tables that let every row
        # through: one mask function for every step, so the compiled flex_attention
        # is specialised once, not per kind of step.
        trees = step.trees if step is not None else []
        try:
            if not self.uses_paged_kv:
                return mask_mod
            # once per step (shared by every layer's metadata); steps without trees
            # share one pair of tables, kept by the engine
            tables = (step.flex.mask_tables if step is not None
                      else tree_context.attention.idle_mask_tables)
            rows = getattr(self, _PERSISTENT_DOC_IDS).shape[0]
            if tables is None or tables[0].shape[0] != rows:
                tables = step_mask_tables(trees, rows, self.doc_ids.device)
                if step is not None:
                    step.flex.mask_tables = tables
                else:
                    tree_context.attention.idle_mask_tables = tables
            convert = self._convert_physical_to_logical
            doc_ids = self.doc_ids
        except Exception:  # tree rows keep the causal mask: the step's trees accept nothing
            if step is not None:
                step.failed = True
            return mask_mod

        def logical_kv(q_idx, kv_idx):
            return convert(doc_ids, q_idx, kv_idx)[2]

        return and_masks(mask_mod, tree_mask_mod(logical_kv, *tables))

    setattr(get_mask_mod, _MARK, True)
    FlexAttentionMetadata.get_mask_mod = get_mask_mod
    return None


def compact_accepted_path(tree: tree_state.TreeRows, row_offset: int, path: list[int],
                          step: tree_state.StepTrees) -> None:
    """Copy the accepted nodes' K/V to the consecutive slots vLLM assumes.

    Node j was written at the slot of query row j+1; the k-th accepted node must sit
    at the slot of row k+1. ``step.flex.slots`` holds the slots of every tree row.
    """
    moves = [(k + 1, path[k] + 1) for k in range(in_place_prefix(path), len(path))]
    if not moves:
        return
    slots = step.flex.slots
    dst = slots[torch.tensor([row_offset + d for d, _ in moves], device=slots.device)]
    src = slots[torch.tensor([row_offset + s for _, s in moves], device=slots.device)]
    for kv_cache in step.flex.kv_caches:
        block_size = kv_cache.shape[2]
        # the right side is gathered (a copy) before anything is written
        kv_cache[dst // block_size, :, dst % block_size] = \
            kv_cache[src // block_size, :, src % block_size]
