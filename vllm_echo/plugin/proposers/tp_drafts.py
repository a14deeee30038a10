# SPDX-License-Identifier: Apache-2.0
"""Tensor parallelism: every rank verifies the drafts of the rank that schedules them.

Each TP rank runs the model runner, so each runs our proposer, the prepare hook
and the tree verdict; but only rank 0's drafts reach the scheduler. A tree's shape
(its parents) and ECHO's plan depend on per-process state (step timing, the
drafting deadline, what the planner learned), so ranks that drafted for
themselves would verify rank 0's tokens under their own masks, positions and KV
compaction, and the all-reduce would mix them. So ranks other than 0 do not
draft: each step they take rank 0's drafts and trees. And a failure on one rank
(a position write, the tree mask, attention, a compaction) must be every rank's:
``agree`` lets the tree stage take, per request, the worst outcome of all ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_echo.plugin.runner.tree_state import TreeContext, TreeDraft


def tensor_parallel_group(vllm_config: Any) -> Any | None:
    """vLLM's TP group coordinator when the drafts must be shared, else None."""
    if vllm_config.parallel_config.tensor_parallel_size <= 1:
        return None
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group()


class RankZeroDrafts:
    """Shares rank 0's drafts and trees (``tree_context.trees``, this rank's engine
    state) with the other ranks of the TP group, once a step.

    Every rank must call ``share`` in every ``propose`` (it is a collective), whatever
    happened while drafting.
    """

    def __init__(self, group: Any, tree_context: TreeContext):
        self._group = group
        self._tree_context = tree_context
        self.leads = group.rank_in_group == 0

    def share(self, drafts: list[list[int]] | None) -> list[list[int]]:
        tree_context = self._tree_context
        if self.leads:
            trees = {req_id: (t.token_ids, t.parents) for req_id, t in tree_context.trees.items()}
            self._group.broadcast_object((drafts, trees), src=0)
            return drafts
        drafts, trees = self._group.broadcast_object(None, src=0)
        tree_context.trees.clear()
        for req_id, (token_ids, parents) in trees.items():
            tree_context.trees[req_id] = TreeDraft(np.asarray(token_ids), np.asarray(parents))
        # This rank's verdicts are not learned from: rank 0's proposer plans.
        tree_context.accepted_paths.by_request.clear()
        return drafts

    def agree(self, outcomes: np.ndarray) -> np.ndarray:
        """The element-wise minimum of ``outcomes`` (int32) over the TP group, over its
        CPU (gloo) group: the tree stage's per-request outcomes, which every rank then
        applies alike (runner/tree_verdicts.py)."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(outcomes, dtype=torch.int32)  # a copy: reduced in place
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self._group.cpu_group)
        return tensor.numpy()
