# SPDX-License-Identifier: Apache-2.0
"""Trace simulator: replay recorded greedy generations through the drafters, no model.

    python benchmarks/simulate.py --record benchmarks/traces/spec_bench_12x128.jsonl
    python benchmarks/simulate.py benchmarks/traces/spec_bench_12x128.jsonl
    python benchmarks/simulate.py --smoke            # CI

Recording runs the embedded model greedily (no speculation) and stores per prompt the
prompt ids, the output ids and, per output position, the top-64 token ids (and their
log-probabilities) of the logits that produced that token (vLLM logprobs in the
default raw_logprobs mode: log_softmax of the raw logits, so the top-k order is the
raw logits' order).

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

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402

from vllm_echo.plugin.config_shim import CPU_ECHO_CAPACITY  # noqa: E402  (imports no vLLM)

TOPK = 64
DEFAULT_TRACE = Path(__file__).resolve().parent / "traces" / "spec_bench_12x128.jsonl"
NO_TOKEN = -1  # a target "argmax" that matches no draft token


# -- recording -----------------------------------------------------------------------

def record(path: Path, dataset: str, num_prompts: int, max_tokens: int, model: str | None,
           dtype: str) -> dict:
    from vllm import LLM, SamplingParams

    from vllm_echo import prompts
    from vllm_echo.models import resolve_model

    model = resolve_model(model)
    llm = LLM(model, dtype=dtype, enforce_eager=True, max_model_len=2048, seed=0,
              kv_cache_memory_bytes=512 * 2**20, max_logprobs=TOPK)
    mode = llm.llm_engine.model_config.logprobs_mode
    if mode != "raw_logprobs":  # processed modes would reorder by temperature/penalties
        raise RuntimeError(f"logprobs_mode is {mode!r}; the trace needs raw_logprobs")
    chosen = prompts.load(dataset, n=num_prompts)
    outs = llm.chat([p.as_chat() for p in chosen],
                    SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=TOPK),
                    use_tqdm=True)
    rank1_mismatch = 0
    rows = []
    for p, out in zip(chosen, outs):
        comp = out.outputs[0]
        topk, topk_logp = [], []
        for tok, lp in zip(comp.token_ids, comp.logprobs):
            # The dict holds the top-64 plus the sampled token; rank orders them.
            ranked = [(t, v) for t, v in sorted(lp.items(), key=lambda kv: kv[1].rank)
                      if v.rank <= TOPK][:TOPK]
            rank1_mismatch += ranked[0][0] != tok
            topk.append([t for t, _ in ranked])
            topk_logp.append([round(v.logprob, 4) for _, v in ranked])
        rows.append({"question_id": p.question_id, "category": p.category,
                     "prompt_ids": list(out.prompt_token_ids),
                     "output_ids": list(comp.token_ids), "topk_ids": topk,
                     "topk_logprobs": topk_logp})
    # the folder name only: a trace is shared, the machine path is not
    meta = {"model": Path(model).name, "dataset": dataset, "num_prompts": len(rows),
            "max_tokens": max_tokens, "dtype": dtype, "topk": TOPK, "logprobs_mode": mode,
            # greedy: the sampled token should be the argmax (rank 1) everywhere
            "positions_where_sampled_is_not_rank1": rank1_mismatch,
            "environment": bench_common.environment(dtype),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    return meta


def load_trace(path: Path, limit: int | None = None) -> tuple[dict, list[dict]]:
    meta, rows = {}, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if "meta" in row:
                meta = row["meta"]
            else:
                rows.append(row)
    return meta, rows[:limit] if limit else rows


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


# -- step cost ------------------------------------------------------------------------

# Decode step time vs tokens verified at batch 1, relative to a step without drafts
# (fp32, context 300, this CPU, vLLM 0.32): `tree_step_time.py --chain-lengths`,
# 5 rotated rounds, 2026-12-02; past 17 tokens the last segment's slope.
CPU_B1_COST = ((1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 17),
               (1.0, 1.067, 1.084, 1.069, 1.116, 1.174, 1.260, 1.323, 1.391, 1.464, 1.595))
CPU_B1_STEP_MS = 30.7
# Batch >= 2, same machine and dtype, from the offline benchmark at batch 8 / 24 / 64
# (commit a665ace, 64 tokens per request): a plain step took 69.8 / 169.6 / 381.9 ms
# for 7.5 / 22.4 / 57.5 requests on average, i.e. ~34 ms + ~6.05 ms per request; the
# K=4 drafters' steps cost ~1.6-1.9 ms more per verified draft token.
CPU_BATCH_MS = (34.0, 6.05, 1.8)  # (per step, per request, per draft token)
TREE_COST = 0.25  # a request verified as a tree on CPU, in batch-1 steps (ECHO measured)


def step_cost(num_tokens: int, curve=CPU_B1_COST) -> float:
    """Relative step time, extended past the last point with the last segment's slope."""
    ks, ts = curve
    if num_tokens <= ks[-1]:
        return float(np.interp(num_tokens, ks, ts))
    return ts[-1] + (num_tokens - ks[-1]) * (ts[-1] - ts[-2]) / (ks[-1] - ks[-2])


def cpu_step_ms(num_requests: int, num_drafts: int, num_trees: int) -> float:
    """Measured on this CPU (fp32): the batch-1 curve at batch 1, the linear fit above."""
    tree_ms = TREE_COST * CPU_B1_STEP_MS * num_trees
    if num_requests == 1:
        return CPU_B1_STEP_MS * step_cost(1 + num_drafts) + tree_ms
    per_step, per_request, per_draft = CPU_BATCH_MS
    return per_step + per_request * num_requests + per_draft * num_drafts + tree_ms


def hinge_step_ms(num_requests: int, num_drafts: int, num_trees: int,
                  knee: int = 256) -> float:
    """Not measured: the shape ECHO assumes for a GPU (Eq. 2), flat up to ``knee``
    verified tokens, then linear (twice the time at 2 x knee), trees free (a masked
    attention). For reading how the budget behaves where verification is cheap."""
    return 1.0 + max(0, num_requests + num_drafts - knee) / knee


# name -> (step cost, ECHO's forest capacity there, trees): the plugin's CPU default
# (chains from a 32-node forest), elsewhere the reference capacity and trees.
COST_CURVES: dict[str, tuple[Callable[[int, int, int], float], int, bool]] = {
    "cpu": (cpu_step_ms, CPU_ECHO_CAPACITY, False),
    "gpu-like hinge (assumed)": (hinge_step_ms, 64, True)}


# -- replay ---------------------------------------------------------------------------

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


class EchoDrafter:
    """ECHO as a replay drafter: the planner the engine runs (EchoPlanner) sees the
    batch's forests each step and learns from each step's verdicts. The engine's step
    timings are replaced by the replay's cost function, fed to the planner's cost curve
    as the plugin feeds measured ones. ``curve``: the start-up curve (a cost function of
    the step's size), or None for none (online only, as the engine runs without the
    start-up measurement). ``stats()``: its own planning time per step and what it
    learned."""

    def __init__(self, capacity: int, trees: bool, curve: Callable[[int], float] | None = None,
                 tuning: dict | None = None, k_max: int | None = None):
        from vllm_echo.algos.echo import EchoPlanner, EchoTuning
        from vllm_echo.config import ECHO_MAX_NGRAM

        self.capacity, self.cap = capacity, capacity - 1
        self.max_ngram = ECHO_MAX_NGRAM
        self.planner = EchoPlanner(EchoTuning(**(tuning or {})), trees=trees, k_max=k_max)
        if curve is not None:
            self.planner.cost.set_curve(STARTUP_SIZES, [curve(n) for n in STARTUP_SIZES])
        self.steps = self.tree_steps = 0
        self.plan_s = 0.0
        self._plans: list = []

    def __call__(self, states: list["Replay"], positions: list[int]) -> list[tuple]:
        from vllm_echo.algos.echo import Candidates
        from vllm_echo.algos.forest import build_forest_nodes

        if any(state.topk_logp is None for state in states):
            raise ValueError("the trace has no topk_logprobs; record it again (--record)")
        start = time.perf_counter()
        empty = (np.empty(0, np.int32), np.empty(0, np.int32))
        drafts, self._plans = [empty] * len(states), [None] * len(states)
        mode = self.planner.drafting_mode(len(states))
        if mode != "none":
            heads = mode == "all"
            candidates = []
            for state, pos in zip(states, positions):
                top = state.topk[pos] if heads else np.empty(0, np.int32)
                nodes = build_forest_nodes(state.index_at(pos), top, self.capacity)
                candidates.append(Candidates(*nodes, head_logp=np.asarray(
                    state.topk_logp[pos] if heads else (), dtype=np.float64)))
            drafts, self._plans = self.planner.plan(candidates, self.cap, len(states))
        self.plan_s += time.perf_counter() - start
        return drafts

    def verdicts(self, states: list["Replay"], positions: list[int], paths: list[list[int]],
                 emitted: list[int], seconds: float, num_tokens: int, num_trees: int) -> None:
        observed = []
        for state, pos, plan, path, n in zip(states, positions, self._plans, paths, emitted):
            if plan is not None and len(path) + 1 == n:  # not cut by the end of the output
                observed.append((plan, path, int(state.full[state.prompt_len + pos + n])))
        self.planner.observe(observed)
        self.planner.cost.observe(num_tokens, seconds, num_tokens > len(states))
        self.steps += 1
        self.tree_steps += num_trees > 0

    def stats(self) -> dict[str, Any]:
        snap = self.planner.snapshot()
        return {"plan_ms_per_step": 1e3 * self.plan_s / self.steps if self.steps else None,
                "tree_steps": self.tree_steps, "probes": snap["probes"],
                "rates": snap["rates"], "cost_curve": self.planner.cost.describe()}


# Sizes of the start-up curve (the plugin times dummy forwards at several sizes).
STARTUP_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024,
                 2048, 4096)


def startup_curve(cost: Callable[[int, int, int], float]) -> Callable[[int], float]:
    """What a dummy forward of n tokens costs under ``cost``: one request, n - 1 drafts
    (no per-request work beyond the first, no tree)."""
    return lambda n: cost(1, n - 1, 0)


def echo_replay(rows: list[dict], capacity: int, trees: bool, batch: int = 1,
                cost: Callable[[int, int, int], float] = cpu_step_ms,
                num_requests: int | None = None, startup: bool = True,
                tuning: dict | None = None, probe_cost: Callable | None = None
                ) -> dict[str, Any]:
    """``probe_cost``: the cost the start-up curve is measured with (default ``cost``)."""
    drafter = EchoDrafter(capacity, trees, startup_curve(probe_cost or cost) if startup
                          else None, tuning)
    return {**replay(rows, drafter, batch, cost, num_requests), **drafter.stats()}


# The batch-1 table's ECHO rows: the CPU default (chains) and trees, start-up curve.
ECHO_VARIANTS = {f"echo chain (capacity {CPU_ECHO_CAPACITY})": False,
                 f"echo tree (capacity {CPU_ECHO_CAPACITY})": True}
# ECHO's rows in the batch comparison: keyword arguments of echo_replay over the default.
ECHO_RUNS = {"echo": {}, "echo, no start-up curve": {"startup": False},
             "echo, other mode": {"other_mode": True}}
# --ablations: ECHO with a mechanism switched off (EchoTuning fields).
ECHO_ABLATIONS = {"echo, no match-length buckets": {"tuning": {"match_edges": (1,)}},
                  "echo, no outlier band": {"tuning": {"outlier_band": 0.0}},
                  # (this replay's CPU cost has no drafted-step extra, so it shows the
                  # share's cost where there is none, not its gain)
                  "echo, no drafted-step share": {"tuning": {"drafted_share": 0.0}},
                  "echo, no probe": {"tuning": {"probe_after": 1 << 30}},
                  "echo, no start-up curve, no probe": {"startup": False,
                                                        "tuning": {"probe_after": 1 << 30}}}


def _with_speedup(result: dict, none: dict) -> dict:
    result["modeled_speedup"] = none["seconds"] / result["seconds"] if result["seconds"] else None
    return result


def simulate(rows: list[dict]) -> dict[str, Any]:
    """Batch 1 on this CPU's cost: every drafter, and ECHO's variants."""
    out = {}
    none = replay(rows, None)
    for name, draft in methods().items():
        start = time.perf_counter()
        out[name] = _with_speedup(replay(rows, draft and PerRequest(draft)), none)
        out[name]["replay_s"] = time.perf_counter() - start
    if all("topk_logprobs" in row for row in rows):  # traces recorded before had none
        for name, trees in ECHO_VARIANTS.items():
            start = time.perf_counter()
            out[name] = _with_speedup(echo_replay(rows, CPU_ECHO_CAPACITY, trees), none)
            out[name]["replay_s"] = time.perf_counter() - start
    return out


def with_stalls(cost: Callable[[int, int, int], float], rate: float, size: float,
                seed: int = 0) -> Callable[[int, int, int], float]:
    """``cost`` with stalls: a step, at random with probability ``rate``, takes
    ``1 + size`` times as long (the VM pausing, a slow first call); every replay with
    the same ``seed`` meets the same draws."""
    rng = np.random.default_rng(seed)
    return lambda *step: cost(*step) * (1.0 + size if rng.random() < rate else 1.0)


def simulate_batches(rows: list[dict], batch_sizes: list[int], requests_per_slot: int = 4,
                     ablations: bool = False, stalls: tuple[float, float] = (0.0, 0.0)
                     ) -> list[dict[str, Any]]:
    """Fixed-K drafters against ECHO (and with ``ablations`` its tuning ablations), per
    cost curve and batch size.

    ``requests_per_slot`` x batch requests pass through the batch (rows cycled), so
    that the batch stays full most of the time, as under steady serving load. With one
    request per slot the run ends with the slowest request, whatever the others
    gained (the offline benchmark's shape: all prompts submitted at once). ``stalls``:
    (rate, size) of :func:`with_stalls` on every step of every replay."""
    fixed = {"ngram k=4 m1..3 (vLLM)": vllm_ngram(4, 1, 3),
             "logitspec chain K=4": logitspec_chain(4)}
    echo_runs = {**ECHO_RUNS, **(ECHO_ABLATIONS if ablations else {})}
    out = []
    for curve_name, (cost, capacity, trees) in COST_CURVES.items():
        for batch in batch_sizes:
            count = max(len(rows), requests_per_slot * batch)

            def steps():  # every replay meets the same stalls
                return with_stalls(cost, *stalls) if stalls[0] else cost
            none = replay(rows, None, batch, steps(), count)
            runs = {name: replay(rows, PerRequest(draft), batch, steps(), count)
                    for name, draft in fixed.items()}
            for name, kwargs in echo_runs.items():
                kwargs = dict(kwargs)
                mode = trees != kwargs.pop("other_mode", False)
                label = name.replace("other mode", "trees" if mode else "chains")
                runs[label] = echo_replay(rows, capacity, mode, batch, steps(), count,
                                          probe_cost=cost, **kwargs)
            for name, result in runs.items():
                out.append({"cost": curve_name, "batch": batch, "method": name,
                            "requests": count, **_with_speedup(result, none)})
    return out


def low_acceptance_first(rows: list[dict]) -> list[dict]:
    """The rows in order of vLLM ngram's tokens per step, lowest first: a workload whose
    early requests barely copy and whose later ones do (rates learned early are low)."""
    drafter = PerRequest(vllm_ngram(4, 1, 3))
    return sorted(rows, key=lambda row: replay([row], drafter)["tokens_per_step"])


def batch_table(results: list[dict], batch_sizes: list[int]) -> str:
    cells: dict[tuple[str, str], dict[int, str]] = {}
    for r in results:
        cells.setdefault((r["cost"], r["method"]), {})[r["batch"]] = (
            f"{r['modeled_speedup']:.2f} ({r['tokens_per_step']:.2f})")
    return bench_common.markdown_table(
        ["cost", "method", *[f"batch {b}" for b in batch_sizes]],
        [[cost, method, *[by_batch.get(b) for b in batch_sizes]]
         for (cost, method), by_batch in cells.items()])


def _warm_up() -> None:
    """Compile the numba kernels before anything is timed."""
    from vllm_echo.algos import echo

    fake = {"prompt_ids": [1, 2, 3, 1, 2], "output_ids": [3, 1, 2, 3],
            "topk_ids": [[3, 4]] * 4}
    for draft in methods().values():
        replay([fake], draft and PerRequest(draft))
    echo.warm_up()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", type=Path, default=None,
                   help=f"trace JSONL to replay (default {DEFAULT_TRACE.name} when present)")
    p.add_argument("--record", type=Path, default=None, metavar="TRACE",
                   help="record a trace from the model into this JSONL, then replay it")
    p.add_argument("--dataset", default="spec_bench_question.jsonl")
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--limit", type=int, default=None, help="replay only the first N prompts")
    p.add_argument("--batch-sizes", nargs="*", type=int, default=[1, 8, 24, 64],
                   help="batch sizes of the ECHO-vs-fixed-methods comparison (none: skip it)")
    p.add_argument("--requests-per-slot", type=int, default=4,
                   help="requests through the batch per batch slot in that comparison")
    p.add_argument("--ablations", action="store_true",
                   help="add ECHO's tuning ablations (EchoTuning switches) to that comparison")
    p.add_argument("--stalls", nargs=2, type=float, default=(0.0, 0.0),
                   metavar=("RATE", "SIZE"),
                   help="in that comparison a step stalls with probability RATE, taking "
                        "1 + SIZE times as long (e.g. 0.05 1.0; --ablations shows what "
                        "ECHO's outlier band does about it)")
    p.add_argument("--low-acceptance-first", action="store_true",
                   help="replay the prompts in order of acceptance, lowest first")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--smoke", action="store_true",
                   help="CI: replay 2 prompts of the shipped trace (record 2x16 if none)")
    args = p.parse_args(argv)

    trace = args.record or args.trace or DEFAULT_TRACE
    if args.smoke:
        args.limit = 2
        args.batch_sizes, args.requests_per_slot = [1, 3], 1
        if not args.record and not (args.trace or DEFAULT_TRACE).is_file():
            args.record = trace = Path(tempfile.mkdtemp()) / "smoke_trace.jsonl"
            args.num_prompts, args.max_tokens = 2, 16
    if args.record:
        record(args.record, args.dataset, args.num_prompts, args.max_tokens, args.model,
               args.dtype)
    if not trace.is_file():
        p.error(f"no trace at {trace}; record one with --record {trace}")
    meta, rows = load_trace(trace, args.limit)
    _warm_up()
    if args.low_acceptance_first:
        rows = low_acceptance_first(rows)
    start = time.perf_counter()
    results = simulate(rows)
    repo = Path(__file__).resolve().parents[1]
    shown = trace.resolve()  # inside the repository: relative, so result files are portable
    shown = shown.relative_to(repo) if shown.is_relative_to(repo) else shown
    report = {"benchmark": "simulate", "trace": str(shown), "trace_meta": meta,
              "low_acceptance_first": args.low_acceptance_first,
              "replayed_prompts": len(rows), "replay_s": time.perf_counter() - start,
              "environment": bench_common.environment(), "methods": results}
    table = bench_common.markdown_table(
        ["method", "tokens/step", "drafted/step", "modeled speed-up (batch 1 CPU cost)"],
        [[name, r["tokens_per_step"], r["drafted_per_step"], r["modeled_speedup"]]
         for name, r in results.items()])
    print(f"{len(rows)} prompts, {sum(len(r['output_ids']) for r in rows)} output tokens, "
          f"replayed in {report['replay_s']:.1f} s\n\n{table}")
    if args.batch_sizes and all("topk_logprobs" in row for row in rows):
        start = time.perf_counter()
        report["batches"] = simulate_batches(rows, args.batch_sizes, args.requests_per_slot,
                                             args.ablations, tuple(args.stalls))
        report["stalls"] = list(args.stalls)
        report["batches_replay_s"] = time.perf_counter() - start
        print(f"\nModeled speed-up over none (tokens per forward) by batch size, "
              f"{args.requests_per_slot} requests per batch slot, replayed in "
              f"{report['batches_replay_s']:.1f} s\n")
        print(batch_table(report["batches"], args.batch_sizes))
    if args.json:
        bench_common.write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
