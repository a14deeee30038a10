# SPDX-License-Identifier: Apache-2.0
"""ECHO's benchmark matrix: workloads x batch sizes x dtypes, with its targets checked.

    python benchmarks/matrix.py                                  # the whole matrix (hours on a CPU)
    python benchmarks/matrix.py --workloads copy-edit --batch-sizes 1 --dtypes float32
    python benchmarks/matrix.py --smoke                          # CI: one tiny cell, every step runs
    python benchmarks/matrix.py --workloads tool-call agent-loop --dtypes float32
    python benchmarks/matrix.py --workloads spec-bench short-chat --batch-sizes 1 8 \
        --cells batch --methods none ngram logitspec echo --temperature 0.7 --top-p 0.95

Each cell (workload, dtype, batch size) is one ``offline.py`` run with ``--repeats``
paired rounds; at batch 1 each round is interleaved (``offline.py --interleave``: the
methods' engines side by side, prompt by prompt). Batch 1 runs one wave of prompts;
batch 8 runs steady load: 4 x 8 prompts, so the batch stays full while requests finish
and new ones start (likewise 4 x 16 at batch 16). Batch 64 measures a window: the 64
decode steps after the first 64 prompts' prefill, with 128 prompts queued so that a
slot whose request ends is refilled (``offline.py --window-steps 64``; run to the end,
one wave lasts as long as its slowest request, and drafts could only add steps' cost).

Workloads: spec-bench, copy-edit, long-context and short-chat (batch 1, 8 and 64 by
default), tool-call (BFCL single-turn function calls: batch 1, 8 and 16) and agent-loop
(BFCL multi-turn conversations, each turn generated after the model's own answer to the
previous one, ``offline.py --multi-turn``: batch 1); ``--batch-sizes`` sets one list
for all. A target is the median over rounds of
echo's throughput divided by the other method's *in the same round*; "best" is the
method with the highest median throughput in that cell. Engines run in vLLM's default
(compiled) mode; ``--eager`` passes ``--eager`` on to offline.py (vLLM's enforce_eager),
and every cell of matrix.json records its mode. Writes ``matrix.md`` and
``matrix.json`` into --out, with every cell's offline.py results next to them.

Cold-start cells (``--cells``; by default with the batch cells): per workload and
dtype, fresh engines measured from their first request with no warm-up at all
(``offline.py --no-warmup``), batch 16: the first 64 decode steps after the batch's
prefill (``offline.py --window-steps 64``; 16 prompts of up to 256 tokens, so no request
ends inside the window), none against echo; echo / none per round of the tokens per
second of those steps, target "echo >= none at cold start". Not for the agent loop,
whose turns are no single wave of prompts.

Sampled cells: ``--temperature T --top-p P`` (passed on to offline.py: every request
sampled with seed 0) make every cell of the run a sampled one, with the targets of a
greedy cell of its batch size. Its record carries ``temperature`` and ``top_p`` (a
greedy one 0 and 1.0; a cell without them is greedy), its results go to a folder of
their own, its workload reads e.g. ``spec-bench, T=0.7 top-p 0.95``, and it never
replaces the greedy cell of the same workload, dtype and batch size when published
(render_tables.py). Identity with ``none`` is not compared (``identical``: None).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402
import offline  # noqa: E402
import offline_report  # noqa: E402

# name -> (prompt file, fewest prompts at batch 1: Spec-Bench's 13 categories each get
# one; its first 8 are MT-Bench's, so 8 prompts would be the short-chat set again)
WORKLOADS = {
    "spec-bench": ("spec_bench_question.jsonl", 13),
    "copy-edit": ("copy_edit_question.jsonl", 1),
    "long-context": ("long_context_question.jsonl", 1),
    "short-chat": ("short_chat_question.jsonl", 1),
    # BFCL single-turn tool calls: 4 categories (simple, multiple, parallel, live simple)
    "tool-call": ("tool_call_question.jsonl", 4),
    # BFCL multi-turn conversations, played turn by turn with the model's own answers
    "agent-loop": ("agent_loop_question.jsonl", 1),
}
# offline.py options a workload needs: the agent loop's conversations (function schemas
# of up to two APIs, up to 7 turns) need up to 7,000 tokens at 128 tokens per answer.
WORKLOAD_ARGS = {"agent-loop": ["--multi-turn", "--max-model-len", "8192"]}
# Batch sizes a workload runs unless --batch-sizes names others (then all run those).
DEFAULT_BATCH_SIZES = [1, 8, 64]
WORKLOAD_BATCH_SIZES = {"tool-call": [1, 8, 16], "agent-loop": [1]}
# The fixed configurations echo is compared with, and echo's ablations (shown, not targets).
FIXED = ["none", "ngram", "ngram8", "logitspec", "logitspec-tree"]
ABLATIONS = ["echo-tree"]
# The cold-start cell: fresh engines, no warm-up at all, batch 16, the first 64 decode
# steps after the prefill, none against echo. A fixed number of steps, not of tokens:
# run to completion, every method takes as many steps as its slowest request (one wave)
# or slot (a queue), so drafts could only add cost; 256 tokens keep every request alive
# through the window.
COLD_START = dict(batch=16, prompts=16, max_tokens=256, window_steps=64,
                  methods=["none", "echo"])
# Batch 64 (and above): the decode steps measured after the first wave's prefill, and
# prompts queued per slot (a full batch through the window).
LOADED = dict(min_batch=64, window_steps=64, prompts_per_slot=2)
CELL_KINDS = ["batch", "cold-start"]
SMOKE = dict(workloads=["copy-edit"], batch_sizes=[1], dtypes=["float32"], repeats=1,
             prompts=2, max_tokens=16, methods=["none", "ngram", "echo"], cells=["batch"])


def sampling(cell: dict) -> tuple[float, float]:
    """A cell's (temperature, top_p); a cell recorded without them is greedy."""
    temperature = float(cell.get("temperature") or 0.0)
    top_p = cell.get("top_p")
    return temperature, 1.0 if top_p is None or temperature == 0 else float(top_p)


def sampling_label(cell: dict) -> str:
    """"T=0.7 top-p 0.95" for a sampled cell; "" for a greedy one."""
    temperature, top_p = sampling(cell)
    return f"T={temperature} top-p {top_p}" if temperature > 0 else ""


def cell_key(cell: dict) -> tuple:
    """What tells cells apart: a later one of the same key replaces an earlier one."""
    return (cell["workload"], cell["dtype"], cell["batch_size"], cell.get("kind", "batch"),
            *sampling(cell))


def workload_label(cell: dict) -> str:
    """The workload, then the cell's kind where it is not a batch cell, then its
    sampling where it is not greedy (matrix.md, the published tables)."""
    return ", ".join([cell["workload"]]
                     + (["cold start"] if cell.get("kind") == "cold-start" else [])
                     + ([sampling_label(cell)] if sampling_label(cell) else []))


def cell_folder(out: Path, workload: str, dtype: str, batch: int, kind: str,
                temperature: float = 0.0, top_p: float = 1.0) -> Path:
    """Where a cell's offline.py results go inside a matrix run's folder."""
    suffix = "cold-start" if kind == "cold-start" else f"b{batch}"
    if temperature > 0:
        suffix += f"-t{temperature}-p{top_p}"
    return out / f"{workload}-{dtype}-{suffix}"


def sampling_argv(args) -> list[str]:
    """offline.py's options for the run's sampling (none when greedy)."""
    if args.temperature == 0:
        return []
    return ["--temperature", str(args.temperature), "--top-p", str(args.top_p)]


def prompts_for(workload: str, batch: int, prompts: int) -> int:
    """Batch 1: one wave (``prompts``, at least the workload's fewest); batch 64: a
    window's queue (LOADED); other sizes: steady, 4 x b."""
    if batch == 1:
        return max(prompts, WORKLOADS[workload][1])
    if batch >= LOADED["min_batch"]:
        return LOADED["prompts_per_slot"] * batch
    return 4 * batch


def targets(batch: int, workload: str, kind: str = "batch") -> list[tuple[str, str, float]]:
    """(label, compared with: a method or "best", minimum ratio) for one cell."""
    if kind == "cold-start":
        return [("echo >= none at cold start", "none", 1.00)]
    if batch == 1:
        out = [("echo >= best at batch 1", "best", 1.00)]
        if workload == "copy-edit":
            out.append(("echo >= 1.10 x best on copy-heavy prompts", "best", 1.10))
        return out
    if batch >= 64:
        return [("echo >= 0.98 x none at batch 64", "none", 0.98),
                ("echo >= 1.15 x ngram at batch 64", "ngram", 1.15)]
    return [(f"echo >= none at batch {batch}, steady", "none", 1.00),
            (f"echo >= best at batch {batch}, steady", "best", 1.00)]


def paired(results: list[dict], method: str, other: str) -> list[float]:
    by = {(r["method"], r["round"]): r["output_tokens_per_s"]
          for r in results if r["status"] == "ok"}
    rounds = sorted({k for m, k in by if m == method})
    return [by[(method, k)] / by[(other, k)] for k in rounds if (other, k) in by]


def check_cell(report: dict, workload: str, batch: int, kind: str = "batch") -> list[dict]:
    summary = {e["method"]: e for e in report["summary"] if e["batch_size"] == batch}
    fixed = [m for m in summary if m in FIXED]
    best = max(fixed, key=lambda m: summary[m]["output_tokens_per_s"]["median"], default=None)
    rows = []
    for label, other, minimum in targets(batch, workload, kind):
        name = best if other == "best" else other
        ratios = paired(report["results"], "echo", name) if name in summary else []
        median = statistics.median(ratios) if ratios else None
        rows.append({"target": label, "against": name, "minimum": minimum,
                     "ratios": ratios, "median": median,
                     "met": None if median is None else median >= minimum})
    return rows


def run_cell(args, workload: str, dtype: str, batch: int, out: Path) -> dict:
    methods = args.methods or [*FIXED, "echo", *(ABLATIONS if args.ablations else [])]
    argv = ["--dataset", WORKLOADS[workload][0], "--dtype", dtype, "--batch-sizes", str(batch),
            "--num-prompts", str(prompts_for(workload, batch, args.prompts)),
            "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats),
            "--reference", "echo", "--out", str(out), "--methods", *methods,
            *WORKLOAD_ARGS.get(workload, []), *sampling_argv(args)]
    offline.main(argv + (["--interleave"] if batch == 1 else [])
                 + (["--window-steps", str(LOADED["window_steps"])]
                    if batch >= LOADED["min_batch"] else [])
                 + (["--eager"] if args.eager else []))
    return json.loads((out / "results.json").read_text(encoding="utf-8"))


def cold_start_workload(workload: str) -> bool:
    """A cold start is a queue of single prompts: not for the agent loop's turns."""
    return "--multi-turn" not in WORKLOAD_ARGS.get(workload, [])


def run_cold_start_cell(args, workload: str, dtype: str, out: Path) -> dict:
    """COLD_START: every round starts fresh engines that get no warm-up request."""
    argv = ["--dataset", WORKLOADS[workload][0], "--dtype", dtype,
            "--batch-sizes", str(COLD_START["batch"]),
            "--num-prompts", str(COLD_START["prompts"]),
            "--max-tokens", str(COLD_START["max_tokens"]), "--repeats", str(args.repeats),
            "--reference", "echo", "--out", str(out), "--no-warmup",
            "--window-steps", str(COLD_START["window_steps"]),
            "--methods", *COLD_START["methods"], *WORKLOAD_ARGS.get(workload, []),
            *sampling_argv(args)]
    offline.main(argv + (["--eager"] if args.eager else []))
    return json.loads((out / "results.json").read_text(encoding="utf-8"))


def cell_record(args, report: dict, workload: str, dtype: str, batch: int, kind: str,
                prompts: int) -> dict:
    # Prompts that ran: fewer than asked where the workload has fewer (copy-edit's 47
    # at batch 64).
    ran = [r["num_prompts"] for r in report["results"] if r.get("num_prompts")]
    git = (report.get("environment") or {}).get("git") or {}
    return {"workload": workload, "dtype": dtype, "batch_size": batch, "kind": kind,
            "temperature": args.temperature, "top_p": args.top_p,
            "mode": "eager" if args.eager else "compiled",
            # cells of several runs are published side by side, each with its commit
            "commit": git.get("commit"), "dirty": git.get("dirty"),
            # the package's code: cells of commits that leave vllm_echo/ alone compare
            "package_tree": git.get("package_tree"), "package_dirty": git.get("package_dirty"),
            "max_tokens": report["max_tokens"], "prompts": max(ran, default=prompts),
            "summary": report["summary"],
            # the same targets as a greedy cell of the batch size
            "targets": check_cell(report, workload, batch, kind),
            # None per method when sampled: identity is compared only when greedy
            "identical": {r["method"]: r["identical_to_none"]
                          for r in report["results"] if r["round"] == 0}}


def markdown(cells: list[dict]) -> str:
    lines = ["| workload | dtype | batch | prompts | target | against | paired ratios | "
             "median | met |", "|---|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        for t in cell["targets"]:
            ratios = " / ".join(f"{r:.2f}" for r in t["ratios"]) or "–"
            met = {True: "met", False: "**not met**", None: "–"}[t["met"]]
            lines.append(f"| {workload_label(cell)} | {cell['dtype']} | "
                         f"{cell['batch_size']} | {cell['prompts']} | {t['target']} | "
                         f"{t['against']} | {ratios} | {bench_common.fmt(t['median'])} | "
                         f"{met} |")
    lines += ["", "| workload | dtype | batch | method | tok/s (median) | tok/forward | "
              "vs none | vs echo |", "|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        for e in cell["summary"]:
            lines.append(
                f"| {workload_label(cell)} | {cell['dtype']} | {cell['batch_size']} | "
                f"{e['method']} "
                f"| {e['output_tokens_per_s']['median']:.1f} | {e['tokens_per_forward']:.2f} | "
                f"{offline_report.ratio_text(e.get('vs_none')) or '–'} | "
                f"{offline_report.ratio_text(e.get('vs_echo')) or '–'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--batch-sizes", nargs="+", type=int, default=None,
                   help=f"default: {' '.join(map(str, DEFAULT_BATCH_SIZES))}, except "
                        + "; ".join(f"{w}: {' '.join(map(str, b))}"
                                    for w, b in WORKLOAD_BATCH_SIZES.items()))
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                   choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8,
                   help="prompts per run at batch 1 (Spec-Bench: at least 13, one per category)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--methods", nargs="+", default=None,
                   help="override the methods (default: the fixed ones and echo)")
    p.add_argument("--ablations", action="store_true", help="also run echo's ablations")
    p.add_argument("--eager", action="store_true",
                   help="passed on to offline.py: engines without torch.compile and CUDA "
                        "graphs (vLLM's enforce_eager); default: vLLM's compiled mode")
    p.add_argument("--cells", nargs="+", default=CELL_KINDS, choices=CELL_KINDS,
                   help="cell kinds: batch (every batch size of a workload) and cold-start "
                        f"(per workload and dtype: batch {COLD_START['batch']}, "
                        f"{COLD_START['prompts']} prompts x {COLD_START['max_tokens']} tokens "
                        "on fresh engines without warm-up, none vs echo; not the agent loop)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="passed on to offline.py: 0 greedy (default), > 0 sampled cells "
                        "(seed 0), labelled and kept apart from the greedy ones")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="passed on to offline.py with --temperature > 0 (default 1.0)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help=f"CI: {SMOKE}")
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        p.error("--temperature must be >= 0 and --top-p in (0, 1]")
    if args.top_p != 1 and args.temperature == 0:
        p.error("--top-p needs --temperature > 0 (greedy decoding ignores it)")
    out = args.out or bench_common.RESULTS_DIR / time.strftime("matrix-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    cells: list[dict[str, Any]] = []
    def save(cell: dict) -> None:
        cells.append(cell)
        bench_common.write_json(out / "matrix.json", cells)
        (out / "matrix.md").write_text(markdown(cells), encoding="utf-8")

    for workload in args.workloads:
        for dtype in args.dtypes:
            if "batch" in args.cells:
                for batch in args.batch_sizes or WORKLOAD_BATCH_SIZES.get(workload,
                                                                          DEFAULT_BATCH_SIZES):
                    report = run_cell(args, workload, dtype, batch,
                                      cell_folder(out, workload, dtype, batch, "batch",
                                                  args.temperature, args.top_p))
                    save(cell_record(args, report, workload, dtype, batch, "batch",
                                     prompts_for(workload, batch, args.prompts)))
            if "cold-start" in args.cells and cold_start_workload(workload):
                report = run_cold_start_cell(
                    args, workload, dtype,
                    cell_folder(out, workload, dtype, COLD_START["batch"], "cold-start",
                                args.temperature, args.top_p))
                save(cell_record(args, report, workload, dtype, COLD_START["batch"],
                                 "cold-start", COLD_START["prompts"]))
    print(markdown(cells))
    print(f"matrix in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
