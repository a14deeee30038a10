# SPDX-License-Identifier: Apache-2.0
"""One request's forest scored and gated in one compiled pass (the planner's per-step work).

:func:`score_forest` computes, for a candidate forest, in order:

1. node depths (:func:`vllm_echo.algos.tree.tree_depths`);
2. each node's acceptance log-prob: a retrieved token from the acceptance table by
   (depth, m-gram match length) (:meth:`AcceptancePrior.prob_table`), a next-next head
   from the head table by the bucket of its last-logit probability, clipped to
   ``[logp_floor, 0]``;
3. siblings counted as exclusive: taken in descending probability, sibling j is worth
   p_j times the chance that every better sibling was rejected;
4. path scores S (ECHO Eq. 5) and the confidence per depth c_d = exp(max S at depth d)
   (Eq. 6);
5. the gate's decision (Eq. 7) from the checks of :func:`gate.gate_checks`.

Compiled because on a forest of a few dozen nodes these steps are some 40 small numpy
calls per request and step (benchmarks/README.md has the per-step cost). The numpy
transcription that the tests check this pass against is tests/unit/echo_reference.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def score_forest(parents, rank, match_len, head_logp, prior_table, head_table, head_edges,
                 logp_floor, conf_size, check_depths, check_taus):
    """Score one forest. Returns ``(depths, buckets, scores, confidence, trunc_depth,
    truncated, best_root_logp)``.

    ``parents``: parent-first; ``rank``: top-k rank of a next-next head, -1
    for a retrieved token; ``match_len``: m of a retrieved token's lookup (1-based);
    ``head_logp``: log p of the top-k candidates by rank. ``buckets``: a head's 1-based
    probability bucket (1 + the number of ``head_edges`` >= p), 1 elsewhere.
    ``confidence`` has ``max(conf_size, deepest)`` entries. ``best_root_logp``: the
    best depth-1 log-prob before the floor clip and the sibling correction.
    """
    n = parents.size
    depths = np.empty(n, dtype=np.int64)
    buckets = np.ones(n, dtype=np.int64)
    logp = np.empty(n, dtype=np.float64)
    prior_depths, max_ngram = prior_table.shape
    best_root = -np.inf
    deepest = 0
    for j in range(n):
        parent = parents[j]
        depths[j] = 1 if parent < 0 else depths[parent] + 1
        deepest = max(deepest, depths[j])
        if rank[j] < 0:
            m = match_len[j]
            if m < 1 or m > max_ngram:
                raise ValueError("match length of a retrieved node out of range")
            lp = np.log(prior_table[min(depths[j], prior_depths) - 1, m - 1])
        else:
            if rank[j] >= head_logp.size:
                raise ValueError("next-next head rank past the top-k log-probs")
            p = np.exp(head_logp[rank[j]])
            bucket = 1
            for edge in head_edges:
                if edge >= p:
                    bucket += 1
            buckets[j] = bucket
            lp = np.log(head_table[0, bucket - 1])
        if parent < 0 and lp > best_root:
            best_root = lp
        logp[j] = min(max(lp, logp_floor), 0.0)

    # Exclusive siblings: sibling j is worth p_j times the chance every better sibling
    # (higher p, or equal p and a lower index) was rejected.
    prob = np.exp(logp)
    scores = np.empty(n, dtype=np.float64)
    for j in range(n):
        s = logp[j]
        for k in range(n):
            if k != j and parents[k] == parents[j] and (
                    prob[k] > prob[j] or (prob[k] == prob[j] and k < j)):
                s += np.log1p(-min(prob[k], 1.0 - 1e-12))
        parent = parents[j]
        scores[j] = s if parent < 0 else scores[parent] + s

    confidence = np.zeros(max(conf_size, deepest), dtype=np.float64)
    for j in range(n):
        c = np.exp(scores[j])
        if c > confidence[depths[j] - 1]:
            confidence[depths[j] - 1] = c

    trunc_depth, truncated = deepest, False
    for i in range(check_depths.size):
        depth = check_depths[i]
        if depth > deepest:
            break  # nothing that deep: the tree ends before the gate, uncut
        if confidence[depth - 1] <= check_taus[i]:
            trunc_depth, truncated = depth, True
            break
    return depths, buckets, scores, confidence, trunc_depth, truncated, best_root


@njit(cache=True)
def count_tree_observations(total, accepted, parents, depths, match_len, eligible, path,
                            token_ids, next_token):
    """Add one verified tree's observations to the (depth, match length) counts in place.

    An observation is an ``eligible`` node whose parent was accepted (the root always
    is); it counts as accepted when its token is what the target emitted after its
    parent (the next path token, or ``next_token`` after the path's end), so a
    duplicate sibling of the accepted node counts too
    Returns how many.
    """
    n = parents.size
    max_depth, max_ngram = total.shape
    # By row (node + 1, row 0 = the root): the token emitted after it, -1 where the
    # row was not accepted (token ids are >= 0).
    emitted = np.full(n + 1, -1, dtype=np.int64)
    row = 0
    for i in range(path.size):
        node = path[i]
        if node < 0 or node >= n or parents[node] + 1 != row:
            raise ValueError("accepted path is not a root-first path of the tree")
        emitted[row] = token_ids[node]
        row = node + 1
    emitted[row] = next_token
    recorded = 0
    for j in range(n):
        if not eligible[j] or emitted[parents[j] + 1] < 0:
            continue
        m = match_len[j]
        if m < 1 or m > max_ngram:
            raise ValueError("match length out of range")
        d = min(depths[j], max_depth) - 1
        total[d, m - 1] += 1.0
        if token_ids[j] == emitted[parents[j] + 1]:
            accepted[d, m - 1] += 1.0
        recorded += 1
    return recorded


@njit(cache=True)
def count_unverified_children(total, accepted, parents, depths, path, keep,
                              candidate_parents, candidate_tokens, candidate_match_len,
                              candidate_rank, next_token):
    """Add the observations of the candidates a verified plan left out just past its
    accepted path, in place; returns how many.

    When ``path`` ends at a leaf of the plan (every node on it accepted, nothing drafted
    below it), the target's token after it (``next_token``) says whether each retrieved
    child of that node in the whole candidate forest would have been accepted: each is
    an observation at the next depth, as if verified. Without them a depth the budget
    does not reach keeps its prior rate, which prices it out of the budget in turn.
    ``keep`` maps plan nodes to forest nodes.
    """
    if path.size == 0:
        return 0
    leaf = path[path.size - 1]
    for j in range(parents.size):
        if parents[j] == leaf:
            return 0  # a drafted child was rejected: the verified nodes tell it all
    end = keep[leaf]
    max_depth, max_ngram = total.shape
    d = min(depths[leaf] + 1, max_depth) - 1
    recorded = 0
    for c in range(candidate_parents.size):
        if candidate_parents[c] != end or candidate_rank[c] >= 0:
            continue
        m = candidate_match_len[c]
        if m < 1 or m > max_ngram:
            raise ValueError("match length out of range")
        total[d, m - 1] += 1.0
        if candidate_tokens[c] == next_token:
            accepted[d, m - 1] += 1.0
        recorded += 1
    return recorded


@njit(cache=True)
def has_child_token(parents, token_ids, parent, token):
    """Whether a child of node ``parent`` (-1: the root) carries ``token``."""
    for j in range(parents.size):
        if parents[j] == parent and token_ids[j] == token:
            return True
    return False
