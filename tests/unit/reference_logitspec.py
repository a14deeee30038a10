# SPDX-License-Identifier: Apache-2.0
"""A direct, slow transcription of the LogitSpec reference pool and drafting
(its retrieval and forest rules), used as the oracle for the numba versions."""


def build_pool(tokens, max_ngram, span):
    pool = [dict() for _ in range(max_ngram)]
    for i in range(len(tokens)):
        for m in range(1, max_ngram + 1):
            end = i + m
            if end >= len(tokens):
                continue
            key = tuple(tokens[i:end])
            value = list(tokens[end:end + span])
            old = pool[m - 1].get(key)
            if old is None or len(value) >= len(old):
                pool[m - 1][key] = value
    return pool


def lookup(pool, context, max_ngram):
    for m in range(max_ngram, 0, -1):
        if len(context) < m:
            continue
        hit = pool[m - 1].get(tuple(context[-m:]))
        if hit is not None:
            return hit
    return []


def branch_len(idx):
    return 4 if idx <= 8 else 3 if idx <= 32 else 1


def forest(tokens, candidates, max_ngram, span, capacity):
    """Chains under the root (= tokens[-1]) as lists, in reference order."""
    pool = build_pool(tokens, max_ngram, span)
    root = tokens[-1]
    chains, used = [], 0
    c = lookup(pool, tokens, max_ngram)[: capacity - 1]
    if c:
        chains.append(c)
        used += len(c)
    for idx, t in enumerate(candidates):
        if used >= capacity - 1:
            break
        if t == root:
            continue
        seq = ([t] + lookup(pool, list(tokens) + [t], max_ngram))[: branch_len(idx)]
        seq = seq[: capacity - 1 - used]
        chains.append(seq)
        used += len(seq)
    return chains
