# SPDX-License-Identifier: Apache-2.0
"""simulate.py's replay of a recorded trace through a drafter, and the fixed drafters.

Replay: at each step the context is prompt + accepted output so far and its last
token is the root; a method drafts a chain or forest, which is verified greedily
(``vllm_echo.algos.verify.verify_greedy``) against the true continuation, and
accepted + 1 tokens are emitted. The first output token costs one forward (prefill).
tokens/step = output tokens / forwards; drafted/step = draft tokens (root excluded)
per decode forward. Requests run one at a time (batch 1) or, for the comparison of
ECHO against the fixed methods, up to B at once with continuous batching; a step's time
comes from a cost function of its live requests, draft tokens and tree requests
(measured on this CPU, or an assumed GPU-like hinge), and ECHO learns from it as
the plugin learns from measured step times. Since greedy decoding is lossless, the
true continuation is exactly what the target would have emitted, so this is the
acceptance of a real run without the verification cost.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from simulate_costs import cpu_step_ms

NO_TOKEN = -1  # a target "argmax" that matches no draft token


# -- drafters: (state, pos) -> (token_ids, parents) ------------------------------------

def _chain(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return tokens, np.arange(-1, len(tokens) - 1, dtype=np.int32)


def vllm_ngram(k: int, lo: int, hi: int) -> Callable:
    """vLLM's own NgramProposer kernel (longest n-gram in [lo, hi], earliest match)."""
    from vllm.v1.spec_decode.ngram_proposer import \
        _find_longest_matched_ngram_and_propose_tokens as find

    def draft(state: "Replay", pos: int):
        context = state.full[:state.prompt_len + pos + 1]
        return _chain(np.asarray(find(context, lo, hi, 1 << 30, k), dtype=np.int32))
    return draft


def logitspec_chain(k: int) -> Callable:
    from vllm_echo.algos.forest import first_chain

    def draft(state: "Replay", pos: int):
        return _chain(first_chain(state.index_at(pos), state.topk[pos], k)[0])
    return draft


def logitspec_forest(capacity: int, max_chains: int = 1 << 30) -> Callable:
    from vllm_echo.algos.forest import build_forest

    def draft(state: "Replay", pos: int):
        return build_forest(state.index_at(pos), state.topk[pos], capacity, max_chains)
    return draft


def methods() -> dict[str, Callable | None]:
    return {
        "none": None,
        "ngram k=4 m1..3 (vLLM)": vllm_ngram(4, 1, 3),
        "ngram k=8 m2..5 (vLLM)": vllm_ngram(8, 2, 5),
        "logitspec chain K=4": logitspec_chain(4),
        "logitspec chain K=8": logitspec_chain(8),
        "logitspec chain K=15 (capacity 16)": logitspec_chain(15),
        "logitspec forest, first chain only, capacity 16": logitspec_forest(16, max_chains=1),
        **{f"logitspec forest capacity {c}": logitspec_forest(c) for c in (8, 16, 32, 64)},
    }


# -- replay --------------------------------------------------------------------------

class Replay:
    """One trace row: the true token stream and an incrementally grown m-gram index."""

    def __init__(self, row: dict, max_ngram: int = 3, span: int = 20):
        from vllm_echo.algos.ngram_index import NgramIndex

        self.prompt_len = len(row["prompt_ids"])
        self.full = np.asarray(row["prompt_ids"] + row["output_ids"], dtype=np.int32)
        self.n_out = len(row["output_ids"])
        self.topk = [np.asarray(t, dtype=np.int32) for t in row["topk_ids"]]
        self.topk_logp = row.get("topk_logprobs")  # traces recorded before had none
        self.index = NgramIndex(max_ngram, span, capacity_hint=len(self.full) + 64)

    def index_at(self, pos: int):
        """The index over the context whose last token is output ``pos``."""
        end = self.prompt_len + pos + 1
        if self.index.length < end:
            self.index.extend(self.full[self.index.length:end])
        return self.index

    def target_argmax(self, pos: int, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """What a greedy target would predict after the root and after each node.

        After the root: the next true token. After node j: the true token following
        j's path if that path matches the truth so far, else NO_TOKEN (matches
        nothing); beyond the recorded output the continuation is unknown (NO_TOKEN).
        """
        truth = self.full[self.prompt_len + pos + 1:]
        n = len(tokens)
        argmax = np.full(n + 1, NO_TOKEN, dtype=np.int64)
        if len(truth):
            argmax[0] = truth[0]
        depth = np.zeros(n, dtype=np.int64)
        on_path = np.zeros(n, dtype=bool)
        for j in range(n):
            par = parents[j]
            depth[j] = 1 if par < 0 else depth[par] + 1
            parent_ok = par < 0 or on_path[par]
            d = depth[j]
            on_path[j] = parent_ok and d <= len(truth) and tokens[j] == truth[d - 1]
            if on_path[j] and d < len(truth):
                argmax[j + 1] = truth[d]
        return argmax


class PerRequest:
    """A drafter ``(state, pos) -> (token_ids, parents)`` applied to each live request."""

    def __init__(self, draft: Callable):
        self.draft = draft

    def __call__(self, states: list["Replay"], positions: list[int]) -> list[tuple]:
        return [self.draft(state, pos) for state, pos in zip(states, positions)]


def replay(rows: list[dict], drafter: Callable | None, batch: int = 1,
           cost: Callable[[int, int, int], float] = cpu_step_ms,
           num_requests: int | None = None) -> dict[str, Any]:
    """Continuous batching over the trace rows: up to ``batch`` requests decode in
    lockstep, a finished request's slot goes to the next row (rows are cycled until
    ``num_requests`` requests exist, default max(rows, batch)). Each step every live
    request drafts (``drafter(states, positions)``), is verified greedily and emits
    accepted + 1 tokens; the step costs ``cost(live requests, draft tokens, tree
    requests)``. A drafter with a ``verdicts``
    method (ECHO) learns from each step. tokens/step counts forwards per request, as
    the offline benchmark's tokens per forward: the prefill emits a request's first
    token, each step after it one forward."""
    from vllm_echo.algos.verify import verify_greedy
    from vllm_echo.config import LOGITSPEC_MAX_NGRAM

    total = num_requests or max(len(rows), batch)
    cycled = (rows[i % len(rows)] for i in range(total)) if rows else ()
    queue = [row for row in cycled if row["output_ids"]][::-1]  # popped from the end
    live: list[list] = []  # [state, pos]
    forwards = tokens = drafted = decode_forwards = 0
    seconds = 0.0
    # The index the drafter reads: ECHO's own m, LogitSpec's reference m otherwise.
    max_ngram = getattr(drafter, "max_ngram", LOGITSPEC_MAX_NGRAM)
    while queue or live:
        while queue and len(live) < batch:
            state = Replay(queue.pop(), max_ngram=max_ngram)
            forwards += 1  # the prefill emits output 0
            tokens += state.n_out
            if state.n_out > 1:
                live.append([state, 0])
        if not live:
            continue
        states, positions = [x[0] for x in live], [x[1] for x in live]
        empty = (np.empty(0, np.int32), np.empty(0, np.int32))
        drafts = drafter(states, positions) if drafter is not None else [empty] * len(live)
        paths, emitted, num_drafts, num_trees = [], [], 0, 0
        for (state, pos), (cand, par) in zip(live, drafts):
            path, _ = verify_greedy(cand, par, state.target_argmax(pos, cand, par))
            paths.append(path)
            emitted.append(min(len(path) + 1, state.n_out - 1 - pos))
            num_drafts += len(cand)
            num_trees += len(par) > 0 and not np.array_equal(par, np.arange(-1, len(par) - 1))
        step_seconds = cost(len(live), num_drafts, num_trees)
        if hasattr(drafter, "verdicts"):
            drafter.verdicts(states, positions, paths, emitted, step_seconds,
                             len(live) + num_drafts, num_trees)
        seconds += step_seconds
        forwards += len(live)
        decode_forwards += len(live)
        drafted += num_drafts
        for item, n in zip(live, emitted):
            item[1] += n
        live = [item for item in live if item[1] < item[0].n_out - 1]
    return {"tokens": tokens, "steps": forwards, "seconds": seconds,
            "tokens_per_step": tokens / forwards if forwards else None,
            "drafted_per_step": drafted / decode_forwards if decode_forwards else None}
