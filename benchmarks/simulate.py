# SPDX-License-Identifier: Apache-2.0
"""Trace simulator: replay recorded greedy generations through the drafters, no model.

    python benchmarks/simulate.py --record benchmarks/traces/spec_bench_12x128.jsonl
    python benchmarks/simulate.py benchmarks/traces/spec_bench_12x128.jsonl
    python benchmarks/simulate.py --smoke            # CI

Recording runs the embedded model greedily (no speculation) and stores per prompt the
prompt ids, the output ids and, per output position, the top-64 token ids (and their
log-probabilities) of the logits that produced that token (vLLM logprobs in the default raw_logprobs mode:
log_softmax of the raw logits, so the top-k order is the raw logits' order).

Replay: at each step the context is prompt + accepted output so far and its last
token is the root; a method drafts a chain or forest, which is verified greedily
(``vllm_echo.algos.verify.verify_greedy``) against the true continuation, and
accepted + 1 tokens are emitted. The first output token costs one step (prefill).
tokens/step = output tokens / steps; drafted/step = draft tokens (root excluded) per
decode step. Since greedy decoding is lossless, the true continuation is exactly what
the target would have emitted, so this is the acceptance of a real run without the
verification cost.
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


def replay(rows: list[dict], draft: Callable | None, tree_cost: float = 0.25
           ) -> dict[str, Any]:
    from vllm_echo.algos.verify import verify_greedy

    steps = tokens = drafted = decode_steps = 0
    seconds = seconds_none = 0.0
    for row in rows:
        state = Replay(row)
        n = state.n_out
        if n == 0:
            continue
        steps += 1  # prefill emits output 0
        seconds_none += (n - 1) * step_cost(1)
        pos = 0
        while pos < n - 1:
            if draft is None:
                cand, par = np.empty(0, np.int32), np.empty(0, np.int32)
            else:
                cand, par = draft(state, pos)
            path, _ = verify_greedy(cand, par, state.target_argmax(pos, cand, par))
            emitted = min(len(path) + 1, n - 1 - pos)
            is_tree = len(par) > 0 and not np.array_equal(par, np.arange(-1, len(par) - 1))
            cost = step_cost(1 + len(cand)) + (tree_cost if is_tree else 0.0)
            if hasattr(draft, "verdict"):  # a drafter that learns (ECHO)
                draft.verdict(state, pos, path, emitted, cost, len(cand), is_tree)
            seconds += cost
            pos += emitted
            steps += 1
            decode_steps += 1
            drafted += len(cand)
        tokens += n
    return {"tokens": tokens, "steps": steps,
            "tokens_per_step": tokens / steps if steps else None,
            "drafted_per_step": drafted / decode_steps if decode_steps else None,
            "modeled_speedup": seconds_none / seconds if seconds else None}


# Decode step time vs tokens verified at batch 1, relative to a plain step (fp32, this
# CPU, vLLM 0.32): medians measured in the engine up to 17 tokens (34.6 ms for 1); 33
# and 65 from ../shared/docs/baselines.md. Not monotone: oneDNN is slower at 2 rows
# than at 4.
CPU_B1_COST = ((1, 2, 3, 4, 5, 6, 7, 9, 10, 14, 17, 33, 65),
               (1.0, 1.093, 0.977, 0.945, 0.965, 0.925, 1.037, 1.188, 1.199, 1.376, 1.441,
                2.0, 2.9))


def step_cost(num_tokens: int, curve=CPU_B1_COST) -> float:
    """Relative step time, extended past the last point with the last segment's slope."""
    ks, ts = curve
    if num_tokens <= ks[-1]:
        return float(np.interp(num_tokens, ks, ts))
    return ts[-1] + (num_tokens - ks[-1]) * (ts[-1] - ts[-2]) / (ks[-1] - ks[-2])


class EchoDrafter:
    """ECHO at batch 1 as a replay drafter: the planner sees each step's forest and
    learns from each verdict. The engine's timings are replaced by ``step_cost`` (plus
    the tree cost for a step verified as a tree), fed to the planner's cost model as
    the plugin feeds measured ones. ``stats()``: its own planning time per step and
    what it learned."""

    def __init__(self, overrides: dict | None = None, probe_every: int = 16,
                 probe_nodes: int = 4):
        from vllm_echo.algos.echo.planner import EchoPlanner
        from vllm_echo.config import EchoSettings

        self.settings = EchoSettings.from_dict({"method": "echo", "num_speculative_tokens": 63,
                                                **(overrides or {})})
        self.cap = self.settings.max_drafts
        self.planner = EchoPlanner(self.settings)
        self.probe_every, self.probe_nodes = probe_every, probe_nodes
        self.steps = self.tree_steps = 0
        self.plan_s = 0.0
        self._plan = None

    def __call__(self, state: "Replay", pos: int):
        from vllm_echo.algos.echo.planner import Candidates
        from vllm_echo.algos.forest import build_forest_nodes

        if state.topk_logp is None:
            raise ValueError("the trace has no topk_logprobs; record it again (--record)")
        start = time.perf_counter()
        self._plan = None
        cand = par = np.empty(0, np.int32)
        probe = self.planner.nothing_can_pay(1)
        if not probe or self.steps % self.probe_every == 0:
            settings = self.settings
            nodes = build_forest_nodes(state.index_at(pos), state.topk[pos],
                                       min(settings.capacity, self.cap + 1),
                                       max_chains=(1 << 30) if settings.tree else 1)
            logp = np.asarray(state.topk_logp[pos], dtype=np.float64)
            (cand, par), self._plan = (x[0] for x in self.planner.plan(
                [Candidates(*nodes, head_logp=logp)], self.cap,
                explore=self.probe_nodes if probe else 0))
        self.plan_s += time.perf_counter() - start
        return cand, par

    def verdict(self, state: "Replay", pos: int, path: list[int], emitted: int, cost: float,
                num_drafts: int, is_tree: bool) -> None:
        if self._plan is not None and len(path) + 1 == emitted:
            next_token = int(state.full[state.prompt_len + pos + emitted])
            self.planner.observe([(self._plan, path, next_token)])
        self.planner.cost.add(1 + num_drafts, cost, int(is_tree), num_drafts > 0)
        self.steps += 1
        self.tree_steps += is_tree

    def stats(self) -> dict[str, Any]:
        cost = self.planner.cost
        return {"plan_ms_per_step": 1e3 * self.plan_s / self.steps if self.steps else None,
                "tree_steps": self.tree_steps, "k_max_last": self.planner.last_k_max,
                "cost_model": cost.coef, "cost_knee": cost.knee, "tree_cost": cost.tree_cost}


def echo_replay(rows: list[dict], overrides: dict | None = None) -> dict[str, Any]:
    drafter = EchoDrafter(overrides)
    return {**replay(rows, drafter), **drafter.stats()}


ECHO_VARIANTS = {"echo (batch 1, capacity 16)": {"capacity": 16},
                 "echo chain mode (batch 1)": {"tree": False}}


def simulate(rows: list[dict]) -> dict[str, Any]:
    out = {}
    for name, draft in methods().items():
        start = time.perf_counter()
        out[name] = replay(rows, draft)
        out[name]["replay_s"] = time.perf_counter() - start
    if all("topk_logprobs" in row for row in rows):  # traces recorded before had none
        for name, overrides in ECHO_VARIANTS.items():
            start = time.perf_counter()
            out[name] = echo_replay(rows, overrides)
            out[name]["replay_s"] = time.perf_counter() - start
    return out


def _warm_up() -> None:
    """Compile the numba kernels before anything is timed."""
    fake = {"prompt_ids": [1, 2, 3, 1, 2], "output_ids": [3, 1, 2, 3],
            "topk_ids": [[3, 4]] * 4}
    for draft in methods().values():
        replay([fake], draft)


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
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--smoke", action="store_true",
                   help="CI: replay 2 prompts of the shipped trace (record 2x16 if none)")
    args = p.parse_args(argv)

    trace = args.record or args.trace or DEFAULT_TRACE
    if args.smoke:
        args.limit = 2
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
    start = time.perf_counter()
    results = simulate(rows)
    report = {"benchmark": "simulate", "trace": str(trace), "trace_meta": meta,
              "replayed_prompts": len(rows), "replay_s": time.perf_counter() - start,
              "methods": results}
    table = bench_common.markdown_table(
        ["method", "tokens/step", "drafted/step", "modeled speed-up (batch 1 CPU cost)"],
        [[name, r["tokens_per_step"], r["drafted_per_step"], r["modeled_speedup"]]
         for name, r in results.items()])
    print(f"{len(rows)} prompts, {sum(len(r['output_ids']) for r in rows)} output tokens, "
          f"replayed in {report['replay_s']:.1f} s\n\n{table}")
    if args.json:
        bench_common.write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
