# SPDX-License-Identifier: Apache-2.0
"""Counters for ECHO's speculative metrics, summed over steps and workers.

Draft utilisation is logged both ways, since they
differ for trees: ``accepted / drafted`` tokens, and MAT / depth =
``accepted / sum of drafted tree depths``. Depths beyond ``max_depth`` are
counted in the last bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
from numba import njit


def _zeros(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.int64)


@njit(cache=True)
def _count_step(drafted_per_depth, accepted_per_depth, truncations_per_depth, depths, sizes,
                accepted, truncated_at):
    """EchoStepStats.record_step's counting (compiled: the planner records every step).
    ``depths``: every tree's node depths, one tree after another, ``sizes[r]`` each.
    Returns (nodes, sum of the trees' depths)."""
    max_depth = drafted_per_depth.size
    start = 0
    sum_deepest = 0
    for r in range(sizes.size):
        deepest = 0
        for j in range(start, start + sizes[r]):
            if depths[j] < 1:
                raise ValueError("node depths must be >= 1")
            deepest = max(deepest, depths[j])
            drafted_per_depth[min(depths[j], max_depth) - 1] += 1
        start += sizes[r]
        if not 0 <= accepted[r] <= deepest:
            raise ValueError("accepted length outside [0, the tree's depth]")
        # The accepted path reached depths 1..accepted.
        for d in range(min(accepted[r], max_depth)):
            accepted_per_depth[d] += 1
        accepted_per_depth[max_depth - 1] += max(accepted[r] - max_depth, 0)
        sum_deepest += deepest
        if truncated_at[r] < 0:
            raise ValueError("truncation depth must be >= 0")
        if truncated_at[r] > 0:
            truncations_per_depth[min(truncated_at[r], max_depth) - 1] += 1
    return start, sum_deepest


@dataclass
class EchoStepStats:
    """Accumulator; ``record_step`` once per verify step, ``merge`` to combine."""

    max_depth: int = 16
    steps: int = 0
    requests: int = 0  # request-steps
    drafted: int = 0
    accepted: int = 0
    sum_tree_depth: int = 0
    budget_used_max: int = 0
    budget_capacity: int = 0  # sum of k_max over steps that gave one
    budget_used_with_capacity: int = 0
    drafted_per_depth: Optional[np.ndarray] = field(default=None)
    accepted_per_depth: Optional[np.ndarray] = field(default=None)
    truncations_per_depth: Optional[np.ndarray] = field(default=None)

    def __post_init__(self):
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        for name in ("drafted_per_depth", "accepted_per_depth", "truncations_per_depth"):
            value = getattr(self, name)
            value = _zeros(self.max_depth) if value is None else np.asarray(value, np.int64)
            if value.shape != (self.max_depth, ):
                raise ValueError(f"{name} must have shape ({self.max_depth},)")
            setattr(self, name, value.copy())

    def record_step(self, drafted_depths: Sequence, accepted_lengths: Sequence[int],
                    truncated_at: Optional[Sequence[int]] = None,
                    k_max: Optional[int] = None) -> None:
        """One verify step.

        Per request: the depths of its verified draft nodes, its accepted
        length (draft tokens, the bonus not counted), and the depth its gate
        truncated at (0 = not truncated). ``k_max``: the step's budget.
        """
        if len(drafted_depths) != len(accepted_lengths):
            raise ValueError(f"{len(drafted_depths)} trees but "
                             f"{len(accepted_lengths)} accepted lengths")
        if truncated_at is not None and len(truncated_at) != len(accepted_lengths):
            raise ValueError(f"{len(truncated_at)} truncation depths for "
                             f"{len(accepted_lengths)} trees")
        sizes = [len(d) for d in drafted_depths]
        depths = (np.concatenate(drafted_depths).astype(np.int64, copy=False)
                  if sum(sizes) else _zeros(0))
        truncated = (_zeros(len(sizes)) if truncated_at is None
                     else np.asarray(truncated_at, dtype=np.int64))
        used, sum_tree_depth = _count_step(
            self.drafted_per_depth, self.accepted_per_depth, self.truncations_per_depth,
            depths, np.array(sizes, dtype=np.int64),
            np.asarray(accepted_lengths, dtype=np.int64), truncated)
        self.drafted += used
        self.accepted += int(sum(accepted_lengths))
        self.sum_tree_depth += sum_tree_depth
        self.steps += 1
        self.requests += len(accepted_lengths)
        self.budget_used_max = max(self.budget_used_max, used)
        if k_max is not None:
            if k_max < 0:
                raise ValueError(f"k_max must be >= 0, got {k_max}")
            self.budget_capacity += int(k_max)
            self.budget_used_with_capacity += used

    def merge(self, other: "EchoStepStats") -> "EchoStepStats":
        """A new accumulator holding both; the inputs are left unchanged."""
        if other.max_depth != self.max_depth:
            raise ValueError(f"cannot merge max_depth {self.max_depth} with "
                             f"{other.max_depth}")
        return EchoStepStats(
            max_depth=self.max_depth,
            steps=self.steps + other.steps,
            requests=self.requests + other.requests,
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            sum_tree_depth=self.sum_tree_depth + other.sum_tree_depth,
            budget_used_max=max(self.budget_used_max, other.budget_used_max),
            budget_capacity=self.budget_capacity + other.budget_capacity,
            budget_used_with_capacity=(self.budget_used_with_capacity
                                       + other.budget_used_with_capacity),
            drafted_per_depth=self.drafted_per_depth + other.drafted_per_depth,
            accepted_per_depth=self.accepted_per_depth + other.accepted_per_depth,
            truncations_per_depth=self.truncations_per_depth + other.truncations_per_depth,
        )

    @property
    def draft_utilization(self) -> float:
        """accepted / drafted tokens (0 before any draft)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self) -> dict:
        """Plain-Python summary for logs and metrics."""

        def ratio(a, b):
            return float(a) / float(b) if b else 0.0

        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(self.drafted_per_depth > 0,
                            self.accepted_per_depth / np.maximum(self.drafted_per_depth, 1),
                            0.0)
        return {
            "steps": self.steps,
            "requests": self.requests,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "draft_utilization": self.draft_utilization,
            "mean_accepted_length": ratio(self.accepted, self.requests),
            "mat_over_depth": ratio(self.accepted, self.sum_tree_depth),
            "accepted_per_depth": self.accepted_per_depth.tolist(),
            "drafted_per_depth": self.drafted_per_depth.tolist(),
            "acceptance_rate_per_depth": rate.tolist(),
            "truncations_per_depth": self.truncations_per_depth.tolist(),
            "budget_used_mean": ratio(self.drafted, self.steps),
            "budget_used_max": self.budget_used_max,
            "budget_fill": ratio(self.budget_used_with_capacity, self.budget_capacity),
        }
