# SPDX-License-Identifier: Apache-2.0
"""Calibration of ECHO's sparse confidence gate (paper §3.2).

During a warm-up the server records, per verified tree, the confidence
c_d = exp(max S at depth d) and how deep the accepted path reached. For every
depth the AUC of c_d separating "the accepted path reached depth d" from "it
did not" says whether gating there is informative. Depths with AUC > delta
become the sweet spots D_sig (at most ``max_sweet_spots``, the best AUCs),
each with the threshold tau_d that maximises Youden's J = TPR - FPR.

Choices the paper leaves open: label_d = 1 iff accepted length
>= d; delta = 0.75; warm-up = 256 verify steps; fallback = the reference
literals (:data:`DEFAULT_GATE`). A tree verified after a gate or budget cut
may have stopped short of where the whole candidate tree would have reached;
the caller then says up to which depth the labels are known (``known_depth``)
and deeper depths of that tree are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from numba import njit

SOURCES = ("default", "calibrated")


@dataclass(frozen=True)
class GateConfig:
    """Where the gate looks (``sweet_spots``, tree depths) and its thresholds.

    ``taus`` are in probability space: the gate keeps extending past sweet
    spot d iff c_d > tau_d. ``aucs[d-1]`` is the warm-up AUC at depth d (NaN
    where it could not be measured); empty for the defaults.
    """

    sweet_spots: tuple[int, ...]
    taus: tuple[float, ...]
    source: str = "default"
    aucs: tuple[float, ...] = field(default=())

    def __post_init__(self):
        spots = tuple(int(d) for d in self.sweet_spots)
        taus = tuple(float(t) for t in self.taus)
        if len(spots) != len(taus):
            raise ValueError(f"sweet_spots and taus differ in length: "
                             f"{len(spots)} vs {len(taus)}")
        if any(d < 1 for d in spots):
            raise ValueError(f"sweet spots are depths >= 1, got {spots}")
        if any(b <= a for a, b in zip(spots, spots[1:])):
            raise ValueError(f"sweet_spots must be strictly increasing, got {spots}")
        if any(not 0.0 <= t <= 1.0 for t in taus):
            raise ValueError(f"taus are probabilities in [0, 1], got {taus}")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        object.__setattr__(self, "sweet_spots", spots)
        object.__setattr__(self, "taus", taus)
        object.__setattr__(self, "aucs", tuple(float(a) for a in self.aucs))

    def tau_at(self, depth: int) -> Optional[float]:
        """tau at ``depth`` if it is a sweet spot, else None."""
        for d, t in zip(self.sweet_spots, self.taus):
            if d == depth:
                return t
        return None


# The reference code (ECHO_transformers cnets.py, Qwen3-32B literals) gates
# before its depth loop on the root level's best score (< log 0.2), then in
# the loop at i == 1 (< log 0.2) and i == 4 (< log 0.3); iteration i drafts
# tree depth i + 2. In our depths (a root child has depth 1): {1: 0.2,
# 3: 0.2, 6: 0.3}. The reference breaks on "<", ECHO's Eq. 7 keeps going on
# ">": the two differ only at equality, and we follow Eq. 7.
DEFAULT_GATE = GateConfig(sweet_spots=(1, 3, 6), taus=(0.2, 0.2, 0.3), source="default")


@njit(cache=True)
def _all_probabilities(values):
    """Every value in [0, 1] (a little over 1 allowed for rounding; NaN is not)."""
    for value in values:
        if not 0.0 <= value <= 1.0 + 1e-9:
            return False
    return True


def _as_scores(values, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    return arr


def auc_mann_whitney(scores_pos, scores_neg) -> float:
    """P(pos > neg) + 0.5 * P(pos == neg), via the Mann-Whitney U statistic.

    Ties get mid-ranks, which is exactly the half credit above. Raises
    ValueError when either class is empty.
    """
    pos = _as_scores(scores_pos, "scores_pos")
    neg = _as_scores(scores_neg, "scores_neg")
    both = np.concatenate([pos, neg])
    _, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    # Mid-rank of a group of equal values: last 1-based rank minus (size-1)/2.
    group_rank = np.cumsum(counts) - (counts - 1) / 2.0
    rank_sum_pos = group_rank[inverse[:pos.size]].sum()
    u_pos = rank_sum_pos - pos.size * (pos.size + 1) / 2.0
    return float(u_pos / (pos.size * neg.size))


def youden_threshold(scores, labels) -> tuple[float, float]:
    """Threshold tau maximising Youden's J = TPR - FPR for "positive iff score > tau".

    Candidates are the observed scores. Among equal J the smallest tau wins:
    a gate errs on the side of extending, which costs only budget, rather
    than truncating, which loses accepted tokens. Returns ``(tau, J)``.
    Raises ValueError unless both classes are present.
    """
    s = _as_scores(scores, "scores")
    y = np.asarray(labels).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels has {y.size} entries, scores {s.size}")
    y = y.astype(bool)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"need both classes, got {n_pos} positive and "
                         f"{n_neg} negative")
    values, inverse = np.unique(s, return_inverse=True)
    pos_at = np.bincount(inverse, weights=y, minlength=values.size)
    neg_at = np.bincount(inverse, weights=~y, minlength=values.size)
    # With tau = values[k], "score > tau" leaves out everything up to k.
    tpr = 1.0 - np.cumsum(pos_at) / n_pos
    fpr = 1.0 - np.cumsum(neg_at) / n_neg
    j = tpr - fpr
    # First (smallest tau) within float noise of the maximum: J values that
    # are equal on paper can differ in the last bit.
    best = int(np.flatnonzero(j >= j.max() - 1e-12)[0])
    return float(values[best]), float(j[best])


class Calibrator:
    """Collects (confidence, reached depth) pairs and turns them into a GateConfig.

    ``observe`` once per verified tree with the confidences of the whole
    candidate tree and the depth its accepted path reached, and, where the
    verified tree was cut (by the gate or the budget) below a node the target
    would have accepted, the depth up to which that reach is known: deeper
    labels are censored and not counted. Depths without any node (c_d == 0)
    are not recorded: there was nothing to gate, and counting them would
    reward any score for predicting "no node, no acceptance".

    ``ready`` turns True after ``warmup_steps`` observations, until
    :meth:`finalize` (calibration happens once). Only the latest ``window``
    observations are kept (default: the larger of the warm-up and 1024 trees, so
    observing a bit past ``ready`` before finalizing loses nothing).
    """

    def __init__(self, max_depth: int, delta: float = 0.75, max_sweet_spots: int = 3,
                 warmup_steps: int = 256, min_samples_per_class: int = 20,
                 window: Optional[int] = None):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        if not 0.5 <= delta < 1.0:
            raise ValueError(f"delta must be in [0.5, 1), got {delta}")
        if max_sweet_spots < 1:
            raise ValueError(f"max_sweet_spots must be >= 1, got {max_sweet_spots}")
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
        if min_samples_per_class < 1:
            raise ValueError(f"min_samples_per_class must be >= 1, "
                             f"got {min_samples_per_class}")
        if window is None:
            window = max(warmup_steps, 1024)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.max_depth = int(max_depth)
        self.delta = float(delta)
        self.max_sweet_spots = int(max_sweet_spots)
        self.warmup_steps = int(warmup_steps)
        self.min_samples_per_class = int(min_samples_per_class)
        self.window = int(window)
        # Ring buffer of the latest observations.
        self._conf = np.zeros((self.window, self.max_depth))
        self._reached = np.zeros(self.window, dtype=np.int64)
        self._known = np.zeros(self.window, dtype=np.int64)
        self._count = 0  # observations ever
        self._since_finalize = 0
        self._finalized = False
        self.gate: GateConfig = DEFAULT_GATE

    @property
    def num_observations(self) -> int:
        return self._count

    @property
    def ready(self) -> bool:
        return not self._finalized and self._since_finalize >= self.warmup_steps

    @property
    def finalized(self) -> bool:
        """The gate is computed; later observations would change nothing."""
        return self._finalized

    def observe(self, confidence_by_depth, reached_depth: int,
                known_depth: Optional[int] = None) -> None:
        """Record one verified tree: ``c[d-1]`` per depth, accepted length, and the
        deepest depth whose label is known (None: all of them)."""
        conf = np.asarray(confidence_by_depth, dtype=np.float64)
        if conf.shape != (self.max_depth, ):
            raise ValueError(f"confidence_by_depth has shape {conf.shape}, "
                             f"expected ({self.max_depth},)")
        if not _all_probabilities(conf):
            raise ValueError("confidences must be probabilities in [0, 1]")
        reached = int(reached_depth)
        if reached < 0:
            raise ValueError(f"reached_depth must be >= 0, got {reached}")
        reached = min(reached, self.max_depth)
        known = self.max_depth if known_depth is None else min(int(known_depth), self.max_depth)
        if known < reached:
            raise ValueError(f"known_depth {known_depth} is below reached_depth {reached}")
        if reached > 0 and conf[reached - 1] == 0:
            raise ValueError(f"reached_depth {reached} but the tree has no node "
                             f"at that depth (c = 0)")
        slot = self._count % self.window
        self._conf[slot] = conf
        self._reached[slot] = reached
        self._known[slot] = known
        self._count += 1
        self._since_finalize += 1

    def _observations(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        held = min(self._count, self.window)
        return self._conf[:held], self._reached[:held], self._known[:held]

    def finalize(self) -> tuple[GateConfig, str]:
        """Compute the gate from the held observations; never raises.

        Falls back to :data:`DEFAULT_GATE` (with the reason in the report)
        when no depth has ``min_samples_per_class`` of both classes or none
        passes ``delta``. The result is also stored in ``self.gate``.
        """
        self._finalized = True
        self._since_finalize = 0
        conf, reached, known = self._observations()
        aucs = np.full(self.max_depth, np.nan)
        taus = np.full(self.max_depth, np.nan)
        lines = [f"ECHO gate calibration over {conf.shape[0]} trees "
                 f"(delta={self.delta}, min {self.min_samples_per_class} per class):"]
        for d in range(1, self.max_depth + 1):
            present = (conf[:, d - 1] > 0) & (known >= d)
            scores = conf[present, d - 1]
            labels = reached[present] >= d
            n_pos = int(labels.sum())
            n_neg = int(labels.size - n_pos)
            if min(n_pos, n_neg) < self.min_samples_per_class:
                if labels.size:
                    lines.append(f"  depth {d}: {n_pos} reached / {n_neg} not, "
                                 f"too few to measure")
                continue
            aucs[d - 1] = auc_mann_whitney(scores[labels], scores[~labels])
            taus[d - 1], j = youden_threshold(scores, labels)
            lines.append(f"  depth {d}: {n_pos} reached / {n_neg} not, "
                         f"AUC={aucs[d - 1]:.3f}, Youden tau={taus[d - 1]:.4g} "
                         f"(J={j:.3f})")
        measured = np.flatnonzero(~np.isnan(aucs))
        if measured.size == 0:
            return self._fallback(lines, aucs, "no depth has enough samples of "
                                  "both classes")
        passing = measured[aucs[measured] > self.delta]
        if passing.size == 0:
            return self._fallback(lines, aucs, f"no depth has AUC > {self.delta} "
                                  f"(best {np.nanmax(aucs):.3f})")
        # Best AUCs first, the shallower depth on ties (stable sort).
        order = np.argsort(-aucs[passing], kind="stable")
        chosen = np.sort(passing[order[:self.max_sweet_spots]])
        self.gate = GateConfig(sweet_spots=tuple(int(i) + 1 for i in chosen),
                               taus=tuple(float(taus[i]) for i in chosen),
                               source="calibrated", aucs=tuple(aucs))
        lines.append(f"  -> sweet spots {self.gate.sweet_spots}, "
                     f"taus {tuple(round(t, 4) for t in self.gate.taus)}")
        return self.gate, "\n".join(lines)

    def _fallback(self, lines: list[str], aucs: np.ndarray,
                  reason: str) -> tuple[GateConfig, str]:
        self.gate = GateConfig(DEFAULT_GATE.sweet_spots, DEFAULT_GATE.taus,
                               source="default", aucs=tuple(aucs))
        lines.append(f"  -> default gate {DEFAULT_GATE.sweet_spots} "
                     f"taus {DEFAULT_GATE.taus}: {reason}")
        return self.gate, "\n".join(lines)
