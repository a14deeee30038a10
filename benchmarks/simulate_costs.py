# SPDX-License-Identifier: Apache-2.0
"""simulate.py's step costs: what a replayed step of so many live requests, draft tokens
and tree requests takes, measured on this CPU or an assumed GPU-like hinge."""

from __future__ import annotations

from typing import Callable

import numpy as np

from vllm_echo.plugin.config_shim import CPU_ECHO_CAPACITY  # imports no vLLM

# Decode step time vs tokens verified at batch 1, relative to a step without drafts
# (fp32, context 300, this CPU, vLLM 0.32): `tree_step_time.py --chain-lengths`,
# 5 rotated rounds, 2026-12-02; past 17 tokens the last segment's slope.
CPU_B1_COST = ((1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 17),
               (1.0, 1.067, 1.084, 1.069, 1.116, 1.174, 1.260, 1.323, 1.391, 1.464, 1.595))
CPU_B1_STEP_MS = 30.7
# Batch >= 2, same machine and dtype, from the offline benchmark at batch 8 / 24 / 64
# (commit a665ace, 64 tokens per request): a plain step took 69.8 / 169.6 / 381.9 ms
# for 7.5 / 22.4 / 57.5 requests on average, i.e. ~34 ms + ~6.05 ms per request; the
# K=4 drafters' steps cost ~1.6-1.9 ms more per verified draft token.
CPU_BATCH_MS = (34.0, 6.05, 1.8)  # (per step, per request, per draft token)
# What a step with drafts costs beyond its tokens at batch >= 2, as a share of the plain
# step (vLLM's speculative path: rejection sampler, spec metadata): 20-26 ms of a ~170 ms
# step at batch 64 (journal 2026-12-06-late), 6-8 ms of 53-56 ms at batch 1 (journal
# 2026-12-07-drafted-step). The batch-1 curve above was timed with drafts, so has it.
CPU_DRAFTED_EXTRA = 0.12
TREE_COST = 0.25  # a request verified as a tree on CPU, in batch-1 steps (ECHO measured)


def step_cost(num_tokens: int, curve=CPU_B1_COST) -> float:
    """Relative step time, extended past the last point with the last segment's slope."""
    ks, ts = curve
    if num_tokens <= ks[-1]:
        return float(np.interp(num_tokens, ks, ts))
    return ts[-1] + (num_tokens - ks[-1]) * (ts[-1] - ts[-2]) / (ks[-1] - ks[-2])


def cpu_step_ms(num_requests: int, num_drafts: int, num_trees: int) -> float:
    """Measured on this CPU (fp32): the batch-1 curve at batch 1, the linear fit above."""
    tree_ms = TREE_COST * CPU_B1_STEP_MS * num_trees
    if num_requests == 1:
        return CPU_B1_STEP_MS * step_cost(1 + num_drafts) + tree_ms
    per_step, per_request, per_draft = CPU_BATCH_MS
    plain = per_step + per_request * num_requests
    extra = CPU_DRAFTED_EXTRA * plain if num_drafts else 0.0
    return plain + extra + per_draft * num_drafts + tree_ms


def hinge_step_ms(num_requests: int, num_drafts: int, num_trees: int,
                  knee: int = 256) -> float:
    """Not measured: the shape ECHO assumes for a GPU (Eq. 2), flat up to ``knee``
    verified tokens, then linear (twice the time at 2 x knee), trees free (a masked
    attention). For reading how the budget behaves where verification is cheap."""
    return 1.0 + max(0, num_requests + num_drafts - knee) / knee


# name -> (step cost, ECHO's forest capacity there, trees): the plugin's CPU default
# (chains from a 32-node forest), elsewhere the reference capacity and trees.
COST_CURVES: dict[str, tuple[Callable[[int, int, int], float], int, bool]] = {
    "cpu": (cpu_step_ms, CPU_ECHO_CAPACITY, False),
    "gpu-like hinge (assumed)": (hinge_step_ms, 64, True)}


def with_stalls(cost: Callable[[int, int, int], float], rate: float, size: float,
                seed: int = 0) -> Callable[[int, int, int], float]:
    """``cost`` with stalls: a step, at random with probability ``rate``, takes
    ``1 + size`` times as long (the VM pausing, a slow first call); every replay with
    the same ``seed`` meets the same draws."""
    rng = np.random.default_rng(seed)
    return lambda *step: cost(*step) * (1.0 + size if rng.random() < rate else 1.0)
