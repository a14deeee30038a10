# SPDX-License-Identifier: Apache-2.0
"""The first example's rounds and its reading (examples/offline_generate.py), without
an engine: each ratio is paired within its round, engines start just before their first
turn and see no prompt twice, the table shows each ratio's spread over the rounds, and
the reading names a winner only when its slowest round beats every other method's
fastest ("within noise" otherwise), never disagreeing with the table. Also: the README's
renderer reads result files from before rounds and after (benchmarks/render_tables.py).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import render_tables  # noqa: E402
from example_module import load_example  # noqa: E402


@pytest.fixture(scope="module")
def example():
    return load_example()


def cell(ratios: list[float], tpf: float | None = 1.2) -> dict:
    return {"tok_s": 10.0 * statistics.median(ratios), "tpf": tpf,
            "x_none": statistics.median(ratios), "x_none_rounds": ratios,
            "identical": 3 * len(ratios), "outputs": 3 * len(ratios)}


def summary(**methods: list[float]) -> dict:
    """One workload, "batch 1": no speculation and the given methods' ratios per round."""
    n = len(next(iter(methods.values())))
    return {"none": {"batch 1": cell([1.0] * n, 1.0)},
            **{m: {"batch 1": cell(ratios)} for m, ratios in methods.items()}}


def test_a_small_gap_inside_the_spread_is_within_noise(example) -> None:
    # echo leads logitspec by 1% in the median, the rounds spread over 10%
    line = example.reading_lines(summary(echo=[1.01, 1.06, 1.11],
                                         logitspec=[1.00, 1.05, 1.10]))[0]
    assert line.startswith("Reading at batch 1: echo leads, 1.06x no speculation "
                           "(1.01-1.11 over 3 rounds")
    assert "within noise of logitspec 1.05x (1.00-1.10): no winner" in line
    assert "fastest" not in line
    assert line.endswith("; faster than no speculation in every round.")


def test_a_clear_gap_names_the_winner(example) -> None:
    line = example.reading_lines(summary(echo=[1.12, 1.15, 1.18], logitspec=[1.00, 1.03, 1.05],
                                         ngram=[0.98, 1.00, 1.02]))[0]
    assert ("echo leads, 1.15x no speculation (1.12-1.18 over 3 rounds, 1.20 tokens per "
            "forward), and is fastest: its slowest round beats logitspec's fastest (1.05x)"
            in line)
    assert "noise" not in line


@pytest.mark.parametrize("ratios, ending", [
    ([0.90, 0.93, 0.95], "; slower than no speculation in every round."),
    ([0.97, 1.01, 1.04], "; within noise of no speculation."),
    ([1.01, 1.02, 1.03], "; faster than no speculation in every round.")])
def test_against_no_speculation(example, ratios, ending) -> None:
    assert example.reading_lines(summary(echo=ratios))[0].endswith(ending)


def test_one_round_gives_no_verdict(example) -> None:
    """A result file from before rounds: one ratio per method, no spread to judge by."""
    one = summary(echo=[1.09], logitspec=[1.11])
    for per in one.values():
        del per["batch 1"]["x_none_rounds"]
    line = example.reading_lines(one)[0]
    assert line == ("Reading at batch 1: logitspec leads, 1.11x no speculation, 1.20 tokens "
                    "per forward; one round, so no spread and no verdict.")
    rows = {row.split("|")[0].strip(): row.split("|")[1].split()
            for row in example.table_lines(one)[2:]}
    assert rows["logitspec"][2:] == ["1.11", "3/3"] and rows["echo"][2:] == ["1.09", "3/3"]


def test_the_table_and_the_reading_never_disagree(example) -> None:
    """Random rounds: the reading's leader has the table's highest median ratio, its
    range is the table's, and it is called fastest exactly when its slowest round beats
    every other method's fastest."""
    rng = random.Random(61)
    for _ in range(300):
        centers = {m: rng.uniform(0.8, 1.2) for m in ("echo", "logitspec", "ngram")}
        noise = rng.choice([0.005, 0.02, 0.08])
        data = summary(**{m: [round(c + rng.uniform(-noise, noise), 3) for _ in range(3)]
                          for m, c in centers.items()})
        table = {row.split("|")[0].strip(): row.split("|")[1].split()
                 for row in example.table_lines(data)[2:]}
        line = example.reading_lines(data)[0]
        leader = line.split(": ", 1)[1].split(" leads")[0]
        shown = {m: float(table[m][2]) for m in centers}
        assert shown[leader] == max(shown.values()), (line, table)
        low, high = (float(x) for x in table[leader][3].strip("()").split("-"))
        assert f"({low:.2f}-{high:.2f} over 3 rounds" in line
        cells = {m: data[m]["batch 1"] for m in centers}
        beats_all = all(min(cells[leader]["x_none_rounds"]) > max(cells[m]["x_none_rounds"])
                        for m in centers if m != leader)
        assert ("is fastest" in line) == beats_all, line
        assert ("no winner" in line) == (not beats_all), line


def test_each_ratio_is_paired_within_its_round(example) -> None:
    def result(tok_s: float, texts: list[str], forwards: int | None = 10) -> dict:
        return {"texts": texts, "tok_s": tok_s, "tokens": 20, "forwards": forwards}

    rounds = [{"none": {"batch 1": result(10.0, ["a", "b"], 20)},
               "echo": {"batch 1": result(11.0, ["a", "b"])}},
              {"none": {"batch 1": result(20.0, ["c", "d"], 20)},
               "echo": {"batch 1": result(18.0, ["c", "x"], None)}}]
    s = example.summarize(rounds)["echo"]["batch 1"]
    assert s["x_none_rounds"] == pytest.approx([1.1, 0.9]) and s["x_none"] == pytest.approx(1.0)
    assert s["tok_s"] == pytest.approx(14.5)
    assert (s["identical"], s["outputs"]) == (3, 4)
    assert s["tpf"] is None  # a round without vLLM's counts: no tokens per forward
    assert example.summarize(rounds[:1])["echo"]["batch 1"]["tpf"] == pytest.approx(2.0)
    assert example.summarize(rounds)["none"]["batch 1"]["tpf"] == pytest.approx(1.0)


class FakeEngine:
    def __init__(self, method: str) -> None:
        self.method, self.seen, self.stopped = method, set(), False


def test_engines_start_just_before_their_first_turn_and_see_no_prompt_twice(example) -> None:
    events, engines = [], []
    groups = [{"batch 1": [p.text for p in g["batch 1"]], "batch 4": [p.text for p in g["loaded"]]}
              for g in example.prompt_groups(4, 2, 3)]

    def start(method: str) -> FakeEngine:
        events.append(("start", method))
        engines.append(FakeEngine(method))
        engines[-1].seen.update(example.WARMUP_MESSAGES)
        return engines[-1]

    def measure(engine: FakeEngine, method: str, name: str, texts: list[str]) -> dict:
        assert engine.method == method and not engine.seen & set(texts)
        engine.seen.update(texts)
        events.append((method, name))
        return {"texts": texts, "tok_s": 1.0, "tokens": 1, "forwards": 1}

    def stop(engine: FakeEngine) -> None:
        engine.stopped = True

    reports = []
    rounds = example.run_rounds(["none", "echo", "ngram"], groups, start, measure, stop,
                                lambda r, m, results: reports.append((r, m, list(results))),
                                settle_s=0)
    assert len(rounds) == 3 and all(list(r) == ["none", "echo", "ngram"] for r in rounds)
    first_round = [("start", "none"), ("none", "batch 1"), ("none", "batch 4"),
                   ("start", "echo"), ("echo", "batch 1"), ("echo", "batch 4"),
                   ("start", "ngram"), ("ngram", "batch 1"), ("ngram", "batch 4")]
    assert events[:9] == first_round
    assert events[9:] == [e for e in first_round if e[0] != "start"] * 2
    assert all(e.stopped for e in engines)
    # no speculation runs first in every round, so each report can show its ratio
    assert reports[:3] == [(0, "none", ["none"]), (0, "echo", ["none", "echo"]),
                           (0, "ngram", ["none", "echo", "ngram"])]


def test_engines_stop_when_a_round_fails(example) -> None:
    engines = []

    def start(method: str) -> FakeEngine:
        engines.append(FakeEngine(method))
        return engines[-1]

    def measure(engine, method, name, texts):
        if method == "echo":
            raise RuntimeError("engine died")
        return {"texts": texts, "tok_s": 1.0, "tokens": 1, "forwards": 1}

    with pytest.raises(RuntimeError, match="engine died"):
        example.run_rounds(["none", "echo", "ngram"], [{"batch 1": ["p"]}], start, measure,
                           lambda e: setattr(e, "stopped", True), settle_s=0)
    assert [(e.method, e.stopped) for e in engines] == [("none", True), ("echo", True)]


def test_ci_invocation_parses(example) -> None:
    """.ci/run: run_example.sh --check --eager --single-prompts 3 --batch 8."""
    args = example.parse_args(["--check", "--eager", "--single-prompts", "3", "--batch", "8"])
    assert (args.check, args.eager, args.single_prompts, args.batch, args.rounds) == (
        True, True, 3, 8, 3)
    assert args.methods == ["none", "echo", "logitspec", "ngram"]
    assert len(example.prompt_groups(args.batch, args.single_prompts, args.rounds)) == 3


def new_file(example, ratios: list[float]) -> dict:
    """What --json writes: the example's summary of rounds (echo at ``ratios``)."""
    def result(tok_s: float) -> dict:
        return {"texts": ["t"], "tok_s": tok_s, "tokens": 12, "forwards": 10}

    rounds = [{m: {w: result(10.0 * (x if m == "echo" else 1.0)) for w in ("batch 1", "batch 8")}
               for m in ("none", "echo")} for x in ratios]
    return {"setup": {"single_prompts": 3, "max_tokens": 48, "batch": 8, "loaded_prompts": 8,
                      "rounds": len(ratios), "mode": "eager"},
            "summary": example.summarize(rounds)}


def test_the_readme_renders_result_files_from_before_rounds_and_after(example) -> None:
    # the file published before rounds (three runs, merged; kept here as it was at
    # 676d2dc): each run's ratio stands in for a round
    before = json.loads((Path(__file__).parent / "data" / "example-before-rounds.json")
                        .read_text(encoding="utf-8"))
    summary, unit = render_tables.example_rounds(before)
    assert unit == "runs" and len(summary["echo"]["batch 1"]["x_none_rounds"]) == 3
    assert " over 3 runs" in example.reading_lines(summary, unit)[0]
    # one run from before rounds: no spread
    old = {"setup": {"single_prompts": 7, "max_tokens": 48, "batch": 16, "loaded_prompts": 32},
           "summary": {m: {"batch 1": {"tok_s": 10.0, "tpf": 1.0, "x_none": x, "identical": 7,
                                       "outputs": 7}} for m, x in (("none", 1.0), ("echo", 1.1))}}
    summary, unit = render_tables.example_rounds(old)
    assert "one round, so no spread" in example.reading_lines(summary, unit)[0]
    # old single runs merged: each run's ratio a round of the merged file
    merged = render_tables.merge_examples([old, old])
    assert merged["summary"]["echo"]["batch 1"]["x_none_rounds"] == [1.1, 1.1]
    # new files, alone and merged: every round of every run
    new = new_file(example, [1.05, 1.10, 1.20])
    summary, unit = render_tables.example_rounds(new)
    assert unit == "rounds"
    assert "1.10x no speculation (1.05-1.20 over 3 rounds" in example.reading_lines(summary)[0]
    merged = render_tables.merge_examples([new, new_file(example, [1.0, 1.02, 1.04])])
    summary, unit = render_tables.example_rounds(merged)
    assert summary["echo"]["batch 8"]["x_none_rounds"] == pytest.approx(
        [1.05, 1.10, 1.20, 1.0, 1.02, 1.04])
    assert summary["echo"]["batch 8"]["tpf"] == pytest.approx(1.2)
    assert example.setup_line(merged["setup"]).endswith(
        "3 rounds, each with prompts of its own: batch 1: 3 prompts x 48 tokens one at a "
        "time; batch 8: 8 prompts x 24 tokens. Medians of 2 runs.")
    assert " over 6 rounds" in example.reading_lines(summary, unit)[0]


def test_main_prints_as_it_goes_then_the_table(example, monkeypatch, tmp_path, capsys) -> None:
    """The whole example with fake engines: a progress line per round and engine (the
    first right after the first engine is up), the table, the reading, the time taken,
    the --json file; --check fails on an output that differs."""
    import types

    speed = {"none": 10.0, "echo": 11.0, "logitspec": 10.5, "ngram": 9.0}
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=dict))
    monkeypatch.setattr(example, "quiet", lambda verbose: None)  # process-wide settings
    monkeypatch.setattr(example, "resolve_model", lambda model: "model")
    monkeypatch.setattr(example, "SETTLE_S", 0)
    monkeypatch.setattr(example, "start_engine", lambda model, method, *a: method)
    monkeypatch.setattr(example, "shutdown", lambda llm: None)

    def timed(llm, chats, params, one_at_a_time, speculative):
        texts = [c[0]["content"][:20] + ("!" if llm == "ngram" and bad else "") for c in chats]
        assert speculative == (llm != "none")
        return {"texts": texts, "tok_s": speed[llm], "tokens": 10, "forwards": 8}

    monkeypatch.setattr(example, "timed", timed)
    out = tmp_path / "example.json"
    bad = False
    monkeypatch.setattr(sys, "argv", ["x", "--eager", "--batch", "4", "--json", str(out)])
    example.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[0:00] starting none: an engine's first start compiles")
    assert lines[1].startswith("[0:00] round 1/3 none       batch 1  10.0 tok/s | batch 4  10.0")
    assert lines[2].startswith("[0:00] round 1/3 echo       batch 1  11.0 tok/s 1.10x none |")
    assert len([line for line in lines if line.startswith("[0:00] round ")]) == 12
    assert any(line.startswith("Reading at batch 1: echo leads, 1.10x no speculation (1.10-1.10 "
                               "over 3 rounds, 1.25 tokens per forward), and is fastest")
               for line in lines)
    assert lines[-2] == ("All 63 outputs match no speculation's. A CPU pays for every verified "
                         "draft token; a GPU far less (README.md).")
    assert lines[-1].startswith("Took 0:00, first numbers after 0:00; engine starts 0:00 (none")
    data = __import__("json").loads(out.read_text())
    assert data["setup"]["rounds"] == 3 and data["timings"]["engine_start_s"].keys() == speed.keys()
    assert data["summary"]["echo"]["batch 4"]["x_none_rounds"] == pytest.approx([1.1] * 3)
    bad = True
    monkeypatch.setattr(sys, "argv", ["x", "--check", "--batch", "4", "--rounds", "2"])
    with pytest.raises(SystemExit) as exit_:
        example.main()
    assert exit_.value.code == 1
    assert "14 of 42 outputs differ from no speculation's" in capsys.readouterr().out
