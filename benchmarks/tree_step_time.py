# SPDX-License-Identifier: Apache-2.0
"""Step time of tree verification: the native CPU path, the flex path and a chain.

Every decode step each request verifies a draft of fixed shape and size (capacity C:
C - 1 drafts and the root) whose tokens are never accepted, so every step does the
same work: a tree of two equal branches from the root (half its rows leave the first
branch: the rows the native path verifies in a second call, as a chain), or a chain of
the same C - 1 drafts.
Contexts are synthetic token ids; prefix caching is off. Reported: the median wall
time of an engine step once every request decodes, per (path, C, batch, context),
and each path's ratio to the chain measured in the same round.

``--chain-lengths K ...`` measures the chain alone instead: the step time at batch 1
with K drafts (0: none), one engine, the lengths in an order rotated each round, each
also as its ratio to the step without drafts of the same round (the curve that
simulate.py prices batch-1 steps with).

Usage::

    python benchmarks/tree_step_time.py [--capacities 8 16 32] [--batches 1 8]
        [--contexts 300 2000] [--dtype bfloat16] [--rounds 2] [--out FILE.json]
    python benchmarks/tree_step_time.py --chain-lengths 0 1 2 3 4 5 6 8 10 12 16 \
        --contexts 300 --dtype float32 --rounds 5
    python benchmarks/tree_step_time.py --smoke --out FILE.json   # CI: C=4, batch 1, 64 tokens,
        eager, and chains of 0 and 2

Each (path, C) is one in-process engine; the rounds alternate the paths.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plugin_internals  # noqa: E402  (the fixed-shape proposer: why, in that file)
from bench_common import environment, write_json  # noqa: E402

from vllm_echo.engines import build_llm, drafter_stats, shutdown  # noqa: E402

PATHS = {  # name: tree, tree_attention
    "chain": (False, None),
    "native": (True, "native"),
    "flex": (True, "flex"),
}
MEASURED_STEPS = 12


def _engine(capacity: int, path: str, dtype: str, max_model_len: int, max_batch: int,
            eager: bool = False):
    # 3 GiB of KV cache: batch 8 of the longest contexts with room to spare. Stats off
    # (vLLM's default): only the drafter's counters are read, and logging them would be
    # work in the timed steps.
    return build_llm(**plugin_internals.fixed_shape_config(capacity, *PATHS[path]),
                     dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_batch,
                     enable_prefix_caching=False, kv_cache_memory_bytes=3 * 2**30,
                     enforce_eager=eager, disable_log_stats=True)


def decode_step_time(llm, batch: int, context: int, seed: int) -> float:
    """Median seconds of the engine steps in which every request decodes."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(seed)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=MEASURED_STEPS + 4, ignore_eos=True)
    for i in range(batch):
        ids = rng.integers(100, 20000, size=context).tolist()
        engine.add_request(f"{seed}-{i}", TokensPrompt(prompt_token_ids=ids), params)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    # the last MEASURED_STEPS steps are decodes of all requests (1 token each)
    return statistics.median(times[-MEASURED_STEPS:])


def _tree_verifications(llm) -> int:
    return drafter_stats(llm)["tree_verifications"]


def run(capacities, batches, contexts, dtype, rounds, paths=tuple(PATHS),
        eager: bool = False) -> list[dict]:
    rows = []
    # vLLM drafts only while the longest sequence plus a step's drafts and the next
    # step's fit in max_model_len (else it schedules zeros as a chain): leave room
    max_len = max(contexts) + MEASURED_STEPS + 4 + 2 * max(capacities) + 16
    for r in range(rounds):
        for capacity in capacities:
            order = list(paths) if r % 2 == 0 else list(reversed(paths))
            for path in order:
                llm = _engine(capacity, path, dtype, max_len, max(batches), eager)
                decode_step_time(llm, 1, 64, seed=999)  # compile and warm up
                for batch in batches:
                    for context in contexts:
                        before = _tree_verifications(llm)
                        seconds = decode_step_time(llm, batch, context, seed=len(rows))
                        trees = _tree_verifications(llm) - before
                        # every request verified a tree in every measured step (or none)
                        as_named = trees >= batch * MEASURED_STEPS if PATHS[path][0] \
                            else trees == 0
                        if not as_named:
                            raise RuntimeError(f"{path}: {trees} tree verifications at batch "
                                               f"{batch} over {MEASURED_STEPS}+ steps")
                        rows.append(dict(round=r, path=path, capacity=capacity, batch=batch,
                                         context=context, step_s=seconds))
                        print(f"round {r} {path:6s} C={capacity:2d} B={batch} "
                              f"ctx={context}: {seconds * 1e3:.1f} ms", flush=True)
                shutdown(llm)
                del llm
    return rows


def chain_curve(lengths: list[int], context: int, dtype: str, rounds: int,
                eager: bool = False) -> list[dict]:
    """Batch-1 step time with chains of each length, one engine (see the module doc)."""
    max_len = context + MEASURED_STEPS + 4 + 2 * max(lengths) + 16
    llm = _engine(max(lengths) + 1, "chain", dtype, max_len, 1, eager)
    decode_step_time(llm, 1, 64, seed=999)  # warm up
    rows = []
    for r in range(rounds):
        shift = r % len(lengths)
        for k in lengths[shift:] + lengths[:shift]:
            plugin_internals.set_chain_length(llm, k)
            seconds = decode_step_time(llm, 1, context, seed=len(rows))
            rows.append(dict(round=r, drafts=k, context=context, step_s=seconds))
            print(f"round {r} chain of {k:2d}: {seconds * 1e3:.1f} ms", flush=True)
    plain = {row["round"]: row["step_s"] for row in rows if row["drafts"] == 0}
    for row in rows:
        row["over_no_drafts"] = row["step_s"] / plain[row["round"]]
    shutdown(llm)
    return rows


def curve_summary(rows: list[dict]) -> list[dict]:
    """Per length: median step time and median ratio to no drafts (same round)."""
    out = []
    for k in sorted({row["drafts"] for row in rows}):
        mine = [row for row in rows if row["drafts"] == k]
        out.append(dict(drafts=k, step_ms=1e3 * statistics.median(r["step_s"] for r in mine),
                        over_no_drafts=statistics.median(r["over_no_drafts"] for r in mine)))
    return out


def summary(rows: list[dict]) -> list[dict]:
    """Per cell: median step time of each path and its median ratio to the chain of the
    same round."""
    cells = {}
    for row in rows:
        cells.setdefault((row["capacity"], row["batch"], row["context"]), {}).setdefault(
            row["round"], {})[row["path"]] = row["step_s"]
    out = []
    for (capacity, batch, context), by_round in sorted(cells.items()):
        cell = dict(capacity=capacity, batch=batch, context=context)
        for path in PATHS:
            if not all(path in r for r in by_round.values()):
                continue
            cell[f"{path}_ms"] = 1e3 * statistics.median(r[path] for r in by_round.values())
            if path != "chain":
                cell[f"{path}_over_chain"] = statistics.median(
                    r[path] / r["chain"] for r in by_round.values())
        out.append(cell)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacities", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--contexts", type=int, nargs="+", default=[300, 2000])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS),
                    help="paths to measure (chain is always one: ratios are to it)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--chain-lengths", type=int, nargs="+", default=None,
                    help="measure batch-1 chains of these lengths instead (0: no drafts)")
    ap.add_argument("--eager", action="store_true",
                    help="engines without torch.compile (vLLM's enforce_eager): every path "
                         "runs without the compile time, but steps are not timed as served")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: capacity 4, batch 1, context 64, one round, --eager, then the "
                         "chain curve with chains of 0 and 2, in one process and one report")
    args = ap.parse_args(argv)
    if args.smoke:
        args.capacities, args.batches, args.contexts, args.rounds = [4], [1], [64], 1
        args.eager = True
        args.chain_lengths = None
    if args.chain_lengths:
        if 0 not in args.chain_lengths:
            ap.error("--chain-lengths must include 0 (ratios are to the step without drafts)")
        rows = chain_curve(args.chain_lengths, args.contexts[0], args.dtype, args.rounds,
                           args.eager)
        curve = curve_summary(rows)
        print("\n| drafts | step ms | / no drafts |\n|---|---|---|")
        for c in curve:
            print(f"| {c['drafts']} | {c['step_ms']:.2f} | {c['over_no_drafts']:.3f} |")
        if args.out:
            write_json(args.out, {"environment": environment(args.dtype), "rows": rows,
                                  "curve": curve})
        return 0
    paths = ["chain"] + [p for p in args.paths if p != "chain"]
    rows = run(args.capacities, args.batches, args.contexts, args.dtype, args.rounds, paths,
               args.eager)
    cells = summary(rows)
    tree_paths = paths[1:]
    print("\n| C | batch | context | " + " | ".join(f"{p} ms" for p in paths) + " | "
          + " | ".join(f"{p} / chain" for p in tree_paths) + " |\n|"
          + "---|" * (3 + len(paths) + len(tree_paths)))
    for c in cells:
        print(f"| {c['capacity']} | {c['batch']} | {c['context']} | "
              + " | ".join(f"{c[p + '_ms']:.1f}" for p in paths) + " | "
              + " | ".join(f"{c[p + '_over_chain']:.2f}" for p in tree_paths) + " |")
    report = {"environment": environment(args.dtype), "rows": rows, "cells": cells}
    if args.smoke:
        report["curve"] = curve_summary(chain_curve([0, 2], args.contexts[0], args.dtype,
                                                    args.rounds, args.eager))
    if args.out:
        write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
