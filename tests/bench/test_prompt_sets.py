# SPDX-License-Identifier: Apache-2.0
"""No prompt reaches one engine twice, warm-up included (a drafter that remembers
earlier requests would replay answers it has seen): the example's rounds and workloads
have disjoint prompt sets, never a warm-up prompt, and offline.py's check refuses
repeats. No engine is started."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import offline_worker  # noqa: E402
import workloads  # noqa: E402
from example_module import load_example  # noqa: E402


def _example():
    return load_example()


@pytest.mark.parametrize("batch, single, rounds", [(8, 3, 3), (16, 3, 3), (4, 3, 3), (1, 7, 2),
                                                  (64, 7, 3), (16, 2, 5)])
def test_example_sets_are_disjoint(batch: int, single: int, rounds: int) -> None:
    """Every round and workload of the example has prompts of its own (the engines stay
    up through all rounds), none of them a warm-up prompt."""
    example = _example()
    groups = example.prompt_groups(batch, single, rounds)
    assert len(groups) == rounds
    sets = []
    for group in groups:
        assert len(group["batch 1"]) == single and len(group["loaded"]) == batch
        # a round's batch-1 prompts come from different categories
        assert len({p.category for p in group["batch 1"]}) == single
        sets += [[p.text for p in group["batch 1"]], [p.text for p in group["loaded"]]]
    workloads.check_no_repeats(list(example.WARMUP_MESSAGES), *sets)


def test_check_no_repeats() -> None:
    workloads.check_no_repeats(["warm"], ["a", "b"], ["c"], [("d", "e")])
    with pytest.raises(ValueError, match="twice in one set"):
        workloads.check_no_repeats([], ["a", "a"])
    with pytest.raises(ValueError, match="in two sets"):
        workloads.check_no_repeats([], ["a"], ["b", "a"])
    with pytest.raises(ValueError, match="warm-up"):
        workloads.check_no_repeats(["a"], ["b", "a"])
    with pytest.raises(ValueError, match="warm-up"):  # a conversation's turn
        workloads.check_no_repeats(["e"], [("d", "e")])


def test_warmup_prompt_is_in_no_shipped_set() -> None:
    data = REPO / "vllm_echo" / "data"
    warmups = {offline_worker.WARMUP_MESSAGE, *_example().WARMUP_MESSAGES}
    for path in data.glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                assert not warmups & set(json.loads(line)["turns"]), path.name
