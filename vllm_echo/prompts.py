# SPDX-License-Identifier: Apache-2.0
"""Benchmark prompt sets (FastChat / Spec-Bench "question" JSONL) for examples,
tests and benchmarks.

Rows look like ``{"question_id", "category", "turns": [str, ...]}``; the first turn
is the prompt. The sets the project uses ship inside the package
(``vllm_echo/data``, sources and licences in its README); ``VLLM_ECHO_DATA`` names a
folder searched first. Any JSONL in that format works, given by path.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

SPEC_BENCH = "spec_bench_question.jsonl"


@dataclass(frozen=True)
class Prompt:
    question_id: object
    category: str
    text: str

    def as_chat(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.text}]


PACKAGED_DATA = Path(__file__).resolve().parent / "data"


def data_dirs() -> list[Path]:
    """Folders searched for a prompt file given by name, in order."""
    env = os.environ.get("VLLM_ECHO_DATA")
    return ([Path(env)] if env else []) + [PACKAGED_DATA]


def resolve(path_or_name: str | os.PathLike) -> Path:
    """A JSONL path, or a file name inside ``VLLM_ECHO_DATA`` or the packaged data."""
    path = Path(path_or_name)
    if path.is_file():
        return path
    for folder in data_dirs():
        if (folder / path).is_file():
            return folder / path
    raise FileNotFoundError(
        f"prompt file {str(path_or_name)!r} not found (looked in "
        f"{', '.join(map(str, data_dirs()))}; pass a path, or set VLLM_ECHO_DATA to the "
        "folder holding it)")


def load(path_or_name: str | os.PathLike = SPEC_BENCH, n: int | None = None) -> list[Prompt]:
    """Load prompts; with ``n``, take ``n`` spread evenly over the categories, in a
    fixed order (round-robin over categories, each in file order)."""
    rows = []
    with open(resolve(path_or_name), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            turns = row.get("turns") or [row.get("prompt") or row.get("question")]
            if not turns or not isinstance(turns[0], str):
                raise ValueError(f"{path_or_name}: row without a text prompt: {line[:80]}")
            rows.append(Prompt(row.get("question_id"), row.get("category", "default"), turns[0]))
    if n is None or n >= len(rows):
        return rows
    by_category: dict[str, list[Prompt]] = {}
    for row in rows:
        by_category.setdefault(row.category, []).append(row)
    picked: list[Prompt] = []
    depth = 0
    while len(picked) < n:
        for items in by_category.values():
            if depth < len(items) and len(picked) < n:
                picked.append(items[depth])
        depth += 1
    return picked
