# SPDX-License-Identifier: Apache-2.0
"""Verification cost model: K_max from a measured cost curve (memo §2.2, §2.8).

ECHO sets the batch budget K_max "near the hardware saturation threshold":
below it one target forward costs about the same whatever the number of
verified tokens K, above it the cost grows linearly (Eq. 2: T(K) ~ T_ar *
(1 + gamma * [K - K_max]^+)). Two estimates from measured (K, T) pairs:

- ``"tolerance"`` (default): the largest measured K with T(K) <= tolerance *
  T(K_min), K_min the smallest measured K. It needs no model and bounds the
  price directly: a step at K_max costs at most ``tolerance`` times the
  cheapest. To resist noise, each K's time is the median of its repeats and
  the curve is made non-decreasing (running max) before the rule applies, so
  a lucky fast sample deep in the linear part cannot extend K_max.
- ``"knee"``: the breakpoint k0 of the best least-squares fit of Eq. 2's
  hinge T = a + g * max(0, K - k0), g >= 0, k0 over the measured K. Needs
  three distinct K; on a curve that is linear from the start it returns
  K_min, on a flat one the largest K (no knee seen).

Both are always computed for logging; ``method="min"`` takes the smaller.
K is in whatever unit ``num_tokens`` uses (verified tokens per forward, roots
included if they were when measuring); the scheduler's ``k_max`` excludes
the batch's roots, so subtract them when converting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

METHODS = ("tolerance", "knee", "min")


@dataclass(frozen=True)
class KneeResult:
    """K_max and both estimates; ``k_knee`` is None with under 3 distinct K."""

    k_max: int
    method: str
    k_tolerance: int
    k_knee: Optional[int]
    base_time: float  # median T at the smallest measured K
    slope: float  # g of the best hinge fit (0 when no fit), time per token
    note: str = ""


def _cost_curve(num_tokens, step_times) -> tuple[np.ndarray, np.ndarray]:
    """Distinct K ascending with the median time of each."""
    k = np.asarray(num_tokens, dtype=np.float64).ravel()
    t = np.asarray(step_times, dtype=np.float64).ravel()
    if k.shape != t.shape:
        raise ValueError(f"num_tokens has {k.size} entries, step_times {t.size}")
    if k.size == 0:
        raise ValueError("need at least one measurement")
    if not (np.isfinite(k).all() and np.isfinite(t).all()):
        raise ValueError("num_tokens and step_times must be finite")
    if (k < 1).any() or (k != np.round(k)).any():
        raise ValueError("num_tokens must be positive integers")
    if (t <= 0).any():
        raise ValueError("step_times must be positive")
    ks, inverse = np.unique(k, return_inverse=True)
    medians = np.array([np.median(t[inverse == i]) for i in range(ks.size)])
    return ks.astype(np.int64), medians


def _hinge_fit(ks: np.ndarray, ts: np.ndarray) -> tuple[int, float]:
    """Best breakpoint k0 (ties: the larger) and slope of T = a + g*(K - k0)^+."""
    best = None
    scale = float(np.sum(ts**2)) or 1.0
    for k0 in ks.tolist():
        x = np.maximum(ks - k0, 0).astype(np.float64)
        var = float(np.var(x))
        slope = float(np.mean((x - x.mean()) * (ts - ts.mean())) / var) if var > 0 else 0.0
        slope = max(slope, 0.0)  # Eq. 2: cost never falls past the knee
        intercept = float(ts.mean() - slope * x.mean())
        sse = float(np.sum((intercept + slope * x - ts)**2))
        # Relative tolerance so that float noise does not decide ties; a later
        # (larger) k0 wins an exact tie, a flat segment being as good a fit.
        if best is None or sse <= best[0] + 1e-12 * scale:
            best = (sse, k0, slope)
    return int(best[1]), float(best[2])


def knee_k_max(num_tokens, step_times, tolerance: float = 1.1, method: str = "tolerance",
               capture_sizes: Optional[Sequence[int]] = None) -> KneeResult:
    """K_max from measured (verified tokens, forward time) pairs; see module doc.

    ``capture_sizes``: if given, K_max is rounded down to the largest one
    not above it (CUDA graph sizes), kept as is when none is.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not tolerance >= 1.0:
        raise ValueError(f"tolerance must be >= 1, got {tolerance}")
    ks, ts = _cost_curve(num_tokens, step_times)
    notes = []
    base = float(ts[0])
    monotone = np.maximum.accumulate(ts)
    k_tol = int(ks[np.flatnonzero(monotone <= tolerance * base)[-1]])
    if ks.size >= 3:
        k_knee, slope = _hinge_fit(ks, ts)
    else:
        k_knee, slope = None, 0.0
        notes.append(f"{ks.size} distinct K: too few for a knee fit")
    if method == "knee" and k_knee is None:
        chosen = k_tol
        notes.append("knee unavailable, used the tolerance rule")
    elif method == "knee":
        chosen = k_knee
    elif method == "min" and k_knee is not None:
        chosen = min(k_tol, k_knee)
    else:
        chosen = k_tol
    if capture_sizes is not None:
        fitting = [int(c) for c in capture_sizes if int(c) <= chosen]
        if fitting:
            chosen = max(fitting)
        else:
            notes.append(f"no capture size <= {chosen}, not rounded")
    return KneeResult(k_max=int(chosen), method=method, k_tolerance=k_tol, k_knee=k_knee,
                      base_time=base, slope=slope, note="; ".join(notes))


def step_time_at(k, num_tokens, step_times) -> np.ndarray:
    """Forward time at K by piecewise-linear interpolation of the cost curve.

    Outside the measured range the end segments are extended (flat when only
    one K was measured); times are floored at the cheapest measurement.
    """
    ks, ts = _cost_curve(num_tokens, step_times)
    q = np.asarray(k, dtype=np.float64)
    out = np.interp(q, ks, ts)
    if ks.size >= 2:
        lo_slope = (ts[1] - ts[0]) / (ks[1] - ks[0])
        hi_slope = (ts[-1] - ts[-2]) / (ks[-1] - ks[-2])
        out = np.where(q < ks[0], ts[0] + lo_slope * (q - ks[0]), out)
        out = np.where(q > ks[-1], ts[-1] + hi_slope * (q - ks[-1]), out)
    return np.maximum(out, ts.min())


def expected_tokens_per_second(path_scores_per_request: Sequence, num_tokens, step_times,
                               count_roots: bool = True) -> float:
    """Expected emitted tokens per second for one batch of draft trees.

    Each request emits its accepted nodes plus one target token; with S a
    calibrated log probability that node j is accepted, E[accepted] =
    sum_j exp(S_j) (exact for greedy verification when siblings carry
    distinct tokens, so their subtrees' acceptances exclude each other).
    The forward verifies every node, plus each root if ``count_roots``
    (match how the cost curve was measured).
    """
    if len(path_scores_per_request) == 0:
        return 0.0
    expected = 0.0
    verified = 0
    for scores in path_scores_per_request:
        s = np.asarray(scores, dtype=np.float64).ravel()
        if np.isnan(s).any() or (s > 1e-6).any():
            raise ValueError("path scores must be log-probabilities (<= 0)")
        expected += 1.0 + float(np.exp(np.minimum(s, 0.0)).sum())
        verified += s.size + (1 if count_roots else 0)
    return expected / float(step_time_at(verified, num_tokens, step_times))
