# SPDX-License-Identifier: Apache-2.0
"""Hooks on the model runner instance that owns our proposer.

vLLM's ``custom_class`` contract gives ``propose()`` neither request ids nor
logits. Both live on the runner: ``input_batch.req_ids`` maps batch rows to
requests, and ``_sample`` sees the target's logits. See patches.py for the list.
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
from typing import Any, Callable, Iterable

import numpy as np

from vllm_echo.algos.top_logprobs import top_logprobs, top_logprobs_bfloat16
from vllm_echo.plugin.tree_state import TreeContext, attach_to_runner, context_of_runner

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply


def runner_on_stack() -> Any | None:
    """The nearest GPUModelRunner (or subclass, e.g. CPUModelRunner) up the call
    stack, or None."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, GPUModelRunner):
            return candidate
        frame = frame.f_back
    return None


def find_runner() -> Any:
    """The runner whose ``load_model`` calls the proposer's.

    Both the GPU and the CPU runner call ``drafter.load_model(model)`` from their
    own ``load_model``; walking frames is the only way the custom_class contract
    lets a proposer reach its runner.
    """
    runner = runner_on_stack()
    if runner is None:
        raise RuntimeError(
            "vllm-echo: the proposer's load_model() was not called by a vLLM model runner; "
            "cannot reach the batch's request ids and logits")
    return runner


# The parameters each wrapper reads, by name, as vLLM 0.32 declares them.
SAMPLE_PARAMS = ("logits", "spec_decode_metadata")
PREPARE_PARAMS = ("scheduler_output", "num_scheduled_tokens")


def signature_drift(method: Any, params: tuple[str, ...]) -> str | None:
    """Why ``method`` cannot be wrapped as one taking ``params`` (None: it can).

    The wrapper finds its arguments by these names; parameters vLLM adds later are
    passed through, as long as they have defaults (else vLLM passes something the
    wrapper knows nothing about).
    """
    if not callable(method):
        return "missing"
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError) as exc:
        return f"no signature ({exc})"
    names = tuple(signature.parameters)
    if names[:len(params)] != params:
        return f"signature {signature} does not start with {params}"
    required = [p.name for p in list(signature.parameters.values())[len(params):]
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        return f"signature {signature} has new required parameters {required}"
    return None


def missing_attributes(root: Any, paths: Iterable[str]) -> list[str]:
    """The dotted attribute paths (``"input_batch.req_ids"``) that ``root`` lacks."""
    missing = []
    for path in paths:
        obj = root
        try:
            for name in path.split("."):
                obj = obj[int(name)] if name.isdigit() else getattr(obj, name)
        except Exception:
            missing.append(path)
    return missing


# Private runner attributes the plugin reads (patches.py lists them all).
RUNNER_STATE_ATTRIBUTES = ("input_batch.req_ids", "input_batch.req_id_to_index", "requests")
SAMPLE_ATTRIBUTES = ("sampler", "input_batch.sampling_metadata",
                     "input_batch.update_async_output_token_ids")
PREPARE_ATTRIBUTES = ("positions", "query_start_loc.np", "input_batch.num_computed_tokens_cpu")
FLEX_PREPARE_ATTRIBUTES = ("input_batch.block_table.0.slot_mapping.gpu",)


def probe_runner(runner: Any, flex: bool = False) -> dict[str, str]:
    """Why the proposer cannot use each hook point of ``runner``: keys "runner state"
    (request ids; without them nothing can be drafted), "_sample" and
    "_prepare_inputs". Empty when vLLM looks as the hooks expect."""
    problems = {}
    missing = missing_attributes(runner, RUNNER_STATE_ATTRIBUTES)
    if missing:
        problems["runner state"] = f"runner has no {', '.join(missing)}"
    for hook, params, attributes in (
            ("_sample", SAMPLE_PARAMS, SAMPLE_ATTRIBUTES),
            ("_prepare_inputs", PREPARE_PARAMS,
             PREPARE_ATTRIBUTES + (FLEX_PREPARE_ATTRIBUTES if flex else ()))):
        reason = signature_drift(getattr(runner, hook, None), params)
        missing = missing_attributes(runner, attributes)
        if reason is None and missing:
            reason = f"runner has no {', '.join(missing)}"
        if reason is not None:
            problems[hook] = reason
    return problems


class ArgumentReader:
    """Reads ``params`` from calls of a method with ``signature``, or None from a call
    that does not bind to it or lacks one of them. What binding decides depends only
    on the call's shape (how many positional arguments, which keywords), so each shape
    is bound once, with placeholders, and later calls of that shape are read where
    their values are (the hooks run every step; ``Signature.bind`` would redo the same
    work each time)."""

    def __init__(self, signature: inspect.Signature, params: tuple[str, ...]):
        self._signature = signature
        self._params = params
        # shape -> per param its position (int) or keyword (str); None: no binding
        self._where: dict[tuple, tuple | None] = {}

    def __call__(self, args: tuple, kwargs: dict) -> tuple | None:
        shape = (len(args), tuple(kwargs))
        if shape not in self._where:
            self._where[shape] = self._locate(*shape)
        where = self._where[shape]
        if where is None:
            return None
        return tuple(args[w] if isinstance(w, int) else kwargs[w] for w in where)

    def _locate(self, num_args: int, keywords: tuple[str, ...]) -> tuple | None:
        try:  # placeholders: a positional argument's index, a keyword's name
            arguments = self._signature.bind(*range(num_args),
                                             **{k: k for k in keywords}).arguments
        except TypeError:
            return None
        if any(p not in arguments for p in self._params):
            return None
        return tuple(arguments[p] for p in self._params)


class LastLogitsTopK:
    """Top-k token ids of the logits row that produced each request's last token.

    The ``_sample`` wrapper records the step's logits and those rows every step;
    ``propose()`` reads them in the same step (the batch order does not change in
    between: the runner condenses its batch only at the start of the next step).
    The top-k and its log-probabilities are computed on first read, so a step
    whose proposer drafts nothing (ECHO when no draft can pay) does not pay for a
    top-k and a log-sum-exp over the vocabulary; on CPU both run as one compiled
    pass per row (vllm_echo/algos/top_logprobs.py). ``release()`` drops the logits.
    """

    def __init__(self, k: int):
        self.k = k
        self.req_ids: list[str] = []
        self._pending: tuple[Any, Any] | None = None  # (logits, rows) of this step
        self._token_ids: np.ndarray | None = None  # [num_reqs, k], best first
        self._logprobs: np.ndarray | None = None   # [num_reqs, k], log softmax of raw logits

    def record(self, logits: Any, rows: Any, req_ids: list[str]) -> None:
        self.req_ids = req_ids
        self._pending = (logits, rows)
        self._token_ids = self._logprobs = None

    def release(self) -> None:
        self._pending = None
        self._token_ids = self._logprobs = None

    def rows_for(self, req_ids: list[str]) -> np.ndarray | None:
        if self.req_ids != req_ids[: len(self.req_ids)]:
            return None
        self._compute()
        return self._token_ids

    @property
    def logprobs(self) -> np.ndarray | None:
        self._compute()
        return self._logprobs

    def _compute(self) -> None:
        if self._token_ids is not None or self._pending is None:
            return
        import torch

        logits, rows = self._pending
        self._pending = None
        if logits.device.type == "cpu":
            if logits.dtype == torch.bfloat16 and logits.is_contiguous():
                # Widened row by row inside the kernel, not copied to float32 here.
                self._token_ids, self._logprobs = top_logprobs_bfloat16(
                    logits.view(torch.uint16).numpy(), rows.numpy(), self.k)
                return
            if logits.dtype != torch.float32 or not logits.is_contiguous():
                logits, rows = logits[rows].float(), torch.arange(len(rows))
            self._token_ids, self._logprobs = top_logprobs(logits.numpy(), rows.numpy(),
                                                           self.k)
            return
        last = logits[rows].float()
        top = torch.topk(last, min(self.k, last.shape[-1]), dim=-1)
        self._logprobs = (top.values - torch.logsumexp(last, dim=-1, keepdim=True)).cpu().numpy()
        self._token_ids = top.indices.to(torch.int32).cpu().numpy()


class StepTimer:
    """Decode step time vs its size, for ECHO's cost model: a step's cycle, from the
    end of its ``_prepare_inputs`` (``started``) to the end of the next step's
    (``started`` or ``skip``). That is forward, sampling (the rejection sampler when
    the step has drafts), drafting, and the engine's scheduling and output processing,
    all of which the step's throughput pays for (at batch 24 on the CPU a fit of the
    forward alone put a step at 76-80 ms, against about 120 ms of wall time per decode
    step). A cycle whose gap after ``propose`` is over
    ``max_gap_ratio`` times the step's own work is dropped: the engine was idle (no
    requests), not working. Fed to ``sink(num_tokens, seconds, num_trees, drafted,
    adjacent)``, ``adjacent`` telling whether the cycle began where the previous one fed
    to it ended (no prefill, idle time or dropped cycle between them).
    """

    def __init__(self, sink: Callable[[int, float, int, bool, bool], None],
                 max_gap_ratio: float = 3.0):
        self.sink = sink
        self.max_gap_ratio = max_gap_ratio
        self._start: tuple[int, int, bool, float] | None = None
        self._stopped_at: float | None = None  # end of the started step's propose
        self._last_end: float | None = None  # end of the last cycle fed to the sink

    def started(self, num_tokens: int, num_trees: int = 0, drafted: bool = False) -> None:
        now = time.perf_counter()
        self._close(now)
        self._start = (num_tokens, num_trees, drafted, now)

    def skip(self) -> None:
        """A step that is not timed (it prefills) ends the previous one's cycle."""
        self._close(time.perf_counter())
        self._start = None

    def stopped(self) -> None:
        if self._start is not None:
            self._stopped_at = time.perf_counter()

    def _close(self, now: float) -> None:
        start, stopped_at = self._start, self._stopped_at
        self._start = self._stopped_at = None
        if start is None or stopped_at is None:
            return
        num_tokens, num_trees, drafted, t0 = start
        if now - stopped_at <= self.max_gap_ratio * (stopped_at - t0):
            self.sink(num_tokens, now - t0, num_trees, drafted, t0 == self._last_end)
            self._last_end = now


def _no_drafts_in_step(metadata: Any, input_batch: Any) -> bool:
    """True when the plain sampler gives exactly the rejection sampler's result: no
    request has a draft token and no logprobs are requested (their layout differs)."""
    sampling = input_batch.sampling_metadata
    return (metadata.max_spec_len == 0 and sampling.max_num_logprobs is None
            and not sampling.logprob_token_ids)


def _verdicts_are_row_argmaxes(runner: Any, metadata: Any) -> bool:
    """True when the rejection sampler's result is fixed by each logits row's argmax:
    every request greedy, no logprobs (their layout differs), no synthetic acceptance,
    nothing that RejectionSampler.apply_logits_processors changes draft rows with
    (penalties, allowed-token masks, bad words, min_tokens, a thinking budget), and
    nothing that the sampler changes bonus rows with (those, logit_bias, a logits
    processor that is not vLLM's own)."""
    from vllm.v1.sample.logits_processor.builtin import (LogitBiasLogitsProcessor,
                                                         MinTokensLogitsProcessor)

    sampling = runner.input_batch.sampling_metadata
    if not (sampling.all_greedy and sampling.max_num_logprobs is None
            and not sampling.logprob_token_ids and sampling.no_penalties
            and sampling.allowed_token_ids_mask is None and not sampling.bad_words_token_ids
            and not getattr(getattr(runner, "rejection_sampler", None), "synthetic_mode", True)):
        return False
    thinking_budget = getattr(sampling, "thinking_budget_state_holder", None)
    if thinking_budget is not None and thinking_budget.has_tracked_requests():
        return False
    if any(type(processor) not in (LogitBiasLogitsProcessor, MinTokensLogitsProcessor)
           for processor in sampling.logitsprocs.non_argmax_invariant):
        return False
    requests = runner.requests
    for req_id in runner.input_batch.req_ids[:len(metadata.num_draft_tokens)]:
        params = requests[req_id].sampling_params
        if params is None or params.min_tokens or params.logit_bias:
            return False
    return True


def _greedy_verdicts(logits: Any, metadata: Any, tree_requests: list[int]) -> tuple[Any, Any]:
    """The rejection sampler's result where _verdicts_are_row_argmaxes, from one argmax
    over every logits row (no row copied): chains keep their drafts up to the first
    that differs from its row's argmax, then that argmax or, all kept, the bonus
    row's (verify_greedy_chains); a tree request's row is its root row's argmax,
    which its tree verdict replaces. Returns the output and the rows' argmaxes, which
    tree verification reads too."""
    import torch
    from vllm.v1.outputs import SamplerOutput

    from vllm_echo.algos.verify import verify_greedy_chains
    from vllm_echo.plugin.tree_runner import row_argmax

    argmaxes = row_argmax(logits)
    num_drafts = np.asarray(metadata.num_draft_tokens, dtype=np.int64)
    chain_drafts = num_drafts.copy()
    chain_drafts[tree_requests] = 0
    last_rows = metadata.bonus_logits_indices.cpu().numpy() - (num_drafts - chain_drafts)
    draft_ids = metadata.draft_token_ids.cpu().numpy()
    target_rows = metadata.target_logits_indices.cpu().numpy()
    if tree_requests:
        in_chain = np.repeat(chain_drafts > 0, num_drafts)
        draft_ids, target_rows = draft_ids[in_chain], target_rows[in_chain]
    rows = verify_greedy_chains(draft_ids, chain_drafts, argmaxes[target_rows],
                                argmaxes[last_rows], metadata.max_spec_len + 1)
    sampled = torch.from_numpy(rows).to(device=logits.device, dtype=torch.int32)
    return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None), argmaxes


def _sample_bonus_rows(runner: Any, logits: Any, metadata: Any) -> Any:
    """A step without drafts (_no_drafts_in_step): the rejection sampler's result is
    its sample of the bonus rows, taken by the same call minus the full-vocabulary
    logprobs it would compute and discard (rejection_sampler.py:141-160)."""
    return runner.sampler(logits=logits[metadata.bonus_logits_indices],
                          sampling_metadata=runner.input_batch.sampling_metadata,
                          predict_bonus_token=True)


def install_sample_hook(runner: Any, tree_context: TreeContext, sink: LastLogitsTopK,
                        on_error: Callable[[str, BaseException], None],
                        on_drift: Callable[[str, str], None],
                        compact: Callable | None = None) -> None:
    """Wrap ``runner._sample`` (instance attribute): tree verdicts, then top-k capture;
    attach ``tree_context`` to the runner, where the hook reads it.

    With ``compact`` (tree mode), the step's tree requests get their tree verdict and
    KV compaction (tree_runner.verify_step_trees) after vLLM's own sampling. Then the
    raw logits rows that produced each request's last token are recorded for the
    top-k (computed when the proposer reads it): the samplers work on indexed copies
    of ``logits``, so ``logits`` is still raw (pre-temperature, post grammar bitmask).
    For a chain, that row is (bonus row - num_draft_tokens[i]) + num_generated[i] - 1;
    for a tree, the row of its last accepted node. A step in which no request has a
    draft (_sample_bonus_rows), or whose verdicts are its logits rows' argmaxes
    (_greedy_verdicts), skips the rejection sampler for the same result.

    A call whose arguments cannot be found by name runs the original unchanged and
    switches the hook off for good (``on_drift("_sample", reason)``: no trees, no
    next-next candidates); tree requests already prepared for that step accept no
    draft.
    """
    import torch

    from vllm_echo.plugin.tree_runner import accept_no_tree_drafts, verify_step_trees

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
                if _no_drafts_in_step(spec_decode_metadata, runner.input_batch):
                    runner.input_batch.update_async_output_token_ids()
                    output = _sample_bonus_rows(runner, logits, spec_decode_metadata)
                elif _verdicts_are_row_argmaxes(runner, spec_decode_metadata):
                    step = tree_context.step if compact is not None else None
                    runner.input_batch.update_async_output_token_ids()
                    output, row_argmaxes = _greedy_verdicts(
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

