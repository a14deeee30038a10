# SPDX-License-Identifier: Apache-2.0
"""One engine's tree verification state, shared by its proposer, runner hooks and
attention layers (TreeContext).

vLLM schedules a request's drafts as a flat list. A tree travels as that list
(nodes in parent-first order, so any prefix the scheduler keeps is still a
tree) plus its parent array, kept in the context's side table keyed by request
id. Each proposer creates its own context, so engines sharing a process (no
engine-core subprocess, notebooks, tests) never see each other's trees; under
tensor parallelism every rank's context holds rank 0's trees (tp_drafts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from vllm_echo.algos.tree import is_chain, tree_depths


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

    @property
    def num_rows(self) -> int:
        return len(self.token_ids) + 1


@dataclass
class CpuStep:
    """The CPU native backend's part of a step (cpu_tree_attention.py)."""

    # The engine's attention layers, every one of which compaction needs in
    # ``captured`` (layer name -> the K/V rows the layer's waves wrote:
    # cpu_tree_attention.PathWaves.captured_rows).
    attention_layers: list[Any]
    captured: dict[str, tuple] = field(default_factory=dict)
    # The native kernel's calls for the tree rows (cpu_tree_attention.PathWaves),
    # planned by the first attention layer of the step.
    waves: Any = None


@dataclass
class FlexStep:
    """FLEX_ATTENTION's part of a step (flex_tree_attention.py): the KV slots of the
    step's tree rows and every attention layer's cache, for the compaction, and the
    step's mask tables (set by the first metadata built)."""

    slots: Any
    kv_caches: list[Any]
    mask_tables: Any = None


@dataclass
class StepTrees:
    """Tree requests of the step being executed, and its attention backend's part."""

    trees: list[TreeRows]
    all_rows: Any                                  # torch.long: every tree query row
    # Set when a tree part of the step failed (positions, mask, the tree rows' kernel
    # calls): its tree requests then accept no draft, whose verdict needs only the root row.
    failed: bool = False
    cpu: CpuStep | None = None    # with the CPU native backend
    flex: FlexStep | None = None  # with FLEX_ATTENTION


@dataclass
class AcceptedPaths:
    """req_id -> accepted node indices of its last tree verification, kept only when a
    proposer that learns from verdicts asks for them (``record``) and pops them."""

    record: bool = False
    by_request: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class TreeAttention:
    """The engine's tree attention backend, as tree_support set it up."""

    # "cpu" or "flex" once tree_support.prepare() accepted trees (None: chain mode),
    # and the tree-checked attention layers.
    mode: str | None = None
    layers: list[Any] = field(default_factory=list)
    # On CPU, what puts vLLM's CPU_ATTN back once this engine's model is built.
    restore_cpu_backend: Any = None
    # FLEX_ATTENTION: the mask tables of steps without trees (they let every row
    # through, and never change).
    idle_mask_tables: Any = None

    @property
    def compacts_by_slot(self) -> bool:
        """True when KV compaction copies by slot (FLEX_ATTENTION), not from captured K/V."""
        return self.mode == "flex"

    def kv_caches(self) -> list[Any]:
        """Every tree-checked attention layer's KV cache tensor."""
        return [layer.kv_cache[0] if isinstance(layer.kv_cache, list) else layer.kv_cache
                for layer in self.layers]


@dataclass
class TreeContext:
    """Tree verification state of one engine (one worker: a TP rank), created by the
    proposer's __init__.

    One step's path through it: the proposer writes ``trees``; the runner's
    ``_prepare_inputs`` hook turns the scheduled ones into ``step``; the attention
    layers read ``step`` (CPU: the native calls with tree rows and K/V capture;
    FLEX_ATTENTION: the mask);
    the ``_sample`` hook takes ``step``, verifies, compacts the KV cache and counts;
    proposers read the accepted paths back from ``accepted_paths``.

    The runner hooks find it on the runner they wrap (``attach_to_runner``, when
    they are installed), the CPU attention impls on themselves (set by
    tree_support.check_model), the FLEX_ATTENTION mask on the runner that builds the
    metadata (flex_tree_attention.py).
    """

    # req_id -> TreeDraft, written by the proposer, read when the step is prepared.
    trees: dict[str, TreeDraft] = field(default_factory=dict)
    # The step in flight: set after _prepare_inputs, taken by the sampling hook.
    step: StepTrees | None = None
    # Tree requests verified, those whose accepted path left the first branch and so
    # needed KV compaction, and steps with drafts verified greedily without vLLM's
    # rejection sampler (reported with the proposer's stats).
    # Also: steps in which a tree request accepted no draft because its step failed
    # (here or, under tensor parallel, on another rank), trees cut to their nodes in
    # place by a failed compaction, and steps whose outcome another rank changed.
    counters: dict[str, int] = field(
        default_factory=lambda: {"tree_verifications": 0, "tree_compactions": 0,
                                 "greedy_verified_steps": 0, "tree_steps_failed": 0,
                                 "tree_paths_cut": 0, "tree_outcomes_from_other_ranks": 0})
    # Tensor parallel: the element-wise minimum of an int32 array over the TP group
    # (every rank calls it in the same steps); None with one rank. Set by the proposer.
    agree: Callable[[np.ndarray], np.ndarray] | None = None
    # The engine's seed (model_config.seed, 0 without one), which seeds the sampled tree
    # verdicts of requests without a seed of their own (tree_verdicts.request_rng).
    engine_seed: int = 0
    accepted_paths: AcceptedPaths = field(default_factory=AcceptedPaths)
    attention: TreeAttention = field(default_factory=TreeAttention)

    def take_step(self) -> StepTrees | None:
        """The step in flight, which is then over (sampling consumes it once)."""
        step, self.step = self.step, None
        return step


# The attribute of vLLM's model runner that holds its engine's TreeContext.
_RUNNER_ATTRIBUTE = "_vllm_echo_tree_context"


def attach_to_runner(runner: Any, tree_context: TreeContext) -> None:
    """Make ``tree_context`` the one the hooks on ``runner`` (and attention metadata
    built under it) use."""
    setattr(runner, _RUNNER_ATTRIBUTE, tree_context)


def context_of_runner(runner: Any) -> TreeContext | None:
    return getattr(runner, _RUNNER_ATTRIBUTE, None)


def tree_rows(req_id: str, req_idx: int, query_start: int, context_len: int, draft: TreeDraft,
              scheduled: list[int]) -> TreeRows | None:
    """The tree record for a request, or None when it should run as vLLM's chain.

    The scheduled list must be a prefix of what we proposed (the scheduler may cut
    it; -1 padding or a stale entry fails the check), and the prefix must not be a
    plain chain (those verify natively at no extra cost).
    """
    n = len(scheduled)
    if n == 0 or n > len(draft.token_ids):
        return None
    if not np.array_equal(draft.token_ids[:n], np.asarray(scheduled, dtype=np.int32)):
        return None
    parents = draft.parents[:n]
    if len(parents) != n or np.any(parents < -1) or np.any(parents >= np.arange(n)):
        return None  # not a parent-first tree over these nodes: verify as the chain it is
    if is_chain(parents):
        return None
    return TreeRows(req_id, req_idx, query_start, context_len, draft.token_ids[:n].copy(), parents)


def positions_of(rows: TreeRows) -> np.ndarray:
    """RoPE positions of the request's query rows: base + depth, root at base."""
    depths = np.concatenate([[0], tree_depths(rows.parents)])
    return rows.context_len + depths


def tree_unsafe_reason(params: Any) -> str | None:
    """Why a request must not be verified as a tree (None: trees are fine).

    These features read the draft list as a chain (penalties, bad words, min
    tokens and allowed-token masks use it as history; grammars advance through it;
    draft logprobs come from chain rows), or need the stochastic verifier.
    """
    if params is None:
        return "no sampling params"
    if params.temperature > 0 and params.min_p:
        return "min_p sampling"
    if params.logprobs is not None:
        return "logprobs requested"
    if (params.presence_penalty or params.frequency_penalty
            or params.repetition_penalty != 1.0):
        return "penalties"
    if params.bad_words or params.min_tokens or params.logit_bias or params.allowed_token_ids:
        return "bad_words/min_tokens/logit_bias/allowed_token_ids"
    if params.structured_outputs is not None:
        return "structured output"
    return None
