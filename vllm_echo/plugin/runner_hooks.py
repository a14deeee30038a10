# SPDX-License-Identifier: Apache-2.0
"""Hooks on the model runner instance that owns our proposer.

vLLM's ``custom_class`` contract gives ``propose()`` neither request ids nor
logits. Both live on the runner: ``input_batch.req_ids`` maps batch rows to
requests, and ``_sample`` sees the target's logits. See patches.py for the list.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable

import numpy as np

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply


def find_runner() -> Any:
    """The GPUModelRunner (or subclass, e.g. CPUModelRunner) up the call stack.

    Both the GPU and the CPU runner call ``drafter.load_model(model)`` from their
    own ``load_model``; walking frames is the only way the custom_class contract
    lets a proposer reach its runner.
    """
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, GPUModelRunner):
            return candidate
        frame = frame.f_back
    raise RuntimeError(
        "vllm-echo: the proposer's load_model() was not called by a vLLM model runner; "
        "cannot reach the batch's request ids and logits")


class LastLogitsTopK:
    """Top-k token ids of the logits row that produced each request's last token.

    Filled by the ``_sample`` wrapper every step, read by ``propose()`` in the same
    step (the batch order does not change in between: the runner condenses its
    batch only at the start of the next step).
    """

    def __init__(self, k: int):
        self.k = k
        self.req_ids: list[str] = []
        self.token_ids: np.ndarray | None = None  # [num_reqs, k], best first
        self.logprobs: np.ndarray | None = None   # [num_reqs, k], log softmax of raw logits

    def rows_for(self, req_ids: list[str]) -> np.ndarray | None:
        if self.token_ids is None or self.req_ids != req_ids[: len(self.req_ids)]:
            return None
        return self.token_ids


class ForwardTimer:
    """Forward-pass time vs tokens and tree requests in the step: from the end of
    ``_prepare_inputs`` to the start of ``_sample`` (model forward plus logits),
    fed to ``sink(num_tokens, seconds, num_trees)``."""

    def __init__(self, sink: Callable[[int, float, int], None]):
        self.sink = sink
        self._start: tuple[int, int, float] | None = None

    def started(self, num_tokens: int, num_trees: int = 0) -> None:
        self._start = (num_tokens, num_trees, time.perf_counter())

    def stopped(self) -> None:
        if self._start is not None:
            num_tokens, num_trees, t0 = self._start
            self._start = None
            self.sink(num_tokens, time.perf_counter() - t0, num_trees)


def install_sample_hook(runner: Any, sink: LastLogitsTopK,
                        on_error: Callable[[str, BaseException], None],
                        compact: Callable | None = None,
                        timer: ForwardTimer | None = None) -> None:
    """Wrap ``runner._sample`` (instance attribute): tree verdicts, then top-k capture.

    With ``compact`` (tree mode), the step's tree requests get their greedy tree
    verdict and KV compaction (tree_runner.verify_step_trees) after vLLM's own
    sampling. Then the top-k of the raw logits is recorded at the row that
    produced each request's last token: the rejection sampler works on indexed
    copies of ``logits``, so ``logits`` is still raw (pre-temperature, post grammar
    bitmask). For a chain, that row is (bonus row - num_draft_tokens[i]) +
    num_generated[i] - 1; for a tree, the row of its last accepted node.
    """
    import torch

    if getattr(runner, "_vllm_echo_sample_wrapped", False):
        return
    original = runner._sample

    def _sample(logits, spec_decode_metadata):
        if timer is not None:
            timer.stopped()
        output = original(logits, spec_decode_metadata)
        sink.token_ids = None
        if logits is None or spec_decode_metadata is None:
            return output
        last_rows: dict[int, int] = {}
        if compact is not None:
            from vllm_echo.plugin.tree_runner import verify_step_trees

            last_rows = verify_step_trees(logits, spec_decode_metadata,
                                          output.sampled_token_ids, compact, on_error,
                                          runner.input_batch.sampling_metadata)
        try:
            sampled = output.sampled_token_ids
            num_generated = (sampled != -1).sum(dim=1).clamp_(min=1)
            num_drafts = torch.as_tensor(spec_decode_metadata.num_draft_tokens,
                                         device=sampled.device)
            rows = spec_decode_metadata.bonus_logits_indices - num_drafts + num_generated - 1
            for i, row in last_rows.items():
                rows[i] = row
            k = min(sink.k, logits.shape[-1])
            last = logits[rows].float()
            top = torch.topk(last, k, dim=-1)
            logprobs = (top.values - torch.logsumexp(last, dim=-1, keepdim=True)).cpu().numpy()
            sink.req_ids = list(runner.input_batch.req_ids[: sampled.shape[0]])
            sink.logprobs = logprobs
            sink.token_ids = top.indices.to(torch.int32).cpu().numpy()  # last: marks it valid
        except Exception as exc:  # never let drafting break sampling
            on_error("logits capture", exc)
        return output

    runner._sample = _sample
    runner._vllm_echo_sample_wrapped = True
