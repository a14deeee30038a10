# SPDX-License-Identifier: Apache-2.0
"""Ray Serve LLM (``ray.serve.llm``) with ``echo`` behind the OpenAI API, on CPU.

examples/ray_serve.py builds one OpenAI app serving the embedded model twice: with
``{"method": "echo"}`` and without speculation. Greedy chat completions sent on
127.0.0.1 must be identical, and the echo replica's drafter must run with the
test's settings (read from the replica's log and stats file, ray_helpers.py).
Runs in the module's local Ray cluster (``ray_cluster`` in conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from engine_helpers import ENGINE_KWARGS
from ray_helpers import RayLogs
from server_helpers import free_port

from vllm_echo import prompts

pytestmark = pytest.mark.ray

pytest.importorskip("ray")
pytest.importorskip("ray.serve.llm")

NUM_PROMPTS = 6
MAX_TOKENS = 40
SPEC = {"method": "echo", "max_ngram": 2, "span": 12}
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_serve.py"


def load_example():
    spec = importlib.util.spec_from_file_location("ray_serve_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def serve_app(ray_cluster, model_path):
    """(base URL, drafters started) of the app; Serve is shut down afterwards."""
    from ray import serve

    example = load_example()
    logs = RayLogs(ray_cluster)
    configs = [example.llm_config(model_path, "echo", SPEC, engine_kwargs=ENGINE_KWARGS),
               example.llm_config(model_path, "no-spec", None, engine_kwargs=ENGINE_KWARGS)]
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(example.build_app(configs), name="vllm-echo", blocking=False)
        url = f"http://127.0.0.1:{port}"
        # Two replicas start their engines side by side; on a loaded 2-core host that
        # has taken close to 5 minutes.
        deadline = time.monotonic() + 900
        while True:
            try:
                listed = requests.get(f"{url}/v1/models", timeout=10).json()
                if {m["id"] for m in listed.get("data", [])} >= {"echo", "no-spec"}:
                    break
            except (requests.RequestException, ValueError):
                pass
            assert time.monotonic() < deadline, "the Serve app did not come up"
            time.sleep(2)
        yield url, logs
    finally:
        serve.shutdown()


def chat(url: str, model: str, content: str) -> dict:
    reply = requests.post(f"{url}/v1/chat/completions", timeout=300, json={
        "model": model, "messages": [{"role": "user", "content": content}],
        "temperature": 0, "max_tokens": MAX_TOKENS})
    reply.raise_for_status()
    body = reply.json()
    return {"text": body["choices"][0]["message"]["content"],
            "tokens": body["usage"]["completion_tokens"]}


def test_echo_app_matches_no_spec_app(serve_app):
    url, logs = serve_app
    texts = [p.text for p in prompts.load(prompts.SPEC_BENCH, n=NUM_PROMPTS)]
    with ThreadPoolExecutor(2 * NUM_PROMPTS) as pool:
        echo = list(pool.map(lambda t: chat(url, "echo", t), texts))
        plain = list(pool.map(lambda t: chat(url, "no-spec", t), texts))

    assert all(r["tokens"] > 0 for r in plain)
    assert echo == plain

    drafters = logs.drafters()
    assert drafters, "no vllm-echo drafter started in the Serve replica"
    for drafter in drafters:  # only the echo model has a drafter
        assert drafter.pid != os.getpid()
        assert {k: drafter.settings[k] for k in SPEC} == SPEC
    assert any(d.stats().get("steps", 0) > 0 for d in drafters), "the drafter never ran"
