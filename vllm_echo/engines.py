# SPDX-License-Identifier: Apache-2.0
"""The engines this repository starts, from one set of defaults, and what to read from them.

Every ``vllm.LLM`` that the benchmarks, the example and the tests start is built by
:func:`build_llm`: the embedded model, :data:`ENGINE_DEFAULTS`, and the caller's
overrides (each caller says why it differs). :data:`SPECULATIVE_CONFIGS` names the
speculative configs the benchmarks and the example compare. What a run is measured
with is the package's public surface: vLLM's spec-decode counters
(:func:`spec_decode_counters`, the numbers ``/metrics`` serves) and the drafter's own
counters (:func:`drafter_stats`, docs/how-it-works.md).

    from vllm_echo.engines import SPECULATIVE_CONFIGS, build_llm, shutdown
    llm = build_llm(SPECULATIVE_CONFIGS["echo"], max_num_seqs=8)

No vLLM import at module level: importing this module stays cheap (vllm_echo/__init__).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

ENGINE_DEFAULTS: dict[str, Any] = {
    # fp32: in bf16 the CPU backend's rounding depends on batch shape, so greedy text
    # could differ from no speculation's for reasons that are not the drafter's.
    "dtype": "float32",
    "max_model_len": 2048,
    "seed": 0,
    # vLLM's default mode (compiled), as users run it; callers pass True for a faster start.
    "enforce_eager": False,
    # A fixed KV cache instead of a share of the machine's memory: an engine starts
    # wherever 1 GiB is free, and several fit on one machine.
    "kv_cache_memory_bytes": 2**30,
    # vLLM's spec-decode counters (LLM.get_metrics()) are kept only with stats on.
    "disable_log_stats": False,
}

# name -> speculative config (None: no speculation): the methods the benchmarks compare.
SPECULATIVE_CONFIGS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4,
              "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "ngram8": {"method": "ngram", "num_speculative_tokens": 8,
               "prompt_lookup_min": 2, "prompt_lookup_max": 5},
    # vLLM's SuffixDecoding, a peer: needs arctic-inference (benchmarks/README.md).
    "suffix": {"method": "suffix"},
    # Chains spelled out (the plugin's CPU default; on a GPU its default is trees).
    "logitspec": {"method": "logitspec", "tree": False},
    "logitspec-tree": {"method": "logitspec", "tree": True},
    "echo": {"method": "echo"},
    "echo-tree": {"method": "echo", "tree": True},  # trees (on CPU ECHO verifies chains)
}


def build_llm(speculative_config: dict[str, Any] | None = None, *, model: str | None = None,
              **overrides: Any):
    """A ``vllm.LLM`` of ``model`` (default: the embedded model) with
    ``speculative_config``, :data:`ENGINE_DEFAULTS` and ``overrides`` (any ``LLM``
    keyword; they win over the defaults)."""
    from vllm import LLM

    from vllm_echo.models import resolve_model

    return LLM(resolve_model(model), speculative_config=speculative_config,
               **{**ENGINE_DEFAULTS, **overrides})


def shutdown(llm) -> None:
    """Stop the engine's core (its processes, or its threads in-process) now, rather
    than whenever the garbage collector finds the ``LLM``."""
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    gc.collect()


def spec_decode_counters(llm) -> dict[str, Any]:
    """vLLM's ``vllm:spec_decode*`` metrics (what ``/metrics`` serves): a number per
    counter, a list per vector (accepted tokens per draft position). They live in the
    process's metrics registry, which the newest engine of the process owns."""
    out: dict[str, Any] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            out[metric.name] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


def drafter_stats(llm) -> dict[str, Any] | None:
    """The vllm-echo drafter's counters on the first worker that has one (rank 0), or
    None when the engine's drafter is not ours. With vLLM's engine in another process
    this needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (``collective_rpc`` ships a
    function)."""
    from vllm_echo.plugin.proposers.logitspec import worker_stats

    return next((s for s in llm.collective_rpc(worker_stats) if s), None)
