#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Split the test modules into lanes of about equal recorded time, for scripts/test.sh.

    python scripts/test_lanes.py --lanes 2      one line per lane: its modules, spaced

Why lanes: a test that starts vLLM spends much of its time waiting (process starts,
servers answering, one Python thread driving a small model), so two pytest processes,
each with its engines' compute threads bound to its own core, finish the suite in about
70% of the time of one (tests/DURATIONS.md). Seconds per module come from
tests/module_seconds.json (written by scripts/test_durations.py --module-seconds from a
full run's timing file); a module missing there counts as NEW_MODULE_SECONDS. Modules
that start Ray share one lane: each starts a local Ray cluster, and two at once would
compete for its ports and its CPUs. Longest first, each to the lane with least time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_SECONDS = ROOT / "tests" / "module_seconds.json"
NEW_MODULE_SECONDS = 60.0  # a module not in the last recorded run: assume a short engine test
RAY_MODULE_PREFIX = "test_ray_"


def modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))


def split(names: list[str], seconds: dict[str, float], lanes: int) -> list[list[str]]:
    """Greedy longest-first assignment; Ray modules travel as one unit."""
    ray = [n for n in names if Path(n).name.startswith(RAY_MODULE_PREFIX)]
    units = [[n] for n in names if n not in ray] + ([ray] if ray else [])
    cost = lambda unit: sum(seconds.get(n, NEW_MODULE_SECONDS) for n in unit)  # noqa: E731
    out: list[list[str]] = [[] for _ in range(lanes)]
    load = [0.0] * lanes
    for unit in sorted(units, key=lambda u: (-cost(u), u)):
        i = min(range(lanes), key=lambda j: (load[j], j))
        out[i] += unit
        load[i] += cost(unit)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lanes", type=int, default=2)
    args = ap.parse_args(argv)
    if args.lanes < 1:
        ap.error("--lanes must be at least 1")
    seconds = json.loads(MODULE_SECONDS.read_text()) if MODULE_SECONDS.exists() else {}
    for lane in split(modules(), seconds, args.lanes):
        print(" ".join(lane))
    return 0


if __name__ == "__main__":
    sys.exit(main())
