# SPDX-License-Identifier: Apache-2.0
"""offline.py's results: ratios to ``none`` paired by round, greedy identity, accepted
tokens by draft source, the summary over rounds, results.md and the plots."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import bench_common


def compare_with_none(rows: list[dict], temperature: float) -> None:
    """Ratios to the `none` row of the same batch size and round; greedy identity
    against the first round's `none`."""
    base = {(r["batch_size"], r["round"]): r for r in rows
            if r["method"] == "none" and r["status"] == "ok"}
    for r in rows:
        ref = base.get((r["batch_size"], r["round"]))
        first = base.get((r["batch_size"], 0)) or ref
        r["ratio_to_none"] = None
        r["identical_to_none"] = None
        if r["status"] != "ok":
            continue
        if ref is not None and ref["output_tokens_per_s"]:
            r["ratio_to_none"] = r["output_tokens_per_s"] / ref["output_tokens_per_s"]
        if temperature == 0 and first is not None:
            # A step window cuts runs at different lengths: compare what both emitted.
            same = sum(a[:len(b)] == b[:len(a)] if r.get("window") else a == b
                       for a, b in zip(r["token_ids"], first["token_ids"]))
            r["identical_to_none"] = f"{same}/{len(first['token_ids'])}"


def accepted_by_source(plugin: dict | None) -> dict[str, float] | None:
    """The plugin's ``accepted_<source>`` counters over the measured run (its worker
    stats at the end less those after the warm-up), the nonzero ones, whatever the
    sources are (ECHO: its ``accepted_by_kind``); None for a row without the plugin's
    stats (no drafter of ours)."""
    if not plugin or not plugin.get("end"):
        return None
    before = plugin.get("after_warmup") or {}
    by_kind = (plugin["end"].get("echo") or {}).get("accepted_by_kind")
    if by_kind:  # ECHO: its planner's split by family (the drafts' counters say "chain")
        earlier = (before.get("echo") or {}).get("accepted_by_kind") or {}
        return {f"accepted_{kind}": value - earlier.get(kind, 0)
                for kind, value in by_kind.items() if value - earlier.get(kind, 0)}
    out = {}
    for key, value in plugin["end"].items():
        if key.startswith("accepted_") and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            delta = value - (before.get(key) or 0)
            if delta:
                out[key] = delta
    return out


def _sources_text(counts: dict | None) -> str | None:
    """``retrieval 120 (80%), logits 30 (20%)``: accepted tokens by draft source."""
    if counts is None:
        return None
    total = sum(counts.values())
    return ", ".join(f"{k.removeprefix('accepted_')} {v:g} ({100 * v / total:.0f}%)"
                     for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "per_round": values}


def tokens_per_s_after_first_step(row: dict) -> float | None:
    """Throughput without the run's first engine step. That step prefills the batch's
    first prompts, the same work for every method, yet on a shared VM its time swings
    between runs by more than the methods differ."""
    first = row.get("first_step")
    if not first or row["batch_size"] == 1 or row["wall_s"] <= first["seconds"]:
        return None
    return (row["output_tokens"] - first["emitted"]) / (row["wall_s"] - first["seconds"])


def _paired(by_round: dict[int, dict], ref: dict[int, dict], rate) -> dict | None:
    ratios = [rate(by_round[k]) / rate(ref[k]) for k in sorted(by_round)
              if k in ref and rate(by_round[k]) and rate(ref[k])]
    return _spread(ratios) if ratios else None


def summarize(rows: list[dict], reference: str) -> list[dict]:
    """Per (method, batch size) over its rounds: throughput, and its ratios to `none`
    and to ``reference`` paired by round (a round whose reference failed is left out),
    also without each run's first step (:func:`tokens_per_s_after_first_step`)."""
    runs: dict[tuple[str, int], dict[int, dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            runs.setdefault((r["method"], r["batch_size"]), {})[r["round"]] = r
    summary = []
    for (method, batch), by_round in runs.items():
        rounds = sorted(by_round)
        entry: dict[str, Any] = {
            "method": method, "batch_size": batch, "rounds": len(rounds),
            "output_tokens_per_s": _spread([by_round[k]["output_tokens_per_s"]
                                            for k in rounds]),
            "tokens_per_forward": statistics.median(by_round[k]["tokens_per_forward"]
                                                    for k in rounds)}
        sources = [by_round[k].get("accepted_by_source") for k in rounds]
        if any(s is not None for s in sources):  # summed over the rounds
            total: dict[str, float] = {}
            for counts in filter(None, sources):
                for key, value in counts.items():
                    total[key] = total.get(key, 0) + value
            entry["accepted_by_source"] = total
        for ref_name in dict.fromkeys(["none", reference]):
            ref = runs.get((ref_name, batch), {})
            entry[f"vs_{ref_name}"] = _paired(by_round, ref,
                                              lambda r: r["output_tokens_per_s"])
            entry[f"vs_{ref_name}_after_first_step"] = _paired(
                by_round, ref, tokens_per_s_after_first_step)
        summary.append(entry)
    return summary


def ratio_text(spread: dict | None) -> str | None:
    if spread is None:
        return None
    if len(spread["per_round"]) == 1:
        return f"{spread['median']:.2f}"
    return f"{spread['median']:.2f} [{spread['min']:.2f}–{spread['max']:.2f}]"


def _per_position(counts: list | None) -> str | None:
    """Accepted tokens per draft position, trailing zeros cut (K can be 63 for trees)."""
    if not counts:
        return None
    shown = list(counts)
    while len(shown) > 1 and shown[-1] == 0:
        shown.pop()
    text = ",".join(str(int(c)) for c in shown[:8]) + (",…" if len(shown) > 8 else "")
    return f"{text} (K={len(counts)})"


def _interpolate(points: dict[int, float], size: int) -> float:
    """Linear in size between the nearest measured sizes, the nearest one outside them."""
    sizes = sorted(points)
    below = [k for k in sizes if k <= size] or sizes[:1]
    above = [k for k in sizes if k >= size] or sizes[-1:]
    lo, hi = below[-1], above[0]
    if lo == hi:
        return points[lo]
    return points[lo] + (points[hi] - points[lo]) * (size - lo) / (hi - lo)


def cut_at_first_miss(step_sizes: list[dict]) -> float | None:
    """A batch-1 run's decode time over what it would have taken had every drafted
    step drafted exactly the tokens it accepted (a step emitting e tokens priced at
    the run's median time of a step of size e): how much knowing where each draft
    goes wrong would have saved."""
    times = {s["tokens"]: s["median_ms"] for s in step_sizes}
    if not times:
        return None
    spent = sum(s["steps"] * s["median_ms"] for s in step_sizes)
    cut = sum(int(n) * (_interpolate(times, int(e)) if s["tokens"] > 1 else s["median_ms"])
              for s in step_sizes for e, n in s["steps_by_emitted"].items())
    return spent / cut


def step_size_table(results: list[dict]) -> str:
    """Batch-1 decode steps by size, per method over its rounds (markdown)."""
    pooled: dict[tuple[str, int], list] = {}
    bounds: dict[str, list[float]] = {}
    for r in results:
        if r["status"] != "ok" or r["batch_size"] != 1 or not r.get("step_sizes"):
            continue
        for s in r["step_sizes"]:
            entry = pooled.setdefault((r["method"], s["tokens"]), [0, [], 0, 0])
            entry[0] += s["steps"]
            entry[1].append(s["median_ms"])
            entry[2] += s["emitted_per_step"] * s["steps"]
            entry[3] += s["accepted_nothing"] if s["tokens"] > 1 else 0
        bound = cut_at_first_miss(r["step_sizes"])
        if bound:
            bounds.setdefault(r["method"], []).append(bound)
    if not pooled:
        return ""
    rows = [[method, size, steps, statistics.median(ms), emitted / steps,
             nothing if size > 1 else "–"]
            for (method, size), (steps, ms, emitted, nothing) in sorted(pooled.items())]
    text = ("\n## Batch-1 decode steps by size\n\nSize: 1 + the step's drafts; median ms "
            "over the rounds' medians. Cut at the first miss: decode time over the same "
            "steps priced at the sizes they emitted, per round.\n\n")
    text += "".join(f"- {m}: cut at the first miss "
                    f"{' / '.join(f'{b:.2f}' for b in v)}\n" for m, v in bounds.items())
    return text + "\n" + bench_common.markdown_table(
        ["method", "size", "steps", "median ms", "tokens emitted / step", "accepted nothing"],
        rows)


def markdown(report: dict) -> str:
    env = report["environment"]
    head = (f"# Offline benchmark\n\nModel `{report['model']}`, dataset `{report['dataset']}`, "
            f"{env['dtype']}, {'eager' if report.get('enforce_eager') else 'compiled'}, "
            f"max_tokens {report['max_tokens']}, temperature {report['temperature']}"
            f"{'' if report['temperature'] == 0 else ', top-p ' + str(report.get('top_p', 1.0))}"
            f"{'' if report.get('warmup', True) else ', cold start (no warm-up)'}; "
            f"vLLM {env['vllm']}, {env['cpu']} ({env['cpu_count']} cores), device "
            f"{env['device']}, commit {env['git']['commit']}"
            f"{' (dirty)' if env['git']['dirty'] else ''}.\n\n")
    if report.get("multi_turn"):
        turns = next((sum(r["turns"]) for r in report["results"] if r.get("turns")), None)
        head += ("Multi-turn: each prompt is a conversation played turn by turn, the model's "
                 "answers in its history; tokens, times and forwards sum over the turns"
                 + (f" ({turns} turns per run)" if turns else "") + ".\n\n")
    headers = ["method", "batch", "prompts", "tok/s", "vs none", "tok/forward", "accept rate",
               "util", "accepted per pos", "accepted by source", "proposer share", "identical",
               "status"]
    rows = []
    for r in report["results"]:
        spec = r.get("spec_decode") or {}
        prop = r.get("proposer") or {}
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')}"
        rows.append([r["method"], r["batch_size"], r.get("num_prompts"),
                     r.get("output_tokens_per_s"), r.get("ratio_to_none"),
                     r.get("tokens_per_forward"), spec.get("draft_acceptance_rate"),
                     spec.get("draft_utilization"),
                     _per_position(spec.get("accepted_tokens_per_position")),
                     _sources_text(r.get("accepted_by_source")),
                     None if prop.get("share_of_step_time") is None
                     else f"{100 * prop['share_of_step_time']:.2f}%",
                     r.get("identical_to_none"),
                     status.replace("\n", " ").replace("|", "/")[:200]])
    text = head
    if report["repeats"] > 1:
        headers = ["round", *headers]
        rows = [[r["round"], *row] for r, row in zip(report["results"], rows)]
        ref = report["reference"]
        refs = list(dict.fromkeys(["none", ref]))
        text += (f"## Summary over {report['repeats']} rounds\n\nMedian [min–max]; ratios "
                 "are paired by round (each round runs every method once, order rotated).\n\n")
        text += bench_common.markdown_table(
            ["method", "batch", "rounds", "tok/s", "tok/s per round", "tok/forward",
             *[f"vs {n}" for n in refs], *[f"vs {n} after the first step" for n in refs],
             "accepted by source (all rounds)"],
            [[e["method"], e["batch_size"], e["rounds"], e["output_tokens_per_s"]["median"],
              " / ".join(f"{v:.1f}" for v in e["output_tokens_per_s"]["per_round"]),
              e["tokens_per_forward"], *[ratio_text(e[f"vs_{n}"]) for n in refs],
              *[ratio_text(e[f"vs_{n}_after_first_step"]) for n in refs],
              _sources_text(e.get("accepted_by_source"))]
             for e in report["summary"]])
        text += "\n## Every run\n\n"
    text += bench_common.markdown_table(headers, rows)
    cats = sorted({c for r in report["results"]
                   for c in (r.get("tokens_per_forward_by_category") or {})})
    if cats:
        rows = [[r["method"], r["batch_size"],
                 *[(r.get("tokens_per_forward_by_category") or {}).get(c) for c in cats]]
                for r in report["results"] if r["status"] == "ok" and r["round"] == 0]
        text += "\n## Tokens per target forward by category\n\n"
        text += bench_common.markdown_table(["method", "batch", *cats], rows)
    text += step_size_table(report["results"])
    if report.get("notes"):
        text += "\n" + "\n".join(f"- {n}" for n in report["notes"]) + "\n"
    return text


def plots(report: dict, out: Path) -> list[str]:
    plt = bench_common.try_import_pyplot()
    if plt is None:
        report["notes"].append("plots skipped: matplotlib is not installed")
        return []
    ok = [r for r in report["results"] if r["status"] == "ok" and r["round"] == 0]
    files = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in dict.fromkeys(e["method"] for e in report["summary"]):
        pts = sorted((e["batch_size"], e["output_tokens_per_s"]["median"])
                     for e in report["summary"] if e["method"] == method)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch_size"] for r in ok})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Throughput vs batch size" + (f" (median of {report['repeats']} rounds)"
                                               if report["repeats"] > 1 else ""))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "throughput_vs_batch.png", dpi=120)
    plt.close(fig)
    files.append("throughput_vs_batch.png")

    # Acceptance does not depend much on batch size; the smallest one is shown.
    if ok:
        batch = min(r["batch_size"] for r in ok)
        rows = [r for r in ok if r["batch_size"] == batch]
        cats = sorted({c for r in rows for c in r["tokens_per_forward_by_category"]})
        fig, ax = plt.subplots(figsize=(max(7, len(cats) * 0.9), 4.5))
        width = 0.8 / max(len(rows), 1)
        for i, r in enumerate(rows):
            vals = [r["tokens_per_forward_by_category"].get(c) or 0 for c in cats]
            ax.bar([x + i * width for x in range(len(cats))], vals, width, label=r["method"])
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cats))], cats, rotation=45,
                      ha="right")
        ax.set_ylabel("tokens per target forward")
        ax.set_title(f"Tokens per forward by category (batch {batch})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "tokens_per_forward_by_category.png", dpi=120)
        plt.close(fig)
        files.append("tokens_per_forward_by_category.png")
    return files
