# SPDX-License-Identifier: Apache-2.0
"""benchmarks/predicted_outputs.py's table: ratios paired by round, the oracle against
regenerate's echo, identity over every round."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "predicted_outputs.py"
sys.path.insert(0, str(_PATH.parent))
_SPEC = importlib.util.spec_from_file_location("predicted_outputs_bench", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def _row(round_, workload, config, tok_s, identical=True, per_step=None):
    return {"round": round_, "batch": 1, "workload": workload, "config": config,
            "tok_s": tok_s, "tok_per_step": per_step, "identical": identical}


def test_ratios_are_paired_by_round_and_the_oracle_compares_with_regenerate():
    rows = [_row(0, "regenerate", "none", 10.0), _row(0, "regenerate", "echo", 12.0),
            _row(0, "regenerate", "echo+p", 24.0, per_step=3.0),
            _row(1, "regenerate", "none", 5.0), _row(1, "regenerate", "echo", 6.0),
            _row(1, "regenerate", "echo+p", 13.0, identical=False, per_step=3.2),
            _row(0, "oracle", "none", 10.0), _row(0, "oracle", "echo+p", 36.0)]
    table = {tuple(cell.strip() for cell in line.strip("|").split("|")[1:3]): line
             for line in bench.summary(rows)[2:]}
    # round 0: 2.4x none, 2.0x echo; round 1: 2.6x, 13/6; medians of the pairs
    echo_p = table[("regenerate", "echo+p")].split("|")
    assert echo_p[5].strip() == "2.50" and echo_p[6].strip() == f"{(2.0 + 13 / 6) / 2:.2f}"
    assert echo_p[7].strip() == "3.10" and echo_p[8].strip() == "False"
    # the oracle's "x echo" is regenerate's echo of the same round
    assert table[("oracle", "echo+p")].split("|")[6].strip() == "3.00"
    assert table[("regenerate", "none")].split("|")[7].strip() == "-"
