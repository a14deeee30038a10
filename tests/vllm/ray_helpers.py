# SPDX-License-Identifier: Apache-2.0
"""Reading what happened inside Ray replicas, for the Ray Data / Ray Serve LLM tests.

Ray writes each worker's output (vLLM's engine processes inherit it) to files under
the session's logs folder; the plugin's drafter logs its settings there at start-up,
and publishes its counters to a stats file named after the engine, which lives as
long as the engine's front process (vllm_echo/plugin/metrics.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from vllm_echo.plugin.metrics import stats_root

DRAFTER_LINE = re.compile(
    r"vllm-echo: (\w+) drafter in pid (\d+), engine (\S+), settings (\{.*\})")


@dataclass(frozen=True)
class Drafter:
    method: str
    pid: int
    engine: str
    settings: dict

    def stats(self) -> dict:
        """The drafter's last published counters (steps, drafts ...); {} once the
        engine's front process has exited (it removes the file)."""
        path = stats_root() / f"{self.engine}.json"
        return json.loads(path.read_text()) if path.is_file() else {}


class RayLogs:
    """What Ray's worker log files gained since this object was made."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._start = {p: p.stat().st_size for p in self._files()}

    def _files(self) -> list[Path]:
        return [p for p in self.folder.glob("worker-*") if p.suffix in (".out", ".err")]

    def new_texts(self) -> list[str]:
        """One text per worker log file (a replica and its engine processes share one)."""
        texts = []
        for path in self._files():
            with open(path, "rb") as f:
                f.seek(self._start.get(path, 0))
                texts.append(f.read().decode("utf-8", "replace"))
        return texts

    def new_text(self) -> str:
        return "\n".join(self.new_texts())

    def drafters(self) -> list[Drafter]:
        return drafters_in(self.new_text())


def drafters_in(text: str) -> list[Drafter]:
    """The drafters whose start-up line is in ``text``."""
    return [Drafter(m[1], int(m[2]), m[3], json.loads(m[4])) for m in DRAFTER_LINE.finditer(text)]
