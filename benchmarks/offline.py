# SPDX-License-Identifier: Apache-2.0
"""Offline comparison of speculative methods across batch sizes.

    python benchmarks/offline.py                       # all methods, batch 1 8 24 64
    python benchmarks/offline.py --methods none ngram logitspec --batch-sizes 1 8
    python benchmarks/offline.py --spec 'ls8={"method":"logitspec","num_speculative_tokens":8}'
    python benchmarks/offline.py --smoke               # CI: 2 prompts, batch 1, 16 tokens
    python benchmarks/offline.py --methods none suffix # after scripts/bootstrap_suffix.sh
    python benchmarks/offline.py --dataset tool_call_question.jsonl --batch-sizes 1 8 16
    python benchmarks/offline.py --multi-turn --dataset agent_loop_question.jsonl \\
        --max-model-len 8192
    python benchmarks/offline.py --temperature 0.7 --top-p 0.95 --batch-sizes 1 8

Every (method, batch size) runs in its own process (offline_worker.py): no engine
state, caches or compiled kernels are shared, and a crash costs one row only. Engines
run in vLLM's default mode, compiled (torch.compile, and CUDA graphs on a GPU), as
users run them; ``--eager`` runs them without (vLLM's ``enforce_eager``: a faster start,
slower steps). results.json records the mode asked for (``enforce_eager``) and, per
row, the one each engine ran in (``execution_mode``).
All configurations of one batch size get the same prompts, rendered once here with
the model's chat template (each worker checks the rendering against ``llm.chat``).

Batch size b means: max_num_seqs = b and all prompts submitted at once, with
max(num_prompts, b) prompts so the batch starts full; with the defaults that is 24
prompts for b <= 24 and 64 for b = 64. Throughput is output tokens over the wall
clock of that generation (after a 1-prompt warm-up, or none with ``--no-warmup``: a
cold start; with ``--window-steps N``, the tokens of a fixed N decode steps over their
time), ratios are to ``none`` of the same batch size in the same invocation. No
prompt reaches an engine twice: the warm-up prompt is never measured, and a prompt
whose text repeats an earlier one is passed over (a drafter that remembered earlier
requests would otherwise replay answers it had seen).

``--multi-turn`` plays every turn of each row (the agent loop: BFCL's multi-turn
conversations, whose function schemas become the system message): the conversations
of a batch advance turn by turn, each answer appended to its history (chat format)
before the next user turn; throughput counts every generated token over the turns'
generation time, identity compares each conversation's tokens over all its turns.
The conversations fit max_model_len with every answer max_tokens long (the agent
loop's need 8192).

``--repeats R`` runs every configuration R times, in rounds: each round runs every
method once, in an order rotated by one each round, so no method always goes first
or last. Ratios are paired by round (method / reference of the same round), which
cancels the machine's drift between rounds; the summary gives medians and ranges.

``--interleave`` (batch 1): within a round, every method's engine is started in turn
and the prompts go to them one at a time, each prompt to every method in turn (the
order rotated per prompt), so a method's wall time is the sum of its prompts' and a
slow stretch of a shared machine costs every method alike, which whole-run rounds
cannot pair when the machine's speed drifts within a round.

Sampling: greedy by default; ``--temperature T`` (> 0) with ``--top-p P`` samples
every request with seed 0, the same for every method. Speculative sampling keeps the
output distribution, not the samples: a method's outputs need not match ``none``'s
token for token, so identity with ``none`` is compared only when greedy.

``suffix`` (vLLM's SuffixDecoding) rows run in a venv of their own (offline_runner.py).

The parts: this script (arguments, the rows in run order), offline_prompts.py (the
prompts and the KV cache), offline_runner.py (the one runner of workers, whole or
interleaved), offline_worker.py with offline_steps.py (one configuration's engine, step
by step), offline_report.py (ratios, summary, results.md, plots).

Writes results.json, results.md and (with matplotlib) PNG plots into --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402
import offline_prompts  # noqa: E402
import offline_report  # noqa: E402
import offline_runner  # noqa: E402

from vllm_echo.engines import SPECULATIVE_CONFIGS  # noqa: E402

# name -> speculative_config (None = no speculation). Methods the installed plugin
# rejects are reported as unavailable, so new ablations show up once they land.
METHODS: dict[str, dict | None] = dict(SPECULATIVE_CONFIGS)

SMOKE = dict(num_prompts=2, batch_sizes=[1], max_tokens=16,
             methods=["none", "logitspec", "echo"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=None,
                   help=f"subset of: {' '.join(METHODS)} (plus names given with --spec)")
    p.add_argument("--spec", action="append", default=[], metavar="NAME=JSON",
                   help="add or override a method: NAME={speculative config JSON} or NAME=null")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 24, 64])
    p.add_argument("--num-prompts", type=int, default=24,
                   help="prompts per configuration; max(this, batch size) are used")
    p.add_argument("--dataset", default="spec_bench_question.jsonl",
                   help="JSONL path, or a file name in vllm_echo/data "
                        "(e.g. humaneval_question.jsonl, gsm8k_question.jsonl)")
    p.add_argument("--multi-turn", action="store_true",
                   help="play every turn of each row, the model's answer appended to the "
                        "history before the next user turn; a row's 'functions' become its "
                        "system message (agent_loop_question.jsonl)")
    p.add_argument("--model", default=None, help="local HF folder (default: embedded model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--eager", action="store_true",
                   help="engines without torch.compile and CUDA graphs (vLLM's "
                        "enforce_eager); default: vLLM's compiled mode")
    p.add_argument("--attention-backend", default=None,
                   help="vLLM attention backend for every method (CUDA trees: FLEX_ATTENTION)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy (default); > 0: sampled, seed 0 for every request")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling with --temperature > 0 (default 1.0: off)")
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV cache size (default: room for the batch's longest requests at once)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per configuration")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default benchmarks/results/offline-<time>)")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of every configuration (order rotated each round); "
                        "ratios are paired by round, the summary shows medians")
    p.add_argument("--reference", default="none",
                   help="method every other one is also compared with, per round "
                        "(e.g. echo, to read echo / ngram directly)")
    p.add_argument("--no-warmup", action="store_true",
                   help="a cold start: measure each fresh engine from its first request, "
                        "with no warm-up request before (kernels compile and drafters "
                        "learn during the measured run)")
    p.add_argument("--window-steps", type=int, default=None, metavar="N",
                   help="measure a fixed number of decode steps: the N engine steps after "
                        "the first batch-size prompts' prefill, then stop; throughput is "
                        "those steps' tokens over their time, identity is checked on the "
                        "tokens both runs emitted")
    p.add_argument("--interleave", action="store_true",
                   help="batch 1: run a round's methods side by side, prompt by prompt")
    p.add_argument("--smoke", action="store_true",
                   help="CI: 2 prompts, batch 1, max_tokens 16, methods none and logitspec")
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        p.error("--temperature must be >= 0 and --top-p in (0, 1]")
    if args.top_p != 1 and args.temperature == 0:
        p.error("--top-p needs --temperature > 0 (greedy decoding ignores it)")
    if args.window_steps is not None and (args.window_steps < 1 or args.interleave
                                          or args.multi_turn):
        p.error("--window-steps needs N >= 1, and neither --interleave nor --multi-turn")
    return args


def method_table(args: argparse.Namespace) -> dict[str, dict | None]:
    table = dict(METHODS)
    for item in args.spec:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--spec expects NAME=JSON, got {item!r}")
        table[name] = json.loads(raw)
    names = args.methods or ([*METHODS] + [s.partition("=")[0] for s in args.spec
                                           if s.partition("=")[0] not in METHODS])
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; known: {sorted(table)}")
    # "none" first: every other row of a batch size is compared with it.
    names = sorted(dict.fromkeys(names), key=lambda n: n != "none")
    return {n: table[n] for n in names}


def round_order(names: list[str], repeats: int) -> list[tuple[int, str]]:
    """(round, method) in run order: every round runs each method once, the order
    rotated by one per round, so no method always runs first or last."""
    return [(k, n) for k in range(repeats)
            for n in names[k % len(names):] + names[:k % len(names)]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vllm_echo.models import resolve_model

    methods = method_table(args)
    if args.reference not in methods:
        raise SystemExit(f"--reference {args.reference!r} is not among the methods run")
    model = resolve_model(args.model)
    out = args.out or bench_common.RESULTS_DIR / time.strftime("offline-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)

    count = max([args.num_prompts, *args.batch_sizes])
    if args.multi_turn:
        prompts, lengths, warm_ids, skipped = offline_prompts.prepare_conversations(
            args, model, count)
        items = {"conversations": [{"system": c.system, "turns": list(c.turns)}
                                   for c in prompts]}
    else:
        prompts, prompt_ids, warm_ids, skipped = offline_prompts.prepare_prompts(
            args, model, count)
        lengths, items = [len(p) for p in prompt_ids], {"prompt_ids": prompt_ids}
    if not prompts:
        raise SystemExit(f"none of {args.dataset}'s prompts fits --max-model-len "
                         f"{args.max_model_len} with --max-tokens {args.max_tokens}"
                         + (" at every turn (the agent loop needs 8192)"
                            if args.multi_turn else ""))
    if len(prompts) < min(args.num_prompts, count):
        print(f"note: {len(prompts)} prompts run, {count} asked: the dataset has no more "
              "that fit max_model_len", file=sys.stderr)

    report: dict[str, Any] = {
        "benchmark": "offline", "model": model, "dataset": args.dataset,
        "max_tokens": args.max_tokens, "temperature": args.temperature,
        "top_p": args.top_p, "max_model_len": args.max_model_len,
        "batch_sizes": args.batch_sizes,
        "methods": methods, "skipped_prompts_too_long": skipped,
        "environment": bench_common.environment(args.dtype), "notes": [], "results": [],
        "repeats": args.repeats, "reference": args.reference,
        "interleaved": bool(args.interleave), "enforce_eager": bool(args.eager),
        "multi_turn": bool(args.multi_turn), "warmup": not args.no_warmup,
        "window_steps": args.window_steps,
    }
    unavailable, pythons = offline_runner.suffix_interpreters(
        methods, report["environment"], report["notes"])
    per_token = offline_prompts.kv_bytes_per_token(model, args.dtype)

    def job_for(name: str, batch: int) -> dict:
        n = max(args.num_prompts, batch)
        kv = args.kv_cache_gib * 2**30 if args.kv_cache_gib else \
            offline_prompts.kv_cache_bytes(lengths[:n], batch, args, per_token)
        return {"model": model, "speculative_config": methods[name], "dtype": args.dtype,
                "max_model_len": args.max_model_len, "kv_cache_bytes": int(kv),
                "attention_backend": args.attention_backend, "enforce_eager": args.eager,
                "warmup": not args.no_warmup, "window_steps": args.window_steps,
                "batch_size": batch, "max_tokens": args.max_tokens,
                "temperature": args.temperature, "top_p": args.top_p,
                **{key: value[:n] for key, value in items.items()},
                "categories": [p.category for p in prompts[:n]],
                "warmup_prompt_ids": warm_ids}

    report["results"] = run_rows(args, methods, job_for, logs, unavailable, pythons)
    offline_report.compare_with_none(report["results"], args.temperature)
    report["summary"] = offline_report.summarize(report["results"], args.reference)
    report["notes"] += warnings(args, report["results"])
    report["plots"] = offline_report.plots(report, out)
    bench_common.write_json(out / "results.json", report)
    text = offline_report.markdown(report)
    (out / "results.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"results in {out}")
    return 0


def run_rows(args, methods: dict, job_for, logs: Path, unavailable: dict[str, str],
             pythons: dict[str, str]) -> list[dict]:
    """Every (batch size, round, method) row, in run order: each configuration's worker
    on its own, or at batch 1 with ``--interleave`` the round's workers side by side."""
    from tqdm import tqdm

    def tag_for(name: str, batch: int, round_: int) -> str:
        return f"{name}-b{batch}" + (f"-r{round_}" if args.repeats > 1 else "")

    configs = [(b, k, n) for b in args.batch_sizes
               for k, n in round_order(list(methods), args.repeats)]
    bar = tqdm(configs, desc="configs", unit="cfg", file=sys.stderr)
    interleaved: dict[tuple[int, int], dict[str, dict]] = {}  # (batch, round) -> results
    rows = []
    for batch, round_, name in bar:
        bar.set_postfix_str(f"{name} b={batch} round {round_}")
        row: dict[str, Any] = {"method": name, "batch_size": batch, "round": round_,
                               "speculative_config": methods[name]}
        if name in unavailable:
            row.update(status="unavailable", reason=unavailable[name])
        elif args.interleave and batch == 1:
            if (batch, round_) not in interleaved:  # the round's first method: run them all
                names = [n for b, k, n in configs if (b, k) == (batch, round_)
                         and n not in unavailable]
                interleaved[batch, round_] = offline_runner.run_interleaved(
                    {n: job_for(n, batch) for n in names}, logs,
                    {n: tag_for(n, batch, round_) for n in names}, args.timeout, round_,
                    pythons)
            row.update(interleaved[batch, round_][name])
        else:
            row.update(offline_runner.run_config(job_for(name, batch), logs,
                                                 tag_for(name, batch, round_), args.timeout,
                                                 pythons.get(name)))
        if name in pythons:
            row["python"] = pythons[name]
        if row["status"] == "ok":
            row["accepted_by_source"] = offline_report.accepted_by_source(
                row.get("plugin_stats"))
        if row["status"] == "unavailable":  # same config at every batch size
            unavailable[name] = row["reason"]
        rows.append(row)
        bar.write(f"{name:>24} b={batch:<3} {row['status']:<11} "
                  + (f"{row['output_tokens_per_s']:.1f} tok/s, "
                     f"{row['tokens_per_forward']:.2f} tok/fwd" if row["status"] == "ok"
                     else str(row.get("reason", ""))[:120]))
    return rows


def warnings(args, rows: list[dict]) -> list[str]:
    """Notes on what the run did otherwise than asked."""
    notes = []
    asked = "eager" if args.eager else "compiled"
    other = sorted({f"{r['method']} b={r['batch_size']}" for r in rows
                    if (r.get("execution_mode") or {}).get("mode", asked) != asked})
    if other:
        notes.append(f"warning: asked for {asked} engines, but vLLM ran "
                     f"{', '.join(other)} otherwise (execution_mode in results.json)")
    if any(r.get("chat_render_matches") is False for r in rows):
        notes.append("warning: prompt rendering differs from llm.chat's")
    if args.temperature > 0:
        notes.append("temperature > 0: identity with `none` is not compared")
    return notes


if __name__ == "__main__":
    sys.exit(main())
