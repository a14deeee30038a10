# SPDX-License-Identifier: Apache-2.0
"""matrix.py's cells without engines (offline.py stubbed): the cold-start cell runs
fresh engines without warm-up, batch 16, the first 64 decode steps of 16 prompts x 256
tokens, none against echo, and reports echo / none per round; the batch-64 cell measures
64 decode steps at a full batch; the new workloads pass their own offline.py options."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import matrix  # noqa: E402
import offline  # noqa: E402
import offline_report  # noqa: E402


@pytest.fixture
def calls(monkeypatch) -> list:
    """offline.main stubbed: each method gets 10 tok/s x (1.2 for echo) x (round + 1)."""
    seen = []

    def fake_main(argv):
        args = offline.parse_args(argv)
        seen.append((argv, args))
        rows = [{"method": m, "batch_size": b, "round": k, "status": "ok",
                 "num_prompts": max(args.num_prompts, b), "tokens_per_forward": 1.0,
                 "output_tokens_per_s": 10.0 * (1.2 if m == "echo" else 1.0) * (k + 1),
                 "token_ids": [[1]]}
                for b in args.batch_sizes for k in range(args.repeats) for m in args.methods]
        offline_report.compare_with_none(rows, 0.0)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"results": rows, "summary": offline_report.summarize(rows, args.reference),
             "max_tokens": args.max_tokens}))
        return 0

    monkeypatch.setattr(matrix.offline, "main", fake_main)
    return seen


def test_cold_start_cell(tmp_path: Path, calls: list) -> None:
    matrix.main(["--workloads", "copy-edit", "agent-loop", "--dtypes", "float32",
                 "--cells", "cold-start", "--repeats", "2", "--out", str(tmp_path)])
    (argv, args), = calls  # the agent loop has no cold-start cell
    assert args.no_warmup and args.batch_sizes == [16] and args.num_prompts == 16
    assert args.max_tokens == 256 and args.window_steps == 64
    assert args.methods == ["none", "echo"]
    assert not args.interleave and not args.eager
    (cell,) = json.loads((tmp_path / "matrix.json").read_text())
    assert (cell["kind"], cell["batch_size"], cell["prompts"], cell["mode"]) == (
        "cold-start", 16, 16, "compiled")
    (target,) = cell["targets"]
    assert target["target"] == "echo >= none at cold start" and target["against"] == "none"
    assert target["ratios"] == [pytest.approx(1.2)] * 2 and target["met"] is True
    assert "| copy-edit, cold start | float32 | 16 | 16 |" in (tmp_path / "matrix.md").read_text()


def test_new_workloads_run_their_batch_sizes(tmp_path: Path, calls: list) -> None:
    matrix.main(["--workloads", "tool-call", "agent-loop", "--dtypes", "float32",
                 "--cells", "batch", "--repeats", "1", "--eager", "--out", str(tmp_path)])
    runs = [(a.dataset, a.batch_sizes[0], a.multi_turn, a.max_model_len, a.interleave,
             a.eager) for _, a in calls]
    assert runs == [("tool_call_question.jsonl", 1, False, 2048, True, True),
                    ("tool_call_question.jsonl", 8, False, 2048, False, True),
                    ("tool_call_question.jsonl", 16, False, 2048, False, True),
                    ("agent_loop_question.jsonl", 1, True, 8192, True, True)]
    cells = json.loads((tmp_path / "matrix.json").read_text())
    assert [(c["workload"], c["batch_size"], c["kind"], c["mode"]) for c in cells] == [
        ("tool-call", 1, "batch", "eager"), ("tool-call", 8, "batch", "eager"),
        ("tool-call", 16, "batch", "eager"), ("agent-loop", 1, "batch", "eager")]
    assert [t["target"] for t in cells[2]["targets"]] == [
        "echo >= none at batch 16, steady", "echo >= best at batch 16, steady"]


def test_batch_64_cell_measures_a_window_at_a_full_batch(tmp_path: Path, calls: list) -> None:
    matrix.main(["--workloads", "spec-bench", "--dtypes", "float32", "--batch-sizes", "8",
                 "64", "--cells", "batch", "--repeats", "1", "--out", str(tmp_path)])
    (_, steady), (_, loaded) = calls
    assert steady.batch_sizes == [8] and steady.num_prompts == 32 and not steady.window_steps
    # two prompts per slot: a slot whose request ends inside the window is refilled
    assert loaded.batch_sizes == [64] and loaded.num_prompts == 128
    assert loaded.window_steps == 64 and not loaded.no_warmup and not loaded.interleave
