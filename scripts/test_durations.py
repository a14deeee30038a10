#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Summarise a test run's timing file (pytest --timing-json, tests/timing.py) as
Markdown: seconds per tier, per module (with its vLLM starts) and the slowest tests.

    python scripts/test_durations.py timing.json [more.json ...] [--title "..."] > tests/DURATIONS.md
    python scripts/test_durations.py timing.json --module-seconds tests/module_seconds.json

Several files (the lanes of one run, scripts/test.sh) are summarised as one run.
--module-seconds also writes each module's seconds outside the tp tier, which
scripts/test_lanes.py balances the lanes with.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys


def tier(row: dict) -> str:
    return "+".join(row["markers"]) if row["markers"] else "quick (no vLLM start)"


def render(rows: list[dict], title: str, top: int = 15) -> str:
    total = sum(r["seconds"] for r in rows)
    out = [f"# {title}", "",
           f"{len(rows)} tests, {total:.0f} s ({total / 60:.1f} min) in pytest; "
           f"{sum(len(r['starts']) for r in rows)} vLLM starts recorded by the test helpers "
           "(engines and servers; scripts and Ray replicas start their own, not counted).", ""]
    out += ["## By tier (markers)", "", "| tier | tests | seconds | share |", "|---|---|---|---|"]
    by_tier = collections.defaultdict(list)
    for r in rows:
        by_tier[tier(r)].append(r)
    for name, mine in sorted(by_tier.items(), key=lambda kv: -sum(r["seconds"] for r in kv[1])):
        s = sum(r["seconds"] for r in mine)
        out.append(f"| {name} | {len(mine)} | {s:.0f} | {s / total:.0%} |")
    out += ["", "## By module", "",
            "| module | tests | vLLM starts | seconds in starts | seconds | share |",
            "|---|---|---|---|---|---|"]
    by_module = collections.defaultdict(list)
    for r in rows:
        by_module[r["module"]].append(r)
    for name, mine in sorted(by_module.items(),
                             key=lambda kv: -sum(r["seconds"] for r in kv[1])):
        s = sum(r["seconds"] for r in mine)
        starts = [st for r in mine for st in r["starts"]]
        out.append(f"| {name} | {len(mine)} | {len(starts)} | "
                   f"{sum(st['seconds'] for st in starts):.0f} | {s:.0f} | {s / total:.1%} |")
    out += ["", f"## The {top} slowest tests", "", "| test | seconds | vLLM starts |",
            "|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r["seconds"])[:top]:
        out.append(f"| `{r['test']}` | {r['seconds']:.0f} | {len(r['starts'])} |")
    failed = [r["test"] for r in rows if r["outcome"] == "failed"]
    if failed:
        out += ["", "Failed: " + ", ".join(f"`{t}`" for t in failed)]
    return "\n".join(out) + "\n"


def module_seconds(rows: list[dict]) -> dict[str, float]:
    """Seconds per module of the tests the lanes run (the tp tier runs alone after them)."""
    out: dict[str, float] = collections.defaultdict(float)
    for r in rows:
        out[r["module"]] += 0.0 if "tp" in r["markers"] else r["seconds"]
    return {m: round(s) for m, s in sorted(out.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("timing_json", nargs="+")
    ap.add_argument("--title", default="Where the test suite's time goes")
    ap.add_argument("--module-seconds", metavar="PATH",
                    help="also write {module: seconds outside the tp tier} to PATH")
    args = ap.parse_args(argv)
    rows = []
    for path in args.timing_json:
        with open(path, encoding="utf-8") as f:
            rows += json.load(f)
    sys.stdout.write(render(rows, args.title))
    if args.module_seconds:
        with open(args.module_seconds, "w", encoding="utf-8") as f:
            f.write(json.dumps(module_seconds(rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
