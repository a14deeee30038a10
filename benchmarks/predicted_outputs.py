#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Predicted Outputs: what a client's ``prediction`` buys, per workload and method.

    python benchmarks/predicted_outputs.py              # 3 rounds at batch 1, 8 and 16
    python benchmarks/predicted_outputs.py --prompts 4 --single-prompts 2 --rounds 1 \
        --batch-sizes 1 4 --eager                        # a smoke run

Workloads, built from the packaged Spec-Bench prompts (their sources and licences:
vllm_echo/data/README.md) and the no-speculation engine's own greedy answers:

- **regenerate**: a question was answered once; it is asked again with a changed
  instruction (``REGENERATE_SUFFIX``), the first answer as the prediction. The first
  answer is not in the second prompt. The set keeps the questions, in the packaged
  order, whose second answer shares at least ``MIN_OVERLAP`` of its tokens with the
  first (the share the alignment of usage_counts finds; the median and the least
  are reported): the case a client sends a prediction for.
- **edit**: the prompt holds a text (a first answer) and asks for it back with a small
  change, as editors send it; the prediction is that text.
- **wrong**: the regenerate prompts with another question's answer as the prediction
  (the cost of a bad hint).
- **oracle**: the regenerate prompts with their own no-speculation answer as the
  prediction (a ceiling, measured once per round).

Configurations: ``none``, vLLM's ``ngram``, ``echo`` and ``logitspec`` without a
prediction, and ``echo+p`` / ``logitspec+p`` with it (the same engines: a prediction is
per request). Every engine lives for the whole run; at batch 1 the first
``--single-prompts`` prompts go one at a time, each to every configuration in turn (the
order rotated per prompt), so a slow stretch of the machine costs all alike; at batch b
all ``--prompts`` go to each configuration b at a time (the order rotated per group).
Ratios are paired by round. Every output is checked against ``none``'s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common  # noqa: E402
from vllm_echo.engines import SPECULATIVE_CONFIGS  # noqa: E402

MAX_TOKENS = 96
REGENERATE_SUFFIX = " Answer in full sentences."
# The regenerate set's least share of a second answer's tokens found in the first.
MIN_OVERLAP = 0.5
EDIT_TEMPLATE = ("Copy the following text exactly, changing nothing but the first word to "
                 "'Indeed,'. Reply with the text only.\n\n{text}")
ENGINES = {name: SPECULATIVE_CONFIGS[name] for name in ("none", "ngram", "echo", "logitspec")}
CONFIGS = {"none": ("none", False), "ngram": ("ngram", False), "echo": ("echo", False),
           "logitspec": ("logitspec", False), "echo+p": ("echo", True),
           "logitspec+p": ("logitspec", True)}


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def build_workloads(llm, n: int) -> tuple[dict[str, list[tuple[list[dict], str]]],
                                         list[float]]:
    """({workload: [(messages, prediction text)]}, the regenerate set's overlaps), from
    greedy answers of ``llm``: the first ``n`` short Spec-Bench questions whose
    regenerated answer shares at least MIN_OVERLAP of its tokens with the first."""
    from vllm import SamplingParams

    from vllm_echo import prompts
    from vllm_echo.algos.prediction_usage import usage_counts

    candidates = [p for p in prompts.load(prompts.SPEC_BENCH) if len(p.text) < 600]
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    tokenizer = llm.get_tokenizer()
    picked, first, oracle, overlaps = [], [], [], []
    for start in range(0, len(candidates), 4 * n):
        chunk = candidates[start:start + 4 * n]
        answers = llm.chat([p.as_chat() for p in chunk], greedy, use_tqdm=False)
        again = llm.chat([chat(p.text + REGENERATE_SUFFIX) for p in chunk], greedy,
                         use_tqdm=False)
        for p, a, b in zip(chunk, answers, again):
            ids = list(b.outputs[0].token_ids)
            shared, _ = usage_counts(tokenizer.encode(a.outputs[0].text,
                                                      add_special_tokens=False), ids)
            if ids and shared / len(ids) >= MIN_OVERLAP and len(picked) < n:
                picked.append(p)
                first.append(a.outputs[0].text)
                oracle.append(b.outputs[0].text)
                overlaps.append(shared / len(ids))
        if len(picked) == n:
            break
    if len(picked) < n:
        raise SystemExit(f"only {len(picked)} questions have a regenerated answer sharing "
                         f">= {MIN_OVERLAP} of its tokens with the first; ask for fewer")
    second = [chat(p.text + REGENERATE_SUFFIX) for p in picked]
    return {
        "regenerate": list(zip(second, first)),
        "edit": [(chat(EDIT_TEMPLATE.format(text=t)), t) for t in first],
        "wrong": [(m, first[(i + 1) % n]) for i, (m, _) in enumerate(zip(second, first))],
        "oracle": list(zip(second, oracle)),
    }, overlaps


def params(prediction: str | None):
    from vllm import SamplingParams

    from vllm_echo.plugin.predicted_outputs import PREDICTION_KEY

    extra = {PREDICTION_KEY: prediction} if prediction is not None else None
    return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, extra_args=extra)


def drafter_steps(llm) -> tuple[int, int]:
    """(proposer steps, accepted predicted tokens) on rank 0 (0, 0 without a drafter)."""
    from vllm_echo.engines import drafter_stats

    stats = drafter_stats(llm)
    return (stats["steps"], stats["prediction_accepted"]) if stats else (0, 0)


def run_batch(llm, items, use_prediction: bool) -> tuple[float, list[list[int]], int, int]:
    """(seconds, token ids per item, proposer steps, accepted predicted tokens)."""
    steps0, pred0 = drafter_steps(llm)
    start = time.perf_counter()
    outs = llm.chat([m for m, _ in items], [params(p if use_prediction else None)
                                            for _, p in items], use_tqdm=False)
    seconds = time.perf_counter() - start
    steps1, pred1 = drafter_steps(llm)
    return seconds, [list(o.outputs[0].token_ids) for o in outs], steps1 - steps0, pred1 - pred0


def measure(engines, workloads, batch: int, rounds: int, names: list[str]) -> list[dict]:
    rows = []
    for r in range(rounds):
        for workload, items in workloads.items():
            groups = [items[i:i + batch] for i in range(0, len(items), batch)]
            acc = {c: {"seconds": 0.0, "tokens": 0, "steps": 0, "accepted_predicted": 0,
                       "outputs": []} for c in names}
            for g, group in enumerate(groups):
                turn = (g + r) % len(names)  # rotated per group and per round
                order = names[turn:] + names[:turn]
                for config in order:
                    engine, with_p = CONFIGS[config]
                    if workload == "oracle" and not with_p and config != "none":
                        continue  # the same as regenerate's
                    seconds, outs, steps, accepted = run_batch(engines[engine], group, with_p)
                    a = acc[config]
                    a["seconds"] += seconds
                    a["tokens"] += sum(map(len, outs))
                    a["steps"] += steps
                    a["accepted_predicted"] += accepted
                    a["outputs"] += outs
            reference = acc["none"]["outputs"]
            for config, a in acc.items():
                if not a["tokens"]:
                    continue
                rows.append({"round": r, "batch": batch, "workload": workload, "config": config,
                             "tok_s": a["tokens"] / a["seconds"], "tokens": a["tokens"],
                             "tok_per_step": a["tokens"] / a["steps"] if a["steps"] else None,
                             "accepted_predicted": a["accepted_predicted"],
                             "identical": a["outputs"] == reference})
            print(json.dumps([x for x in rows if x["round"] == r and x["workload"] == workload
                              and x["batch"] == batch], default=str), flush=True)
    return rows


def summary(rows: list[dict]) -> list[str]:
    """Markdown: per (batch, workload, config) the median tok/s, the medians of its
    per-round ratios to none and to echo without a prediction (oracle: regenerate's)."""
    keyed = {(x["round"], x["batch"], x["workload"], x["config"]): x for x in rows}
    lines = ["| batch | workload | config | tok/s | x none | x echo | tok/step | identical |",
             "|---|---|---|---|---|---|---|---|"]
    for batch, workload, config in sorted({(x["batch"], x["workload"], x["config"])
                                           for x in rows}):
        mine = [x for x in rows if (x["batch"], x["workload"], x["config"]) ==
                (batch, workload, config)]

        def ratio(ref_workload: str, ref_config: str) -> str:
            vals = [x["tok_s"] / ref["tok_s"] for x in mine
                    if (ref := keyed.get((x["round"], batch, ref_workload, ref_config)))]
            return f"{statistics.median(vals):.2f}" if vals else "-"

        base = "regenerate" if workload == "oracle" else workload
        steps = [x["tok_per_step"] for x in mine if x["tok_per_step"]]
        per_step = f"{statistics.median(steps):.2f}" if steps else "-"
        lines.append(f"| {batch} | {workload} | {config} | "
                     f"{statistics.median(x['tok_s'] for x in mine):.1f} | "
                     f"{ratio(workload, 'none')} | {ratio(base, 'echo')} | {per_step} | "
                     f"{all(x['identical'] for x in mine)} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16, help="questions at batch > 1")
    ap.add_argument("--single-prompts", type=int, default=6, help="of them, at batch 1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                    help="none is always measured (the reference)")
    ap.add_argument("--eager", action="store_true", help="engines without torch.compile")
    ap.add_argument("--json", type=Path, help="write every row and the summary here")
    args = ap.parse_args(argv)
    import os

    os.environ.update(bench_common.engine_env(dict(os.environ)))
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc
    from vllm_echo.engines import build_llm

    configs = ["none"] + [c for c in args.configs if c != "none"]
    # Several engines side by side: half the default KV cache each.
    engines = {name: build_llm(spec, enforce_eager=args.eager,
                               max_num_seqs=max(args.batch_sizes),
                               kv_cache_memory_bytes=512 * 2**20, disable_log_stats=True)
               for name, spec in ENGINES.items() if any(CONFIGS[c][0] == name for c in configs)}
    workloads, overlaps = build_workloads(engines["none"], args.prompts)
    print(f"regenerate: share of a second answer's tokens found in the first: median "
          f"{statistics.median(overlaps):.2f}, least {min(overlaps):.2f}", flush=True)
    # one untimed pass of every configuration: compiled kernels, caches, ECHO's curve
    for config in configs:
        engine, with_p = CONFIGS[config]
        run_batch(engines[engine], workloads["wrong"][:1], with_p)
    rows = []
    for batch in args.batch_sizes:
        count = args.single_prompts if batch == 1 else args.prompts
        rows += measure(engines, {w: items[:count] for w, items in workloads.items()},
                        batch, args.rounds, configs)
    table = summary(rows)
    print("\n".join(table))
    if args.json:
        bench_common.write_json(args.json, {"environment": bench_common.environment("float32"),
                                            "overlap_regenerate": statistics.median(overlaps),
                                            "overlaps_regenerate": overlaps, "rows": rows,
                                            "table": table, "args": sys.argv[1:]})
    return 0 if all(x["identical"] for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
