# SPDX-License-Identifier: Apache-2.0
"""Ray-distributed data-parallel offline inference with ``{"method": "echo"}``.

vLLM's CPU platform refuses the Ray executor, so this covers Ray the way batch
users drive it on CPU: Ray actors, each holding an ``LLM``, in a local
``ray.init`` started and stopped here. It shows the plugin loads inside Ray
worker processes, the user's settings reach the drafter there through vLLM's
config, and the outputs are identical to no speculation. (The Ray executor with
tensor parallelism is in tests/gpu/test_gpu_engine.py.)
"""

from __future__ import annotations

import sys

import pytest
from engine_helpers import ENGINE_KWARGS

from vllm_echo import prompts

ray = pytest.importorskip("ray")

SPEC = {"method": "echo", "max_ngram": 2, "span": 12}
MAX_TOKENS = 48


class Generator:
    """One data-parallel replica: an LLM inside a Ray actor process."""

    def __init__(self, model: str, spec: dict | None):
        import os

        from vllm import LLM

        self.pid = os.getpid()
        self.llm = LLM(model, speculative_config=spec,
                       **{**ENGINE_KWARGS, "kv_cache_memory_bytes": 128 * 2**20})

    def generate(self, chats: list) -> list[list[int]]:
        from vllm import SamplingParams

        outs = self.llm.chat(chats, SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                             use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def drafter_view(self) -> dict:
        """What the drafter in this replica's worker sees."""
        from vllm_echo.plugin.proposer import worker_stats

        def settings(worker):
            return worker.model_runner.drafter.settings.to_dict()

        return {"pid": self.pid, "settings": self.llm.collective_rpc(settings)[0],
                "stats": self.llm.collective_rpc(worker_stats)[0]}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}})
    # Ray ships this module's classes to its workers by value (tests/ is not a package).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield ray
    finally:
        ray.shutdown()


def test_echo_replicas_in_ray_actors_match_no_spec(local_ray, model_path):
    chats = [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=8)]
    actor = ray.remote(num_cpus=1)(Generator)
    replicas = [actor.remote(model_path, SPEC) for _ in range(2)]
    shards = [chats[0::2], chats[1::2]]
    got_shards = ray.get([r.generate.remote(s) for r, s in zip(replicas, shards)])
    views = ray.get([r.drafter_view.remote() for r in replicas])
    for r in replicas:
        ray.kill(r)
    reference = actor.remote(model_path, None)
    expected = ray.get(reference.generate.remote(chats))
    ray.kill(reference)

    got = [None] * len(chats)
    got[0::2], got[1::2] = got_shards
    assert got == expected
    import os

    assert len({v["pid"] for v in views} | {os.getpid()}) == 3, "replicas ran in this process"
    for view in views:
        assert view["settings"]["method"] == "echo"
        assert (view["settings"]["max_ngram"], view["settings"]["span"]) == (2, 12)
        assert view["stats"]["steps"] > 0
