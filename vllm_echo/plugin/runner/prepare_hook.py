# SPDX-License-Identifier: Apache-2.0
"""The ``_prepare_inputs`` hook: the step's tree rows and their RoPE positions, and the
start of ECHO's step clock.

Installed on the runner instance that owns our proposer (see patches.py); after
``_prepare_inputs`` it finds this step's tree requests, gives their nodes RoPE
positions base + depth (slots stay linear, so vLLM's KV allocation is untouched),
and publishes the step (``TreeContext.step``) to the attention layers.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from vllm_echo.plugin.runner import tree_state
from vllm_echo.plugin.runner.access import PREPARE_PARAMS, wrap_runner_method
from vllm_echo.plugin.runner.tree_state import CpuStep, FlexStep, StepTrees, TreeContext


def install_prepare_hook(runner: Any, tree_context: TreeContext,
                         on_error: Callable[[str, BaseException], None],
                         on_drift: Callable[[str, str], None], timer: Any = None,
                         on_first_step: Callable[[], None] | None = None) -> None:
    """Wrap ``runner._prepare_inputs`` (instance attribute) and attach ``tree_context``
    to the runner; ``timer`` (step_timer.StepTimer) starts timing decode steps here;
    ``on_first_step`` runs once, before the first step's attention metadata is built.

    A call whose arguments cannot be found by name runs the original unchanged and
    switches the hook off for good (``on_drift("_prepare_inputs", reason)``: chain
    mode).
    """
    tree_state.attach_to_runner(runner, tree_context)
    first_step = [on_first_step]

    def make_wrapper(original: Callable, read_arguments: Callable) -> Callable:
        def _prepare_inputs(*args, **kwargs):
            result = original(*args, **kwargs)
            # read per call: a later install attaches a new context without rewrapping
            context = tree_state.context_of_runner(runner)
            context.step = None
            if first_step[0] is not None:
                first_step[0], callback = None, first_step[0]
                callback()
            found = read_arguments(args, kwargs)
            if found is None:
                if timer is not None:
                    timer.skip()
                return result
            scheduler_output, _ = found
            try:
                if context.trees and scheduler_output.scheduled_spec_decode_tokens:
                    context.step = _prepare_step(context, runner, scheduler_output, on_error)
            except Exception as exc:  # nothing written yet: vLLM's chain semantics hold
                context.step = StepTrees([], None, failed=True)
                on_error("tree step preparation", exc)
            if timer is not None:
                try:
                    _time_step(timer, scheduler_output)
                except Exception as exc:
                    on_error("step timing", exc)
                    timer.skip()
            return result
        return _prepare_inputs

    wrap_runner_method(runner, "_prepare_inputs", PREPARE_PARAMS, on_drift, make_wrapper)


def _time_step(timer: Any, scheduler_output: Any) -> None:
    num_drafts = sum(map(len, scheduler_output.scheduled_spec_decode_tokens.values()))
    total = scheduler_output.total_num_scheduled_tokens
    # Only decode steps (each request runs its last token and its drafts) are
    # timed: the model's N is what drafting adds to. Prefill steps (hundreds of
    # tokens) would decide the fit and price a draft token at the prompt's rate,
    # far below what a few drafts really add to a decode step.
    if total == len(scheduler_output.num_scheduled_tokens) + num_drafts:
        timer.started(int(total), num_drafts > 0)
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
    if tree_context.attention.compacts_by_slot:  # slot mapping is computed in the original
        step.flex = FlexStep(batch.block_table[0].slot_mapping.gpu[rows],
                             tree_context.attention.kv_caches())
    else:
        step.cpu = CpuStep(tree_context.attention.layers)
    return step, positions

