# SPDX-License-Identifier: Apache-2.0
"""Verification cost model: K_max from a measured cost curve.

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

:class:`CostModel` is what the ECHO planner runs on: the same hinge, fitted online
to every decode step, with per-size corrections (see there).
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


class CostModel:
    """Decode step time T vs verified tokens N, tree requests R and whether the step
    has drafts at all (D), fitted online:
    T = a + b max(0, N - knee) + c R + d D (Eq. 2's hinge, plus two fixed costs).

    Why a hinge and not a line: on the 2-core CPU at batch 1, the first few extra
    tokens cost little (4 drafts: 1.07x a plain step) and each one past that costs
    about 3% of a step. The knee is the breakpoint with the least squared error
    among the measured N; it needs samples past it.
    ``c`` is what verifying a request as a tree rather than a chain adds (on CPU,
    recomputing its rows' attention in every layer); ``d`` what a step pays as soon
    as anything is drafted (vLLM's rejection sampler instead of the plain one, and
    the drafting work). Each stays None until both of its cases were timed.

    The hinge is the shape; the measured curve has bumps it cannot express, and they
    are large at small N on this CPU: at batch 1 in fp32 a step verifying N = 1 / 2 /
    4 / 6 / 7 tokens took 34.6 / 37.8 / 32.7 / 32.0 / 35.9 ms (oneDNN's kernels for 2
    rows are slower than for 4). So every N keeps the mean residual of its own
    samples, shrunk toward 0 by ``shrink`` pseudo-samples: T(N) = hinge + that
    correction. A well-measured N is priced by its measurements, a rarely seen one
    mostly by the hinge, minus an exploration bonus of ``explore`` residual standard
    deviations / sqrt(1 + its samples): the planner only measures the sizes it
    chooses, so without the bonus a size the hinge overprices (4 tokens, after 2
    were slow) would never be tried, and never priced right.

    Samples live in a sliding window and are refitted every ``refit_every`` new
    ones: the knee is found as the planner explores larger N, and the model follows
    a changing load.
    """

    def __init__(self, min_samples: int = 8, min_distinct: int = 3, window: int = 512,
                 refit_every: int = 16, min_case_samples: int = 4, max_knots: int = 24,
                 shrink: float = 4.0, explore: float = 1.0):
        self.min_samples, self.min_distinct, self.shrink = min_samples, min_distinct, shrink
        self.explore = explore
        self.window, self.refit_every = window, refit_every
        self.min_case_samples, self.max_knots = min_case_samples, max_knots
        self._n: list[int] = []
        self._r: list[int] = []
        self._d: list[bool] = []
        self._t: list[float] = []
        self._since_fit = 0
        self.coef: tuple[float, float] | None = None  # (a, b)
        self.knee = 0
        self.tree_cost: float | None = None  # c
        self.draft_cost: float | None = None  # d
        self._correction = np.zeros(1)  # per N (index), shrunk mean residual of the hinge
        self._bonus = np.zeros(1)  # per N, exploration bonus (falls with its samples)
        self._unseen_bonus = 0.0  # for N past the last measured one
        self.fits = 0
        self._fitted_max = 0  # largest step size in the samples of the current fit

    @classmethod
    def fixed(cls, a: float, b: float, knee: int = 0, tree_cost: float | None = None,
              draft_cost: float | None = None) -> "CostModel":
        """A model with given coefficients that never refits (tests, simulations)."""
        model = cls(min_samples=1 << 62)
        model.coef, model.knee = (float(a), float(b)), int(knee)
        model.tree_cost, model.draft_cost = tree_cost, draft_cost
        return model

    def add(self, num_tokens: int, seconds: float, num_trees: int = 0,
            drafted: bool = False) -> None:
        if num_tokens <= 0 or not seconds > 0:
            return
        self._n.append(num_tokens)
        self._r.append(num_trees)
        self._d.append(bool(drafted))
        self._t.append(seconds)
        if len(self._n) > self.window:
            del self._n[0], self._r[0], self._d[0], self._t[0]
        self._since_fit += 1
        # A step larger than any the fit saw is refitted at once: the budget grows
        # toward unmeasured sizes only as fast as they are priced (trusted_size).
        due = self.coef is None or self._since_fit >= self.refit_every \
            or num_tokens > self._fitted_max
        if (due and len(self._n) >= self.min_samples
                and len(set(self._n)) >= self.min_distinct):
            self._fit()

    def times(self, num_tokens: np.ndarray, num_trees: int = 0,
              drafted: bool | np.ndarray = False) -> np.ndarray:
        """Modelled step time for each entry of ``num_tokens`` (needs a fit)."""
        a, b = self.coef
        n = np.asarray(num_tokens, dtype=np.int64)
        known = n < self._correction.size
        index = np.minimum(n, self._correction.size - 1)
        corr = np.where(known, self._correction[index] - self._bonus[index],
                        -self._unseen_bonus)
        return np.maximum(a + b * np.maximum(n - self.knee, 0.0) + corr
                          + (self.tree_cost or 0.0) * num_trees
                          + (self.draft_cost or 0.0) * np.asarray(drafted, dtype=np.float64),
                          1e-6)

    def trusted_size(self) -> int | None:
        """Largest step (verified tokens) the model may be asked to price: twice the
        largest its current fit saw (None for a fixed model). Past its data the fit is an
        extrapolation; a model fitted on flat samples only (a GPU below its knee) would
        call every candidate free and admit all of them at once (in a replay at batch
        64 under a hinge with its knee at 256 tokens: 4096 tokens, 16x a plain step).
        Doubling at most per step finds the knee in a few measured steps."""
        return 2 * self._fitted_max if self.fits else None

    def time(self, num_tokens: int, num_trees: int = 0, drafted: bool = False) -> float:
        return float(self.times(np.array([num_tokens]), num_trees, drafted)[0])

    def _both_cases(self, values: np.ndarray) -> bool:
        nonzero = np.count_nonzero(values)
        return min(nonzero, values.size - nonzero) >= self.min_case_samples

    def _fit(self) -> None:
        self._since_fit = 0
        n, r, d, t = (np.asarray(x, float) for x in (self._n, self._r, self._d, self._t))
        extra = [col for col in (r, d) if self._both_cases(col)]
        with_trees, with_drafts = self._both_cases(r), self._both_cases(d)
        knots = np.unique(n)[:-1]  # a knot needs samples past it to price them
        if knots.size > self.max_knots:
            knots = np.unique(np.quantile(knots, np.linspace(0, 1, self.max_knots)).round())
        best = None
        for knee in knots:
            x = np.maximum(n - knee, 0.0)
            columns = np.stack([np.ones_like(n), x] + extra, axis=1)
            coef, *_ = np.linalg.lstsq(columns, t, rcond=None)
            # Noise can tilt the fit; time never falls with more work, nor is negative.
            b, *fixed = np.maximum(coef[1:], 0.0)
            c = fixed.pop(0) if with_trees else 0.0
            dc = fixed.pop(0) if with_drafts else 0.0
            a = max(float(np.median(t - b * x - c * r - dc * d)), 1e-6)
            sse = float(np.sum((t - a - b * x - c * r - dc * d)**2))
            if best is None or sse < best[0]:  # ties: the smaller knee (prices more)
                best = (sse, int(knee), a, float(b), float(c), float(dc))
        _, self.knee, a, b, c, dc = best
        residual = t - a - b * np.maximum(n - self.knee, 0.0) - c * r - dc * d
        size = int(n.max()) + 1
        sums = np.bincount(n.astype(np.int64), weights=residual, minlength=size)
        counts = np.bincount(n.astype(np.int64), minlength=size)
        self._correction = np.divide(sums, counts + self.shrink, out=np.zeros(size),
                                     where=counts > 0)
        spread = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))  # robust sd
        self._unseen_bonus = self.explore * spread
        self._bonus = self._unseen_bonus / np.sqrt(1.0 + counts)
        self.coef = (a, b)
        self._fitted_max = int(n.max())
        self.tree_cost = c if with_trees else None
        self.draft_cost = dc if with_drafts else None
        self.fits += 1
