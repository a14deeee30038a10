# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests that run vLLM (CPU backend, embedded model, fp32): engines built by
vllm_echo.engines.build_llm, with the tests' overrides."""

from __future__ import annotations

import contextlib
import gc
import os

from timing import StartClock

from vllm_echo.engines import ENGINE_DEFAULTS

# The package's engine defaults, but eager (a faster start) and a smaller KV cache, so
# that the session's shared engines and a module's own live side by side. Also the
# engine arguments of the Ray tests' configs.
ENGINE_KWARGS = {**ENGINE_DEFAULTS, "enforce_eager": True, "kv_cache_memory_bytes": 256 * 2**20}


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
    from vllm_echo.engines import build_llm, shutdown

    with StartClock("engine"):
        llm = build_llm(speculative_config, model=model, **{**ENGINE_KWARGS, **kwargs})
    try:
        yield llm
    finally:
        shutdown(llm)
        del llm
        gc.collect()


def accepted_tokens(stats: dict) -> int:
    """Draft tokens accepted, all sources (the drafter's own count: vLLM's metrics are
    process-wide, and an engine started later in the same process takes them over, so
    tests on shared engines read the drafter's)."""
    return sum(v for k, v in stats.items() if k.startswith("accepted_"))


def drafter_stats(llm) -> dict:
    """The drafter's counters on the first worker that has one (rank 0)."""
    from vllm_echo.engines import drafter_stats as first_drafter_stats

    stats = first_drafter_stats(llm)
    assert stats is not None, "the engine's drafter is not vllm-echo's"
    return stats


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
