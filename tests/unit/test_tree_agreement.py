# SPDX-License-Identifier: Apache-2.0
"""Tensor parallel: a failure on one rank is every rank's fallback
(tree_verdicts.finish_tree_step with ``TreeContext.agree``).

Each "rank" is a thread running the tree stage on its own context and copy of the
sampled rows; ``agree`` is an element-wise minimum over the ranks (what
RankZeroDrafts.agree computes with one all-reduce), behind a barrier as in a
collective. No engine: the tree is root -> n0 -> n1 and root -> n2.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_echo.plugin.runner.tree_state import (StepTrees, TreeAttention, TreeContext, TreeDraft,
                                                tree_rows)
from vllm_echo.plugin.runner.tree_verdicts import CUT, FAILED, WHOLE, finish_tree_step

VOCAB = 32
PARENTS = np.array([-1, 0, -1], dtype=np.int32)
TOKENS = np.array([10, 11, 20], dtype=np.int32)
# The root's argmax is n2 (token 20), whose row's argmax (7) is the bonus.
ARGMAX_PER_ROW = [20, 0, 0, 7]
METADATA = SimpleNamespace(num_draft_tokens=[3, 2], bonus_logits_indices=torch.tensor([3, 6]))


def _logits() -> torch.Tensor:
    rows = ARGMAX_PER_ROW + [1, 2, 3]  # request "b": a chain, verified by vLLM
    logits = torch.zeros(len(rows), VOCAB)
    logits[torch.arange(len(rows)), rows] = 1.0
    return logits


class Ranks:
    """``n`` ranks' ``agree``: each rank's call returns the minimum over all ranks."""

    def __init__(self, n: int):
        self._barrier = threading.Barrier(n)
        self._values: dict[int, np.ndarray] = {}
        self.calls = 0

    def agree_for(self, rank: int):
        def agree(outcomes: np.ndarray) -> np.ndarray:
            self._values[rank] = outcomes.copy()
            self._barrier.wait()
            agreed = np.minimum.reduce(list(self._values.values()))
            self._barrier.wait()
            self.calls += 1
            outcomes[:] = agreed  # in place, as an all-reduce does
            return outcomes
        return agree


def _run_rank(agree, *, compaction_fails=False, step_fails=False, prepare_fails=False):
    """One rank's tree stage; returns its rows, counters and logged failures."""
    context = TreeContext(attention=TreeAttention(mode="cpu"), agree=agree)
    context.trees["a"] = TreeDraft(TOKENS, PARENTS)
    rows = tree_rows("a", 0, 0, 5, context.trees["a"], TOKENS.tolist())
    context.step = StepTrees([], None, failed=True) if prepare_fails \
        else StepTrees([rows], torch.arange(4), failed=step_fails)
    # vLLM's chain verdict: "a" read as a chain (root sample 20, n0 rejected), "b" 1, 2, 3
    sampled = torch.tensor([[20, -1, -1], [1, 2, 3]], dtype=torch.int32)
    errors: list[str] = []

    def compact(tree, row_offset, path, step):
        if compaction_fails:
            raise RuntimeError("injected compaction fault")

    finish_tree_step(context, _logits(), METADATA, sampled, ["a", "b"], compact,
                     lambda where, exc: errors.append(where), SimpleNamespace(all_greedy=True))
    return sampled.tolist(), context.counters, errors


def _run_ranks(faults: list[dict]):
    ranks = Ranks(len(faults))
    results: list = [None] * len(faults)

    def run(rank):
        results[rank] = _run_rank(ranks.agree_for(rank), **faults[rank])

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(faults))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(r is not None for r in results), "a rank did not finish (collective hang)"
    return results, ranks.calls


def test_healthy_ranks_take_the_whole_path():
    results, calls = _run_ranks([{}, {}, {}])
    assert calls == 3  # one agreement per rank in the step
    for rows, counters, errors in results:
        assert rows == [[20, 7, -1], [1, 2, 3]]
        assert counters["tree_verifications"] == 1 and counters["tree_compactions"] == 1
        assert errors == []


@pytest.mark.parametrize("fault, row_a, counter", [
    # compaction failed on rank 1: every rank keeps only the nodes already in place
    # (none: n2 was at n0's slot), then the root row's argmax
    ({"compaction_fails": True}, [20, -1, -1], "tree_paths_cut"),
    # rank 1's mask or attention failed: every rank accepts no draft for "a"
    ({"step_fails": True}, [20, -1, -1], "tree_steps_failed"),
    # rank 1 could not even prepare the step: every rank's tree requests accept no
    # draft, chains included ("b" was a tree candidate nowhere, so it keeps its verdict)
    ({"prepare_fails": True}, [20, -1, -1], "tree_steps_failed"),
], ids=["compaction", "mask-or-attention", "preparation"])
def test_a_failure_on_one_rank_is_every_ranks_fallback(fault, row_a, counter):
    results, _ = _run_ranks([{}, fault, {}])
    rows = [r[0] for r in results]
    assert rows == [[row_a, [1, 2, 3]]] * 3, rows  # identical on every rank
    counts = [r[1][counter] for r in results]
    assert counts == [1, 1, 1], counts  # and counted alike
    assert [r[1]["tree_outcomes_from_other_ranks"] for r in results] == [1, 0, 1]


def test_without_agreement_a_one_rank_failure_diverges():
    """What the agreement prevents: the same fault with each rank on its own."""
    healthy = _run_rank(None)[0]
    faulty = _run_rank(None, compaction_fails=True)[0]
    assert healthy != faulty


def test_outcomes_order_from_failed_to_whole():
    assert FAILED < CUT < WHOLE  # the minimum over ranks is the safe choice
