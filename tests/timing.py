# SPDX-License-Identifier: Apache-2.0
"""Where the suite's time goes: each test's duration and the vLLM starts it made.

A pytest plugin (loaded by tests/conftest.py). With ``--timing-json PATH`` it writes,
at the end of the session, one row per test: its node id, module, markers, outcome,
seconds (setup + call + teardown: a shared fixture's start-up is paid by the first test
that asks for it) and the vLLM starts recorded during it. Engines and servers started
through tests/vllm's helpers call :func:`record_start`; scripts/test_durations.py
turns the file into tests/DURATIONS.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

# Markers of tests that start vLLM processes (pytest.ini); the quick tier runs the rest.
START_MARKERS = ("engine", "server", "ray", "tp")

_rows: dict[str, dict] = {}
_current: list[str] = []


def record_start(kind: str, seconds: float) -> None:
    """A vLLM engine or server (``kind``) became ready after ``seconds``."""
    if _current:
        row = _rows[_current[0]]
        row["starts"].append({"kind": kind, "seconds": round(seconds, 2)})


class StartClock:
    """``with StartClock("engine"):`` around a start records it."""

    def __init__(self, kind: str):
        self.kind = kind

    def __enter__(self):
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            record_start(self.kind, time.monotonic() - self._t0)


def pytest_addoption(parser):
    parser.addoption("--timing-json", default=None, metavar="PATH",
                     help="write each test's seconds, markers and vLLM starts to PATH")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _rows[item.nodeid] = {
        "test": item.nodeid, "module": item.nodeid.split("::")[0],
        "markers": sorted({m.name for m in item.iter_markers()} & set(START_MARKERS)),
        "seconds": 0.0, "outcome": "passed", "starts": []}
    _current[:] = [item.nodeid]
    try:
        yield
    finally:
        _current.clear()


def pytest_runtest_logreport(report):
    row = _rows.get(report.nodeid)
    if row is None:
        return
    row["seconds"] = round(row["seconds"] + report.duration, 3)
    if report.failed:
        row["outcome"] = "failed"
    elif report.skipped and row["outcome"] == "passed":
        row["outcome"] = "skipped"


def pytest_sessionfinish(session):
    path = session.config.getoption("--timing-json")
    if path:
        Path(path).write_text(json.dumps(list(_rows.values()), indent=1) + "\n")
