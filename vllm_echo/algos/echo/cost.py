# SPDX-License-Identifier: Apache-2.0
"""Verification cost model: what a decode step costs, fitted online.

ECHO sets the batch budget K_max "near the hardware saturation threshold": below it
one target forward costs about the same whatever the number of verified tokens, above
it the cost grows linearly (Eq. 2: T(K) ~ T_ar * (1 + gamma * [K - K_max]^+)).
:class:`CostModel` fits that hinge to the decode steps the planner observes, with a
price for tree requests and for drafting at all.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vllm_echo.algos.echo.pricing import step_time

# Pairs whose log time ratio is further than this many robust standard deviations from
# the fit are left out of the refit (a step that the machine or the engine stalled).
_OUTLIER_SDS = 3.0
_GAUSS_NEWTON_STEPS = 12
# A Gauss-Newton step moving no parameter by more than this ends the fit (the error
# left is a small fraction of it, far below what moves a decision).
_CONVERGED = 1e-9


class CostModel:
    """Decode step time T vs verified tokens N, tree requests R and whether the step
    has drafts at all (D):

        T = a (1 + beta max(0, N - knee) + gamma R + delta D)

    (Eq. 2's hinge, plus two fixed costs). ``gamma`` is what verifying a request as a
    tree rather than a chain adds (on CPU, recomputing its rows' attention in every
    layer); ``delta`` what a step pays as soon as anything is drafted (vLLM's
    rejection sampler instead of the plain one, and the drafting work). Each stays
    unknown (None) until both of its cases were timed, and keeps its last fitted value
    while the window holds one case only (ECHO at batch 1 may draft in every step for
    thousands of steps; a price forgotten would have to be measured again at the cost
    of steps without drafts).

    **Fitted on the ratios of consecutive steps.** A shared machine runs slower or
    faster in stretches of hundreds of steps, by 15-25%, and the planner chooses step
    sizes in stretches too (a prompt that copies keeps the drafts long): fitted on
    absolute times, the stretch's speed is taken for the cost of the sizes chosen in
    it. Two adjacent steps run at the same speed, so log(t_i / t_{i-1}) =
    log F(x_i) - log F(x_{i-1}) with F the bracket above, whatever that speed is; the
    shape (knee, beta, gamma, delta) is fitted to those log ratios (Gauss-Newton, per
    candidate knee; pairs a stall threw far off are dropped and the fit repeated; a
    step that does not directly follow its predecessor, ``adjacent=False`` after a
    prefill or idle time, pairs with neither neighbour), and the level ``a`` is the
    median of t / F over the most recent steps. The budget needs only ratios of step
    times, so only the shape decides anything.

    The knee is the breakpoint with the least squared error among the measured N; it
    needs ``min_case_samples`` samples past it. Samples live in a sliding window and are
    refitted every ``refit_every`` new ones, and at once for a step larger than any
    fitted: the knee is found as the planner explores larger N, and the model follows a
    changing load.
    """

    def __init__(self, min_samples: int = 8, min_distinct: int = 3, window: int = 512,
                 refit_every: int = 16, min_case_samples: int = 4, max_knots: int = 24,
                 level_window: int = 32):
        self.min_samples, self.min_distinct = min_samples, min_distinct
        self.window, self.refit_every = window, refit_every
        self.min_case_samples, self.max_knots = min_case_samples, max_knots
        self.level_window = level_window
        self._n: list[int] = []
        self._r: list[int] = []
        self._d: list[bool] = []
        self._t: list[float] = []
        self._adjacent: list[bool] = []  # the step directly follows the previous sample
        self._since_fit = 0
        self.coef: tuple[float, float] | None = None  # (a, a beta)
        self.knee = 0
        self.tree_cost: float | None = None  # a gamma
        self.draft_cost: float | None = None  # a delta
        self._gamma: float | None = None  # last fitted, relative to a
        self._delta: float | None = None
        self.fits = 0
        self._fitted_max = 0  # largest step size in the samples of the current fit

    @classmethod
    def fixed(cls, a: float, b: float, knee: int = 0, tree_cost: float | None = None,
              draft_cost: float | None = None) -> "CostModel":
        """A model T = a + b max(0, N - knee) + tree_cost R + draft_cost D that never
        refits (tests, simulations)."""
        model = cls(min_samples=1 << 62)
        model.coef, model.knee = (float(a), float(b)), int(knee)
        model.tree_cost, model.draft_cost = tree_cost, draft_cost
        return model

    def add(self, num_tokens: int, seconds: float, num_trees: int = 0,
            drafted: bool = False, adjacent: bool = True) -> None:
        if num_tokens <= 0 or not seconds > 0:
            return
        self._n.append(num_tokens)
        self._r.append(num_trees)
        self._d.append(bool(drafted))
        self._t.append(seconds)
        self._adjacent.append(bool(adjacent))
        if len(self._n) > self.window:
            del self._n[0], self._r[0], self._d[0], self._t[0], self._adjacent[0]
        self._since_fit += 1
        # A step larger than any the fit saw is refitted at once: the budget grows
        # toward unmeasured sizes only as fast as they are priced (trusted_size).
        due = self.coef is None or self._since_fit >= self.refit_every \
            or num_tokens > self._fitted_max
        if (due and len(self._n) >= self.min_samples
                and len(set(self._n)) >= self.min_distinct):
            self._fit()

    def time(self, num_tokens: int, num_trees: int = 0, drafted: bool = False) -> float:
        """Modelled time of one step (needs a fit)."""
        return step_time(self.prices(), float(num_tokens), float(num_trees),
                         float(bool(drafted)))

    def prices(self) -> tuple[float, float, float, float, float]:
        """(a, b, knee, tree cost, draft cost) for the compiled choices of
        vllm_echo.algos.echo.pricing (needs a fit; an unmeasured cost counts 0)."""
        a, b = self.coef
        return (a, b, float(self.knee), self.tree_cost or 0.0, self.draft_cost or 0.0)

    def trusted_size(self) -> int | None:
        """Largest step (verified tokens) the model may be asked to price: twice the
        largest its current fit saw (None for a fixed model). Past its data the fit is an
        extrapolation; a model fitted on flat samples only (a GPU below its knee) would
        call every candidate free and admit all of them at once (in a replay at batch
        64 under a hinge with its knee at 256 tokens: 4096 tokens, 16x a plain step).
        Doubling at most per step finds the knee in a few measured steps."""
        return 2 * self._fitted_max if self.fits else None

    def _both_cases(self, values: np.ndarray) -> bool:
        """Both cases timed often enough, and adjacent somewhere (a ratio sees them)."""
        nonzero = np.count_nonzero(values)
        return (min(nonzero, values.size - nonzero) >= self.min_case_samples
                and bool(np.any(values[1:] != values[:-1])))

    def _fit(self) -> None:
        self._since_fit = 0
        n = np.asarray(self._n, dtype=np.float64)
        r = np.asarray(self._r, dtype=np.float64)
        d = np.asarray(self._d, dtype=np.float64)
        t = np.asarray(self._t, dtype=np.float64)
        with_trees, with_drafts = self._both_cases(r), self._both_cases(d)
        sizes, counts = np.unique(n, return_counts=True)
        past = counts[::-1].cumsum()[::-1] - counts  # samples larger than each size
        knots = sizes[past >= self.min_case_samples]  # samples past a knot price it
        if knots.size == 0:
            knots = sizes[:1]
        if knots.size > self.max_knots:
            knots = np.unique(np.quantile(knots, np.linspace(0, 1, self.max_knots)).round())
        # Fitted where both cases are in the window, else held at the last fitted price
        # (0 before any: then the column does not matter).
        free = np.array([True, with_trees, with_drafts])
        start = np.array([0.0, self._gamma or 0.0, self._delta or 0.0])
        # The pair ending at sample i counts if i and i - 1 both directly follow their
        # predecessor: the first step after a gap compares with neither neighbour.
        adjacent = np.asarray(self._adjacent, dtype=np.float64)
        paired = adjacent * np.concatenate([[0.0], adjacent[:-1]])
        knee, (beta, gamma, delta) = _fit_shape(n, r, d, np.log(t), knots, start, free,
                                                paired)
        if with_trees:
            self._gamma = gamma
        if with_drafts:
            self._delta = delta
        shape = 1.0 + beta * np.maximum(n - knee, 0.0) + gamma * r + delta * d
        a = float(np.median((t / shape)[-self.level_window:]))
        self.coef, self.knee = (a, a * beta), int(knee)
        self.tree_cost = None if self._gamma is None else a * self._gamma
        self.draft_cost = None if self._delta is None else a * self._delta
        self._fitted_max = int(n.max())
        self.fits += 1


@njit(cache=True)
def _solve3(m, v):
    """m x = v for a 3 x 3 symmetric positive (semi)definite m (Gaussian elimination;
    numba's np.linalg.solve needs scipy)."""
    a = m.copy()
    x = v.copy()
    for k in range(3):
        for i in range(k + 1, 3):
            factor = a[i, k] / a[k, k]
            for j in range(k, 3):
                a[i, j] -= factor * a[k, j]
            x[i] -= factor * x[k]
    for k in range(2, -1, -1):
        for j in range(k + 1, 3):
            x[k] -= a[k, j] * x[j]
        x[k] /= a[k, k]
    return x


@njit(cache=True)
def _gauss_newton(h, r, d, prev, cur, w_sum, w_log_sum, w_log2_sum, start, free):
    """(beta, gamma, delta) >= 0 minimising the weighted squared error of
    log(t_i / t_{i-1}) against log(F_i / F_{i-1}), F = 1 + beta h + gamma r + delta d,
    over consecutive samples, from ``start`` and moving only the ``free`` ones; that
    error, and log F of each kind of step.

    F depends on a sample only through its kind (``h``, ``r``, ``d`` per kind), so the
    pairs come summed by kinds: pair type p goes from kind ``prev[p]`` to ``cur[p]``,
    with the sums of its pairs' weights, weighted log ratios and their squares: the
    same sums as pair by pair, with a logarithm per kind instead of per sample."""
    theta = start.copy()
    kinds = h.size
    f = np.zeros(kinds)
    jac = np.zeros((kinds, 3))
    jtj = np.zeros((3, 3))
    jte = np.zeros(3)
    dj = np.zeros(3)
    for _ in range(_GAUSS_NEWTON_STEPS):
        _log_shape(theta, h, r, d, f, jac)
        jtj[:] = 0.0
        jte[:] = 0.0
        for p in range(prev.size):
            a, b = prev[p], cur[p]
            residual = w_log_sum[p] - w_sum[p] * (f[b] - f[a])  # sum of weight x error
            for k in range(3):
                dj[k] = jac[b, k] - jac[a, k]
            for k in range(3):
                jte[k] += residual * dj[k]
                for m in range(3):
                    jtj[k, m] += w_sum[p] * dj[k] * dj[m]
        for k in range(3):
            if not free[k]:  # held: no step in its direction
                jtj[k, :] = 0.0
                jtj[:, k] = 0.0
                jtj[k, k] = 1.0
                jte[k] = 0.0
            jtj[k, k] += 1e-12  # an unidentified direction (no such change) stays put
        step = _solve3(jtj, jte)
        moved = 0.0
        for k in range(3):
            new = max(theta[k] + step[k], 0.0)  # time never falls with more work
            moved = max(moved, abs(new - theta[k]))
            theta[k] = new
        if moved < _CONVERGED:
            break
    _log_shape(theta, h, r, d, f, jac)
    sse = 0.0
    for p in range(prev.size):
        change = f[cur[p]] - f[prev[p]]
        sse += w_log2_sum[p] - 2.0 * change * w_log_sum[p] + w_sum[p] * change * change
    return theta, sse, f


@njit(cache=True)
def _log_shape(theta, h, r, d, f, jac):
    """log F per kind into ``f``, and its gradient in (beta, gamma, delta) into ``jac``."""
    for k in range(h.size):
        shape = 1.0 + theta[0] * h[k] + theta[1] * r[k] + theta[2] * d[k]
        f[k] = np.log(shape)
        jac[k, 0], jac[k, 1], jac[k, 2] = h[k] / shape, r[k] / shape, d[k] / shape


@njit(cache=True)
def _fit_knees(n, r, d, prev, cur, w_sum, w_log_sum, w_log2_sum, knots, start, free):
    best_sse, best_knee, best_theta = np.inf, 0.0, start.copy()
    best_f = np.zeros(n.size)
    theta = start
    for knee in knots:  # ascending: ties keep the smaller knee (it prices more)
        # Each knee's fit starts from the last one's: neighbouring knees fit alike.
        theta, sse, f = _gauss_newton(np.maximum(n - knee, 0.0), r, d, prev, cur, w_sum,
                                      w_log_sum, w_log2_sum, theta, free)
        if sse < best_sse - 1e-15:
            best_sse, best_knee, best_theta, best_f = sse, knee, theta, f
    return best_knee, best_theta, best_f


def _fit_shape(n: np.ndarray, r: np.ndarray, d: np.ndarray, log_t: np.ndarray,
               knots: np.ndarray, start: np.ndarray, free: np.ndarray, weight: np.ndarray
               ) -> tuple[float, np.ndarray]:
    """(knee, (beta, gamma, delta)) from the log time ratios of consecutive samples
    (``weight[i]``: the pair ending at sample i, 0 where it is no pair), refitted once
    without the pairs far off the first fit."""
    # Kinds of step (n, r, d), and the pairs' types (kind before, kind after).
    key = (n * (r.max() + 1.0) + r) * 2.0 + d
    kinds, first, kind_of = np.unique(key, return_index=True, return_inverse=True)
    pair_key = kind_of[:-1] * kinds.size + kind_of[1:]
    types, type_of = np.unique(pair_key, return_inverse=True)
    prev, cur = types // kinds.size, types % kinds.size
    log_ratio = log_t[1:] - log_t[:-1]
    n_k, r_k, d_k = n[first], r[first], d[first]

    def fit(w: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        sums = [np.bincount(type_of, w * x, minlength=types.size)
                for x in (1.0, log_ratio, log_ratio * log_ratio)]
        return _fit_knees(n_k, r_k, d_k, prev, cur, *sums, knots, start, free)

    pair_weight = weight[1:]
    knee, theta, f = fit(pair_weight)
    errors = log_ratio - (f[kind_of[1:]] - f[kind_of[:-1]])
    used = errors[pair_weight > 0]
    spread = 1.4826 * float(np.median(np.abs(used - np.median(used)))) if used.size else 0.0
    far = np.abs(errors) > _OUTLIER_SDS * spread
    if spread > 0 and far.any():
        knee, theta, _ = fit(np.where(far, 0.0, pair_weight))
    return knee, theta


def warm_up() -> None:
    """Compile the fit (a decode step should not pay for it)."""
    model = CostModel(min_samples=4, min_distinct=3)
    for n, drafted in ((1, 0), (3, 1), (5, 1), (1, 0)):
        model.add(n, 0.01 + 0.001 * n + 0.001 * drafted, 0, drafted)
