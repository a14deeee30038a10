# SPDX-License-Identifier: Apache-2.0
"""What speculation buys on this machine: none, ngram, logitspec and echo side by side.

    python examples/offline_generate.py [--model PATH] [--batch 16] [--check]

Each method gets one engine (the embedded model, fp32, so greedy text must match no
speculation exactly) and two workloads of Spec-Bench prompts:
- batch 1: prompts one at a time, where a forward pass is cheap next to its fixed
  cost and verified drafts pay;
- loaded: twice ``--batch`` prompts submitted at once to an engine that runs
  ``--batch`` at a time, where every extra verified token costs compute.
It prints one table: output tokens per second, tokens per target forward pass, the
ratio to no speculation, and how many outputs are identical to no speculation's.
``--check`` exits with status 1 if any output differs.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

from vllm_echo import prompts
from vllm_echo.models import resolve_model

METHODS = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4,
              "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "logitspec": {"method": "logitspec"},
    "echo": {"method": "echo"},
}


# The table is the output; vLLM's start-up log would bury it (set the variable to see it).
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def accepted_tokens(llm) -> int:
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_accepted_tokens":
            return int(metric.value)
    return 0


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


def run_method(model: str, spec, workloads, batch: int) -> dict:
    from vllm import LLM, SamplingParams

    # A fixed KV cache instead of a share of the machine's memory: starts wherever 1 GiB is free.
    llm = LLM(model, speculative_config=spec, dtype="float32", enforce_eager=True,
              max_model_len=2048, max_num_seqs=batch, seed=0, disable_log_stats=False,
              kv_cache_memory_bytes=2**30)
    try:
        results = {}
        for name, (chats, max_tokens, one_at_a_time) in workloads.items():
            params = SamplingParams(temperature=0, max_tokens=max_tokens)
            llm.chat(chats[:1], params, use_tqdm=False)  # warm-up: first-step costs
            results[name] = timed(llm, chats, params, one_at_a_time)
        return results
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def print_table(results: dict, workloads: dict) -> int:
    """Print the comparison; returns the number of outputs that differ from none."""
    differ = 0
    head = f"{'method':<11}"
    for name in workloads:
        head += f"| {name + ': tok/s':>16} {'tok/fwd':>8} {'x none':>7} {'identical':>10} "
    print(head)
    print("-" * len(head))
    base = results["none"]
    for method, per_workload in results.items():
        line = f"{method:<11}"
        for name in workloads:
            r, ref = per_workload[name], base[name]
            same = sum(a == b for a, b in zip(r["texts"], ref["texts"]))
            total = len(ref["texts"])
            differ += total - same
            identical = f"{same}/{total}"
            line += (f"| {r['tok_s']:>16.1f} {r['tpf']:>8.2f} {r['tok_s'] / ref['tok_s']:>7.2f} "
                     f"{identical:>10} ")
        print(line)
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF folder or name (default: embedded)")
    parser.add_argument("--batch", type=int, default=16, help="requests per step when loaded")
    parser.add_argument("--single-prompts", type=int, default=7, help="at most 7")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if any output differs from no speculation")
    args = parser.parse_args()
    methods = ["none"] + [m for m in args.methods if m != "none"]  # the reference first

    from tqdm import tqdm

    model = resolve_model(args.model)
    chats = [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=2 * args.batch)]
    # One prompt from every other Spec-Bench category (13 in all), not the first few
    # categories only: how much drafts get accepted differs by category.
    singles = [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=13)[::2]]
    workloads = {
        "batch 1": (singles[:args.single_prompts], args.max_tokens, True),
        f"batch {args.batch}": (chats, args.max_tokens // 2, False),
    }
    results = {}
    with tqdm(methods, desc="methods", unit="engine", file=sys.stderr) as bar:
        for method in bar:
            bar.set_postfix_str(method)
            results[method] = run_method(model, METHODS[method], workloads, args.batch)
    print(f"\nSpec-Bench on the embedded model, fp32, greedy; batch 1: {len(workloads['batch 1'][0])} "
          f"prompts x {args.max_tokens} tokens one at a time; batch {args.batch}: "
          f"{len(chats)} prompts x {args.max_tokens // 2} tokens.\n")
    differ = print_table(results, workloads)
    if args.check and differ:
        print(f"{differ} outputs differ from no speculation", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
