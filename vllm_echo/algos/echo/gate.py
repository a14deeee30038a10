# SPDX-License-Identifier: Apache-2.0
"""ECHO's sparse confidence gate (Eq. 7): where to stop deepening a tree.

Walking the sweet spots in increasing depth, the tree is truncated at the
first sweet spot d with c_d <= tau_d, where c_d = exp(max S at depth d). As in
the reference code's "late break", the gating level itself is kept: nodes at
depth <= d stay candidates, deeper ones are cut. A tree that passes every
gate keeps its full depth.

Modes (the paper's ablations):

- ``"sparse"`` (ECHO): check only the sweet spots, each with its own tau;
- ``"dense"``: check every depth; tau is ``dense_tau`` if given, else the tau
  of the nearest sweet spot (the shallower one on a tie);
- ``"fixed"``: check the sweet spots with one tau for all (``fixed_tau``,
  0.2 as the SGLang PR's example flag).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from vllm_echo.algos.echo.calibration import GateConfig

MODES = ("sparse", "dense", "fixed")


def _nearest_tau(gate: GateConfig, depth: int) -> float:
    spots = np.asarray(gate.sweet_spots)
    # argmin returns the first minimum, i.e. the shallower spot on a tie.
    return gate.taus[int(np.argmin(np.abs(spots - depth)))]


def _checks(gate: GateConfig, mode: str, max_depth: int, fixed_tau: float,
            dense_tau: Optional[float]) -> list[tuple[int, float]]:
    """(depth, tau) pairs to test, in increasing depth."""
    if mode == "sparse":
        return list(zip(gate.sweet_spots, gate.taus))
    if mode == "fixed":
        return [(d, fixed_tau) for d in gate.sweet_spots]
    if dense_tau is None and not gate.sweet_spots:
        raise ValueError("dense mode needs dense_tau or at least one sweet spot")
    return [(d, dense_tau if dense_tau is not None else _nearest_tau(gate, d))
            for d in range(1, max_depth + 1)]


def gate_checks(gate: GateConfig, mode: str, max_depth: int, fixed_tau: float = 0.2,
                dense_tau: Optional[float] = None) -> tuple[np.ndarray, np.ndarray]:
    """The (depths, taus) the gate tests on a tree of ``max_depth``,
    in increasing depth, as two arrays (for the compiled forest scoring)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    checks = _checks(gate, mode, max_depth, fixed_tau, dense_tau)
    return (np.array([d for d, _ in checks], dtype=np.int64),
            np.array([t for _, t in checks], dtype=np.float64))
