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
