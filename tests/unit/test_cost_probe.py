# SPDX-License-Identifier: Apache-2.0
"""The start-up step-cost probe (runner/cost_probe.py): which sizes it times, that it
times what the forward costs, and that it runs once the KV cache exists."""

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_echo.plugin.runner.cost_probe import install_cost_probe, probe_sizes, time_forwards


def test_sizes_double_up_to_the_cap():
    assert probe_sizes(1, 128) == [1]
    assert probe_sizes(8, 128) == [1, 2, 4, 8]
    assert probe_sizes(24, 128) == [1, 2, 4, 8, 16, 24]
    assert probe_sizes(10**6, 128)[-1] == 128


def test_timed_seconds_follow_the_forward_cost():
    calls = []

    def forward(n):
        calls.append(n)
        time.sleep(0.002 * n)

    sizes, seconds = time_forwards(forward, [1, 4, 8], repeats=2)
    assert sizes.tolist() == [1, 4, 8]
    assert calls == [1, 4, 8, 1, 4, 8, 1, 4, 8]  # one untimed call per size, then passes
    assert np.all(np.diff(seconds) > 0)
    assert seconds[2] == pytest.approx(0.016, abs=0.01)


class Runner:
    def __init__(self):
        self.events = []
        self.model = SimpleNamespace(compute_logits=self._compute_logits)

    def initialize_kv_cache(self, kv_cache_config):
        self.events.append(("kv", kv_cache_config))

    def _dummy_run(self, num_tokens, force_attention=False):
        assert force_attention, "the probe's forwards must run attention"
        self.events.append(("forward", num_tokens))
        hidden = torch.zeros(num_tokens + 3, 2)  # padded, as vLLM may
        return hidden, hidden[-1:]

    def _compute_logits(self, hidden):
        self.events.append(("logits", hidden.shape[0]))
        return torch.zeros(hidden.shape[0], 5)


def test_a_stall_during_one_size_does_not_price_it():
    """The machine stalls for the first timed pass's 8-token forward: the fastest of the
    passes is the forward's cost."""
    calls = []

    def forward(n):
        calls.append(n)
        time.sleep(0.002 * n + (0.1 if len(calls) == 6 else 0.0))

    _, seconds = time_forwards(forward, [1, 4, 8], repeats=3)
    assert calls[5] == 8
    assert seconds[2] == pytest.approx(0.016, abs=0.008)


def test_the_probe_runs_after_the_kv_cache_is_made():
    runner, measured, errors = Runner(), [], []
    install_cost_probe(runner, [1, 2, 4], 3, lambda *a: measured.append(a),
                       lambda where, exc: errors.append(where), lambda *a: None)
    runner.initialize_kv_cache("config")
    assert runner.events[0] == ("kv", "config")
    assert {n for kind, n in runner.events[1:]} == {1, 2, 4}
    # every forward is followed by the logits of all its tokens, as in a verification
    assert runner.events[1:3] == [("forward", 1), ("logits", 1)]
    assert ("logits", 4) in runner.events
    (sizes, seconds, took), = measured
    assert sizes.tolist() == [1, 2, 4] and len(seconds) == 3 and took >= 0
    assert errors == []


def test_a_failing_probe_is_reported_and_the_engine_goes_on():
    runner, measured, errors = Runner(), [], []

    def broken(num_tokens):
        raise RuntimeError("no dummy run")

    runner._dummy_run = broken
    install_cost_probe(runner, [1, 2, 4], 3, lambda *a: measured.append(a),
                       lambda where, exc: errors.append(where), lambda *a: None)
    runner.initialize_kv_cache("config")
    assert measured == [] and errors == ["step cost probe"]
