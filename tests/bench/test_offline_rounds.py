# SPDX-License-Identifier: Apache-2.0
"""offline.py's rounds: ratios are paired by round, medians and ranges are exact; what
knowing each draft's first miss would have saved; which interpreter runs the suffix rows;
accepted tokens by draft source."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import offline  # noqa: E402
import offline_report  # noqa: E402
import offline_runner  # noqa: E402


def _run(method: str, round_: int, tok_s: float, status: str = "ok") -> dict:
    return {"method": method, "batch_size": 1, "round": round_, "status": status,
            "output_tokens_per_s": tok_s, "tokens_per_forward": 1.0 + round_ / 10,
            "token_ids": [[1, 2]] if method != "ngram" or round_ else [[1, 3]]}


def test_ratios_are_paired_by_round() -> None:
    # The machine slows down in round 1: every method halves. Paired ratios do not move.
    rows = [_run("none", 0, 20.0), _run("echo", 0, 30.0), _run("ngram", 0, 24.0),
            _run("none", 1, 10.0), _run("echo", 1, 15.0), _run("ngram", 1, 13.0),
            _run("none", 2, 20.0), _run("echo", 2, 20.0), _run("ngram", 2, 0.0, "error")]
    offline_report.compare_with_none(rows, temperature=0.0)
    assert [r["ratio_to_none"] for r in rows[:6]] == [1.0, 1.5, 1.2, 1.0, 1.5, 1.3]
    assert rows[2]["identical_to_none"] == "0/1" and rows[5]["identical_to_none"] == "1/1"
    summary = {e["method"]: e for e in offline_report.summarize(rows, reference="echo")}
    echo = summary["echo"]
    assert echo["rounds"] == 3
    assert echo["output_tokens_per_s"] == {"median": 20.0, "min": 15.0, "max": 30.0,
                                           "per_round": [30.0, 15.0, 20.0]}
    assert echo["vs_none"]["per_round"] == [1.5, 1.5, 1.0]
    assert echo["vs_none"]["median"] == 1.5
    assert echo["tokens_per_forward"] == pytest.approx(1.1)
    ngram = summary["ngram"]  # round 2 failed: left out, not counted as 0
    assert ngram["rounds"] == 2
    assert ngram["vs_echo"]["per_round"] == [pytest.approx(0.8), pytest.approx(13 / 15)]
    assert ngram["vs_none"]["min"] == pytest.approx(1.2)
    assert offline_report.ratio_text(ngram["vs_none"]) == "1.25 [1.20–1.30]"


def test_a_step_window_compares_the_tokens_both_runs_emitted() -> None:
    window = {"steps": 64, "seconds": 1.0, "emitted": 3}
    none = {**_run("none", 0, 10.0), "token_ids": [[1, 2], [5, 6]], "window": window}
    same = {**_run("echo", 0, 11.0), "token_ids": [[1, 2, 3], [5, 6]], "window": window}
    other = {**_run("ngram", 0, 9.0), "token_ids": [[1, 2, 3], [5, 7, 8]], "window": window}
    offline_report.compare_with_none([none, same, other], temperature=0.0)
    assert same["identical_to_none"] == "2/2" and other["identical_to_none"] == "1/2"
    whole = {**_run("echo", 0, 11.0), "token_ids": [[1, 2, 3], [5, 6]]}  # no window
    offline_report.compare_with_none([none, whole], temperature=0.0)
    assert whole["identical_to_none"] == "1/2"


def test_ratios_after_the_first_step_leave_its_time_out() -> None:
    def run(method: str, round_: int, wall: float, first_s: float) -> dict:
        return {"method": method, "batch_size": 8, "round": round_, "status": "ok",
                "output_tokens": 808, "wall_s": wall, "output_tokens_per_s": 808 / wall,
                "tokens_per_forward": 2.0, "first_step": {"seconds": first_s, "emitted": 8}}
    # Round 0: the same decode time (4 s) after a first step that took 1 s for `none`
    # and 2 s for `echo`; round 1: echo's decode 3 s against 4 s, equal first steps.
    rows = [run("none", 0, 5.0, 1.0), run("echo", 0, 6.0, 2.0),
            run("none", 1, 5.0, 1.0), run("echo", 1, 4.0, 1.0)]
    assert offline_report.tokens_per_s_after_first_step(rows[0]) == pytest.approx(200.0)
    echo = {e["method"]: e for e in offline_report.summarize(rows, reference="none")}["echo"]
    assert echo["vs_none"]["per_round"] == [pytest.approx(5 / 6), pytest.approx(5 / 4)]
    assert echo["vs_none_after_first_step"]["per_round"] == [pytest.approx(1.0),
                                                             pytest.approx(4 / 3)]
    # batch 1 (one prompt's prefill per step) and interleaved runs have no such ratio
    assert offline_report.tokens_per_s_after_first_step({**rows[0], "batch_size": 1}) is None
    assert offline_report.tokens_per_s_after_first_step({**rows[0], "first_step": None}) is None


def test_rounds_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        offline.parse_args(["--repeats", "0"])


def test_round_order_rotates() -> None:
    assert offline.round_order(["none", "echo", "ngram"], 3) == [
        (0, "none"), (0, "echo"), (0, "ngram"),
        (1, "echo"), (1, "ngram"), (1, "none"),
        (2, "ngram"), (2, "none"), (2, "echo")]
    assert offline.round_order(["none"], 2) == [(0, "none"), (1, "none")]


def test_cut_at_first_miss_prices_steps_at_what_they_emitted() -> None:
    steps = [{"tokens": 1, "steps": 2, "median_ms": 40.0, "steps_by_emitted": {"1": 2}},
             {"tokens": 9, "steps": 2, "median_ms": 60.0, "steps_by_emitted": {"1": 1, "5": 1}}]
    # the miss re-priced as a plain step (40), the 5-token step at size 5, between the
    # sizes measured (40 + (60 - 40) * 4 / 8 = 50)
    assert offline_report.cut_at_first_miss(steps) == pytest.approx((80 + 120) / (80 + 40 + 50))
    assert offline_report.cut_at_first_miss([]) is None


def test_suffix_rows_find_their_venv_or_say_why_not(tmp_path: Path, monkeypatch) -> None:
    # Only vLLM's "suffix" method runs in the separate venv (arctic-inference's plugin
    # must stay out of the interpreter every other method runs in).
    assert offline_runner.runs_in_suffix_venv({"method": "suffix", "num_speculative_tokens": 8})
    assert [n for n, spec in offline.METHODS.items()
            if offline_runner.runs_in_suffix_venv(spec)] == ["suffix"]
    monkeypatch.delenv(offline_runner.SUFFIX_VENV_VAR, raising=False)
    assert offline_runner.suffix_venv() == offline_runner.REPO / ".venv-suffix"
    monkeypatch.setenv(offline_runner.SUFFIX_VENV_VAR, "some/venv")  # relative: to the repository
    assert offline_runner.suffix_venv() == offline_runner.REPO / "some" / "venv"

    info, reason = offline_runner.probe_suffix_venv(tmp_path / "missing")
    assert info is None and "not found" in reason and "bootstrap_suffix.sh" in reason
    # A "venv" whose python is this interpreter, which has no arctic-inference.
    fake = tmp_path / "fake" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    fake.chmod(0o755)
    info, reason = offline_runner.probe_suffix_venv(tmp_path / "fake")
    assert info is None and "cannot import arctic_inference.suffix_decoding" in reason

    monkeypatch.setenv("ARCTIC_INFERENCE_ENABLED", "1")
    env = offline_runner._worker_env(str(fake))
    assert "ARCTIC_INFERENCE_ENABLED" not in env
    assert env["VIRTUAL_ENV"] == str(tmp_path / "fake")
    assert env["PATH"].split(os.pathsep)[0] == str(fake.parent)
    here = offline_runner._worker_env()  # this interpreter's rows: its environment as it is
    assert "ARCTIC_INFERENCE_ENABLED" not in here
    assert here.get("PATH") == os.environ.get("PATH")
    assert here.get("VIRTUAL_ENV") == os.environ.get("VIRTUAL_ENV")


def test_accepted_tokens_by_source_are_every_nonzero_counter() -> None:
    # Any accepted_<source> key counts, a source added later included; warm-up subtracted.
    stats = {"after_warmup": {"accepted_retrieval": 5, "accepted_logits": 0, "steps": 3},
             "end": {"accepted_retrieval": 45, "accepted_logits": 10, "accepted_tree": 0,
                     "accepted_new_source": 7, "steps": 90, "tree_enabled": True}}
    counts = offline_report.accepted_by_source(stats)
    assert counts == {"accepted_retrieval": 40, "accepted_logits": 10,
                      "accepted_new_source": 7}
    assert offline_report.accepted_by_source(None) is None
    assert offline_report._sources_text(counts) == "retrieval 40 (70%), logits 10 (18%), " \
                                            "new_source 7 (12%)"
    rows = [{**_run("echo", k, 20.0), "accepted_by_source": {"accepted_retrieval": 10 + k}}
            for k in range(2)] + [_run("none", k, 10.0) for k in range(2)]
    summary = {e["method"]: e for e in offline_report.summarize(rows, reference="none")}
    assert summary["echo"]["accepted_by_source"] == {"accepted_retrieval": 21}
    assert "accepted_by_source" not in summary["none"]


def test_echo_accepted_tokens_by_family() -> None:
    # ECHO's chain counters lump every family together; its planner's split is used.
    kinds = {"retrieved": 120, "head": 0, "shared": 1206, "recycled": 1}
    stats = {"after_warmup": {"accepted_chain": 9, "echo": {"accepted_by_kind": {
                 "retrieved": 20, "head": 0, "shared": 6, "recycled": 1}}},
             "end": {"accepted_chain": 1327, "echo": {"accepted_by_kind": kinds}}}
    assert offline_report.accepted_by_source(stats) == {"accepted_retrieved": 100,
                                                 "accepted_shared": 1200}
