# SPDX-License-Identifier: Apache-2.0
"""Per-node acceptance probabilities: ECHO's confidence interface.

A candidate node's P(accepted) is the product, along its path from the root, of
conditional acceptance rates: the rate at which such a node is accepted once its parent
was. Rates are Beta posteriors per bucket:

- "retrieved" (an m-gram continuation), by depth bucket and match-length class
  (``EchoTuning.match_edges``: a 1-gram guess and a copied passage differ);
- "head" (a next-next candidate from the target's top-k), by its last-logit
  probability bucket;
- "shared" (other requests' outputs) and "recycled" (the recycled-candidates table), by
  depth bucket (vllm_echo.algos.draft_sources);
- "prediction" (the request's predicted output, algos/prediction.py), by depth bucket and
  the class of how many tokens in a row the output has copied from it (a 2-gram
  re-anchor after an edit and a prediction followed for 20 tokens differ).

They learn from uncensored labels only: a verified node is a trial only if its parent
was accepted (or it hangs off the root); it succeeds if its token is the one the target
emitted after its parent. :meth:`AcceptanceModel.node_probabilities` is usable
without ECHO's budget (e.g. as per-draft confidences for vLLM's adaptive verification).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from vllm_echo.algos.echo.tuning import EchoTuning


@dataclass
class Candidates:
    """One request's candidate forest (vllm_echo.algos.forest.ForestNodes) and the
    log-probabilities of its top-k next-next candidates, by rank."""

    token_ids: np.ndarray
    parents: np.ndarray  # parent-first; -1 hangs the node off the root
    match_len: np.ndarray  # m of the lookup that retrieved the node (0: a head)
    rank: np.ndarray  # top-k rank of a head, -1 for a retrieved token
    head_logp: np.ndarray
    chain_only: bool = False  # verified as a chain whatever the planner's mode
    origin: np.ndarray | None = None  # int8 per node (draft_sources.ORIGIN_*); None: own


class Pool(NamedTuple):
    """Several forests as one: node arrays concatenated, parents made global."""

    offsets: np.ndarray  # forest r holds nodes offsets[r]:offsets[r + 1]
    parents: np.ndarray  # global index of each node's parent, -1 for the root
    tokens: np.ndarray
    buckets: np.ndarray  # each node's rate bucket
    probs: np.ndarray  # each node's P(accepted)


@njit(cache=True)
def _depths(parents):
    depths = np.empty(parents.size, np.int64)
    for j in range(parents.size):  # parent-first order
        depths[j] = 1 if parents[j] < 0 else depths[parents[j]] + 1
    return depths


@njit(cache=True)
def _path_products(parents, rates):
    probs = np.empty(parents.size)
    for j in range(parents.size):
        probs[j] = rates[j] if parents[j] < 0 else rates[j] * probs[parents[j]]
    return probs


# the bucket families; the last ones are the other origins, in draft_sources.ORIGIN_* order
KINDS = ("retrieved", "head", "shared", "recycled", "prediction")
_OTHER_KINDS = KINDS[2:]


class AcceptanceModel:
    """Beta posteriors of conditional acceptance rates, and P(accepted) per node."""

    def __init__(self, tuning: EchoTuning | None = None):
        tune = self.tuning = tuning or EchoTuning()
        self._depth_edges = np.asarray(tune.depth_edges, dtype=np.int64)
        self._match_edges = np.asarray(tune.match_edges, dtype=np.int64)
        self._lengths = self._match_edges.size
        self.num_retrieved = self._depth_edges.size * self._lengths
        self._head_edges = -np.asarray(tune.head_p_edges, dtype=np.float64)  # ascending
        self.num_heads = self._head_edges.size + 1
        self._other_start = self.num_retrieved + self.num_heads  # _OTHER_KINDS in order
        depths = self._depth_edges.size
        # match-length classes per other kind: shared and recycled by depth only,
        # prediction by depth and class, like a retrieved token
        self._kind_classes = np.array([1, 1, self._lengths], dtype=np.int64)
        self._kind_starts = self._other_start + np.concatenate(
            ([0], np.cumsum(depths * self._kind_classes)))
        size = int(self._kind_starts[-1])
        priors = np.empty((size, 2))
        priors[:self.num_retrieved] = tune.retrieved_prior
        priors[self.num_retrieved:self._other_start] = tune.head_prior
        for j, prior in enumerate((tune.shared_prior, tune.recycled_prior,
                                   tune.prediction_prior)):
            priors[self._kind_starts[j]:self._kind_starts[j + 1]] = prior
        self._prior_a, self._prior_b = priors[:, 0].copy(), priors[:, 1].copy()
        # Origins beyond the request's own text whose drafts are offered (draft_sources)
        self.other_origins: tuple[int, ...] = ()
        self.successes = np.zeros(size)
        self.trials = np.zeros(size)
        self.rates = self._posterior()

    def _posterior(self) -> np.ndarray:
        return (self._prior_a + self.successes) / (self._prior_a + self._prior_b + self.trials)

    def best_first_rates(self) -> tuple[float, float]:
        """(best retrieved, best head) rate at depth 1: no node of a forest scores above
        the better one, and no head above the second."""
        first = self.rates[0:self._lengths].max()
        for origin in self.other_origins:  # depth 1 is each kind's first row
            start = self._kind_starts[origin - 1]
            first = max(first, self.rates[start:start + self._kind_classes[origin - 1]].max())
        return (float(first),
                float(self.rates[self.num_retrieved:self._other_start].max()))

    def kinds(self, buckets: np.ndarray) -> np.ndarray:
        """Each bucket's index in KINDS."""
        return np.where(buckets < self.num_retrieved, 0, np.where(
            buckets < self._other_start, 1,
            1 + np.searchsorted(self._kind_starts, buckets, side="right")))

    def buckets(self, parents: np.ndarray, match_len: np.ndarray, rank: np.ndarray,
                head_logp: np.ndarray, origin: np.ndarray | None = None) -> np.ndarray:
        """Each node's rate bucket (``parents`` global or local, parent-first)."""
        depth = _depths(parents)
        depth_bucket = np.searchsorted(self._depth_edges, depth, side="right") - 1
        length_class = np.maximum(
            np.searchsorted(self._match_edges, match_len, side="right") - 1, 0)
        out = depth_bucket * self._lengths + length_class
        if origin is not None and origin.any():
            other = origin > 0
            kind = origin[other].astype(np.int64) - 1  # index in _OTHER_KINDS
            classes = self._kind_classes[kind]
            out[other] = (self._kind_starts[kind] + depth_bucket[other] * classes
                          + np.minimum(length_class[other], classes - 1))
        heads = rank >= 0
        if heads.any():
            logp = np.asarray(head_logp, dtype=np.float64)[rank[heads]]
            out[heads] = self.num_retrieved + np.searchsorted(self._head_edges, -np.exp(logp),
                                                              side="right")
        return out

    def pool(self, forests: list[Candidates]) -> Pool:
        """The forests' nodes as one array each, with their probabilities."""
        sizes = np.array([len(c.token_ids) for c in forests], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        local = np.concatenate([c.parents for c in forests]).astype(np.int64)
        parents = np.where(local >= 0, local + np.repeat(offsets[:-1], sizes), -1)
        # Each forest's heads index its own top-k log-probabilities.
        head_logp = [np.asarray(c.head_logp, dtype=np.float64) for c in forests]
        rank = np.concatenate([c.rank for c in forests]).astype(np.int64)
        head_starts = np.concatenate(([0], np.cumsum([h.size for h in head_logp])))
        rank = np.where(rank >= 0, rank + np.repeat(head_starts[:-1], sizes), -1)
        origin = None
        if any(c.origin is not None for c in forests):
            origin = np.concatenate([np.zeros(len(c.token_ids), np.int8) if c.origin is None
                                     else c.origin for c in forests])
        buckets = self.buckets(parents, np.concatenate([c.match_len for c in forests]), rank,
                               np.concatenate(head_logp) if head_logp else np.empty(0), origin)
        probs = _path_products(parents, self.rates[buckets])
        tokens = np.concatenate([c.token_ids for c in forests]).astype(np.int64)
        return Pool(offsets, parents, tokens, buckets, probs)

    def node_probabilities(self, candidates: Candidates) -> np.ndarray:
        """P(accepted) of every node of one forest, in its node order."""
        if len(candidates.token_ids) == 0:
            return np.empty(0)
        return self.pool([candidates]).probs

    def observe(self, buckets: np.ndarray, trial: np.ndarray, success: np.ndarray) -> None:
        """One step's labels: ``trial``/``success`` masks over nodes of ``buckets``
        (the counts decay by ``acceptance_decay`` per step first)."""
        size = self.trials.size
        self.trials *= self.tuning.acceptance_decay
        self.successes *= self.tuning.acceptance_decay
        self.trials += np.bincount(buckets[trial], minlength=size)
        self.successes += np.bincount(buckets[trial & success], minlength=size)
        self.rates = self._posterior()

    def table(self) -> dict[str, list[float]]:
        """Current rates (JSON-able): retrieved and prediction by depth bucket (x
        match-length class), heads by probability bucket, shared and recycled by depth
        bucket."""
        retrieved = self.rates[:self.num_retrieved].reshape(-1, self._lengths)

        def rounded(values):
            return [round(float(x), 4) for x in values]

        out = {"retrieved": [rounded(row) for row in retrieved],
               "head": rounded(self.rates[self.num_retrieved:self._other_start])}
        starts, classes = self._kind_starts, self._kind_classes
        for j, kind in enumerate(_OTHER_KINDS):
            rates = self.rates[starts[j]:starts[j + 1]]
            out[kind] = (rounded(rates) if classes[j] == 1 else
                         [rounded(row) for row in rates.reshape(-1, classes[j])])
        out["trials"] = [round(float(x), 1) for x in self.trials]
        return out


def labels(parents: np.ndarray, tokens: np.ndarray, accepted: np.ndarray, next_token: int,
           verified: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(trial, success) masks over one forest's nodes, given the ``verified`` nodes, the
    ``accepted`` root path among them (node indices, root side first) and the token the
    target emitted after it.

    The token the target emitted after the root and after each accepted node is known;
    a verified node under one of them is a trial, and succeeds if it is that token (a
    duplicate of the accepted sibling too). Nodes that were not verified give no label
    (an ablation in replay found their labels worth less than 1%)."""
    emitted = np.full(parents.size + 1, -1, dtype=np.int64)  # after the root, after node j
    stops = np.concatenate(([-1], accepted)) + 1
    emitted[stops] = np.concatenate((tokens[accepted], [next_token]))
    after_parent = emitted[parents + 1]
    trial = np.zeros(parents.size, np.bool_)
    trial[verified] = after_parent[verified] >= 0
    return trial, trial & (tokens == after_parent)
