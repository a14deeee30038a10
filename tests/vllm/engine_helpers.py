# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests that run vLLM (CPU backend, embedded model, fp32)."""

from __future__ import annotations

import contextlib
import gc
import os

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
    """An LLM that is shut down on exit, so tests never hold two engines' memory."""
    from vllm import LLM

    llm = LLM(model, speculative_config=speculative_config,
              **{**ENGINE_KWARGS, "disable_log_stats": False, **kwargs})
    try:
        yield llm
    finally:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def spec_counters(llm) -> dict[str, float]:
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            out[metric.name] = getattr(metric, "value", None) if hasattr(metric, "value") \
                else list(metric.values)
    return out
