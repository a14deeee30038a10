# SPDX-License-Identifier: Apache-2.0
"""LogitSpec's draft forest, built exactly as the reference `generate_draft_tokens`.

The root of the forest is the request's last sampled token (vLLM's bonus or
recovered token), which is already the last token of the context. Under it hang
independent chains (no trie merge, no deduplication, as in the reference):

1. the next-token chain: the retrieved continuation of the context (m-gram
   lookup, longest m first), up to ``span`` tokens, not length-pruned;
2. next-next branches: for each candidate ``t`` of the top-k of the logits that
   produced the root (rank order, the root itself skipped), ``[t]`` followed by
   the retrieved continuation of ``context + [t]``, cut to a length that depends
   on ``t``'s rank ``idx`` (0-based in the top-k list, counting the skipped root):
   4 if idx <= 8, 3 if idx <= 32, else 1.

Capacity counts verified tokens including the root, so a forest has at most
``capacity - 1`` draft nodes; the branch that crosses it is clipped.

A forest is returned as ``(token_ids, parents)`` in parent-first order:
``parents[j] == -1`` when node j hangs off the root, else the index of its parent.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from vllm_echo.algos.ngram_index import index_lookup

# Where a chain-mode draft came from (for acceptance statistics).
SOURCE_NONE = 0
SOURCE_RETRIEVAL = 1
SOURCE_LOGITS = 2


@njit(cache=True)
def rank_branch_length(idx):
    """Reference pruning: longer branches for better-ranked next-next candidates."""
    if idx <= 8:
        return 4
    if idx <= 32:
        return 3
    return 1


@njit(cache=True)
def _append_chain(out_tokens, out_parents, out_match, out_rank, n, first, rank, src, start,
                  count, match_len):
    """Append ``[first?] + src[start:start+count]`` as one chain under the root.

    Per node it also records how it was drafted: ``out_rank`` is the candidate's
    rank in the top-k for a next-next head (-1 for retrieved tokens) and
    ``out_match`` the m-gram length of the lookup that retrieved it (0 for heads).
    """
    parent = -1
    if first >= 0:
        out_tokens[n] = first
        out_parents[n] = parent
        out_match[n] = 0
        out_rank[n] = rank
        parent = n
        n += 1
    for j in range(count):
        out_tokens[n] = src[start + j]
        out_parents[n] = parent
        out_match[n] = match_len
        out_rank[n] = -1
        parent = n
        n += 1
    return n


@njit(cache=True)
def _context_query(tokens, length, max_ngram):
    """The context's last ``qlen`` tokens plus one free slot for a candidate token."""
    qlen = min(max_ngram, length)
    query = np.empty(qlen + 1, dtype=np.int32)
    query[:qlen] = tokens[length - qlen:length]
    return query, qlen


@njit(cache=True)
def build_forest_kernel(tokens, length, keys, vals, max_ngram, span, candidates,
                        capacity, max_chains, out_tokens, out_parents, out_match, out_rank):
    """Fill ``out_tokens/out_parents`` with the forest; returns its node count.

    Args:
        tokens, length, keys, vals: one request's NgramIndex (context = tokens[:length],
            whose last token is the root).
        candidates: top-k token ids of the logits that produced the root, best first.
        capacity: max verified tokens incl. the root (drafts <= capacity - 1).
        max_chains: stop after this many chains (chain mode passes 1).
    """
    limit = capacity - 1
    n = 0
    chains = 0
    if limit <= 0 or length == 0:
        return 0
    root = tokens[length - 1]
    query, qlen = _context_query(tokens, length, max_ngram)

    # 1. next-token chain
    e, m = index_lookup(tokens, length, query[:qlen], max_ngram, keys, vals)
    if e >= 0:
        count = min(span, length - e, limit)
        n = _append_chain(out_tokens, out_parents, out_match, out_rank, n, -1, -1, tokens, e,
                          count, m)
        chains += 1

    # 2. next-next branches from the root's logits: query = context tail + t
    for idx in range(candidates.shape[0]):
        if n >= limit or chains >= max_chains:
            break
        t = candidates[idx]
        if t == root:
            continue
        query[qlen] = t
        e, m = index_lookup(tokens, length, query, max_ngram, keys, vals)
        cont = 0
        if e >= 0:
            cont = min(span, length - e)
        keep = min(1 + cont, rank_branch_length(idx), limit - n)
        n = _append_chain(out_tokens, out_parents, out_match, out_rank, n, t, idx, tokens, e,
                          keep - 1, m)
        chains += 1
    return n


@njit(cache=True)
def first_chain_kernel(tokens, length, keys, vals, max_ngram, span, candidates,
                       max_len, out_tokens):
    """Chain mode: the forest's first chain, clipped to ``max_len`` tokens.

    Rule (documented in the README): the retrieved next-token continuation if the
    index has one; otherwise the best-ranked next-next candidate followed by its
    own retrieved continuation. In chain mode there is no capacity to share, so
    the candidate's branch is not cut by the rank rule, only by ``max_len``.
    Returns ``(length, source)`` with source SOURCE_NONE / SOURCE_RETRIEVAL /
    SOURCE_LOGITS (the chain starts with a next-next candidate).
    """
    if max_len <= 0 or length == 0:
        return 0, SOURCE_NONE
    root = tokens[length - 1]
    query, qlen = _context_query(tokens, length, max_ngram)
    e, m = index_lookup(tokens, length, query[:qlen], max_ngram, keys, vals)
    if e >= 0:
        count = min(span, length - e, max_len)
        out_tokens[:count] = tokens[e:e + count]
        return count, SOURCE_RETRIEVAL
    for idx in range(candidates.shape[0]):
        t = candidates[idx]
        if t == root:
            continue
        out_tokens[0] = t
        query[qlen] = t
        e, m = index_lookup(tokens, length, query, max_ngram, keys, vals)
        count = 0
        if e >= 0:
            count = min(span, length - e, max_len - 1)
            out_tokens[1:1 + count] = tokens[e:e + count]
        return 1 + count, SOURCE_LOGITS
    return 0, SOURCE_NONE


class ForestNodes(NamedTuple):
    """A forest plus how each node was drafted (for ECHO's node scores)."""

    token_ids: np.ndarray  # int32 [n]
    parents: np.ndarray    # int32 [n], -1 = child of the root
    match_len: np.ndarray  # int32 [n], m of the lookup that retrieved the node (0: head)
    rank: np.ndarray       # int32 [n], top-k rank of a next-next head, -1 if retrieved


def build_forest_nodes(index, candidates: np.ndarray, capacity: int,
                       max_chains: int = 1 << 30) -> ForestNodes:
    """The LogitSpec forest of one request with per-node provenance."""
    size = max(capacity - 1, 0)
    out = [np.empty(size, dtype=np.int32) for _ in range(4)]
    n = build_forest_kernel(index.tokens, index.length, index.keys, index.vals,
                            index.max_ngram, index.span,
                            np.ascontiguousarray(candidates, np.int32),
                            capacity, max_chains, out[0], out[1], out[2], out[3])
    return ForestNodes(*(a[:n] for a in out))


def build_forest(index, candidates: np.ndarray, capacity: int,
                 max_chains: int = 1 << 30) -> tuple[np.ndarray, np.ndarray]:
    """The LogitSpec forest of one request as ``(token_ids, parents)`` (int32)."""
    nodes = build_forest_nodes(index, candidates, capacity, max_chains)
    return nodes.token_ids, nodes.parents


def first_chain(index, candidates: np.ndarray, max_len: int) -> tuple[np.ndarray, int]:
    """Chain-mode draft of one request and its source (see ``first_chain_kernel``)."""
    out = np.empty(max(max_len, 0), dtype=np.int32)
    n, source = first_chain_kernel(index.tokens, index.length, index.keys, index.vals,
                           index.max_ngram, index.span,
                           np.ascontiguousarray(candidates, np.int32), max_len, out)
    return out[:n], source
