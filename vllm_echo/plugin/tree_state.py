# SPDX-License-Identifier: Apache-2.0
"""Per-worker state shared by the tree proposer, runner hooks and attention.

vLLM schedules a request's drafts as a flat list. A tree travels as that list
(nodes in parent-first order, so any prefix the scheduler keeps is still a
tree) plus its parent array, kept here in a side table keyed by request id.
The proposer, the model runner and the attention layers of one worker all run
in the same process, so a module-level table is enough (one per TP rank; under
tensor parallelism every rank's table holds rank 0's trees, see tp_drafts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_echo.algos.tree import ancestor_mask, tree_depths


@dataclass
class TreeDraft:
    token_ids: np.ndarray  # int32 [n] flattened nodes, parent-first
    parents: np.ndarray    # int32 [n] -1 = child of the root


@dataclass
class TreeRows:
    """One tree request inside the current step's flattened batch."""

    req_id: str
    req_idx: int           # row in the input batch
    query_start: int       # first query row (the root) in the flattened tokens
    context_len: int       # tokens already in the KV cache before this step (C)
    token_ids: np.ndarray  # scheduled nodes (n)
    parents: np.ndarray    # their parents
    ancestors: Any         # torch.bool [n+1, n+1]: row r sees column c
    recompute: Any         # torch.long: query rows (relative) the native kernel gets wrong

    @property
    def num_rows(self) -> int:
        return len(self.token_ids) + 1


@dataclass
class StepTrees:
    """Tree requests of the step being executed, and K/V captured for compaction."""

    trees: list[TreeRows]
    all_rows: Any                                  # torch.long: every tree query row
    captured: dict[str, tuple] = field(default_factory=dict)  # CPU: layer -> K/V of all_rows
    # Set when a tree part of the step failed (positions, mask, recomputed rows):
    # its tree requests then accept no draft, whose verdict needs only the root row.
    failed: bool = False
    # FLEX_ATTENTION (flex_tree_attention.py): the step's mask tables, the KV slots of
    # all_rows and every attention layer's cache, for the mask and the compaction.
    mask_tables: Any = None
    slots: Any = None
    kv_caches: list[Any] = field(default_factory=list)


# req_id -> TreeDraft, written by the proposer, read when the step is prepared.
TREES: dict[str, TreeDraft] = {}
# The step in flight: set in _prepare_inputs, cleared after sampling.
STEP: StepTrees | None = None
# Verification counters of this worker (reported with the proposer's stats):
# tree requests verified, and those whose accepted path left the first branch and
# so needed KV compaction.
COUNTERS = {"tree_verifications": 0, "tree_compactions": 0}
# req_id -> accepted node indices of its last tree verification, kept only when a
# proposer that learns from verdicts (ECHO) asks for them and pops them.
RECORD_PATHS = False
LAST_PATHS: dict[str, list[int]] = {}


def tree_rows(req_id: str, req_idx: int, query_start: int, context_len: int, draft: TreeDraft,
              scheduled: list[int]) -> TreeRows | None:
    """The tree record for a request, or None when it should run as vLLM's chain.

    The scheduled list must be a prefix of what we proposed (the scheduler may cut
    it; -1 padding or a stale entry fails the check), and the prefix must not be a
    plain chain (those verify natively at no extra cost).
    """
    import torch

    n = len(scheduled)
    if n == 0 or n > len(draft.token_ids):
        return None
    if not np.array_equal(draft.token_ids[:n], np.asarray(scheduled, dtype=np.int32)):
        return None
    parents = draft.parents[:n]
    if len(parents) != n or np.any(parents < -1) or np.any(parents >= np.arange(n)):
        return None  # not a parent-first tree over these nodes: verify as the chain it is
    if np.array_equal(parents, np.arange(-1, n - 1, dtype=parents.dtype)):
        return None
    anc = torch.from_numpy(ancestor_mask(parents))
    # Rows whose ancestors are exactly the rows before them are what causal
    # attention already computes (e.g. the first branch): skip recomputing them.
    causal = torch.ones(n + 1, n + 1, dtype=torch.bool).tril_()
    recompute = torch.nonzero((anc != causal).any(dim=1)).flatten()
    return TreeRows(req_id, req_idx, query_start, context_len, draft.token_ids[:n].copy(), parents,
                    anc, recompute)


def positions_of(rows: TreeRows) -> np.ndarray:
    """RoPE positions of the request's query rows: base + depth, root at base."""
    depths = np.concatenate([[0], tree_depths(rows.parents)])
    return rows.context_len + depths
