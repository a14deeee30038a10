# SPDX-License-Identifier: Apache-2.0
"""Ray Data LLM batch jobs (``ray.data.llm``) with the plugin's methods, on CPU.

The way Ray users run vLLM in batch: ``vLLMEngineProcessorConfig`` +
``build_processor``, with ``speculative_config`` in ``engine_kwargs``; each replica
is a Ray Data actor holding a vLLM engine, here on a CPU bundle, in the module's
local Ray cluster (``ray_cluster`` in conftest.py). The jobs without speculation,
with echo and with logitspec run at the same time, each on its own replica.

What reaches the replica is read from the replica's own log (ray_helpers.py): the
drafter's start-up line with its settings, and vLLM's spec-decode counters.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from engine_helpers import ENGINE_KWARGS
from ray_helpers import RayLogs, drafters_in

from vllm_echo import prompts

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data.llm")
psutil = pytest.importorskip("psutil")

NUM_PROMPTS = 6
MAX_TOKENS = 24
PLUGIN_SETTINGS = {"max_ngram": 2, "span": 12}  # not the defaults: must reach the drafter
BATCH_DONE = "[vLLM] Elapsed time for batch "
# vLLM's counters, logged by the replica after each batch.
DRAFTED = re.compile(r"SpecDecoding metrics: .*Drafted: (\d+) tokens")


@pytest.fixture(scope="module")
def ray_logs(ray_cluster):
    # Ray ships this module's pre/postprocess functions by value (tests/ is no package).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray_cluster


@pytest.fixture(scope="module")
def chat_prompts(model_path):
    """Spec-Bench chats as prompt text, templated here once (examples/ray_batch.py uses
    Ray's chat-template stage; here that would be one more actor per job)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return [tokenizer.apply_chat_template(p.as_chat(), tokenize=False, add_generation_prompt=True)
            for p in prompts.load(prompts.SPEC_BENCH, n=NUM_PROMPTS)]


def run_job(model: str, chat_prompts: list, speculative_config: dict | None, *,
            batch_size: int = 4, max_concurrent_batches: int = 8) -> list[dict]:
    """One Ray Data LLM job on a single CPU replica; rows sorted by prompt index."""
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    config = vLLMEngineProcessorConfig(
        model_source=model,
        engine_kwargs={**ENGINE_KWARGS, "speculative_config": speculative_config},
        concurrency=1, batch_size=batch_size, max_concurrent_batches=max_concurrent_batches,
        placement_group_config={"bundles": [{"CPU": 1}]},
        # The engine tokenizes and detokenizes itself: no extra actor pools.
        chat_template_stage=False, tokenize_stage=False, detokenize_stage=False)
    processor = build_processor(
        config,
        preprocess=lambda row: dict(
            id=row["id"], prompt=row["prompt"],
            sampling_params=dict(temperature=0, max_tokens=MAX_TOKENS)),
        postprocess=lambda row: dict(
            id=row["id"], token_ids=[int(t) for t in row["generated_tokens"]],
            text=row["generated_text"], arrival_time=row["metrics"]["arrival_time"]))
    dataset = ray.data.from_items([{"id": i, "prompt": p} for i, p in enumerate(chat_prompts)])
    return sorted(processor(dataset).take_all(), key=lambda r: r["id"])


@pytest.fixture(scope="module")
def jobs(ray_logs, model_path, chat_prompts):
    """The same job without speculation ("none"), with echo and with logitspec, run at
    the same time (one replica each): ({name: rows}, the replicas' log texts)."""
    specs = {"none": None, **{m: {"method": m, **PLUGIN_SETTINGS} for m in ("echo", "logitspec")}}
    logs = RayLogs(ray_logs)
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = {name: pool.submit(run_job, model_path, chat_prompts, spec)
                   for name, spec in specs.items()}
        rows = {name: future.result() for name, future in futures.items()}
    reference = rows["none"]
    assert [r["id"] for r in reference] == list(range(NUM_PROMPTS))
    assert all(r["token_ids"] for r in reference)
    return rows, logs.new_texts()


def check_replica(log_text: str, method: str) -> None:
    """The replica's drafters ran ``method`` with the test's settings, and drafted."""
    drafters = drafters_in(log_text)
    assert drafters, "no vllm-echo drafter started in the replica"
    for drafter in drafters:
        assert drafter.method == method
        assert drafter.pid != os.getpid(), "the engine ran in the test process, not a replica"
        assert drafter.settings["method"] == method
        assert {k: drafter.settings[k] for k in PLUGIN_SETTINGS} == PLUGIN_SETTINGS
    assert sum(int(n) for n in DRAFTED.findall(log_text)) > 0, "nothing was drafted"


@pytest.mark.parametrize("method", ["echo", "logitspec"])
def test_job_with_method_matches_no_spec(jobs, method):
    rows, log_texts = jobs

    assert [r["id"] for r in rows[method]] == list(range(NUM_PROMPTS))
    assert [r["token_ids"] for r in rows[method]] == [r["token_ids"] for r in rows["none"]]
    replica_log = "\n".join(t for t in log_texts if f"vllm-echo: {method} drafter" in t)
    check_replica(replica_log, method)


def _replica_process(engine_pid: int) -> psutil.Process:
    """The Ray actor process above an engine process (vLLM's engine runs in children)."""
    for proc in psutil.Process(engine_pid).parents():
        if proc.name().startswith("ray::") or "MapWorker" in " ".join(proc.cmdline()):
            return proc
    raise AssertionError(f"no Ray actor above pid {engine_pid}")


def test_replica_killed_mid_job_loses_no_rows(ray_logs, model_path, chat_prompts, jobs):
    """Batches of 2 run one at a time on one replica; once its first batch is done,
    the replica's process is killed. Ray Data restarts the actor and retries the lost
    batch: every row comes back exactly once, identical to no speculation."""
    logs = RayLogs(ray_logs)
    killed = {}
    orphans = []

    def kill_after_first_batch():
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline:
            text = logs.new_text()
            drafters = logs.drafters()
            if BATCH_DONE in text and drafters:
                replica = _replica_process(drafters[0].pid)
                orphans.extend(replica.children(recursive=True))
                killed.update(pid=replica.pid, time=time.time(),
                              batches_done=text.count(BATCH_DONE))
                os.kill(replica.pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_after_first_batch, daemon=True)
    killer.start()
    try:
        rows = run_job(model_path, chat_prompts, {"method": "echo", **PLUGIN_SETTINGS},
                       batch_size=2, max_concurrent_batches=1)
    finally:
        killer.join(timeout=1)
        for proc in orphans:  # the killed replica's engine, should vLLM not reap it
            if proc.is_running():
                proc.kill()

    assert killed, "the replica was never killed"
    assert killed["batches_done"] < NUM_PROMPTS // 2, "killed after the last batch"
    assert [r["id"] for r in rows] == list(range(NUM_PROMPTS)), "rows lost or duplicated"
    assert [r["token_ids"] for r in rows] == [r["token_ids"] for r in jobs[0]["none"]]
    redone = [r["id"] for r in rows if r["arrival_time"] > killed["time"]]
    # The batch lost with the replica and those after it ran on the replacement. A batch
    # the replica had logged as done may not have reached the driver before the kill:
    # Ray then runs it again too (seen once in CI: all 6 rows after the kill).
    assert 2 <= len(redone) <= NUM_PROMPTS, redone
    check_replica(logs.new_text(), "echo")
    assert len({d.pid for d in logs.drafters()}) >= 2, "no replacement replica started"
