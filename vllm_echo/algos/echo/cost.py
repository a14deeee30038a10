# SPDX-License-Identifier: Apache-2.0
"""Verification cost model: what a decode step costs, fitted online.

ECHO sets the batch budget K_max "near the hardware saturation threshold": below it
one target forward costs about the same whatever the number of verified tokens, above
it the cost grows linearly (Eq. 2: T(K) ~ T_ar * (1 + gamma * [K - K_max]^+)).
:class:`CostModel` fits that hinge to every decode step the planner observes, with a
price for tree requests and per-size corrections (see there).
"""

from __future__ import annotations

import numpy as np


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
    rows are slower than for 4). So every N keeps the residual of its own samples
    (by their medians, below), shrunk toward 0 by ``shrink`` pseudo-samples:
    T(N) = hinge + that correction. A well-measured N is priced by its measurements,
    a rarely seen one mostly by the hinge, minus an exploration bonus of ``explore``
    residual standard deviations / sqrt(1 + its samples): the planner only measures
    the sizes it chooses, so without the bonus a size the hinge overprices (4 tokens,
    after 2 were slow) would never be tried, and never priced right.

    Each kind of step (N, R, D) enters the fit as the median of its times, weighted
    by its count, and the corrections are its median's residual: a burst of slow
    steps on a shared machine moves a median little and a mean a lot.

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
        # Per measured N: the hinge plus its correction, less its bonus (times() adds the
        # tree and draft costs); computed once per fit, read several times a step.
        self._known_times = np.zeros(1)
        self.fits = 0
        self._fitted_max = 0  # largest step size in the samples of the current fit

    @classmethod
    def fixed(cls, a: float, b: float, knee: int = 0, tree_cost: float | None = None,
              draft_cost: float | None = None) -> "CostModel":
        """A model with given coefficients that never refits (tests, simulations)."""
        model = cls(min_samples=1 << 62)
        model.coef, model.knee = (float(a), float(b)), int(knee)
        model.tree_cost, model.draft_cost = tree_cost, draft_cost
        model._tabulate()
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
        n = np.asarray(num_tokens, dtype=np.int64)
        known = self._known_times
        if n.size and n.max() < known.size:
            base = known[n]
        else:
            base = np.where(n < known.size, known[np.minimum(n, known.size - 1)],
                            self._hinge(n) - self._unseen_bonus)
        return np.maximum(base + (self.tree_cost or 0.0) * num_trees
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
        """``times`` for one step, in plain floats (the same arithmetic, in the same
        order; the planner asks this once per request and step)."""
        n = int(num_tokens)
        if n < self._known_times.size:
            base = float(self._known_times[n])
        else:
            base = float(self._hinge(n)) - self._unseen_bonus
        return max(base + (self.tree_cost or 0.0) * num_trees
                   + (self.draft_cost or 0.0) * float(bool(drafted)), 1e-6)

    def _both_cases(self, values: np.ndarray) -> bool:
        nonzero = np.count_nonzero(values)
        return min(nonzero, values.size - nonzero) >= self.min_case_samples

    def _fit(self) -> None:
        self._since_fit = 0
        n, r, d, t = (np.asarray(x, float) for x in (self._n, self._r, self._d, self._t))
        with_trees, with_drafts = self._both_cases(r), self._both_cases(d)
        # Steps of one kind (N, R, D) enter the fit as their median time, weighted by
        # their count: on a shared machine slow bursts hit a few steps at a time, and a
        # least-squares line through them trades intercept for slope (a burst among
        # the rarer large steps made every draft token look dearer).
        gn, gr, gd, gt, weight = _group_medians(n, r, d, t)
        group_extra = [col for col, keep in ((gr, with_trees), (gd, with_drafts)) if keep]
        root_weight = np.sqrt(weight)
        knots = np.unique(n)[:-1]  # a knot needs samples past it to price them
        if knots.size > self.max_knots:
            knots = np.unique(np.quantile(knots, np.linspace(0, 1, self.max_knots)).round())
        best = None
        for knee in knots:
            gx = np.maximum(gn - knee, 0.0)
            columns = np.stack([np.ones_like(gn), gx] + group_extra, axis=1)
            coef, *_ = np.linalg.lstsq(columns * root_weight[:, None], gt * root_weight,
                                       rcond=None)
            # Noise can tilt the fit; time never falls with more work, nor is negative.
            b, *fixed = np.maximum(coef[1:], 0.0)
            c = fixed.pop(0) if with_trees else 0.0
            dc = fixed.pop(0) if with_drafts else 0.0
            x = np.maximum(n - knee, 0.0)
            a = max(float(np.median(t - b * x - c * r - dc * d)), 1e-6)
            sse = float(np.sum(weight * (gt - a - b * gx - c * gr - dc * gd)**2))
            if best is None or sse < best[0]:  # ties: the smaller knee (prices more)
                best = (sse, int(knee), a, float(b), float(c), float(dc))
        _, self.knee, a, b, c, dc = best
        residual = t - a - b * np.maximum(n - self.knee, 0.0) - c * r - dc * d
        group_residual = gt - a - b * np.maximum(gn - self.knee, 0.0) - c * gr - dc * gd
        size = int(n.max()) + 1
        sums = np.bincount(gn.astype(np.int64), weights=weight * group_residual,
                           minlength=size)
        counts = np.bincount(n.astype(np.int64), minlength=size)
        self._correction = np.divide(sums, counts + self.shrink, out=np.zeros(size),
                                     where=counts > 0)
        spread = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))  # robust sd
        self._unseen_bonus = self.explore * spread
        self._bonus = self._unseen_bonus / np.sqrt(1.0 + counts)
        self.coef = (a, b)
        self._tabulate()
        self._fitted_max = int(n.max())
        self.tree_cost = c if with_trees else None
        self.draft_cost = dc if with_drafts else None
        self.fits += 1

    def _hinge(self, n: np.ndarray) -> np.ndarray:
        a, b = self.coef
        return a + b * np.maximum(n - self.knee, 0.0)

    def _tabulate(self) -> None:
        self._known_times = (self._hinge(np.arange(self._correction.size))
                             + (self._correction - self._bonus))


def _group_medians(n: np.ndarray, r: np.ndarray, d: np.ndarray, t: np.ndarray
                   ) -> tuple[np.ndarray, ...]:
    """Per distinct (n, r, d): n, r, d, the median of its t, and its sample count."""
    rows = int(r.max()) + 1
    _, first, group, counts = np.unique((n * rows + r) * 2 + d, return_index=True,
                                           return_inverse=True, return_counts=True)
    ordered = t[np.lexsort((t, group))]  # by group, then by time
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    medians = 0.5 * (ordered[starts + (counts - 1) // 2] + ordered[starts + counts // 2])
    return n[first], r[first], d[first], medians, counts.astype(float)
