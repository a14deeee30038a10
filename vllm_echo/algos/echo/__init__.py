# SPDX-License-Identifier: Apache-2.0
"""ECHO as a small core (numpy/numba, engine-agnostic).

- :class:`StepCost` (cost.py): step time vs tokens verified, from a measured curve
  corrected online by the timed decode steps;
- :class:`AcceptanceModel` (acceptance.py): P(accepted) per candidate node, from Beta
  posteriors of conditional acceptance rates (the confidence interface);
- :class:`EchoPlanner` (planner.py): the one decision rule (budget and gate in one)
  and the probe;
- :class:`EchoTuning` (tuning.py): every tunable.
"""

from vllm_echo.algos.echo.acceptance import AcceptanceModel, Candidates
from vllm_echo.algos.echo.cost import StepCost
from vllm_echo.algos.echo.planner import EchoPlanner, Plan, warm_up
from vllm_echo.algos.echo.tuning import EchoTuning

__all__ = ["AcceptanceModel", "Candidates", "EchoPlanner", "EchoTuning", "Plan", "StepCost",
           "warm_up"]
