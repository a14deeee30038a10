# SPDX-License-Identifier: Apache-2.0
"""Worker snapshot file -> Prometheus text, without an engine."""

from __future__ import annotations

import time
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from vllm_echo.plugin import metrics

SNAPSHOT = {
    "steps": 7, "tracked_requests": 2, "state_bytes": 4096,
    "shared_outputs_bytes": 2048, "recycled_bytes": 1024, "tree_verifications": 5, "tree_compactions": 1,
    "unmarked_requests": 3,
    "drafts_retrieval": 1, "drafts_logits": 0, "drafts_tree": 5,
    "tokens_retrieval": 4, "tokens_logits": 0, "tokens_tree": 36,
    "accepted_retrieval": 2, "accepted_logits": 0, "accepted_tree": 8,
    "failures": {"propose:ValueError": 3},
    "echo": {"last_budget": 12, "draft_utilization": 0.25, "drafted": 36, "accepted": 8,
             "probes": 1, "cost_curve_ms": {"1": 30.0, "2": 32.0},
             "rates": {"retrieved": [[0.4, 0.6], [0.7, 0.8]], "head": [0.1, 0.05],
                       "trials": [3.0] * 6}},
}


class Source:
    def __init__(self):
        self.value = dict(SNAPSHOT)

    def snapshot(self):
        return self.value


def scrape(collector) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def series(name: str, **labels: str) -> str:
    """Prometheus text key: labels in the sorted order prometheus_client writes them."""
    labels = {"model_name": "smol", "engine": "0", **labels}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def wait_for(path, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)


def test_published_snapshot_becomes_prometheus_series(tmp_path):
    source = Source()
    publisher = metrics.StatsPublisher(source, "abc12", root=tmp_path, interval_s=0.02)
    wait_for(publisher.path)
    collector = metrics._StatsCollector(tmp_path)
    collector.instances["abc12"] = "smol"
    got = scrape(collector)
    assert got[series("vllm_echo:proposer_steps_total")] == 7
    assert got[series("vllm_echo:draft_tokens_total", source="tree")] == 36
    assert got[series("vllm_echo:accepted_tokens_total", source="retrieval")] == 2
    assert got[series("vllm_echo:draft_utilization")] == 10 / 40
    assert got[series("vllm_echo:failures_total", kind="propose:ValueError")] == 3
    assert got[series("vllm_echo:tracked_requests")] == 2
    assert got[series("vllm_echo:state_bytes")] == 4096
    assert got[series("vllm_echo:shared_outputs_bytes")] == 2048
    assert got[series("vllm_echo:recycled_bytes")] == 1024
    assert got[series("vllm_echo:unmarked_requests_total")] == 3
    assert got[series("vllm_echo:echo_accepted_tokens_total")] == 8
    assert got[series("vllm_echo:echo_k_max")] == 12
    assert got[series("vllm_echo:echo_step_cost_seconds", tokens="2")] == 0.032
    assert got[series("vllm_echo:echo_acceptance_rate", source="retrieved", bucket="2")] == 0.7
    assert got[series("vllm_echo:echo_acceptance_rate", source="head", bucket="1")] == 0.05

    source.value = {**SNAPSHOT, "steps": 9}  # published again only when it changed
    deadline = time.monotonic() + 5
    while scrape(collector)[series("vllm_echo:proposer_steps_total")] != 9:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_publisher_stops_with_its_source_and_collector_forgets_files(tmp_path):
    source = Source()
    publisher = metrics.StatsPublisher(source, "gone", root=tmp_path, interval_s=0.02)
    wait_for(publisher.path)
    del source
    publisher._thread.join(timeout=5)
    assert not publisher._thread.is_alive()
    collector = metrics._StatsCollector(tmp_path)
    collector.instances["gone"] = "m"
    assert scrape(collector)  # the file outlives the worker until the server exits
    collector.forget()
    assert not publisher.path.exists() and scrape(collector) == {}


def test_data_parallel_engines_get_their_own_label(tmp_path):
    for suffix in ("_dp0", "_dp1"):
        (tmp_path / f"inst{suffix}.json").write_text('{"steps": 3}')
    (tmp_path / "other.json").write_text('{"steps": 100}')  # another server on the host
    collector = metrics._StatsCollector(tmp_path)
    collector.instances["inst"] = "smol"
    assert scrape(collector) == {
        series("vllm_echo:proposer_steps_total", engine="dp0"): 3,
        series("vllm_echo:proposer_steps_total", engine="dp1"): 3,
        series("vllm_echo:draft_utilization", engine="dp0"): 0,
        series("vllm_echo:draft_utilization", engine="dp1"): 0}


def test_uses_plugin_only_with_our_settings():
    assert metrics.uses_plugin(SimpleNamespace(additional_config={"vllm_echo": {"method": "echo"}}))
    assert not metrics.uses_plugin(SimpleNamespace(additional_config={}))
    assert not metrics.uses_plugin(SimpleNamespace(additional_config=None))
