# SPDX-License-Identifier: Apache-2.0
"""The step-cost curve measured at engine start: dummy forwards of the runner, timed
at several numbers of tokens, once its KV cache exists (the model is compiled by
then, so the curve is the mode the engine runs in), each with the logits and argmax
of all its rows, as a verification step computes them (vLLM's dummy run stops at the
hidden states; at 49k-token vocabularies the logits are a fifth of a small model's
work per token, which a curve without them would sell as free).

ECHO prices a draft token by this curve from its first step instead of learning it
by exploring; real decode steps then correct it online (attention over long
contexts, sampling and scheduling, which a dummy forward does not show).
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Callable

import numpy as np

from vllm_echo.plugin.runner.access import wrap_runner_method

# How many passes and up to which size: EchoTuning.probe_repeats and probe_largest (at
# 128 tokens the probe took about 2.5 s, embedded model on 2 CPU cores). Sizes are fixed
# (not time-bounded) so that tensor-parallel ranks, whose forwards are collectives, run
# the same ones.


def probe_sizes(max_tokens: int, largest: int) -> list[int]:
    """1, 2, 4, ... up to ``max_tokens`` (capped at ``largest``), the cap included."""
    top = max(1, min(int(max_tokens), int(largest)))
    sizes = [1 << i for i in range(top.bit_length()) if (1 << i) < top]
    return sizes + [top]


def time_forwards(forward: Callable[[int], Any], sizes: list[int],
                  repeats: int) -> tuple[np.ndarray, np.ndarray]:
    """``(sizes, fastest seconds)`` of ``forward(n)`` for each size, over ``repeats``
    passes through all the sizes, after one untimed call per size (a first call may
    allocate or specialise).

    Passes, not repeats in a row, and the fastest, not the median: a stall of the
    machine only adds time, and repeats in a row let one stall of a second or so take
    a size's whole median."""
    for n in sizes:
        forward(n)
    seconds = np.full(len(sizes), np.inf)
    for _ in range(repeats):
        for i, n in enumerate(sizes):
            start = time.perf_counter()
            forward(n)
            seconds[i] = min(seconds[i], time.perf_counter() - start)
    return np.asarray(sizes, dtype=np.int64), seconds


def accepts(method: Any, keyword: str) -> bool:
    """Whether ``method`` is callable with ``keyword`` (the probe needs
    ``_dummy_run(n, force_attention=True)``)."""
    if not callable(method):
        return False
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def verification_step(runner: Any, n: int) -> Any:
    """A dummy forward of ``n`` tokens, then the logits of every row and their argmax
    (a verification step samples every verified token's row).

    With attention (``force_attention``): without it vLLM's dummy run builds no
    attention metadata, the attention layers leave their output unwritten and the
    forward computes on garbage (every hidden state came out non-finite on the CPU),
    at a speed that depends on the garbage: 5 of 17 batch-8 engine starts priced
    64-token steps at 2-3x their cost (journal 2026-12-06-night)."""
    hidden, _ = runner._dummy_run(n, force_attention=True)
    return runner.model.compute_logits(hidden[:n]).argmax(dim=-1)


def install_cost_probe(runner: Any, sizes: list[int], repeats: int,
                       on_measured: Callable[[np.ndarray, np.ndarray, float], None],
                       on_error: Callable[[str, BaseException], None],
                       on_drift: Callable[[str, str], None]) -> None:
    """Wrap ``runner.initialize_kv_cache`` (instance attribute): after it, time
    ``verification_step(runner, n)`` at ``sizes``, ``repeats`` passes, and hand the points and
    the seconds the probe took to ``on_measured``. A failure is reported and leaves
    the curve unmeasured (ECHO then learns it from real steps)."""

    def make_wrapper(original: Callable, read_arguments: Callable) -> Callable:
        def initialize_kv_cache(*args, **kwargs):
            result = original(*args, **kwargs)
            started = time.perf_counter()
            try:
                timed, seconds = time_forwards(lambda n: verification_step(runner, n),
                                               sizes, repeats)
            except Exception as exc:
                on_error("step cost probe", exc)
            else:
                on_measured(timed, seconds, time.perf_counter() - started)
            return result
        return initialize_kv_cache

    wrap_runner_method(runner, "initialize_kv_cache", ("kv_cache_config",), on_drift,
                       make_wrapper)
