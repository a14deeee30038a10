# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.echo.stats import EchoStepStats


def test_step_stats_accumulate_and_merge():
    a = EchoStepStats(max_depth=4)
    a.record_step([np.array([1, 2, 3]), np.array([1, 1])], [2, 0], truncated_at=[0, 1],
                  k_max=8)
    b = EchoStepStats(max_depth=4)
    b.record_step([np.array([1, 2, 3, 4, 5, 6])], [6], truncated_at=[3])
    merged = a.merge(b)
    d = merged.as_dict()
    assert d["steps"] == 2 and d["requests"] == 3
    assert d["drafted"] == 11 and d["accepted"] == 8
    assert d["draft_utilization"] == pytest.approx(8 / 11)
    assert d["mean_accepted_length"] == pytest.approx(8 / 3)
    assert d["mat_over_depth"] == pytest.approx(8 / (3 + 1 + 6))
    assert d["accepted_per_depth"] == [2, 2, 1, 3]  # depths 5, 6 land in bucket 4
    assert d["drafted_per_depth"] == [4, 2, 2, 3]
    assert d["truncations_per_depth"] == [1, 0, 1, 0]
    assert d["budget_used_max"] == 6 and d["budget_used_mean"] == 5.5
    assert d["budget_fill"] == pytest.approx(5 / 8)
    # Inputs untouched.
    assert a.steps == 1 and b.steps == 1
    assert EchoStepStats().as_dict()["draft_utilization"] == 0.0


def test_step_stats_validation():
    s = EchoStepStats(max_depth=3)
    with pytest.raises(ValueError, match="accepted length"):
        s.record_step([np.array([1, 2])], [3])
    with pytest.raises(ValueError, match="trees"):
        s.record_step([np.array([1])], [0, 0])
    with pytest.raises(ValueError, match="merge"):
        s.merge(EchoStepStats(max_depth=4))
