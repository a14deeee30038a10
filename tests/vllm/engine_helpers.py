# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests that run vLLM (CPU backend, embedded model, fp32)."""

from __future__ import annotations

import contextlib
import gc
import os

from timing import StartClock

# fp32: in bf16 greedy text differs with batch shape alone, so identity needs fp32.
ENGINE_KWARGS = dict(dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
                     kv_cache_memory_bytes=256 * 2**20)


# Length of the shared no-speculation greedy reference (conftest.greedy_reference);
# tests with shorter outputs compare against its prefix.
REFERENCE_MAX_TOKENS = 96


# Lets tests read the drafter's counters with LLM.collective_rpc(worker_stats) (a
# function, which vLLM only ships to workers with pickle). Tests only.
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


@contextlib.contextmanager
def engine(model: str, speculative_config=None, **kwargs):
    """An LLM that is shut down on exit (fixtures that share one engine between tests
    hold it for their scope; the session's no-spec engine is the one that stays up)."""
    from vllm import LLM

    with StartClock("engine"):
        llm = LLM(model, speculative_config=speculative_config,
                  **{**ENGINE_KWARGS, "disable_log_stats": False, **kwargs})
    try:
        yield llm
    finally:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def accepted_tokens(stats: dict) -> int:
    """Draft tokens accepted, all sources (the drafter's own count: vLLM's metrics are
    process-wide, and an engine started later in the same process takes them over, so
    tests on shared engines read the drafter's)."""
    return sum(v for k, v in stats.items() if k.startswith("accepted_"))


def spec_counters(llm) -> dict[str, float]:
    """vLLM's speculative-decoding counters. They live in the process's metrics
    registry, which the newest engine of the process owns: read them only from an
    engine started inside the test."""
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            out[metric.name] = getattr(metric, "value", None) if hasattr(metric, "value") \
                else list(metric.values)
    return out


def drafter_stats(llm) -> dict:
    """The drafter's counters on the first worker that has one (rank 0)."""
    from vllm_echo.plugin.proposers.logitspec import worker_stats

    return [s for s in llm.collective_rpc(worker_stats) if s][0]


def since(before: dict, after: dict) -> dict:
    """``after`` with every number (and every number in a nested dict, such as the
    failure counts) reduced by its value in ``before``: what one test added to an
    engine that other tests share. Anything else is ``after``'s."""
    out = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict):
            out[key] = since(old if isinstance(old, dict) else {}, value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value - (old if isinstance(old, (int, float)) else 0)
        else:
            out[key] = value
    return out


def faults(stats: dict) -> dict:
    """Counted failures other than a drafting step past its deadline (the designed
    fallback on a busy machine)."""
    return {k: n for k, n in stats["failures"].items() if n and k != "propose:TimeoutError"}
