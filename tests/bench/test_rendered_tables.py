# SPDX-License-Identifier: Apache-2.0
"""The result tables in README.md and benchmarks/README.md are what their committed
result files render to (benchmarks/render_tables.py --check), and every rendered file
says where it came from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_rendered_tables_match_their_result_files() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "render_tables.py"),
                           "--check"], capture_output=True, text=True, timeout=120,
                          check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_every_published_file_has_its_source() -> None:
    published = REPO / "benchmarks" / "published"
    sources = json.loads((published / "sources.json").read_text(encoding="utf-8"))
    files = {p.name for p in published.glob("*.json")} - {"sources.json", "notes.json"}
    assert files == {s["file"] for s in sources.values()}
    for name, source in sources.items():
        assert {"command", "commit", "date", "machine", "vllm"} <= source.keys(), name
        assert len(source["commit"]) == 40, name


def test_settings_reference_names_real_keys() -> None:
    """docs/settings.md documents keys the config accepts (no stale ones)."""
    from vllm_echo.config import EchoSettings, VLLM_PASSTHROUGH_KEYS

    text = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    rows = [line.split("|")[1].strip() for line in text.splitlines()
            if line.startswith("| `")]
    keys = {row.strip("`") for row in rows}
    assert keys, "no settings table found"
    assert keys <= EchoSettings.field_names() | VLLM_PASSTHROUGH_KEYS, \
        keys - EchoSettings.field_names()


def test_matrix_runs_merge_cell_by_cell(tmp_path: Path) -> None:
    """--publish matrix OLD NEW: NEW's cell replaces OLD's of the same workload, dtype,
    batch size and kind; each keeps the commit it ran at."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import render_tables

    def run(name: str, commit: str, cells: list[tuple]) -> Path:
        folder = tmp_path / name
        out = []
        for workload, batch, kind, median in cells:
            sub = "cold-start" if kind == "cold-start" else f"b{batch}"
            (folder / f"{workload}-float32-{sub}").mkdir(parents=True)
            (folder / f"{workload}-float32-{sub}" / "results.json").write_text(json.dumps(
                {"environment": {"git": {"commit": commit * 40, "dirty": False}}}))
            out.append({"workload": workload, "dtype": "float32", "batch_size": batch,
                        "kind": kind, "targets": [{"median": median}]})
        (folder / "matrix.json").write_text(json.dumps(out))
        return folder

    old = run("old", "a", [("copy-edit", 1, "batch", 1.1), ("spec-bench", 16, "cold-start", 0.9)])
    new = run("new", "b", [("spec-bench", 16, "cold-start", 1.1), ("spec-bench", 8, "batch", 1.2)])
    merged = render_tables.merge_matrices([old, new])
    assert [(c["workload"], c["batch_size"], c["commit"][0], c["targets"][0]["median"])
            for c in merged] == [("copy-edit", 1, "a", 1.1), ("spec-bench", 16, "b", 1.1),
                                 ("spec-bench", 8, "b", 1.2)]
    # a published matrix.json (no folder of results behind it) takes new cells the same way
    published = tmp_path / "published-matrix.json"
    published.write_text(json.dumps(merged))
    newer = run("newer", "c", [("copy-edit", 1, "batch", 1.3)])
    assert [(c["workload"], c["batch_size"], c["commit"][0])
            for c in render_tables.merge_matrices([published, newer])] == [
        ("copy-edit", 1, "c"), ("spec-bench", 16, "b"), ("spec-bench", 8, "b")]


def test_sampled_cells_publish_next_to_greedy_ones(tmp_path: Path, monkeypatch) -> None:
    """--publish matrix GREEDY SAMPLED: a sampled cell (temperature, top_p) keeps its own
    row beside the greedy cell of the same workload, dtype and batch size, labelled with
    its sampling; a published cell without temperature is greedy, and a new greedy cell
    replaces it."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import matrix
    import render_tables

    env = {"git": {"commit": "c" * 40, "dirty": False}, "date": "2026-01-01",
           "cpu": "test cpu", "cpu_count": 2, "vllm": "0.0"}
    summary = [{"method": m, "output_tokens_per_s": {"median": 10.0}, "tokens_per_forward": 1.5,
                "vs_none": {"median": 1.1}} for m in ("none", "echo")]

    def run(name: str, cells: list[dict]) -> Path:
        folder = tmp_path / name
        for cell in cells:
            sub = matrix.cell_folder(folder, cell["workload"], "float32", 1, "batch",
                                     *matrix.sampling(cell))
            sub.mkdir(parents=True)
            (sub / "results.json").write_text(json.dumps({"environment": env}))
        (folder / "matrix.json").write_text(json.dumps(cells))
        return folder

    def cell(median: float, **sampling) -> dict:
        return {"workload": "spec-bench", "dtype": "float32", "batch_size": 1, "kind": "batch",
                "prompts": 13, "commit": "c" * 40, "dirty": False, **sampling,
                "summary": summary, "identical": {"none": None if sampling.get("temperature")
                                                  else "13/13", "echo": None},
                "targets": [{"target": "echo >= best at batch 1", "against": "none",
                             "ratios": [median], "median": median, "met": median >= 1}]}

    old = run("old", [cell(1.01)])  # published before cells carried their sampling
    greedy = run("greedy", [cell(1.02, temperature=0.0, top_p=1.0)])
    sampled = run("sampled", [cell(1.07, temperature=0.7, top_p=0.95),
                              cell(0.97, temperature=1.0, top_p=0.95)])
    published = tmp_path / "published"
    published.mkdir()
    monkeypatch.setattr(render_tables, "PUBLISHED", published)
    monkeypatch.setattr(render_tables, "SOURCES", published / "sources.json")
    monkeypatch.setattr(render_tables, "NOTES", published / "notes.json")
    render_tables.publish("matrix", old, "python benchmarks/matrix.py ...", [sampled, greedy])
    cells = json.loads((published / "matrix.json").read_text())
    assert [(matrix.workload_label(c), c["targets"][0]["median"]) for c in cells] == [
        ("spec-bench", 1.02), ("spec-bench, T=0.7 top-p 0.95", 1.07),
        ("spec-bench, T=1.0 top-p 0.95", 0.97)]
    targets = render_tables.render_targets()
    assert "| spec-bench | float32 | 1 | 13 |" in targets
    assert "| spec-bench, T=0.7 top-p 0.95 | float32 | 1 | 13 |" in targets
    assert "| spec-bench, T=1.0 top-p 0.95 | float32 | 1 | 13 |" in targets
    # an unmet sampled target's note is its own, not the greedy cell's
    (published / "notes.json").write_text(json.dumps({
        "spec-bench/float32/1/echo >= best at batch 1": "greedy note",
        "spec-bench/float32/1/T=1.0 top-p 0.95/echo >= best at batch 1": "sampled note"}))
    row = next(line for line in render_tables.render_targets().splitlines()
               if line.startswith("| spec-bench, T=1.0"))
    assert row.endswith("| **not met** | sampled note |")
    methods = render_tables.render_methods()
    assert "spec-bench, b1, float32 | spec-bench, T=0.7 top-p 0.95, b1, float32 |" in methods
    assert "1.50 tok/fwd, 13/13 identical |" in methods and "1.50 tok/fwd, sampled |" in methods
