# SPDX-License-Identifier: Apache-2.0
"""What the plugin costs a step that verifies no draft, part by part.

    python benchmarks/overhead.py                      # batch 1 and 16, 3 paired rounds, compiled
    python benchmarks/overhead.py --eager --rounds 1   # quicker
    python benchmarks/overhead.py --smoke --out F.json  # CI

Configurations, each a fresh engine per round that runs every batch size on prompts of
its own (rounds rotate the order):
- ``none``: no speculation;
- ``echo-idle``: ``echo`` whose planner decides every step that no draft pays (what a
  loaded engine runs when verification costs too much);
- ``echo-work``: ``echo`` whose planner plans every step in full (the target's top-k
  read, every request's forest built and pooled, the rule run) and then verifies no
  node: all the drafting work, none of the verification;
- ``echo``: ``echo`` as users run it, drafting (``--configs none echo``: what a step
  that verifies drafts costs beyond its tokens, part by part).

Each engine runs in its own process with vLLM's engine core in that process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the runner's methods can be timed: vLLM's own
``_prepare_inputs`` and ``_sample`` (class methods, wrapped before the engine starts)
against our hooks around them (the instance attributes), the top-k capture, and the
proposer. A step is ``execute_model`` plus ``sample_tokens``. Prints one table per
batch size: output tokens per second relative to ``none`` in the same round (median
over rounds) and milliseconds per step by part.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402

CONFIGS = {"none": None, "echo-idle": {"method": "echo"},
           "echo-work": {"method": "echo"}, "echo": {"method": "echo"}}
PARTS = ("step", "prepare_vllm", "prepare_hook", "sample_vllm", "sample_hook", "topk",
         "propose")


def _timers() -> dict[str, list]:
    return {part: [0, 0.0] for part in PARTS}


def _timed(fn, slot: list):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            slot[0] += 1
            slot[1] += time.perf_counter() - start
    wrapper.__wrapped__ = fn
    return wrapper


def worker(job: dict) -> dict:
    """One engine, one configuration: generate, return throughput and part timings."""
    os.environ.update(bench_common.engine_env(dict(os.environ)))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with a function
    import plugin_internals
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_echo import prompts
    from vllm_echo.engines import build_llm

    timers = _timers()
    inner = {"execute_model": [0, 0.0], "sample_tokens": [0, 0.0]}
    for name in ("_prepare_inputs", "_sample", "execute_model", "sample_tokens"):
        slot = {"_prepare_inputs": timers["prepare_vllm"], "_sample": timers["sample_vllm"]
                }.get(name, inner.get(name))
        setattr(GPUModelRunner, name, _timed(getattr(GPUModelRunner, name), slot))
    plugin_internals.time_topk(lambda fn: _timed(fn, timers["topk"]))
    # vLLM's default stats off (not the package's): this script reads no counters, and
    # logging them would be one more cost in every configuration's steps.
    llm = build_llm(CONFIGS[job["config"]], enforce_eager=job["eager"],
                    max_num_seqs=max(job["batches"]), disable_log_stats=True)
    # after the engine started: its warm-up plans for real
    if job["config"] == "echo-idle":
        plugin_internals.planner_drafts_nothing()
    elif job["config"] == "echo-work":
        plugin_internals.planner_verifies_nothing()

    outer = {"prepare_hook": timers["prepare_hook"], "sample_hook": timers["sample_hook"],
             "propose": timers["propose"]}

    def wrap_instance(worker_: Any) -> bool:
        runner = worker_.model_runner
        if getattr(runner, "drafter", None) is None:
            return False
        runner._prepare_inputs = _timed(runner._prepare_inputs, outer["prepare_hook"])
        runner._sample = _timed(runner._sample, outer["sample_hook"])
        runner.drafter.propose = _timed(runner.drafter.propose, outer["propose"])
        return True

    hooked = llm.collective_rpc(wrap_instance)[0]
    chats = [p.as_chat() for p in prompts.load(n=sum(_prompts(b) for b in job["batches"]) + 1)]
    params = SamplingParams(temperature=0, max_tokens=job["max_tokens"], ignore_eos=True)
    llm.chat(chats[-1:], params, use_tqdm=False)  # warm-up, on a prompt never measured
    out = []
    for batch in job["batches"]:  # each batch size on prompts of its own
        chats_b, chats = chats[:_prompts(batch)], chats[_prompts(batch):]
        for slot in [*timers.values(), *inner.values()]:
            slot[:] = [0, 0.0]
        start = time.perf_counter()
        if batch == 1:
            outs = [llm.chat([c], params, use_tqdm=False)[0] for c in chats_b]
        else:
            outs = llm.chat(chats_b, params, use_tqdm=False)
        wall = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        steps = max(inner["execute_model"][0], 1)
        timers["step"] = [steps, inner["execute_model"][1] + inner["sample_tokens"][1]]
        ms = {part: 1e3 * seconds / steps for part, (_, seconds) in timers.items()}
        if hooked:  # our hooks' own time: the instance wrapper minus vLLM's method inside
            ms["prepare_hook"] -= ms["prepare_vllm"]
            ms["sample_hook"] -= ms["sample_vllm"]
            ms["propose"] -= ms["topk"]
        out.append({"config": job["config"], "batch": batch, "tok_s": tokens / wall,
                    "steps": steps, "ms_per_step": ms, "hooked": hooked,
                    "texts": [o.outputs[0].text for o in outs]})
    return out


def _prompts(batch: int) -> int:
    return 4 if batch == 1 else batch


def run_job(job: dict, timeout: float) -> list[dict]:
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)],
                          capture_output=True, text=True, timeout=timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("["):
            return json.loads(line)
    raise RuntimeError(f"{job}: no result (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def table(results: list[dict], batch: int) -> list[str]:
    rounds: dict[int, dict[str, dict]] = {}
    for r in results:
        if r["batch"] == batch:
            rounds.setdefault(r["round"], {})[r["config"]] = r
    lines = [f"batch {batch}: ms per step by part (median over {len(rounds)} rounds); "
             "x none = tok/s over none's in the same round",
             f"{'config':<10} {'x none':>7} {'tok/s':>7} " + " ".join(f"{p:>12}" for p in PARTS)]
    for config in CONFIGS:
        runs = [rnd[config] for rnd in rounds.values() if config in rnd and "none" in rnd]
        if not runs:
            continue
        ratio = statistics.median(r["tok_s"] / rounds[r["round"]]["none"]["tok_s"] for r in runs)
        tok_s = statistics.median(r["tok_s"] for r in runs)
        parts = [statistics.median(r["ms_per_step"][p] for r in runs) for p in PARTS]
        lines.append(f"{config:<10} {ratio:>7.3f} {tok_s:>7.1f} "
                     + " ".join(f"{v:>12.3f}" for v in parts))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--eager", action="store_true", help="vLLM's enforce_eager (no torch.compile)")
    ap.add_argument("--configs", nargs="+", default=["none", "echo-idle", "echo-work"],
                    choices=list(CONFIGS))
    ap.add_argument("--out", type=Path, help="JSON file for every run's numbers")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--smoke", action="store_true",
                    help="CI: eager, one round, batch 1, 8 tokens, none and echo-idle")
    args = ap.parse_args()
    if args.smoke:
        args.eager, args.rounds, args.batch_sizes, args.max_tokens = True, 1, [1], 8
        args.configs = ["none", "echo-idle"]
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    results = []
    for rnd in range(args.rounds):
        shift = rnd % len(args.configs)
        for config in args.configs[shift:] + args.configs[:shift]:
            job = {"config": config, "batches": args.batch_sizes, "eager": args.eager,
                   "max_tokens": args.max_tokens}
            for result in run_job(job, args.timeout):
                result["round"] = rnd
                results.append(result)
                print(f"round {rnd} batch {result['batch']} {config}: "
                      f"{result['tok_s']:.1f} tok/s", flush=True)
    for batch in args.batch_sizes:
        print("\n".join(table(results, batch)))
        base = {r["round"]: r["texts"] for r in results if r["config"] == "none"
                and r["batch"] == batch}
        differ = sum(r["texts"] != base.get(r["round"], r["texts"]) for r in results
                     if r["batch"] == batch)
        print(f"runs whose texts differ from none's: {differ}")
    if args.out:
        bench_common.write_json(args.out, {"environment": bench_common.environment("float32"),
                                           "args": {k: str(v) for k, v in vars(args).items()},
                                           "runs": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
