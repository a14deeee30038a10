# SPDX-License-Identifier: Apache-2.0
"""Data-parallel offline inference with Ray actors, each holding an ``LLM`` with ECHO.

    python examples/ray_data_parallel.py [--replicas 2] [--num-prompts 16] [--model PATH]
        [--speculative-config '{"method": "echo"}'] [--address auto]

Works on CPU hosts (where vLLM refuses the Ray executor) and on GPU clusters (add
``--gpus-per-replica 1``). Install vllm-echo on every node: vLLM loads the plugin
in each actor through its ``vllm.general_plugins`` entry point, and the settings
travel inside vLLM's config, so nothing has to be set in the environment.
"""

from __future__ import annotations

import argparse
import json
import time

from vllm_echo import prompts
from vllm_echo.models import resolve_model


class Replica:
    def __init__(self, model: str, speculative_config: dict | None, on_cpu: bool):
        from vllm import LLM

        kwargs = dict(dtype="float32", enforce_eager=True) if on_cpu else {}
        self.llm = LLM(model, speculative_config=speculative_config, max_model_len=2048,
                       seed=0, **kwargs)

    def generate(self, chats: list, max_tokens: int) -> list[str]:
        from vllm import SamplingParams

        outs = self.llm.chat(chats, SamplingParams(temperature=0, max_tokens=max_tokens),
                             use_tqdm=False)
        return [o.outputs[0].text for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local HF folder (default: embedded)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--gpus-per-replica", type=float, default=0)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--speculative-config", type=json.loads, default={"method": "echo"})
    parser.add_argument("--address", default=None, help="Ray cluster address (default: local)")
    args = parser.parse_args()

    import ray

    model = resolve_model(args.model)
    chats = [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=args.num_prompts)]
    ray.init(address=args.address)
    try:
        actor = ray.remote(num_cpus=1, num_gpus=args.gpus_per_replica)(Replica)
        replicas = [actor.remote(model, args.speculative_config, args.gpus_per_replica == 0)
                    for _ in range(args.replicas)]
        start = time.perf_counter()
        shards = ray.get([r.generate.remote(chats[i::args.replicas], args.max_tokens)
                          for i, r in enumerate(replicas)])
        wall = time.perf_counter() - start
    finally:
        ray.shutdown()
    texts = [None] * len(chats)
    for i, shard in enumerate(shards):
        texts[i::args.replicas] = shard
    for chat, text in zip(chats, texts):
        print(f"--- {chat[0]['content'][:70]!r}\n{text}\n")
    print(f"{len(chats)} prompts on {args.replicas} replicas in {wall:.1f} s")


if __name__ == "__main__":
    main()
