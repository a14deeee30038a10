# SPDX-License-Identifier: Apache-2.0
"""Each benchmark script's --smoke mode runs and writes well-formed JSON.

Speed is not checked (CI machines vary); only that the scripts work end to end and
their reports carry the keys the README documents. Each script runs in its own
process, so no vLLM engine outlives its test. Scripts whose engines run compiled by
default (vLLM's mode) get ``--eager`` here: compiling costs CI time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_echo.plugin.config_shim import CPU_ECHO_CAPACITY

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def run_smoke(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(BENCH / script), "--smoke", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.engine
def test_matrix_smoke(tmp_path: Path) -> None:
    run_smoke("matrix.py", "--eager", "--out", str(tmp_path), timeout=900)
    cells = json.loads((tmp_path / "matrix.json").read_text())
    assert [(c["workload"], c["dtype"], c["batch_size"], c["mode"]) for c in cells] == [
        ("copy-edit", "float32", 1, "eager")]
    (cell,) = cells
    assert {e["method"] for e in cell["summary"]} == {"none", "ngram", "echo"}
    assert all(v == "2/2" for v in cell["identical"].values()), cell["identical"]
    # batch 1 on the copy-heavy set: "echo >= best" and "echo >= 1.10 x best", each with
    # echo / best of the same round, and met or not by its median
    assert [t["minimum"] for t in cell["targets"]] == [1.00, 1.10]
    for target in cell["targets"]:
        assert target["against"] in {"none", "ngram"} and len(target["ratios"]) == 1
        assert target["met"] == (target["median"] >= target["minimum"])
    assert "| copy-edit | float32 | 1 |" in (tmp_path / "matrix.md").read_text()
    # batch 1 runs the methods side by side, prompt by prompt, each its whole prompt set
    offline_report = json.loads((tmp_path / "copy-edit-float32-b1" / "results.json").read_text())
    assert offline_report["interleaved"] is True
    assert all(r["status"] == "ok" and r["num_prompts"] == 2 and len(r["token_ids"]) == 2
               for r in offline_report["results"])


def test_shipped_prompt_sets_match_their_build() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "build_prompt_sets.py"), "--check"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.engine
def test_offline_smoke(tmp_path: Path) -> None:
    run_smoke("offline.py", "--eager", "--out", str(tmp_path), timeout=900)
    report = json.loads((tmp_path / "results.json").read_text())
    assert {"environment", "results", "methods", "max_tokens"} <= report.keys()
    assert report["enforce_eager"] is True
    assert {"vllm", "cpu", "dtype", "git"} <= report["environment"].keys()
    rows = {r["method"]: r for r in report["results"]}
    assert set(rows) == {"none", "logitspec", "echo"}
    # "unavailable" is for configs the plugin does not have; ours must always run.
    for name, row in rows.items():
        assert row["status"] == "ok", f"{name}: {row['status']}: {row.get('reason')}"
        assert row["execution_mode"]["mode"] == "eager", (name, row["execution_mode"])
    none = rows["none"]
    assert {"output_tokens_per_s", "tokens_per_forward", "tokens_per_forward_by_category",
            "ratio_to_none", "identical_to_none", "wall_s"} <= none.keys()
    # Without drafts every forward emits exactly one token.
    assert none["tokens_per_forward"] == pytest.approx(1.0)
    assert [(s["tokens"], s["emitted_per_step"]) for s in none["step_sizes"]] == [(1, 1.0)]
    for name, row in rows.items():
        # every token but each prompt's first (its prefill's) comes from a decode step
        decoded = sum(round(s["emitted_per_step"] * s["steps"]) for s in row["step_sizes"])
        assert decoded == row["output_tokens"] - row["num_prompts"], name
        # batch 1: the first step prefills the first prompt and emits its first token
        assert row["first_step"]["emitted"] == 1, name
    for name in ("logitspec", "echo"):
        spec = rows[name]
        assert {"num_drafts", "draft_acceptance_rate", "accepted_tokens_per_position",
                "draft_utilization"} <= spec["spec_decode"].keys(), name
        assert spec["proposer"]["calls"] > 0, name
        # greedy fp32 speculation is lossless
        assert spec["identical_to_none"] == "2/2", name
    assert (tmp_path / "results.md").is_file()


def test_micro_proposer_smoke(tmp_path: Path) -> None:
    out = tmp_path / "micro.json"
    run_smoke("micro_proposer.py", "--json", str(out), timeout=300)
    report = json.loads(out.read_text())
    methods = {r["method"] for r in report["results"]}
    assert any(m.startswith("vLLM NgramProposer") for m in methods)
    assert any(m.startswith("vllm-echo forest") for m in methods)
    for row in report["results"]:
        assert {"batch", "context", "ms_per_step", "ns_per_context_token"} <= row.keys()
        assert row["ms_per_step"] > 0


@pytest.mark.engine
def test_overhead_smoke(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    run_smoke("overhead.py", "--out", str(out), timeout=600)
    runs = json.loads(out.read_text())["runs"]
    echo = next(r for r in runs if r["config"] == "echo-idle")
    assert echo["hooked"] and echo["ms_per_step"]["step"] > 0, echo
    assert echo["texts"] == next(r for r in runs if r["config"] == "none")["texts"]


@pytest.mark.engine
def test_simulate_smoke(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    run_smoke("simulate.py", "--json", str(out), timeout=300)
    report = json.loads(out.read_text())
    assert report["replayed_prompts"] == 2
    results = report["methods"]
    assert results["none"]["tokens_per_step"] == pytest.approx(1.0)
    assert results["none"]["modeled_speedup"] == pytest.approx(1.0)
    assert {f"echo chain (capacity {CPU_ECHO_CAPACITY})",
            f"echo tree (capacity {CPU_ECHO_CAPACITY})"} <= results.keys()
    for name, row in results.items():
        assert {"tokens_per_step", "drafted_per_step", "steps", "tokens",
                "modeled_speedup"} <= row.keys(), name
        assert row["tokens_per_step"] >= 1.0 and row["modeled_speedup"] > 0
    # ECHO (with and without a start-up curve, in its other mode) against the fixed-K
    # drafters, per cost curve and batch size
    cells = {(r["cost"], r["batch"], r["method"]) for r in report["batches"]}
    assert len(cells) == len(report["batches"]) == 2 * 2 * 5
    assert ("cpu", 3, "echo, no start-up curve") in cells
    assert ("cpu", 3, "echo, trees") in cells and ("cpu", 1, "echo") in cells
    assert all(r["modeled_speedup"] > 0 and r["tokens_per_step"] >= 1.0
               for r in report["batches"])


@pytest.mark.server
def test_online_smoke(tmp_path: Path) -> None:
    run_smoke("online.py", "--out", str(tmp_path), timeout=600)
    report = json.loads((tmp_path / "results.json").read_text())
    assert "error" not in report, report.get("error")
    (level,) = report["levels"]
    assert level["completed"] == 2 and level["errors"] == 0
    assert level["output_tokens"] > 0
    assert {"p50", "p99", "mean"} <= level["ttft_ms"].keys()
    assert {"output_tokens_per_s", "itl_ms", "tpot_ms"} <= level.keys()


@pytest.mark.engine
def test_tree_step_time_smoke(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    run_smoke("tree_step_time.py", "--out", str(out), timeout=900)
    report = json.loads(out.read_text())
    # every path ran and verified what it is named for (the script checks the tree
    # verifications of each: trees for native and flex, none for the chain)
    assert {r["path"] for r in report["rows"]} == {"chain", "native", "flex"}
    (cell,) = report["cells"]
    assert {"chain_ms", "native_ms", "flex_ms", "native_over_chain", "flex_over_chain"} <= cell.keys()
    assert all(r["step_s"] > 0 for r in report["rows"])
    # the chain curve (--chain-lengths), smoked in the same process
    curve = report["curve"]
    assert [c["drafts"] for c in curve] == [0, 2]
    assert curve[0]["over_no_drafts"] == 1.0 and curve[1]["step_ms"] > 0


def test_recycled_bound_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bound.json"
    run_smoke("recycled_bound.py", "--json", str(out), timeout=300)
    report = json.loads(out.read_text())
    assert report["requests"] == 4
    own, *trees = report["results"]
    assert own["recycled_tree_widths"] is None and own["over_own_chain"] == 1.0
    assert [t["recycled_tree_widths"] for t in trees] == [[1], [2, 1]]
    # the tree is verified besides the chain: never fewer tokens per forward
    assert all(t["tokens_per_forward"] >= own["tokens_per_forward"] for t in trees)
