# SPDX-License-Identifier: Apache-2.0
"""The only benchmark code that reaches past the package's public surface into the
plugin, each reach for a measurement no public surface can give.

The other scripts use the speculative config, vllm_echo.engines (the engine builder,
vLLM's spec-decode counters, the drafter's stats) and /metrics. overhead.py and
tree_step_time.py measure parts of one step, so they need what follows; when the
plugin's insides move, this file is the one to follow them.

- overhead.py times the top-k capture (``LastLogitsTopK``), which no counter times,
  and runs ECHO with a planner that declines every draft (``echo-idle``) or plans but
  verifies none (``echo-work``): a speculative config can ask for neither, since both
  exist only to price the drafting work.
- tree_step_time.py verifies drafts of one fixed shape every step, which only a
  proposer of its own can draft (a subclass of ``LogitSpecProposer`` whose trees are
  ``TreeDraft`` objects).
"""

from __future__ import annotations

import os

import numpy as np

# The fixed-shape proposer must run in the process that builds the engine (the engine
# loads it by this module's name).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from vllm_echo.algos.echo import EchoPlanner  # noqa: E402
from vllm_echo.plugin.proposers.logitspec import LogitSpecProposer  # noqa: E402
from vllm_echo.plugin.runner.last_logits import LastLogitsTopK  # noqa: E402
from vllm_echo.plugin.runner.tree_state import TreeDraft  # noqa: E402


# -- overhead.py -------------------------------------------------------------------------

def time_topk(timed) -> None:
    """Wrap the top-k capture with ``timed`` (a function -> its timed wrapper)."""
    LastLogitsTopK._compute = timed(LastLogitsTopK._compute)


def planner_drafts_nothing() -> None:
    """``echo-idle``: every step the planner decides that no draft pays."""
    def idle(self, num_requests, max_drafts):
        self.stats["steps"] += 1
        return "none"
    EchoPlanner.drafting_mode = idle


def planner_verifies_nothing() -> None:
    """``echo-work``: every step the planner plans in full (top-k read, every request's
    forest built and pooled, the rule run), then takes no node."""
    choose = EchoPlanner._choose
    EchoPlanner.drafting_mode = lambda self, num_requests, max_drafts: "all"
    EchoPlanner._choose = lambda self, *args: choose(self, *args)[:0]


# -- tree_step_time.py -------------------------------------------------------------------

# Tokens drafted: an id no context holds (tree_step_time.py draws contexts from 100
# up), so no draft is ever accepted.
DRAFT_TOKEN = 7


def two_branches(num_drafts: int) -> np.ndarray:
    """Parents of a tree of two chains from the root, the first one longer by one at
    most (parent-first order)."""
    first = (num_drafts + 1) // 2
    parents = [-1] + list(range(first - 1)) + [-1] + list(range(first, num_drafts - 1))
    return np.array(parents[:num_drafts], dtype=np.int32)


class FixedShapeProposer(LogitSpecProposer):
    """Drafts the same shape every step: a two-branch tree of capacity - 1 nodes, or
    (tree off) a chain of as many tokens."""

    num_drafts: int | None = None  # set on the instance: chains of this length instead

    def _draft(self, req_id, state, candidates, max_len):
        n = min(self.settings.capacity - 1 if self.num_drafts is None else self.num_drafts,
                max_len)
        tokens = np.full(n, DRAFT_TOKEN, dtype=np.int32)
        if self.tree_enabled:
            self.tree_context.trees[req_id] = TreeDraft(tokens, two_branches(n))
        return tokens, 0


def fixed_shape_config(capacity: int, tree: bool, tree_attention: str | None) -> dict:
    """``LLM`` keywords of an engine whose drafter is :class:`FixedShapeProposer`."""
    from vllm_echo.config import ADDITIONAL_CONFIG_KEY, EchoSettings

    settings = EchoSettings(num_speculative_tokens=capacity - 1, capacity=capacity, tree=tree,
                            tree_attention=tree_attention)
    return {"speculative_config": {"method": "custom_class",
                                   "model": f"{__name__}.FixedShapeProposer",
                                   "num_speculative_tokens": capacity - 1},
            "additional_config": {ADDITIONAL_CONFIG_KEY: settings.to_dict()}}


def set_chain_length(llm, num_drafts: int) -> None:
    """Make the in-process engine's :class:`FixedShapeProposer` draft chains of
    ``num_drafts`` tokens from its next step on."""
    llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter.num_drafts = \
        num_drafts
