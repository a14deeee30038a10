# SPDX-License-Identifier: Apache-2.0
"""matrix.py's cells without engines (offline.py stubbed): the cold-start cell runs
fresh engines without warm-up, batch 16, the first 64 decode steps of 16 prompts x 256
tokens, none against echo, and reports echo / none per round; the batch-64 cell measures
64 decode steps at a full batch; the new workloads pass their own offline.py options;
a sampled cell is labelled, stored and keyed apart from the greedy one."""

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
        offline_report.compare_with_none(rows, args.temperature)
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


def test_sampled_cell_is_told_apart_from_the_greedy_one(tmp_path: Path, calls: list) -> None:
    for extra in ([], ["--temperature", "0.7", "--top-p", "0.95"]):
        matrix.main(["--workloads", "spec-bench", "--dtypes", "float32", "--batch-sizes", "1",
                     "--cells", "batch", "--repeats", "1", "--methods", "none", "ngram",
                     "echo", "--out", str(tmp_path / ("sampled" if extra else "greedy")),
                     *extra])
    (_, greedy), (_, sampled) = calls
    assert (greedy.temperature, greedy.top_p) == (0.0, 1.0)
    assert (sampled.temperature, sampled.top_p) == (0.7, 0.95) and sampled.interleave
    (g,) = json.loads((tmp_path / "greedy" / "matrix.json").read_text())
    (s,) = json.loads((tmp_path / "sampled" / "matrix.json").read_text())
    assert (g["temperature"], g["top_p"], s["temperature"], s["top_p"]) == (0.0, 1.0, 0.7, 0.95)
    # the same targets as greedy at batch 1; identity is not compared when sampled
    assert [t["target"] for t in s["targets"]] == [t["target"] for t in g["targets"]]
    assert s["targets"][0]["met"] is True
    assert g["identical"] == {"none": "1/1", "ngram": "1/1", "echo": "1/1"}
    assert set(s["identical"].values()) == {None}
    # its own folder, label and key; a greedy cell of old (no temperature) stays greedy
    assert (tmp_path / "sampled" / "spec-bench-float32-b1-t0.7-p0.95" / "results.json").is_file()
    assert (tmp_path / "greedy" / "spec-bench-float32-b1" / "results.json").is_file()
    assert matrix.workload_label(g) == "spec-bench"
    assert matrix.workload_label(s) == "spec-bench, T=0.7 top-p 0.95"
    old = {k: v for k, v in g.items() if k not in ("temperature", "top_p")}
    assert matrix.cell_key(old) == matrix.cell_key(g) != matrix.cell_key(s)
    assert "| spec-bench | float32 | 1 |" in (tmp_path / "greedy" / "matrix.md").read_text()
    assert "| spec-bench, T=0.7 top-p 0.95 | float32 | 1 |" in (
        tmp_path / "sampled" / "matrix.md").read_text()


def test_top_p_needs_a_temperature(tmp_path: Path, calls: list) -> None:
    with pytest.raises(SystemExit):
        matrix.main(["--workloads", "spec-bench", "--top-p", "0.9", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        offline.parse_args(["--top-p", "0.9"])
    assert not calls
