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

Replay (simulate_replay.py) drafts with each method at every step and verifies the
draft greedily against the recorded continuation; a step's time comes from a cost
function (simulate_costs.py), and ECHO (simulate_echo.py) learns from it as the plugin
learns from measured step times.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402
from simulate_costs import COST_CURVES, with_stalls  # noqa: E402
from simulate_echo import ECHO_ABLATIONS, ECHO_RUNS, ECHO_VARIANTS, echo_replay  # noqa: E402
from simulate_replay import (PerRequest, logitspec_chain, methods, replay,  # noqa: E402
                             vllm_ngram)

from vllm_echo.plugin.config_shim import CPU_ECHO_CAPACITY  # noqa: E402  (imports no vLLM)

TOPK = 64
DEFAULT_TRACE = Path(__file__).resolve().parent / "traces" / "spec_bench_12x128.jsonl"


# -- recording -----------------------------------------------------------------------

def record(path: Path, dataset: str, num_prompts: int, max_tokens: int, model: str | None,
           dtype: str) -> dict:
    from vllm import SamplingParams

    from vllm_echo import prompts
    from vllm_echo.engines import build_llm
    from vllm_echo.models import resolve_model

    model = resolve_model(model)
    llm = build_llm(model=model, dtype=dtype, enforce_eager=True, max_logprobs=TOPK)
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
                runs[label] = echo_replay(rows, kwargs.pop("capacity", capacity), mode,
                                          batch, steps(), count,
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
