# SPDX-License-Identifier: Apache-2.0
"""The plugin's statistics on the server's ``/metrics``, next to ``vllm:spec_decode_*``.

The drafter lives in the worker (engine-core process) while ``/metrics`` is served
by the API server process, and vLLM carries no custom data between the two. So:

- worker side, ``StatsPublisher``: a daemon thread writes the proposer's snapshot
  as JSON twice a second, only when it changed, to ``<tmp>/vllm_echo-stats-<uid>/
  <instance_id>.json`` (atomic rename; tensor-parallel rank 0 only, the other
  ranks draft the same tokens);
- API-server side, ``install_collector`` (called when the engine config is built,
  patches.py entry 5): one Prometheus collector per process reads those files at
  scrape time, so /metrics is never staler than half a second and needs no engine
  step to refresh.

Both sides key the files on ``vllm_config.instance_id``, which the engine core
receives with the config; data-parallel engines append ``_dp<rank>`` to it, which
becomes the ``engine`` label. Limits: engines on other nodes (multi-node Ray)
publish on their own node, and with ``PROMETHEUS_MULTIPROC_DIR`` (several API
server processes) vLLM serves a registry this collector is not part of.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable

from vllm_echo.config import ADDITIONAL_CONFIG_KEY

logger = logging.getLogger("vllm.vllm_echo")

PUBLISH_INTERVAL_S = 0.5
_STALE_FILE_AGE_S = 7 * 24 * 3600


def stats_root() -> Path:
    return Path(tempfile.gettempdir()) / f"vllm_echo-stats-{os.getuid()}"


def uses_plugin(vllm_config: Any) -> bool:
    return bool((getattr(vllm_config, "additional_config", None) or {}).get(ADDITIONAL_CONFIG_KEY))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# -- worker side ------------------------------------------------------------------

class StatsPublisher:
    """Writes ``snapshot()`` of an object to its stats file while the object lives."""

    def __init__(self, source: Any, instance_id: str, root: Path | None = None,
                 interval_s: float = PUBLISH_INTERVAL_S):
        self.path = (root or stats_root()) / f"{instance_id}.json"
        self._thread = threading.Thread(
            target=self._run, args=(weakref.ref(source), self.path, interval_s),
            name="vllm-echo-stats", daemon=True)
        self._thread.start()

    @staticmethod
    def _run(source_ref: Callable[[], Any], path: Path, interval_s: float) -> None:
        last = None
        snapshot_failed = False
        while True:
            time.sleep(interval_s)
            source = source_ref()
            if source is None:  # the proposer is gone (engine shut down)
                return
            try:
                text = json.dumps(source.snapshot(), default=_jsonable, sort_keys=True)
            except RuntimeError:  # a dict changed size while being copied: next round
                continue
            except Exception as exc:  # a bug: say so once, keep serving
                if not snapshot_failed:
                    snapshot_failed = True
                    logger.warning("vllm-echo: statistics snapshot failed (%s: %s); /metrics "
                                   "misses the plugin's series.", type(exc).__name__, exc)
                continue
            finally:
                del source
            if text != last:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_suffix(f".{os.getpid()}.tmp")
                    tmp.write_text(text)
                    os.replace(tmp, path)
                    last = text
                except OSError as exc:  # statistics must never disturb serving
                    logger.warning("vllm-echo: cannot publish statistics to %s (%s); "
                                   "/metrics will not show them.", path, exc)
                    return


def publish_worker_stats(source: Any, vllm_config: Any) -> StatsPublisher | None:
    """Start publishing on tensor-parallel rank 0 of this engine; None elsewhere."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        rank = get_tensor_model_parallel_rank()
    except Exception:  # no distributed state (single process): rank 0
        rank = 0
    instance_id = getattr(vllm_config, "instance_id", "")
    if rank != 0 or not instance_id:
        return None
    return StatsPublisher(source, instance_id)


# -- API-server side --------------------------------------------------------------

# snapshot key -> (metric name, kind, help); kind "counter" gets "_total" appended.
_SCALARS = {
    "steps": ("vllm_echo:proposer_steps", "counter", "propose() calls (engine steps with decodes)"),
    "tree_verifications": ("vllm_echo:tree_verifications", "counter",
                           "requests verified as a token tree"),
    "tree_compactions": ("vllm_echo:tree_compactions", "counter",
                         "accepted tree paths whose KV was moved into consecutive slots"),
    "tracked_requests": ("vllm_echo:tracked_requests", "gauge",
                         "requests holding retrieval state now"),
    "state_bytes": ("vllm_echo:state_bytes", "gauge",
                    "bytes held by the per-request retrieval indexes now"),
    "shared_outputs_bytes": ("vllm_echo:shared_outputs_bytes", "gauge",
                             "bytes held by the store of requests' outputs (fixed at start)"),
    "recycled_bytes": ("vllm_echo:recycled_bytes", "gauge",
                       "bytes held by the recycled-candidates tables (one per pool that "
                       "learned, up to a fixed number)"),
    "prediction_requests": ("vllm_echo:prediction_requests", "counter",
                            "requests that came with a predicted output (`prediction`)"),
    "prediction_drafts": ("vllm_echo:prediction_drafts", "counter",
                          "request-steps whose draft held predicted tokens"),
    "prediction_tokens": ("vllm_echo:prediction_draft_tokens", "counter",
                          "predicted tokens drafted"),
    "prediction_accepted": ("vllm_echo:prediction_accepted_tokens", "counter",
                            "predicted tokens drafted and accepted"),
    "prediction_bytes": ("vllm_echo:prediction_bytes", "gauge",
                         "bytes held by the indexes of the running requests' predictions"),
    "unmarked_requests": ("vllm_echo:unmarked_requests", "counter",
                          "requests without the scheduler's pool mark while shared draft "
                          "sources are on; they drafted from no shared pool"),
}
_BY_SOURCE = {
    "drafts": ("vllm_echo:draft_requests", "request-steps that got a draft, by draft source"),
    "tokens": ("vllm_echo:draft_tokens", "drafted tokens, by draft source"),
    "accepted": ("vllm_echo:accepted_tokens", "accepted draft tokens, by draft source"),
}
_ECHO_SCALARS = {
    "last_budget": ("vllm_echo:echo_k_max", "gauge", "draft tokens ECHO verified last step"),
    "draft_utilization": ("vllm_echo:echo_draft_utilization", "gauge",
                          "accepted / drafted tokens under ECHO"),
    "drafted": ("vllm_echo:echo_drafted_tokens", "counter", "draft tokens ECHO verified"),
    "accepted": ("vllm_echo:echo_accepted_tokens", "counter", "draft tokens of ECHO accepted"),
    "probes": ("vllm_echo:echo_probes", "counter",
               "steps that drafted only because none had for a while (ECHO's probe)"),
}


def metric_families(snapshots: list[tuple[str, str, dict]]) -> list:
    """Prometheus metric families for (model name, engine label, worker snapshot) rows."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    families: dict[str, Any] = {}

    def add(name: str, kind: str, doc: str, labels: dict[str, str], value: float) -> None:
        family = families.get(name)
        if family is None:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = families[name] = cls(name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), float(value))

    for model_name, engine, snap in snapshots:
        base = {"model_name": model_name, "engine": engine}
        for key, (name, kind, doc) in _SCALARS.items():
            if key in snap:
                add(name, kind, doc, base, snap[key])
        drafted = accepted = 0
        for key, (name, doc) in _BY_SOURCE.items():
            for field, value in snap.items():
                if field.startswith(key + "_"):
                    add(name, "counter", doc, {**base, "source": field[len(key) + 1:]}, value)
                    drafted += value if key == "tokens" else 0
                    accepted += value if key == "accepted" else 0
        add("vllm_echo:draft_utilization", "gauge", "accepted / drafted tokens", base,
            accepted / drafted if drafted else 0.0)
        for kind, count in (snap.get("failures") or {}).items():
            add("vllm_echo:failures", "counter",
                "proposer or tree-verification failures that fell back to safe verification",
                {**base, "kind": kind}, count)
        echo = snap.get("echo") or {}
        for key, (name, kind, doc) in _ECHO_SCALARS.items():
            if echo.get(key) is not None:
                add(name, kind, doc, base, echo[key])
        for tokens, ms in (echo.get("cost_curve_ms") or {}).items():
            add("vllm_echo:echo_step_cost_seconds", "gauge",
                "decode step time by tokens verified, as ECHO's cost curve has it",
                {**base, "tokens": str(tokens)}, ms / 1e3)
        rates = echo.get("rates") or {}
        for source in ("retrieved", "head", "shared", "recycled", "prediction"):
            flat = [x for row in rates.get(source) or [] for x in
                    (row if isinstance(row, list) else [row])]
            for bucket, rate in enumerate(flat):
                add("vllm_echo:echo_acceptance_rate", "gauge",
                    "ECHO's conditional acceptance rate per source and bucket",
                    {**base, "source": source, "bucket": str(bucket)}, rate)
    return list(families.values())


class _StatsCollector:
    """One per process: reads the stats files of every engine registered with it."""

    def __init__(self, root: Path):
        self.root = root
        self.instances: dict[str, str] = {}  # instance id -> model name

    def _files(self, instance_id: str) -> list[Path]:
        return [self.root / f"{instance_id}.json", *self.root.glob(f"{instance_id}_dp*.json")]

    def read(self) -> list[tuple[str, str, dict]]:
        """(model name, engine label, snapshot) for every file present now."""
        rows = []
        for instance_id, model_name in list(self.instances.items()):
            for path in self._files(instance_id):
                try:
                    snap = json.loads(path.read_text())
                except (OSError, ValueError):  # not written yet, or being replaced
                    continue
                engine = path.stem[len(instance_id):].lstrip("_") or "0"
                rows.append((model_name, engine, snap))
        return rows

    def collect(self) -> Iterable:
        return metric_families(self.read())

    def forget(self) -> None:
        for instance_id in list(self.instances):
            for path in self._files(instance_id):
                path.unlink(missing_ok=True)


_COLLECTOR: _StatsCollector | None = None
_COLLECTOR_LOCK = threading.Lock()


def install_collector(vllm_config: Any, root: Path | None = None) -> _StatsCollector:
    """Register (once per process) the collector and this engine's instance id."""
    global _COLLECTOR
    with _COLLECTOR_LOCK:
        if _COLLECTOR is None:
            import atexit

            from prometheus_client import REGISTRY

            _COLLECTOR = _StatsCollector(root or stats_root())
            _remove_stale_files(_COLLECTOR.root)
            REGISTRY.register(_COLLECTOR)
            atexit.register(_COLLECTOR.forget)
        model = vllm_config.model_config
        names = getattr(model, "served_model_name", None) or model.model
        _COLLECTOR.instances[vllm_config.instance_id] = (
            names[0] if isinstance(names, (list, tuple)) else str(names))
        return _COLLECTOR


def _remove_stale_files(root: Path) -> None:
    now = time.time()
    for path in root.glob("*.json"):
        try:
            if now - path.stat().st_mtime > _STALE_FILE_AGE_S:
                path.unlink()
        except OSError:
            continue

