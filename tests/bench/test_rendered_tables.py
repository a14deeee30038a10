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
