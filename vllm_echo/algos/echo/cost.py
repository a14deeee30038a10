# SPDX-License-Identifier: Apache-2.0
"""Step-cost curve: decode step time vs tokens verified in the step.

A step verifies ``n`` tokens: one per request plus its draft tokens. Its time is

    T(n) = base(n) + (a + b n) + correction(n), forced non-decreasing in n,

and a step that verifies any draft costs ``EchoTuning.drafted_share`` of a plain step
more (:meth:`StepCost.step_times`): vLLM's speculative path for the whole batch, which
the start-up curve (plain dummy forwards) does not show. On the 2-core CPU such a step
took 10-15% longer than a plain step of the same engine at batch 1 (2-4 drafts) and at
batch 64 (a few drafts). It is a prior, not fitted: where every step drafts (batch 1)
it cannot be told from ``a``, and where few do, two drafted steps in a slow stretch
(the first steps after a prefill) were enough to price drafting out at batch 64.

- ``base``: the curve measured at start-up (:meth:`StepCost.set_curve`: dummy forwards
  at several sizes); without one, a prior line through the origin (a token costs
  ``EchoTuning.prior_token_cost`` of the first timed step's time per token);
- ``a + b n``: what the timed steps add to it, fitted by exponentially weighted least
  squares (the slope pulled toward 0 until the steps have spread over enough sizes).
  It is what a dummy forward does not show (sampling, scheduling, attention over long
  contexts) and the machine's drift, and it applies at every size, timed or not: the
  rule compares a plain step with drafted ones, and when every step drafts about as
  much, the plain step is never timed;
- ``correction``: per size bucket, an EWMA of what is left (shrunk toward 0 while a
  bucket has few steps), interpolated piecewise-linearly between buckets (0 in
  buckets never timed).
"""

from __future__ import annotations

import numpy as np

from vllm_echo.algos.echo.tuning import EchoTuning

_MAX_KNOT = 1 << 14  # knots up to this size, past it the last segment's slope: a bound of
# the representation, not a decision (a vLLM step past 16k tokens is priced by the slope)


def _knots(growth: float) -> np.ndarray:
    """Bucket sizes: every size up to 16, then growing geometrically."""
    knots = list(range(1, 17))
    while knots[-1] < _MAX_KNOT:
        knots.append(max(knots[-1] + 1, int(round(knots[-1] * growth))))
    return np.asarray(knots, dtype=np.float64)


class StepCost:
    """T(n) for ECHO's decision rule: ``set_curve`` (optional), ``observe`` every timed
    decode step, ``time(n)`` vectorised."""

    def __init__(self, tuning: EchoTuning | None = None):
        self.tuning = tuning or EchoTuning()
        self.knots = _knots(self.tuning.bucket_growth)
        # Bucket i holds the sizes nearest knot i (geometric midpoints between knots).
        self._edges = np.sqrt(self.knots[1:] * self.knots[:-1])
        self._curve: np.ndarray | None = None  # base at the knots, when measured
        self._reset()

    def _reset(self) -> None:
        self.steps = 0
        self._line = (0.0, 0.0)  # (a, b)
        self._sums = np.zeros(self.knots.size)  # decayed residual sums per bucket
        self._weights = np.zeros(self.knots.size)  # decayed step counts per bucket
        self._fit = np.zeros(5)  # decayed sums of 1, n, r, n^2, n r (r = t - base(n))
        self._prior_slope: float | None = None
        self._table: np.ndarray | None = None

    @property
    def ready(self) -> bool:
        """Whether the curve can price a step (a measured curve, or one timed step)."""
        return self._curve is not None or self.steps > 0

    def set_curve(self, num_tokens, seconds) -> None:
        """The measured curve: ``seconds[i]`` per step of ``num_tokens[i]`` tokens. Any
        earlier curve and every online correction are dropped."""
        n = np.asarray(num_tokens, dtype=np.float64)
        t = np.asarray(seconds, dtype=np.float64)
        if n.ndim != 1 or n.shape != t.shape or n.size == 0:
            raise ValueError("set_curve needs two 1-D arrays of the same non-zero length")
        if not (np.all(n > 0) and np.all(t > 0)):
            raise ValueError("set_curve needs positive sizes and times")
        order = np.argsort(n, kind="stable")
        n, t = n[order], np.maximum.accumulate(t[order])
        self._curve = _interp_extrapolate(self.knots, n, t)
        self._reset()

    def observe(self, num_tokens: int, seconds: float, drafted: bool = False) -> None:
        """One timed decode step of ``num_tokens`` verified tokens (``drafted``: some
        were drafts; the curve learns its time as a plain step's)."""
        if num_tokens <= 0 or not seconds > 0:
            return
        tune = self.tuning
        n, t = float(num_tokens), float(seconds) / (1.0 + tune.drafted_share * drafted)
        if self.steps and tune.outlier_band and self._curve is not None:
            # A hiccup (a slow first call, the VM pausing) counts at most this far from
            # the model: a few slow steps at one size cannot tilt the whole curve.
            # (Without a measured curve the model is a guess: steps teach it freely.)
            modelled = float(self.time(np.array([n]))[0])
            t = min(max(t, modelled * (1.0 - tune.outlier_band)),
                    modelled * (1.0 + tune.outlier_band))
        self.steps += 1
        if self._curve is None and self._prior_slope is None:
            self._prior_slope = tune.prior_token_cost * t / n
        residual = t - float(self._base(np.array([n]))[0])
        self._fit = self._fit * (1.0 - tune.overhead_rate) + (1.0, n, residual, n * n,
                                                              n * residual)
        w, sn, sr, snn, snr = self._fit
        b = (snr - sn * sr / w) / (max(snn - sn * sn / w, 0.0) + tune.prior_slope_weight)
        self._line = ((sr - b * sn) / w, b)
        i = int(np.searchsorted(self._edges, n))
        keep = 1.0 - tune.bucket_rate
        self._sums[i] = keep * self._sums[i] + residual - self._line[0] - self._line[1] * n
        self._weights[i] = keep * self._weights[i] + 1.0
        self._table = None

    @property
    def overhead(self) -> float:
        """What the timed steps add to the base curve, at the mean size timed (s)."""
        w, sn = self._fit[:2]
        return self._line[0] + self._line[1] * (sn / w if w else 0.0)

    def step_times(self, num_requests: int, max_drafts: int) -> np.ndarray:
        """Modelled seconds of a step of ``num_requests`` with 0..max_drafts drafts."""
        times = self.time(num_requests + np.arange(max_drafts + 1))
        times[1:] += self.tuning.drafted_share * times[0]
        return times

    def time(self, num_tokens) -> np.ndarray:
        """Modelled seconds of steps of ``num_tokens`` tokens (array in, array out)."""
        if not self.ready:
            raise RuntimeError("StepCost has neither a curve nor a timed step")
        table = self._knot_times()
        return _interp_extrapolate(np.asarray(num_tokens, dtype=np.float64), self.knots, table)

    def _base(self, n: np.ndarray) -> np.ndarray:
        if self._curve is not None:
            return _interp_extrapolate(n, self.knots, self._curve)
        return self._prior_slope * n

    def _knot_times(self) -> np.ndarray:
        if self._table is None:
            correction = self._sums / np.maximum(self._weights, self.tuning.bucket_prior_steps)
            a, b = self._line
            table = self._base(self.knots) + a + b * self.knots + correction
            self._table = np.maximum.accumulate(np.maximum(table, 1e-9))
        return self._table

    def points(self, sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256)) -> dict[int, float]:
        """T at a few sizes, in seconds (for logs and snapshots)."""
        if not self.ready:
            return {}
        return {int(n): float(t) for n, t in zip(sizes, self.time(np.asarray(sizes)))}

    def describe(self) -> str:
        """One line for a log: the curve at a few sizes and where it comes from."""
        if not self.ready:
            return "step cost: no curve and no timed step yet"
        curve = " ".join(f"{n}:{1e3 * t:.1f}" for n, t in self.points().items())
        source = "measured curve" if self._curve is not None else (
            f"prior {1e3 * self._prior_slope:.3f} ms/token")
        a, b = self._line
        return (f"step cost ms by tokens {curve} ({source} {1e3 * a:+.2f} ms "
                f"{1e3 * b:+.4f} ms/token, {self.steps} timed steps)")


def _interp_extrapolate(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Piecewise-linear through (xp, fp); flat below xp[0], the last segment's slope
    (at least 0) past xp[-1]."""
    out = np.interp(x, xp, fp)
    if xp.size > 1:
        slope = max((fp[-1] - fp[-2]) / (xp[-1] - xp[-2]), 0.0)
        out = out + slope * np.maximum(x - xp[-1], 0.0)
    return out
