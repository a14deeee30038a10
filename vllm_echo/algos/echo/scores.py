# SPDX-License-Identifier: Apache-2.0
"""Node scores for ECHO on a retrieval forest: the acceptance priors.

ECHO ranks draft nodes by the path score S (Eq. 5): the cumulative log
probability of the path from the root to the node, and gates depth on the
confidence c_d = exp(max S over depth-d nodes) (Eq. 6). An EAGLE drafter gets
the per-node log probability from its own softmax. A retrieval forest has no
drafter, so the log probability of a *retrieved continuation token* comes from
:class:`AcceptancePrior`, an online estimate of how often such a token is
accepted once its parent was accepted. Nodes drawn from the target's logits
(next-next candidates) carry the target's own log probability instead; that is
the caller's business.

Trees follow :mod:`vllm_echo.algos.tree`: ``parents[j] == -1`` hangs node j off
the root, otherwise ``0 <= parents[j] < j``; a root child has depth 1.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np
from numba import njit

from vllm_echo.algos.echo.forest_scoring import (count_tree_observations,
                                                  count_unverified_children)

ArrayLike = Union[np.ndarray, Sequence[int], Sequence[float]]


def _int_array(values, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size == 0:
        return arr.astype(np.int64).reshape(arr.shape)
    if arr.dtype.kind not in "iu":  # signed or unsigned integers (cheaper than issubdtype)
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


class AcceptancePrior:
    """Online P(retrieved token accepted | parent accepted), by depth and match length.

    Observations are bucketed by tree depth ``d`` (1-based; depths beyond
    ``max_depth`` share the last bucket) and by the m-gram match length ``m``
    (``1..max_ngram``) of the lookup that produced the token.

    Smoothing is a two-level Beta prior so every bucket is defined before any
    data and sparse buckets borrow from their depth:

    - depth rate  p_d  = (a_d  + s * p0)  / (n_d  + s), counts pooled over m;
    - bucket rate p_dm = (a_dm + s * p_d) / (n_dm + s),

    where ``a`` counts accepted and ``n`` all observations, ``p0 =
    prior_mean`` and ``s = prior_strength``. The defaults (p0 = 0.5, s = 2)
    put Beta(1, 1) (Laplace) on the depth rate: no opinion, overridden after a
    handful of steps.

    ``optimism = z > 0`` raises the rates at depth 1 by z standard deviations of their
    Beta posterior, sqrt(p_dm (1 - p_dm) / (n_dm + s + 1)) (optimism under
    uncertainty). A planner that verifies only what looks worth its cost learns only
    from what it verifies: a few unlucky early observations (a new reply's first
    drafts come from the prompt alone) can push a depth-1 bucket below break-even,
    and with the plain estimate it is never verified, nor corrected, again. The
    optimistic rate keeps it in play until enough observations confirm it is low.
    Deeper buckets need no such help: they are observed whenever their parent is
    accepted, verified or not (the planner also records the candidates just past a fully
    accepted plan, observe_retrieved_and_heads), and raising them would make long chains
    look better than they are.
    """

    def __init__(self, max_ngram: int, max_depth: int = 16, prior_mean: float = 0.5,
                 prior_strength: float = 2.0, optimism: float = 0.0):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        if not 0.0 < prior_mean < 1.0:
            raise ValueError(f"prior_mean must be in (0, 1), got {prior_mean}")
        if not prior_strength > 0.0:
            raise ValueError(f"prior_strength must be > 0, got {prior_strength}")
        if not optimism >= 0.0:
            raise ValueError(f"optimism must be >= 0, got {optimism}")
        self.max_ngram = int(max_ngram)
        self.max_depth = int(max_depth)
        self.prior_mean = float(prior_mean)
        self.prior_strength = float(prior_strength)
        self.optimism = float(optimism)
        self._accepted = np.zeros((self.max_depth, self.max_ngram))
        self._total = np.zeros((self.max_depth, self.max_ngram))
        self._table: np.ndarray | None = None  # prob_table, until the next update
        self._best_first = 0.0  # its best depth-1 rate

    @property
    def num_observations(self) -> float:
        """Observations held."""
        return float(self._total.sum())

    def _bucket(self, depths: ArrayLike, match_lens: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        d = _int_array(depths, "depths")
        m = _int_array(match_lens, "match_lens")
        d, m = np.broadcast_arrays(d, m)
        if (d < 1).any():
            raise ValueError(f"depths must be >= 1, got {int(d.min())}")
        if ((m < 1) | (m > self.max_ngram)).any():
            bad = m[(m < 1) | (m > self.max_ngram)].flat[0]
            raise ValueError(
                f"match_lens must be in [1, {self.max_ngram}], got {int(bad)}")
        return np.minimum(d, self.max_depth) - 1, m - 1

    def prob_table(self) -> np.ndarray:
        """Smoothed (with ``optimism``, depth 1 raised) acceptance probabilities, shape
        ``(max_depth, max_ngram)``.

        Read-only: cached until the next update (it is read several times a step;
        :meth:`observe_tree` recomputes it in its own compiled call)."""
        if self._table is None:
            self._set_table(_smoothed_rates(self._accepted, self._total, self.prior_strength,
                                            self.prior_mean, self.optimism))
        return self._table

    def best_first_rate(self) -> float:
        """The best depth-1 rate of :meth:`prob_table`: no path of a tree scores above it."""
        self.prob_table()
        return self._best_first

    def prob(self, depth: ArrayLike, match_len: ArrayLike) -> np.ndarray:
        """Smoothed acceptance probability per (depth, match length); broadcasts."""
        d, m = self._bucket(depth, match_len)
        return self.prob_table()[d, m]

    def log_prob(self, depth: ArrayLike, match_len: ArrayLike) -> np.ndarray:
        """``log(prob(depth, match_len))``; always finite (prob is in (0, 1))."""
        return np.log(self.prob(depth, match_len))

    def update(self, depths: ArrayLike, match_lens: ArrayLike, accepted_mask: ArrayLike) -> None:
        """Record observations: one per entry, ``accepted_mask`` is the outcome.

        Only pass nodes whose parent was accepted (see :meth:`observe_tree`).
        """
        d, m = self._bucket(depths, match_lens)
        acc = np.asarray(accepted_mask, dtype=bool)
        if acc.shape != d.shape:
            raise ValueError(f"accepted_mask has shape {acc.shape}, "
                             f"expected {d.shape}")
        self._table = None
        np.add.at(self._total, (d.ravel(), m.ravel()), 1.0)
        np.add.at(self._accepted, (d.ravel(), m.ravel()), acc.ravel().astype(float))

    def observe_tree(self, parents: np.ndarray, depths: np.ndarray, match_lens: np.ndarray,
                     is_retrieved_mask: np.ndarray, accepted_path: Sequence[int],
                     token_ids: np.ndarray, next_token: int) -> int:
        """Record the observations of one verified tree; returns how many.

        An observation is a retrieved node whose parent was accepted (the root
        always is): only then did the node have a chance. It counts as accepted when
        its token is what the target emitted after its parent (the next path token,
        or ``next_token`` after the path's end), so a duplicate sibling of the
        accepted node counts too. ``accepted_path`` lists the accepted node indices
        root side first. Compiled, for trees the caller built (the planner's own
        plans, every step): the array shapes and dtypes are not checked, the path
        and the match lengths are. The table is recomputed in the same call: the
        next step reads it."""
        recorded, table = _observe_tree(
            self._total, self._accepted, parents, depths, match_lens, is_retrieved_mask,
            np.asarray(accepted_path, dtype=np.int64), token_ids, int(next_token),
            self.prior_strength, self.prior_mean, self.optimism, 0)
        if recorded:
            self._set_table(table)
        return recorded

    def _set_table(self, table: np.ndarray) -> None:
        table.flags.writeable = False
        self._table = table
        self._best_first = float(table[0].max())


def observe_retrieved_and_heads(retrieved: AcceptancePrior, heads: AcceptancePrior,
                                parents: np.ndarray, depths: np.ndarray,
                                match_lens: np.ndarray, head_buckets: np.ndarray,
                                is_retrieved_mask: np.ndarray, accepted_path: Sequence[int],
                                token_ids: np.ndarray, next_token: int,
                                forest: tuple[np.ndarray, ...] | None = None) -> None:
    """:meth:`AcceptancePrior.observe_tree` for a forest's two kinds of nodes in one
    compiled call: retrieved nodes into ``retrieved`` by (depth, match length), the
    others (next-next heads) into ``heads`` by (depth, ``head_buckets``).

    ``forest``: ``(keep, parents, token_ids, match_len, rank)`` of the candidate forest
    the tree was cut from (``keep``: each tree node's index in it). With it, the
    retrieved candidates just past a fully accepted path are observed too
    (:func:`~vllm_echo.algos.echo.forest_scoring.count_unverified_children`)."""
    keep, cand_parents, cand_tokens, cand_match, cand_rank = forest or (_NO_FOREST, ) * 5
    got_retrieved, table_retrieved, got_heads, table_heads = _observe_both(
        retrieved._total, retrieved._accepted, heads._total, heads._accepted, parents,
        depths, match_lens, head_buckets, is_retrieved_mask,
        np.asarray(accepted_path, dtype=np.int64), token_ids, int(next_token),
        retrieved.prior_strength, retrieved.prior_mean, retrieved.optimism,
        heads.prior_strength, heads.prior_mean, heads.optimism,
        keep, cand_parents, cand_tokens, cand_match, cand_rank)
    if got_retrieved:
        retrieved._set_table(table_retrieved)
    if got_heads:
        heads._set_table(table_heads)


_NO_FOREST = np.empty(0, dtype=np.int64)


@njit(cache=True)
def _observe_both(total_r, accepted_r, total_h, accepted_h, parents, depths, match_len,
                  head_bucket, retrieved, path, token_ids, next_token, strength_r, mean_r,
                  optimism_r, strength_h, mean_h, optimism_h, keep, cand_parents, cand_tokens,
                  cand_match, cand_rank):
    unverified = 0
    if keep.size:
        unverified = count_unverified_children(total_r, accepted_r, parents, depths, path,
                                               keep, cand_parents, cand_tokens, cand_match,
                                               cand_rank, next_token)
    got_r, table_r = _observe_tree(total_r, accepted_r, parents, depths, match_len, retrieved,
                                   path, token_ids, next_token, strength_r, mean_r, optimism_r,
                                   unverified)
    got_h, table_h = _observe_tree(total_h, accepted_h, parents, depths, head_bucket,
                                   ~retrieved, path, token_ids, next_token, strength_h, mean_h,
                                   optimism_h, 0)
    return got_r, table_r, got_h, table_h


@njit(cache=True)
def _observe_tree(total, accepted, parents, depths, match_len, eligible, path, token_ids,
                  next_token, strength, prior_mean, optimism, recorded_before):
    """count_tree_observations, then the new table (empty when nothing was recorded,
    counting ``recorded_before`` observations the caller already added)."""
    recorded = recorded_before + count_tree_observations(
        total, accepted, parents, depths, match_len, eligible, path, token_ids, next_token)
    if recorded == 0:
        return recorded, np.empty((0, 0))
    return recorded, _smoothed_rates(accepted, total, strength, prior_mean, optimism)


@njit(cache=True)
def _smoothed_rates(accepted, total, strength, prior_mean, optimism):
    """AcceptancePrior's table: per depth the pooled rate, then per bucket a rate
    smoothed toward it, depth 1 raised by ``optimism`` posterior SDs (below 1, so that
    log-probabilities stay finite and path scores fall)."""
    depths, lengths = total.shape
    table = np.empty((depths, lengths))
    for d in range(depths):
        depth_rate = (accepted[d].sum() + strength * prior_mean) / (total[d].sum() + strength)
        for m in range(lengths):
            rate = (accepted[d, m] + strength * depth_rate) / (total[d, m] + strength)
            if d == 0 and optimism > 0:
                spread = np.sqrt(rate * (1.0 - rate) / (total[d, m] + strength + 1.0))
                rate = min(rate + optimism * spread, 1.0 - 1e-6)
            table[d, m] = rate
    return table


class AcceptedOverExpected:
    """Accepted draft tokens over the tokens the node scores expected, on recent plans.

    The scores come from bucket rates, raised at depth 1 by the prior's optimism, and
    the planner verifies the nodes they rank best, so the tokens they promise run above
    what arrives (at batch 8 in fp32: 78.7 expected, 55 accepted). The budget prices
    candidates at score x :attr:`ratio`; the gate and the calibration keep the raw
    scores. Sums decay by ``decay`` per plan and start from ``pseudo`` tokens each
    (ratio 1); the ratio is kept within ``bounds``.
    """

    def __init__(self, decay: float = 0.998, pseudo: float = 5.0,
                 bounds: tuple[float, float] = (0.2, 5.0)):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if not pseudo > 0.0:
            raise ValueError(f"pseudo must be > 0, got {pseudo}")
        self.decay, self.pseudo, self.bounds = float(decay), float(pseudo), bounds
        self.expected = self.accepted = 0.0

    def observe(self, expected: float, accepted: int) -> None:
        self.expected = self.expected * self.decay + float(expected)
        self.accepted = self.accepted * self.decay + int(accepted)

    @property
    def ratio(self) -> float:
        raw = (self.accepted + self.pseudo) / (self.expected + self.pseudo)
        return min(max(raw, self.bounds[0]), self.bounds[1])
