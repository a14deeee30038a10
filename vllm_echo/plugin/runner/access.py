# SPDX-License-Identifier: Apache-2.0
"""How the plugin reaches the model runner that owns its proposer, and checks that
vLLM still looks as the hooks expect (drift probes, arguments read by name).

vLLM's ``custom_class`` contract gives ``propose()`` neither request ids nor
logits. Both live on the runner: ``input_batch.req_ids`` maps batch rows to
requests, and ``_sample`` sees the target's logits. See patches.py for the list.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Iterable


def _runner_on_stack() -> Any | None:
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
    runner = _runner_on_stack()
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



def wrap_runner_method(runner: Any, name: str, params: tuple[str, ...],
                       on_drift: Callable[[str, str], None],
                       make_wrapper: Callable[[Callable, Callable], Callable]) -> None:
    """Replace ``runner.<name>`` (an instance attribute, once per runner) with
    ``make_wrapper(original, read_arguments)``. ``read_arguments(args, kwargs)`` gives
    the call's ``params`` by name, or None for a call that does not bind to them:
    after the first such call it reports the drift once (``on_drift(name, reason)``)
    and returns None for good, so the wrapper runs the original unchanged."""
    mark = f"_vllm_echo_{name.strip('_')}_wrapped"
    if getattr(runner, mark, False):
        return
    original = getattr(runner, name)
    reader = ArgumentReader(inspect.signature(original), params)
    active = [True]

    def read_arguments(args: tuple, kwargs: dict) -> tuple | None:
        found = reader(args, kwargs) if active[0] else None
        if found is None and active[0]:
            active[0] = False
            on_drift(name, f"a call without {params}")
        return found

    setattr(runner, name, make_wrapper(original, read_arguments))
    setattr(runner, mark, True)
