# SPDX-License-Identifier: Apache-2.0
"""ECHO in simulate.py's replay: the planner the engine runs, fed the replay's step
costs, and the ECHO rows of simulate.py's tables."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
from simulate_costs import cpu_step_ms
from simulate_replay import Replay, replay

from vllm_echo.plugin.config_shim import CPU_ECHO_CAPACITY  # imports no vLLM
from vllm_echo.plugin.runner.cost_probe import probe_sizes  # imports no vLLM


class EchoDrafter:
    """ECHO as a replay drafter: the planner the engine runs (EchoPlanner) sees the
    batch's forests each step and learns from each step's verdicts. The engine's step
    timings are replaced by the replay's cost function, fed to the planner's cost curve
    as the plugin feeds measured ones. ``curve``: the start-up curve (a cost function of
    the step's size), or None for none (online only, as the engine runs without the
    start-up measurement). ``stats()``: its own planning time per step and what it
    learned."""

    def __init__(self, capacity: int, trees: bool, curve: Callable[[int], float] | None = None,
                 tuning: dict | None = None, k_max: int | None = None, batch: int = 1,
                 probe_cpu: bool = True):
        from vllm_echo.algos.echo import EchoPlanner, EchoTuning
        from vllm_echo.config import ECHO_MAX_NGRAM

        self.capacity, self.cap = capacity, capacity - 1
        self.max_ngram = ECHO_MAX_NGRAM
        self.planner = EchoPlanner(EchoTuning(**(tuning or {})), trees=trees, k_max=k_max)
        if curve is not None:  # the sizes the plugin's probe times (runner/cost_probe.py)
            tune = self.planner.tuning
            largest = tune.probe_largest_cpu if probe_cpu else batch * capacity
            sizes = probe_sizes(batch * capacity, largest)
            self.planner.cost.set_curve(sizes, [curve(n) for n in sizes])
        self.steps = self.tree_steps = 0
        self.plan_s = 0.0
        self._plans: list = []

    def __call__(self, states: list["Replay"], positions: list[int]) -> list[tuple]:
        from vllm_echo.algos.echo import Candidates
        from vllm_echo.algos.forest import build_forest_nodes

        if any(state.topk_logp is None for state in states):
            raise ValueError("the trace has no topk_logprobs; record it again (--record)")
        start = time.perf_counter()
        empty = (np.empty(0, np.int32), np.empty(0, np.int32))
        drafts, self._plans = [empty] * len(states), [None] * len(states)
        mode = self.planner.drafting_mode(len(states), self.cap)
        if mode != "none":
            heads = mode == "all"
            candidates = []
            for state, pos in zip(states, positions):
                top = state.topk[pos] if heads else np.empty(0, np.int32)
                nodes = build_forest_nodes(state.index_at(pos), top, self.capacity)
                candidates.append(Candidates(*nodes, head_logp=np.asarray(
                    state.topk_logp[pos] if heads else (), dtype=np.float64)))
            drafts, self._plans = self.planner.plan(candidates, self.cap, len(states))
        self.plan_s += time.perf_counter() - start
        return drafts

    def verdicts(self, states: list["Replay"], positions: list[int], paths: list[list[int]],
                 emitted: list[int], seconds: float, num_tokens: int, num_trees: int) -> None:
        observed = []
        for state, pos, plan, path, n in zip(states, positions, self._plans, paths, emitted):
            if plan is not None and len(path) + 1 == n:  # not cut by the end of the output
                observed.append((plan, path, int(state.full[state.prompt_len + pos + n])))
        self.planner.observe(observed)
        self.planner.cost.observe(num_tokens, seconds, num_tokens > len(states))
        self.steps += 1
        self.tree_steps += num_trees > 0

    def stats(self) -> dict[str, Any]:
        snap = self.planner.snapshot()
        return {"plan_ms_per_step": 1e3 * self.plan_s / self.steps if self.steps else None,
                "tree_steps": self.tree_steps, "probes": snap["probes"],
                "rates": snap["rates"], "cost_curve": self.planner.cost.describe()}


def startup_curve(cost: Callable[[int, int, int], float]) -> Callable[[int], float]:
    """What a dummy forward of n tokens costs under ``cost``: one request, n - 1 drafts
    (no per-request work beyond the first, no tree)."""
    return lambda n: cost(1, n - 1, 0)


def echo_replay(rows: list[dict], capacity: int, trees: bool, batch: int = 1,
                cost: Callable[[int, int, int], float] = cpu_step_ms,
                num_requests: int | None = None, startup: bool = True,
                tuning: dict | None = None, probe_cost: Callable | None = None,
                probe_cpu: bool | None = None) -> dict[str, Any]:
    """``probe_cost``: the cost the start-up curve is measured with (default ``cost``);
    ``probe_cpu``: the probe stops at EchoTuning.probe_largest_cpu as on a CPU, not at
    the largest step (default: where ``cost`` is the CPU's)."""
    if probe_cpu is None:
        probe_cpu = cost is cpu_step_ms or probe_cost is cpu_step_ms
    drafter = EchoDrafter(capacity, trees, startup_curve(probe_cost or cost) if startup
                          else None, tuning, batch=batch, probe_cpu=probe_cpu)
    return {**replay(rows, drafter, batch, cost, num_requests), **drafter.stats()}


# The batch-1 table's ECHO rows: the CPU default (chains) and trees, start-up curve.
ECHO_VARIANTS = {f"echo chain (capacity {CPU_ECHO_CAPACITY})": False,
                 f"echo tree (capacity {CPU_ECHO_CAPACITY})": True}
# ECHO's rows in the batch comparison: keyword arguments of echo_replay over the default.
ECHO_RUNS = {"echo": {}, "echo, no start-up curve": {"startup": False},
             "echo, other mode": {"other_mode": True}}
# --ablations: ECHO with a mechanism switched off or a number moved (EchoTuning fields;
# "capacity" is CPU_ECHO_CAPACITY on the CPU curve, 64 on the hinge).
ECHO_ABLATIONS = {"echo, no match-length buckets": {"tuning": {"match_edges": (1,)}},
                  "echo, no outlier band": {"tuning": {"outlier_band": 0.0}},
                  "echo, no drafted-step share": {"tuning": {"drafted_share": 0.0}},
                  "echo, drafted-step share 0.12": {"tuning": {"drafted_share": 0.12}},
                  "echo, capacity 16": {"capacity": 16},
                  "echo, capacity 64": {"capacity": 64},
                  "echo, probe up to 16 tokens": {"tuning": {"probe_largest_cpu": 16},
                                                  "probe_cpu": True},
                  "echo, probe up to 128 tokens": {"probe_cpu": True},
                  "echo, probe up to the largest step": {"probe_cpu": False},
                  "echo, no probe": {"tuning": {"probe_after": 1 << 30}},
                  "echo, no start-up curve, no probe": {"startup": False,
                                                        "tuning": {"probe_after": 1 << 30}}}
