# SPDX-License-Identifier: Apache-2.0
"""Model-runner side of tree verification: positions, acceptance, KV compaction.

Installed on the runner instance that owns our proposer (see patches.py); the
engine's state is the TreeContext attached to that runner (tree_state.py):
- after ``_prepare_inputs``: find this step's tree requests, give their nodes
  RoPE positions base + depth (slots stay linear, so vLLM's KV allocation is
  untouched), and publish the step (``TreeContext.step``) to the attention layers;
- inside ``_sample``: after vLLM's own sampling, replace each tree request's
  row with the greedy tree verdict ``[path tokens..., bonus]`` and move the
  accepted path's K/V to the consecutive slots vLLM assumes. This happens before
  the next schedule() can hash the block for prefix caching.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import numpy as np
import torch

from vllm_echo.algos.verify import verify_greedy, verify_sampling
from vllm_echo.plugin import tree_state, tree_support
from vllm_echo.plugin.tree_state import StepTrees, TreeContext, TreeRows


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


def install_prepare_hook(runner: Any, tree_context: TreeContext,
                         on_error: Callable[[str, BaseException], None],
                         on_drift: Callable[[str, str], None], timer: Any = None) -> None:
    """Wrap ``runner._prepare_inputs`` (instance attribute) and attach ``tree_context``
    to the runner; ``timer`` (runner_hooks.StepTimer) starts timing decode steps here.

    A call whose arguments cannot be found by name runs the original unchanged and
    switches the hook off for good (``on_drift("_prepare_inputs", reason)``: chain
    mode).
    """
    from vllm_echo.plugin.runner_hooks import PREPARE_PARAMS, ArgumentReader

    tree_state.attach_to_runner(runner, tree_context)
    if getattr(runner, "_vllm_echo_prepare_wrapped", False):
        return
    original = runner._prepare_inputs
    read_arguments = ArgumentReader(inspect.signature(original), PREPARE_PARAMS)
    active = [True]

    def _prepare_inputs(*args, **kwargs):
        result = original(*args, **kwargs)
        # read per call: a later install attaches a new context without rewrapping
        tree_context = tree_state.context_of_runner(runner)
        tree_context.step = None
        found = read_arguments(args, kwargs) if active[0] else None
        if found is None:
            if active[0]:
                active[0] = False
                on_drift("_prepare_inputs", f"a call without {PREPARE_PARAMS}")
            if timer is not None:
                timer.skip()
            return result
        scheduler_output, num_scheduled_tokens = found
        try:
            if tree_context.trees and scheduler_output.scheduled_spec_decode_tokens:
                tree_context.step = _prepare_step(tree_context, runner, scheduler_output,
                                                  on_error)
        except Exception as exc:  # nothing written yet: vLLM's chain semantics hold
            tree_context.step = None
            on_error("tree step preparation", exc)
        if timer is not None:
            try:
                _time_step(timer, scheduler_output, tree_context.step)
            except Exception as exc:
                on_error("step timing", exc)
                timer.skip()
        return result

    runner._prepare_inputs = _prepare_inputs
    runner._vllm_echo_prepare_wrapped = True


def _time_step(timer: Any, scheduler_output: Any, step: StepTrees | None) -> None:
    num_drafts = sum(map(len, scheduler_output.scheduled_spec_decode_tokens.values()))
    total = scheduler_output.total_num_scheduled_tokens
    # Only decode steps (each request runs its last token and its drafts) are
    # timed: the model's N is what drafting adds to. Prefill steps (hundreds of
    # tokens) would decide the fit and price a draft token at the prompt's rate,
    # far below what a few drafts really add to a decode step.
    if total == len(scheduler_output.num_scheduled_tokens) + num_drafts:
        timer.started(int(total), len(step.trees) if step is not None else 0, num_drafts > 0)
    else:
        timer.skip()


def _prepare_step(tree_context: TreeContext, runner: Any, scheduler_output: Any,
                  on_error: Callable[[str, BaseException], None]) -> StepTrees | None:
    """Collect the step's trees (reads only), then write their RoPE positions. If a
    write fails, positions may be half written: the step is marked failed, so its
    tree requests accept no draft (the root row's position is the same either way)."""
    step, positions = _collect_step(tree_context, runner, scheduler_output)
    if step is None:
        return None
    try:
        for tree, tree_positions in zip(step.trees, positions):
            qs = tree.query_start
            runner.positions[qs:qs + tree.num_rows] = tree_positions.to(runner.positions.device)
    except Exception as exc:
        on_error("tree positions", exc)
        step.failed = True
    return step


def _collect_step(tree_context: TreeContext, runner: Any,
                  scheduler_output: Any) -> tuple[StepTrees | None, list]:
    batch = runner.input_batch
    query_start = runner.query_start_loc.np
    device = runner.positions.device
    trees, all_rows, positions = [], [], []
    for req_id, scheduled in scheduler_output.scheduled_spec_decode_tokens.items():
        draft = tree_context.trees.get(req_id)
        if draft is None:
            continue
        i = batch.req_id_to_index[req_id]
        rows = tree_state.tree_rows(req_id, i, int(query_start[i]),
                                    int(batch.num_computed_tokens_cpu[i]), draft, scheduled)
        if rows is None:
            continue
        positions.append(torch.from_numpy(tree_state.positions_of(rows)))
        trees.append(rows)
        all_rows.append(np.arange(rows.query_start, rows.query_start + rows.num_rows))
    if not trees:
        return None, []
    rows = torch.from_numpy(np.concatenate(all_rows)).to(device)
    step = StepTrees(trees, rows)
    if tree_support.compacts_by_slot(tree_context):  # slot mapping is computed in the original
        step.slots = batch.block_table[0].slot_mapping.gpu[rows]
        step.kv_caches = tree_support.kv_caches(tree_context)
    else:
        step.attention_layers = tree_context.attention_layers
    return step, positions


def row_argmax(rows: torch.Tensor) -> np.ndarray:
    """Each logits row's argmax (the first one on ties), in fp32: on CPU an argmax over
    bf16 logits is several times slower, and vLLM's CPU greedy sampler op (the one it
    samples greedy requests with) several times faster than torch's."""
    rows = rows.float()
    greedy_argmax = _cpu_greedy_argmax() if rows.device.type == "cpu" else None
    if greedy_argmax is not None:
        return greedy_argmax(rows.contiguous()).numpy()
    return rows.argmax(dim=-1).cpu().numpy()


@functools.cache
def _cpu_greedy_argmax() -> Callable | None:
    try:
        return torch.ops._C.greedy_argmax
    except (AttributeError, RuntimeError):
        return None


def _target_probs(rows: torch.Tensor, sampling: Any, req_idx: int) -> np.ndarray:
    """The distribution vLLM samples request ``req_idx`` from, for each logits row:
    temperature, then top-k / top-p (penalties and min_p keep a request off trees)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    x = rows.float() / float(sampling.temperature[req_idx])
    n = x.shape[0]
    k = None if sampling.top_k is None else sampling.top_k[req_idx].expand(n)
    p = None if sampling.top_p is None else sampling.top_p[req_idx].expand(n)
    if k is not None or p is not None:
        x = apply_top_k_top_p_pytorch(x, k, p)
    return torch.softmax(x, dim=-1).double().cpu().numpy()


def _request_rng(sampling: Any, req_idx: int) -> np.random.Generator:
    """Seeded requests stay reproducible: draw from the request's own generator."""
    generator = sampling.generators.get(req_idx)
    seed = torch.randint(0, 2**62, (1,), generator=generator).item()
    return np.random.default_rng(seed)


def accept_no_tree_drafts(tree_context: TreeContext, output: Any,
                          on_error: Callable[[str, BaseException], None]) -> None:
    """End the step's trees with no draft accepted: each tree request's row becomes
    vLLM's own sample of its root row, which tree attention and positions computed
    exactly as a chain's (the root sees the context and itself, at the base position)."""
    step = tree_context.take_step()
    if step is None:
        return
    try:
        sampled = output.sampled_token_ids
        for tree in step.trees:
            _set_row(sampled, tree.req_idx, [int(sampled[tree.req_idx, 0])])
    except Exception as exc:  # the output is not vLLM's as we know it: nothing safe is left
        raise RuntimeError("vllm-echo: cannot undo a prepared tree step") from exc


def _set_row(sampled: torch.Tensor, req_idx: int, row: list[int]) -> None:
    sampled[req_idx].fill_(-1)
    sampled[req_idx, :len(row)] = torch.tensor(row, dtype=sampled.dtype)


def verify_step_trees(tree_context: TreeContext, logits: torch.Tensor, metadata: Any,
                      sampled: torch.Tensor, compact: Callable,
                      on_error: Callable[[str, BaseException], None],
                      sampling: Any, row_argmaxes: np.ndarray | None = None) -> dict[int, int]:
    """Apply tree verification to the step's tree requests (in place); ``row_argmaxes``,
    every logits row's argmax when the sampling hook took them already.

    Greedy requests accept the longest path matching the target's argmax; sampled
    requests use recursive rejection over siblings against the processed target
    distribution (drafts are point masses), which keeps that distribution exact.

    Returns, per tree request's batch row, the logits row that produced its last
    token (the bonus), for the next-next capture. Never leaves a wrong row: if
    verification fails (or the step was marked failed) a request accepts no draft
    (vLLM's sample of the root row is right whatever the tree), and if compaction
    fails it keeps only the accepted nodes that were already in place.
    """
    step = tree_context.take_step()
    last_rows: dict[int, int] = {}
    if step is None:
        return last_rows
    if tree_support.compacts_by_slot(tree_context) and step.mask_tables is None:
        step.failed = True  # no attention metadata of the step got the tree mask
    offset = 0
    for tree in step.trees:
        try:
            last_rows[tree.req_idx] = _verify_tree(tree_context, tree, offset, step, logits,
                                                   metadata, sampled, compact, on_error, sampling,
                                                   row_argmaxes)
        except Exception as exc:
            on_error("tree verification", exc)
            _set_row(sampled, tree.req_idx, [int(sampled[tree.req_idx, 0])])
            if tree_context.record_paths:
                tree_context.last_paths[tree.req_id] = []
        offset += tree.num_rows
    return last_rows


def _verify_tree(tree_context: TreeContext, tree: TreeRows, offset: int, step: StepTrees,
                 logits: torch.Tensor, metadata: Any, sampled: torch.Tensor, compact: Callable,
                 on_error: Callable[[str, BaseException], None], sampling: Any,
                 row_argmaxes: np.ndarray | None) -> int:
    """Verify one tree request, compact its KV and write its row; returns the logits
    row of its last token. Raises only before its row is written."""
    if step.failed:
        raise RuntimeError("the step's tree preparation or attention failed")
    n = len(tree.token_ids)
    if metadata.num_draft_tokens[tree.req_idx] != n:
        raise RuntimeError(f"{n} tree nodes prepared but "
                           f"{metadata.num_draft_tokens[tree.req_idx]} drafts sampled")
    start = int(metadata.bonus_logits_indices[tree.req_idx]) - n
    argmax = (row_argmax(logits[start:start + n + 1]) if row_argmaxes is None
              else row_argmaxes[start:start + n + 1])
    # vLLM marks greedy requests with temperature <= 0
    greedy = sampling.all_greedy or float(sampling.temperature[tree.req_idx]) <= 0
    if greedy:
        path, next_token = verify_greedy(tree.token_ids, tree.parents, argmax)
    else:
        probs = _target_probs(logits[start:start + n + 1], sampling, tree.req_idx)
        path, next_token = verify_sampling(tree.token_ids, tree.parents, probs,
                                           _request_rng(sampling, tree.req_idx))
    try:
        compact(tree, offset, path, step)
    except Exception as exc:
        on_error("KV compaction", exc)
        in_place = next((k for k, j in enumerate(path) if j != k), len(path))
        if in_place < len(path):
            path = path[:in_place]
            # the verdict's next token belonged to the cut path: resample safely
            next_token = int(argmax[path[-1] + 1 if path else 0]) if greedy else None
            if next_token is None:
                path, next_token = [], int(sampled[tree.req_idx, 0])
    tree_context.counters["tree_verifications"] += 1
    tree_context.counters["tree_compactions"] += any(j != k for k, j in enumerate(path))
    last = path[-1] + 1 if path else 0
    if next_token is None:
        next_token = int(argmax[last])
    _set_row(sampled, tree.req_idx, [int(tree.token_ids[j]) for j in path] + [next_token])
    if tree_context.record_paths:
        tree_context.last_paths[tree.req_id] = path
    return start + last
