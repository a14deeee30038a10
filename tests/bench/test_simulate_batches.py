# SPDX-License-Identifier: Apache-2.0
"""simulate.py's continuous-batching replay on tiny traces whose schedule is known."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import simulate_costs  # noqa: E402
import simulate_echo  # noqa: E402
import simulate_replay  # noqa: E402


def _row(prompt: list[int], output: list[int]) -> dict:
    return {"prompt_ids": prompt, "output_ids": output, "topk_ids": [[0]] * len(output),
            "topk_logprobs": [[-0.1]] * len(output)}


ROWS = [_row([1, 2], [3, 4, 5, 6]), _row([7], [8, 9]), _row([5, 5], [1, 2, 3])]


def _squared(num_requests: int, num_drafts: int, num_trees: int) -> float:
    return float(num_requests**2 + 100 * num_drafts + 1000 * num_trees)


def test_continuous_batching_schedule() -> None:
    # Batch 2: A and B decode (4 s); B is done, C takes its slot: A+C twice (4 s each).
    # Batch 1: the 3 + 1 + 2 decode steps one request at a time (1 s each).
    result = simulate_replay.replay(ROWS, None, batch=2, cost=_squared)
    assert result["seconds"] == 12.0
    assert result["steps"] == 3 + 6 and result["tokens"] == 9
    assert result["tokens_per_step"] == 1.0
    assert simulate_replay.replay(ROWS, None, batch=1, cost=_squared)["seconds"] == 6.0
    # Rows are cycled to fill the batch: 4 requests of which A twice.
    assert simulate_replay.replay(ROWS, None, batch=4, cost=_squared)["tokens"] == 13


def _oracle(k: int):
    """Drafts the true next k tokens as a chain: all of them are accepted."""
    def draft(state, pos):
        start = state.prompt_len + pos + 1
        tokens = state.full[start:start + k].astype(np.int32)
        return tokens, np.arange(-1, len(tokens) - 1, dtype=np.int32)
    return simulate_replay.PerRequest(draft)


def test_accepted_drafts_emit_tokens_and_cost_their_rows() -> None:
    # Oracle with k = 2 at batch 1: A (3 tokens after the prefill) takes one step with
    # 2 drafts (emits 3); B one step with its 1 remaining token drafted; C one step with
    # 2 drafts, both accepted (emits 2: its output ends there, no bonus token).
    result = simulate_replay.replay(ROWS, _oracle(2), batch=1, cost=_squared)
    assert result["steps"] == 3 + 3
    assert result["tokens_per_step"] == pytest.approx(9 / 6)
    assert result["seconds"] == 3 * 1 + 100 * (2 + 1 + 2)
    assert result["drafted_per_step"] == pytest.approx(5 / 3)


def test_cpu_cost_is_the_measured_curve() -> None:
    assert simulate_costs.cpu_step_ms(1, 0, 0) == pytest.approx(simulate_costs.CPU_B1_STEP_MS)
    # batch 1: any draft costs time, 16 drafts over half a step more
    assert simulate_costs.cpu_step_ms(1, 0, 0) < simulate_costs.cpu_step_ms(1, 1, 0)
    assert simulate_costs.cpu_step_ms(1, 16, 0) > 1.5 * simulate_costs.cpu_step_ms(1, 0, 0)
    # batch >= 2: a step with drafts also pays the drafted-step extra on its plain time
    plain = 34.0 + 6.05 * 24
    assert simulate_costs.cpu_step_ms(24, 0, 0) == pytest.approx(plain)
    assert simulate_costs.cpu_step_ms(24, 10, 1) == pytest.approx(
        plain * (1 + simulate_costs.CPU_DRAFTED_EXTRA) + 1.8 * 10
        + 0.25 * simulate_costs.CPU_B1_STEP_MS)
    assert simulate_costs.hinge_step_ms(64, 192, 5) == 1.0
    assert simulate_costs.hinge_step_ms(64, 448, 0) == 2.0


def test_echo_replays_the_engines_planner_and_learns() -> None:
    """The replay's ECHO is the class the engine runs. On prompts the reply copies, with
    free verification it drafts and gets drafts accepted; where verification costs far
    more than any draft can bring, it drafts only the probes."""
    from vllm_echo.algos.echo import EchoPlanner

    text = list(range(10, 40))
    rows = [{"prompt_ids": text, "output_ids": text * 2,
             "topk_ids": [[0]] * 60, "topk_logprobs": [[-0.1]] * 60}]
    drafter = simulate_echo.EchoDrafter(capacity=16, trees=False, curve=lambda n: 1.0)
    assert isinstance(drafter.planner, EchoPlanner)
    free = simulate_replay.replay(rows, drafter, batch=1, cost=lambda *_: 1.0)
    assert free["tokens_per_step"] > 3 and drafter.planner.snapshot()["accepted"] > 0

    def dear(num_requests, num_drafts, num_trees):
        return 1.0 + 100.0 * num_drafts

    drafter = simulate_echo.EchoDrafter(16, False, simulate_echo.startup_curve(dear))
    simulate_replay.replay(rows, drafter, batch=1, cost=dear)
    snap = drafter.planner.snapshot()
    assert snap["drafted_steps"] == snap["probes"] > 0
