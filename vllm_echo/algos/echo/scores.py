# SPDX-License-Identifier: Apache-2.0
"""Node scores for ECHO on a retrieval forest: priors, path scores, confidence.

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

from typing import Optional, Sequence, Union

import numpy as np

from vllm_echo.algos.echo.forest_scoring import count_tree_observations
from vllm_echo.algos.tree import ROOT, validate_parents

ArrayLike = Union[np.ndarray, Sequence[int], Sequence[float]]

# log-probs a little above 0 are float noise from a log-softmax; larger ones
# are a caller bug (S would grow along a path and exp(S) exceed 1).
_LOGP_TOLERANCE = 1e-6


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
    handful of steps. ``decay < 1`` multiplies all counts by ``decay`` before
    each update, so old traffic fades (effective memory ~ 1 / (1 - decay)
    updates).

    ``optimism = z > 0`` raises the rates at depth 1 by z standard deviations of their
    Beta posterior, sqrt(p_dm (1 - p_dm) / (n_dm + s + 1)) (optimism under
    uncertainty). A planner that verifies only what looks worth its cost learns only
    from what it verifies: a few unlucky early observations (a new reply's first
    drafts come from the prompt alone) can push a depth-1 bucket below break-even,
    and with the plain estimate it is never verified, nor corrected, again. The
    optimistic rate keeps it in play until enough observations confirm it is low.
    Deeper buckets need no such help (they are observed whenever their parent is
    accepted), and raising them would make long chains look better than they are.
    """

    def __init__(self, max_ngram: int, max_depth: int = 16, prior_mean: float = 0.5,
                 prior_strength: float = 2.0, decay: float = 1.0, optimism: float = 0.0):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        if not 0.0 < prior_mean < 1.0:
            raise ValueError(f"prior_mean must be in (0, 1), got {prior_mean}")
        if not prior_strength > 0.0:
            raise ValueError(f"prior_strength must be > 0, got {prior_strength}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if not optimism >= 0.0:
            raise ValueError(f"optimism must be >= 0, got {optimism}")
        self.max_ngram = int(max_ngram)
        self.max_depth = int(max_depth)
        self.prior_mean = float(prior_mean)
        self.prior_strength = float(prior_strength)
        self.decay = float(decay)
        self.optimism = float(optimism)
        # Float counts so that decay can scale them.
        self._accepted = np.zeros((self.max_depth, self.max_ngram))
        self._total = np.zeros((self.max_depth, self.max_ngram))
        self._table: np.ndarray | None = None  # prob_table, until the next update

    @property
    def num_observations(self) -> float:
        """Observations held (after decay, so possibly fractional)."""
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

        Read-only: cached until the next update (it is read several times a step)."""
        if self._table is None:
            s = self.prior_strength
            depth_rate = ((self._accepted.sum(axis=1) + s * self.prior_mean)
                          / (self._total.sum(axis=1) + s))
            table = (self._accepted + s * depth_rate[:, None]) / (self._total + s)
            if self.optimism > 0:
                first = table[0]
                spread = np.sqrt(first * (1.0 - first) / (self._total[0] + s + 1.0))
                # Kept below 1: log-probabilities stay finite and path scores fall.
                table[0] = np.minimum(first + self.optimism * spread, 1.0 - 1e-6)
            self._table = table
            self._table.flags.writeable = False
        return self._table

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
        if self.decay < 1.0:
            self._accepted *= self.decay
            self._total *= self.decay
        np.add.at(self._total, (d.ravel(), m.ravel()), 1.0)
        np.add.at(self._accepted, (d.ravel(), m.ravel()), acc.ravel().astype(float))

    def observe_tree(self, parents: ArrayLike, depths: ArrayLike, match_lens: ArrayLike,
                     is_retrieved_mask: ArrayLike, accepted_path: Sequence[int],
                     token_ids: Optional[ArrayLike] = None,
                     next_token: Optional[int] = None) -> int:
        """Derive the observations of one verified tree and record them.

        An observation is a retrieved node whose parent was accepted (the root
        always is): only then did the node have a chance. Its label is whether
        it was accepted. ``accepted_path`` lists the accepted node indices root
        side first (as :func:`vllm_echo.algos.verify.verify_greedy` returns).

        The verifier keeps one path, but an unmerged forest can hold the same
        token twice under one accepted parent (e.g. the retrieved chain's head
        equals the top next-next candidate); the copy that lost the tie was
        correct all the same. Pass ``token_ids`` and ``next_token`` (the token
        the target emitted after the path) to label every such node by what
        the target actually produced after its parent. Without them the label
        is membership in ``accepted_path``.

        Returns the number of observations recorded.
        """
        par = validate_parents(parents)
        n = par.size
        dep = _int_array(depths, "depths")
        retrieved = np.asarray(is_retrieved_mask, dtype=bool)
        mlen = _int_array(match_lens, "match_lens")
        for name, arr in (("depths", dep), ("match_lens", mlen),
                          ("is_retrieved_mask", retrieved)):
            if arr.shape != (n, ):
                raise ValueError(f"{name} has shape {arr.shape}, expected ({n},)")
        path = [int(j) for j in accepted_path]
        expected_parent = ROOT
        for j in path:
            if not 0 <= j < n or par[j] != expected_parent:
                raise ValueError(f"accepted_path {path} is not a root-first path "
                                 f"of the tree")
            expected_parent = j
        if (token_ids is None) != (next_token is None):
            raise ValueError("pass both token_ids and next_token, or neither")

        # Row-indexed (row = node + 1, row 0 = root) so the root needs no case.
        parent_accepted = np.zeros(n + 1, dtype=bool)
        parent_accepted[0] = True
        parent_accepted[np.asarray(path, dtype=np.int64) + 1] = True
        chance = retrieved & parent_accepted[par + 1]
        if token_ids is None:
            accepted = np.zeros(n, dtype=bool)
            accepted[path] = True
        else:
            tokens = _int_array(token_ids, "token_ids")
            if tokens.shape != (n, ):
                raise ValueError(f"token_ids has shape {tokens.shape}, expected ({n},)")
            # What the target produced after each accepted row: the next path
            # token, or next_token after the last accepted row.
            emitted = np.full(n + 1, -1, dtype=np.int64)
            rows = [0] + [j + 1 for j in path]
            for row, nxt in zip(rows, [tokens[j] for j in path] + [int(next_token)]):
                emitted[row] = nxt
            accepted = tokens == emitted[par + 1]
        if chance.any():
            self.update(dep[chance], mlen[chance], accepted[chance])
        return int(chance.sum())

    def observe_tree_trusted(self, parents: np.ndarray, depths: np.ndarray,
                             match_lens: np.ndarray, is_retrieved_mask: np.ndarray,
                             accepted_path: Sequence[int], token_ids: np.ndarray,
                             next_token: int) -> int:
        """:meth:`observe_tree` with token ids, compiled, for trees the caller built
        (the planner's own plans, every step): the array shapes and dtypes are not
        checked, the path and the match lengths are."""
        if self.decay < 1.0:  # the decay applies before each update: the checked path
            return self.observe_tree(parents, depths, match_lens, is_retrieved_mask,
                                     accepted_path, token_ids, next_token)
        recorded = count_tree_observations(
            self._total, self._accepted, parents.astype(np.int64, copy=False),
            depths.astype(np.int64, copy=False), match_lens.astype(np.int64, copy=False),
            is_retrieved_mask.astype(np.bool_, copy=False),
            np.asarray(accepted_path, dtype=np.int64),
            token_ids.astype(np.int64, copy=False), int(next_token))
        if recorded:
            self._table = None
        return recorded


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


def exclusive_sibling_logp(parents: ArrayLike, node_logp: ArrayLike) -> np.ndarray:
    """Node log-probs once siblings are counted as exclusive.

    ``node_logp`` holds each node's acceptance log-probability given its parent was
    accepted, estimated one node at a time (by depth and match length). Siblings
    carry distinct tokens, so at most one of them is accepted: taken in descending
    probability, sibling j is worth p_j times the chance that every better sibling
    was rejected, prod (1 - p_k). Without this, three retrieved continuations of one
    m-gram at p = 0.7 each promise 2.1 tokens where at most one can come, and the
    budget buys side branches (and tree verification) that do not pay.
    """
    par = validate_parents(parents)
    logp = np.asarray(node_logp, dtype=np.float64)
    if logp.shape != par.shape:
        raise ValueError(f"node_logp has shape {logp.shape}, expected {par.shape}")
    n = par.size
    if n < 2:
        return logp.copy()
    p = np.exp(np.minimum(logp, 0.0))
    order = np.lexsort((-p, par))  # grouped by parent, best first within a group
    log_miss = np.log1p(-np.minimum(p[order], 1.0 - 1e-12))
    before = np.cumsum(log_miss) - log_miss  # sum over everything earlier in ``order``
    group = par[order]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, n]))
    out = logp.copy()
    out[order] += before - before[first]  # only the better siblings' misses
    return out


def path_scores(parents: ArrayLike, node_logp: ArrayLike) -> np.ndarray:
    """Path score S (Eq. 5): ``S_j = S_parent(j) + logp_j``, the root scoring 0.

    ``node_logp`` must be log-probabilities (<= 0, no NaN), so S never grows
    along a path; tiny positive float noise is clipped to 0.
    """
    par = validate_parents(parents)
    logp = np.asarray(node_logp, dtype=np.float64)
    if logp.shape != par.shape:
        raise ValueError(f"node_logp has shape {logp.shape}, expected {par.shape}")
    if np.isnan(logp).any():
        raise ValueError("node_logp contains NaN")
    if (logp > _LOGP_TOLERANCE).any():
        raise ValueError(f"node_logp must be log-probabilities (<= 0), "
                         f"got max {float(logp.max())}")
    logp = np.minimum(logp, 0.0)
    scores = np.empty(par.size, dtype=np.float64)
    # Parent-first order: scores[p] is final before any child reads it.
    for j, p in enumerate(par.tolist()):
        scores[j] = logp[j] if p == ROOT else scores[p] + logp[j]
    return scores


def depth_confidence(scores: ArrayLike, depths: ArrayLike, max_depth: int) -> np.ndarray:
    """Confidence per depth (Eq. 6): ``c[d-1] = exp(max S over depth-d nodes)``.

    Depths with no node get 0 (nothing there to be confident about); nodes
    deeper than ``max_depth`` are ignored.
    """
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    s = np.asarray(scores, dtype=np.float64)
    d = _int_array(depths, "depths")
    if s.shape != d.shape or s.ndim != 1:
        raise ValueError(f"scores and depths must be 1-D of equal length, "
                         f"got {s.shape} and {d.shape}")
    if (d < 1).any():
        raise ValueError(f"depths must be >= 1, got {int(d.min())}")
    best = np.full(max_depth, -np.inf)
    keep = d <= max_depth
    np.maximum.at(best, d[keep] - 1, s[keep])
    return np.exp(best)  # exp(-inf) == 0 for empty depths
