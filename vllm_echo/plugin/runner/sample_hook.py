# SPDX-License-Identifier: Apache-2.0
"""The ``_sample`` hook: vLLM's sampling (or a shortcut to the same result), then the
step's tree verdicts, then the top-k capture of the rows behind the last tokens."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from vllm_echo.plugin.runner.access import SAMPLE_PARAMS, ArgumentReader
from vllm_echo.plugin.runner.last_logits import LastLogitsTopK
from vllm_echo.plugin.runner.tree_state import TreeContext, attach_to_runner, context_of_runner
from vllm_echo.plugin.runner.verdicts import (accept_no_tree_drafts, greedy_verdicts,
                                              no_drafts_in_step, sample_bonus_rows,
                                              verdicts_are_row_argmaxes, verify_step_trees)


def install_sample_hook(runner: Any, tree_context: TreeContext, sink: LastLogitsTopK,
                        on_error: Callable[[str, BaseException], None],
                        on_drift: Callable[[str, str], None],
                        compact: Callable | None = None) -> None:
    """Wrap ``runner._sample`` (instance attribute): tree verdicts, then top-k capture;
    attach ``tree_context`` to the runner, where the hook reads it.

    With ``compact`` (tree mode), the step's tree requests get their tree verdict and
    KV compaction (verdicts.verify_step_trees) after vLLM's own sampling. Then the
    raw logits rows that produced each request's last token are recorded for the
    top-k (computed when the proposer reads it): the samplers work on indexed copies
    of ``logits``, so ``logits`` is still raw (pre-temperature, post grammar bitmask).
    For a chain, that row is (bonus row - num_draft_tokens[i]) + num_generated[i] - 1;
    for a tree, the row of its last accepted node. A step in which no request has a
    draft (sample_bonus_rows), or whose verdicts are its logits rows' argmaxes
    (greedy_verdicts), skips the rejection sampler for the same result.

    A call whose arguments cannot be found by name runs the original unchanged and
    switches the hook off for good (``on_drift("_sample", reason)``: no trees, no
    next-next candidates); tree requests already prepared for that step accept no
    draft.
    """
    attach_to_runner(runner, tree_context)
    if getattr(runner, "_vllm_echo_sample_wrapped", False):
        return
    original = runner._sample
    read_arguments = ArgumentReader(inspect.signature(original), SAMPLE_PARAMS)
    active = [True]

    def _sample(*args, **kwargs):
        sink.release()
        # read per call: a later install attaches a new context without rewrapping
        tree_context = context_of_runner(runner)
        found = read_arguments(args, kwargs) if active[0] else None
        if found is None:
            output = original(*args, **kwargs)
            if active[0]:
                active[0] = False
                on_drift("_sample", f"a call without {SAMPLE_PARAMS}")
            accept_no_tree_drafts(tree_context, output, on_error)
            return output
        logits, spec_decode_metadata = found
        output = row_argmaxes = None
        try:
            # vLLM builds spec metadata for every step once speculation is on; steps
            # with no draft, or whose verdicts are the rows' argmaxes, need less than
            # its rejection sampler (minus empty kernels, full-vocabulary logprobs
            # and a torch argmax over row copies).
            if spec_decode_metadata is not None:
                if no_drafts_in_step(spec_decode_metadata, runner.input_batch):
                    runner.input_batch.update_async_output_token_ids()
                    output = sample_bonus_rows(runner, logits, spec_decode_metadata)
                elif verdicts_are_row_argmaxes(runner, spec_decode_metadata):
                    step = tree_context.step if compact is not None else None
                    runner.input_batch.update_async_output_token_ids()
                    output, row_argmaxes = greedy_verdicts(
                        logits, spec_decode_metadata,
                        [] if step is None else [tree.req_idx for tree in step.trees])
                    tree_context.counters["greedy_verified_steps"] += 1
        except Exception as exc:  # vLLM changed: its own sampling is always right
            on_error("sampling without the rejection sampler", exc)
            output = row_argmaxes = None
        if output is None:
            output = original(*args, **kwargs)
        if logits is None or spec_decode_metadata is None:
            return output
        last_rows: dict[int, int] = {}
        if compact is not None:
            try:
                sampling = runner.input_batch.sampling_metadata
            except Exception as exc:  # without it sampled trees cannot be verified
                on_error("tree verification", exc)
                accept_no_tree_drafts(tree_context, output, on_error)
            else:
                last_rows = verify_step_trees(tree_context, logits, spec_decode_metadata,
                                              output.sampled_token_ids, compact, on_error,
                                              sampling, row_argmaxes)
        try:
            sampled = output.sampled_token_ids
            num_generated = (sampled != -1).sum(dim=1).clamp_(min=1)
            num_drafts = torch.as_tensor(spec_decode_metadata.num_draft_tokens,
                                         device=sampled.device)
            rows = spec_decode_metadata.bonus_logits_indices - num_drafts + num_generated - 1
            for i, row in last_rows.items():
                rows[i] = row
            sink.record(logits, rows, list(runner.input_batch.req_ids[: sampled.shape[0]]))
        except Exception as exc:  # never let drafting break sampling
            on_error("logits capture", exc)
        return output

    runner._sample = _sample
    runner._vllm_echo_sample_wrapped = True

