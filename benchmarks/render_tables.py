# SPDX-License-Identifier: Apache-2.0
"""Render the result tables of README.md and benchmarks/README.md from committed files.

    python benchmarks/render_tables.py              # rewrite every table in place
    python benchmarks/render_tables.py --check      # exit 1, with a diff, if one differs
    python benchmarks/render_tables.py --publish matrix benchmarks/results/matrix-<time> \\
        --command "python benchmarks/matrix.py ..."  # commit a result as a table's source
    python benchmarks/render_tables.py --publish matrix OLD_RUN NEW_RUN --command "..."

A table sits between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` in a
Markdown file; everything between the two markers is generated, so numbers are
never typed by hand. The result files live in benchmarks/published/ (the scripts
write to benchmarks/results/, which git ignores), and benchmarks/published/sources.json
records for each the command that made it, the commit and date it ran at, and the
machine. benchmarks/published/notes.json holds the one line per unmet target that
says why (text, no numbers). tests/bench/test_rendered_tables.py runs ``--check``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the example this checkout renders imports vllm_echo
sys.path.insert(0, str(REPO / "benchmarks"))
import matrix  # noqa: E402  (its cells' folder names)
import predicted_outputs  # noqa: E402  (its summary table)
PUBLISHED = REPO / "benchmarks" / "published"
SOURCES = PUBLISHED / "sources.json"
NOTES = PUBLISHED / "notes.json"

# published name -> the file its script writes (inside a --publish folder, if one)
RESULT_FILES = {"example": "example.json", "matrix": "matrix.json", "simulate": "simulate.json",
                "predicted_outputs": "predicted_outputs.json"}


def _load(name: str) -> Any:
    return json.loads((PUBLISHED / RESULT_FILES[name]).read_text(encoding="utf-8"))


def _sources() -> dict[str, dict]:
    return json.loads(SOURCES.read_text(encoding="utf-8"))


def provenance(name: str, link_from: str = "benchmarks/") -> str:
    """One line: which command made the file, at which commit, when, on what.

    ``link_from``: the folder of the Markdown file the line goes into, for the link."""
    src = _sources()[name]
    dirty = " (with local changes)" if src.get("dirty") else ""
    target = f"benchmarks/published/{RESULT_FILES[name]}"
    machine = src["machine"].replace(" (", ", ").rstrip(")")
    return (f"From commit `{src['commit'][:7]}`{dirty} ({src['date']}; {machine}; "
            f"vLLM {src['vllm'].replace('+cpu', '')}): `{src['command']}` "
            f"([result file]({target[len(link_from):] if link_from else target})).")


def _example_module():
    spec = importlib.util.spec_from_file_location(
        "offline_generate_example", REPO / "examples" / "offline_generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- renderers: each returns the Markdown that goes between its markers ---------------

def example_rounds(data: dict) -> tuple[dict, str]:
    """The example's summary with every ratio's rounds, and what a round is: files from
    before the example ran rounds merged several runs (each run's ratio stands in for a
    round) or hold one run (one round, no spread)."""
    if "rounds" in data["setup"] or not data.get("runs"):
        return data["summary"], "rounds"
    summary = {method: {name: {**cell, "x_none_rounds": [run[method][name]["x_none"]
                                                          for run in data["runs"]]}
                        for name, cell in per_workload.items()}
               for method, per_workload in data["summary"].items()}
    return summary, "runs"


def render_example() -> str:
    """README.md: what `bash scripts/run_example.sh` printed, from its --json file."""
    example = _example_module()
    data = _load("example")
    summary, unit = example_rounds(data)
    lines = [example.setup_line(data["setup"]), "",
             *example.table_lines(summary), *example.reading_lines(summary, unit)]
    return (provenance("example", link_from="") + "\n\n```text\n"
            + "\n".join(lines) + "\n```\n")


def _ratios(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values) or "–"


def _workload(cell: dict) -> str:
    """The workload, the cell's kind where it is not a batch cell and its sampling where
    it is not greedy (matrix.py; a cell without temperature is greedy)."""
    return matrix.workload_label(cell)


def _note_key(cell: dict, target: str) -> str:
    """A target's key in notes.json: workload/dtype/batch/target, and the sampling
    before the target for a sampled cell."""
    sampled = matrix.sampling_label(cell)
    return "/".join([cell["workload"], cell["dtype"], str(cell["batch_size"]),
                     *([sampled] if sampled else []), target])


def render_targets() -> str:
    """benchmarks/README.md: ECHO's targets, cell by cell, from matrix.json."""
    cells = _load("matrix")
    notes = json.loads(NOTES.read_text(encoding="utf-8")) if NOTES.is_file() else {}
    rows = ["| workload | dtype | batch | prompts | commit | package | target | against | "
            "ratio per round | median | status | why not |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        commit = (cell.get("commit") or "–")[:7] + ("+" if cell.get("dirty") else "")
        # vllm_echo/'s tree hash: cells with the same one measured the same package code
        package = (cell.get("package_tree") or "–")[:7] + ("+" if cell.get("package_dirty") else "")
        for t in cell["targets"]:
            key = _note_key(cell, t["target"])
            status = {True: "met", False: "**not met**", None: "–"}[t["met"]]
            why = "" if t["met"] else notes.get(key, "(no note yet)")
            median = "–" if t["median"] is None else f"{t['median']:.3f}"
            rows.append(f"| {_workload(cell)} | {cell['dtype']} | {cell['batch_size']} | "
                        f"{cell['prompts']} | `{commit}` | `{package}` | {t['target']} | "
                        f"`{t['against']}` | "
                        f"{_ratios(t['ratios'])} | {median} | {status} | {why} |")
    return provenance("matrix") + "\n\n" + "\n".join(rows) + "\n"


def render_methods() -> str:
    """benchmarks/README.md: every method in every cell of the same matrix run."""
    cells = _load("matrix")
    names = [f"{_workload(c)}, b{c['batch_size']}, {c['dtype']}" for c in cells]
    methods: list[str] = []
    for cell in cells:
        methods += [e["method"] for e in cell["summary"] if e["method"] not in methods]
    rows = ["| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for method in methods:
        line = f"| `{method}` |"
        for cell in cells:
            entry = next((e for e in cell["summary"] if e["method"] == method), None)
            if entry is None:
                line += " – |"
                continue
            vs_none = entry.get("vs_none")
            ratio = "–" if not vs_none else f"{vs_none['median']:.2f}x"
            identical = cell["identical"].get(method, "–")
            line += (f" {entry['output_tokens_per_s']['median']:.1f} tok/s, {ratio}, "
                     f"{entry['tokens_per_forward']:.2f} tok/fwd, "
                     + ("sampled |" if identical is None and matrix.sampling_label(cell)
                        else f"{identical} identical |"))
        rows.append(line)
    return ("Each cell: median output tokens per second, its ratio to `none` of the same "
            "round, tokens per target forward, outputs identical to `none`'s. "
            + provenance("matrix") + "\n\n" + "\n".join(rows) + "\n")


def render_replay() -> str:
    """benchmarks/README.md: trace replay, ECHO and fixed drafters per batch size."""
    report = _load("simulate")
    batches = sorted({r["batch"] for r in report["batches"]})
    by_cell: dict[tuple[str, str], dict[int, dict]] = {}
    for r in report["batches"]:
        if r["method"].startswith("echo-"):  # ablations of switches ECHO no longer has
            continue
        by_cell.setdefault((r["cost"], r["method"]), {})[r["batch"]] = r
    rows = ["| step cost | method | " + " | ".join(f"batch {b}" for b in batches) + " |",
            "|---|---|" + "---|" * len(batches)]
    for (cost, method), per_batch in by_cell.items():
        cells = [f"{per_batch[b]['modeled_speedup']:.2f} ({per_batch[b]['tokens_per_step']:.2f})"
                 if b in per_batch else "–" for b in batches]
        rows.append(f"| {cost} | `{method}` | " + " | ".join(cells) + " |")
    return (f"{report['replayed_prompts']} recorded prompts; each cell: modeled speed-up over "
            "no speculation (tokens per forward). " + provenance("simulate") + "\n\n"
            + "\n".join(rows) + "\n")


def render_predicted_outputs() -> str:
    """benchmarks/README.md: Predicted Outputs per workload, method and batch size."""
    data = _load("predicted_outputs")
    overlaps = data["overlaps_regenerate"]
    return (f"Regenerate set: a second answer shares {min(overlaps):.2f} to {max(overlaps):.2f} "
            f"of its tokens with the first (median {data['overlap_regenerate']:.2f}). "
            + provenance("predicted_outputs") + "\n\n"
            + "\n".join(predicted_outputs.summary(data["rows"])) + "\n")


# table name -> (file, renderer)
TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "example": ("README.md", render_example),
    "targets": ("benchmarks/README.md", render_targets),
    "methods": ("benchmarks/README.md", render_methods),
    "replay": ("benchmarks/README.md", render_replay),
    "predicted_outputs": ("benchmarks/README.md", render_predicted_outputs),
}


def _marker(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- table:{name} -->\n)(.*?)(<!-- /table:{name} -->)", re.S)


def rendered_files() -> dict[Path, tuple[str, str]]:
    """{file: (text now, text with every table re-rendered)}."""
    out: dict[Path, tuple[str, str]] = {}
    for name, (rel, render) in TABLES.items():
        path = REPO / rel
        before = out[path][0] if path in out else path.read_text(encoding="utf-8")
        text = out[path][1] if path in out else before
        pattern = _marker(name)
        if not pattern.search(text):
            raise SystemExit(f"{rel}: no <!-- table:{name} --> ... <!-- /table:{name} --> block")
        body = render()
        text = pattern.sub(lambda m: m.group(1) + body + m.group(3), text)
        out[path] = (before, text)
    return out


def merge_examples(runs: list[dict]) -> dict:
    """Several runs of the example as one: per method and workload the median tok/s,
    tokens per forward and ratio to none (each run's ratio from that run), every run's
    rounds' ratios (a run from before rounds: its ratio), and the identical outputs
    summed; ``runs`` keeps every run's summary."""
    import statistics

    merged = {**runs[-1], "runs": [r["summary"] for r in runs]}
    summary = {}
    for method, per_workload in runs[-1]["summary"].items():
        summary[method] = {}
        for workload in per_workload:
            cells = [r["summary"][method][workload] for r in runs]
            tpf = [c["tpf"] for c in cells if c["tpf"] is not None]
            summary[method][workload] = {
                "tok_s": statistics.median(c["tok_s"] for c in cells),
                "tpf": statistics.median(tpf) if tpf else None,
                "x_none": statistics.median(c["x_none"] for c in cells),
                "x_none_rounds": [x for c in cells for x in c.get("x_none_rounds", [c["x_none"]])],
                "identical": sum(c["identical"] for c in cells),
                "outputs": sum(c["outputs"] for c in cells)}
    merged["summary"] = summary
    merged["setup"] = {**runs[-1]["setup"], "runs": len(runs)}
    return merged


def merge_matrices(folders: list[Path]) -> list[dict]:
    """The cells of several matrix.py runs as one matrix: a later folder's cell replaces
    an earlier one of the same workload, dtype, batch size, kind and sampling
    (matrix.cell_key: a sampled cell and the greedy one stay side by side; a cell without
    temperature is greedy); every cell carries the commit it ran at (read from its
    offline.py results where matrix.json has none). A path may also be a matrix.json
    itself (the published one: new cells join the published cells)."""
    cells: dict[tuple, dict] = {}
    for folder in folders:
        path = folder / "matrix.json" if folder.is_dir() else folder
        for cell in json.loads(path.read_text(encoding="utf-8")):
            if not cell.get("commit"):
                report = matrix.cell_folder(folder, cell["workload"], cell["dtype"],
                                            cell["batch_size"], cell.get("kind", "batch"),
                                            *matrix.sampling(cell))
                report = report / "results.json"
                git = json.loads(report.read_text(encoding="utf-8"))["environment"]["git"]
                cell = {**cell, "commit": git["commit"], "dirty": git["dirty"],
                        "package_tree": git.get("package_tree"),
                        "package_dirty": git.get("package_dirty")}
            cells[matrix.cell_key(cell)] = cell  # a replaced cell keeps its place
    return list(cells.values())


def publish(name: str, source: Path, command: str, more: list[Path] = ()) -> None:
    """Copy a script's result into benchmarks/published/ and record where it came from
    (the example: several runs' files are published as their medians; the matrix:
    several runs' cells as one matrix, the last folder's commit as its source)."""
    src = source / RESULT_FILES[name] if source.is_dir() else source
    data = json.loads(src.read_text(encoding="utf-8"))
    if name == "example" and more:
        data = merge_examples([data] + [json.loads(p.read_text(encoding="utf-8")) for p in more])
    if name == "matrix":  # matrix.json has no environment; each cell's offline.py run has
        data = merge_matrices([source, *more])
        cell = next((more[-1] if more else source).glob("*/results.json"))
        env = json.loads(cell.read_text(encoding="utf-8"))["environment"]
        git = env["git"]
    elif name == "example":
        env = data["environment"]
        git = {"commit": env["commit"], "dirty": env["dirty"]}
    else:
        env = data["environment"]
        git = env["git"]
    PUBLISHED.mkdir(parents=True, exist_ok=True)
    if more or name == "matrix":
        (PUBLISHED / RESULT_FILES[name]).write_text(json.dumps(data, indent=1) + "\n",
                                                   encoding="utf-8")
    else:
        shutil.copyfile(src, PUBLISHED / RESULT_FILES[name])
    sources = _sources() if SOURCES.is_file() else {}
    sources[name] = {
        "file": RESULT_FILES[name], "command": command, "commit": git["commit"],
        "dirty": git["dirty"],
        "date": env.get("date") or time.strftime("%Y-%m-%d", time.localtime(src.stat().st_mtime)),
        "machine": f"{env['cpu']} ({env['cpu_count']} cores)", "vllm": env["vllm"]}
    SOURCES.write_text(json.dumps(sources, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"published {src} as {PUBLISHED / RESULT_FILES[name]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 and print a diff if a table differs")
    p.add_argument("--publish", nargs="+", metavar="NAME PATH",
                   help=f"NAME: one of {', '.join(RESULT_FILES)}; PATH: the result file or "
                        "the folder the script wrote (example: several files, published "
                        "as their medians; matrix: several folders, or the published "
                        "matrix.json first, their cells merged, a later folder's cell "
                        "replacing an earlier one's)")
    p.add_argument("--command", help="with --publish: the command that made the result")
    args = p.parse_args(argv)
    if args.publish:
        if not args.command:
            p.error("--publish needs --command")
        if len(args.publish) < 2:
            p.error("--publish needs NAME and PATH")
        name, path, *more = args.publish
        if name not in RESULT_FILES:
            p.error(f"unknown NAME {name!r}; allowed: {', '.join(RESULT_FILES)}")
        if more and name not in ("example", "matrix"):
            p.error("several PATHs: the example or the matrix only")
        publish(name, Path(path), args.command, [Path(m) for m in more])
    stale = 0
    for path, (before, after) in rendered_files().items():
        if before == after:
            continue
        if args.check:
            stale += 1
            rel = str(path.relative_to(REPO))
            sys.stdout.writelines(difflib.unified_diff(
                before.splitlines(True), after.splitlines(True), rel, rel + " (rendered)"))
        else:
            path.write_text(after, encoding="utf-8")
            print(f"rendered the tables of {path.relative_to(REPO)}")
    if stale:
        print(f"\n{stale} file(s) differ from their result files: run "
              "python benchmarks/render_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
