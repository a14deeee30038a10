# SPDX-License-Identifier: Apache-2.0
"""The ``_sample`` hook: vLLM's sampling (or a shortcut to the same result), then the
step's tree stage (tree_verdicts.finish_tree_step), then the capture of the logits
rows behind each request's last token (next-next candidates)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from vllm_echo.plugin.runner.access import SAMPLE_PARAMS, wrap_runner_method
from vllm_echo.plugin.runner.greedy_shortcut import (greedy_verdicts, no_drafts_in_step,
                                                     sample_bonus_rows,
                                                     verdicts_are_row_argmaxes)
from vllm_echo.plugin.runner.last_logits import LastLogitsTopK
from vllm_echo.plugin.runner.tree_state import TreeContext, attach_to_runner, context_of_runner
from vllm_echo.plugin.runner.tree_verdicts import accept_no_tree_drafts, finish_tree_step


def install_sample_hook(runner: Any, tree_context: TreeContext, sink: LastLogitsTopK,
                        on_error: Callable[[str, BaseException], None],
                        on_drift: Callable[[str, str], None],
                        compact: Callable | None = None) -> None:
    """Wrap ``runner._sample`` (instance attribute) and attach ``tree_context`` to the
    runner, where the hook reads it.

    With ``compact`` (tree mode) the step's tree requests then get the tree stage.
    Then the raw logits rows that produced each request's last token are recorded
    for the top-k (computed when the proposer reads it): the samplers work on indexed
    copies of ``logits``, so ``logits`` is still raw (pre-temperature, post grammar
    bitmask). For a chain, that row is (bonus row - num_draft_tokens[i]) +
    num_generated[i] - 1; for a tree, the row of its last accepted node. A step in
    which no request has a draft, or whose verdicts are its logits rows' argmaxes,
    skips the rejection sampler for the same result (greedy_shortcut.py).

    A call whose arguments cannot be found by name runs the original unchanged and
    switches the hook off for good (``on_drift("_sample", reason)``: no trees, no
    next-next candidates); tree requests already prepared for that step accept no
    draft.
    """
    attach_to_runner(runner, tree_context)

    def make_wrapper(original: Callable, read_arguments: Callable) -> Callable:
        def _sample(*args, **kwargs):
            sink.release()
            # read per call: a later install attaches a new context without rewrapping
            context = context_of_runner(runner)
            found = read_arguments(args, kwargs)
            if found is None:
                output = original(*args, **kwargs)
                accept_no_tree_drafts(context, output)
                return output
            logits, metadata = found
            output, row_argmaxes = _sample_without_rejection_sampler(
                runner, context, logits, metadata, compact is not None, on_error)
            if output is None:
                output = original(*args, **kwargs)
            if logits is None or metadata is None:
                return output
            last_rows: dict[int, int] = {}
            req_ids = list(runner.input_batch.req_ids)
            if compact is not None:
                try:
                    sampling = runner.input_batch.sampling_metadata
                except Exception as exc:  # without it sampled trees cannot be verified
                    on_error("tree verification", exc)
                    sampling = None
                last_rows = finish_tree_step(context, logits, metadata,
                                             output.sampled_token_ids, req_ids, compact,
                                             on_error, sampling, row_argmaxes)
            _record_last_rows(sink, logits, metadata, output, req_ids, last_rows, on_error)
            return output
        return _sample

    wrap_runner_method(runner, "_sample", SAMPLE_PARAMS, on_drift, make_wrapper)


def _sample_without_rejection_sampler(runner: Any, tree_context: TreeContext, logits: Any,
                                      metadata: Any, trees: bool,
                                      on_error: Callable[[str, BaseException], None]
                                      ) -> tuple[Any, Any]:
    """vLLM builds spec metadata for every step once speculation is on; steps with no
    draft, or whose verdicts are the rows' argmaxes, need less than its rejection
    sampler (minus empty kernels, full-vocabulary logprobs and a torch argmax over
    row copies). Returns ``(output, row_argmaxes)``, or Nones: run vLLM's own."""
    if metadata is None:
        return None, None
    try:
        if no_drafts_in_step(metadata, runner.input_batch):
            runner.input_batch.update_async_output_token_ids()
            return sample_bonus_rows(runner, logits, metadata), None
        if verdicts_are_row_argmaxes(runner, metadata):
            step = tree_context.step if trees else None
            runner.input_batch.update_async_output_token_ids()
            result = greedy_verdicts(logits, metadata,
                                     [] if step is None else [t.req_idx for t in step.trees])
            tree_context.counters["greedy_verified_steps"] += 1
            return result
    except Exception as exc:  # vLLM changed: its own sampling is always right
        on_error("sampling without the rejection sampler", exc)
    return None, None


def _record_last_rows(sink: LastLogitsTopK, logits: Any, metadata: Any, output: Any,
                      req_ids: list[str], last_rows: dict[int, int],
                      on_error: Callable[[str, BaseException], None]) -> None:
    try:
        sampled = output.sampled_token_ids
        if metadata.max_spec_len == 0:  # no drafts: each request's one row is its last
            rows = metadata.bonus_logits_indices
        else:
            num_generated = (sampled != -1).sum(dim=1).clamp_(min=1)
            num_drafts = torch.as_tensor(metadata.num_draft_tokens, device=sampled.device)
            rows = metadata.bonus_logits_indices - num_drafts + num_generated - 1
        if last_rows:
            rows = rows.clone()  # never write into vLLM's metadata
            for i, row in last_rows.items():
                rows[i] = row
        sink.record(logits, rows, req_ids[: sampled.shape[0]])
    except Exception as exc:  # never let drafting break sampling
        on_error("logits capture", exc)
