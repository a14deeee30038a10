# SPDX-License-Identifier: Apache-2.0
"""Ray Data LLM batch inference over Spec-Bench prompts with ECHO.

    python examples/ray_batch.py [--num-prompts 16] [--max-tokens 64] [--model PATH]
        [--speculative-config '{"method": "echo"}'] [--replicas 1] [--batch-size 4]
        [--gpus-per-replica 1 --tensor-parallel-size 2] [--address auto] [--compare]

``ray.data.llm`` (``vLLMEngineProcessorConfig`` + ``build_processor``) runs vLLM
replicas as a Ray Data actor pool and hands ``engine_kwargs`` to each engine, so
``speculative_config={"method": "echo"}`` is all it takes. Runs as is on a CPU host
(fp32, eager; each replica takes one CPU bundle) and on a GPU cluster with
``--gpus-per-replica`` (GPUs per engine worker) and ``--tensor-parallel-size``.
Install vllm-echo and ``ray[data,serve]`` on every node: vLLM loads the plugin in
each replica through its entry point and the settings travel in vLLM's config.

Prints throughput (wall time includes replica start-up) and, with ``--compare``,
how many answers are identical to the same job without speculation.
"""

from __future__ import annotations

import argparse
import json
import time

from vllm_echo import prompts
from vllm_echo.models import resolve_model

CPU_ENGINE_KWARGS = dict(dtype="float32", enforce_eager=True,
                         kv_cache_memory_bytes=512 * 2**20)


def processor_config(model: str, speculative_config: dict | None, *, replicas: int,
                     batch_size: int, gpus_per_replica: float, tensor_parallel_size: int,
                     max_concurrent_batches: int = 8):
    """A ``vLLMEngineProcessorConfig``; on CPU hosts (no GPUs per replica) each engine
    worker gets a CPU-only bundle, otherwise Ray would wait for GPUs forever."""
    from ray.data.llm import vLLMEngineProcessorConfig

    engine_kwargs = dict(max_model_len=2048, seed=0, tensor_parallel_size=tensor_parallel_size,
                         speculative_config=speculative_config)
    stages = {}
    if gpus_per_replica:
        bundle = {"CPU": 1, "GPU": gpus_per_replica}
    else:
        bundle = {"CPU": 1}
        engine_kwargs.update(CPU_ENGINE_KWARGS)
        # Few cores: the engine tokenizes and detokenizes itself, no extra actor pools.
        stages = dict(tokenize_stage=False, detokenize_stage=False)
    return vLLMEngineProcessorConfig(
        model_source=model, engine_kwargs=engine_kwargs, concurrency=replicas,
        batch_size=batch_size, max_concurrent_batches=max_concurrent_batches,
        placement_group_config={"bundles": [bundle] * tensor_parallel_size}, **stages)


def build(config, max_tokens: int):
    """A processor mapping rows {"id", "messages"} to {"id", "text", "num_tokens"}."""
    from ray.data.llm import build_processor

    return build_processor(
        config,
        preprocess=lambda row: dict(
            id=row["id"], messages=row["messages"],
            sampling_params=dict(temperature=0, max_tokens=max_tokens)),
        postprocess=lambda row: dict(id=row["id"], text=row["generated_text"],
                                     num_tokens=row["num_generated_tokens"]))


def run_job(chats: list, config, max_tokens: int) -> tuple[list[dict], float]:
    """Rows sorted by prompt index, and the job's wall time."""
    import ray

    processor = build(config, max_tokens)
    dataset = ray.data.from_items([{"id": i, "messages": chat} for i, chat in enumerate(chats)])
    start = time.perf_counter()
    rows = processor(dataset).take_all()
    wall = time.perf_counter() - start
    return sorted(rows, key=lambda r: r["id"]), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local HF folder (default: embedded)")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--speculative-config", type=json.loads, default={"method": "echo"})
    parser.add_argument("--replicas", type=int, default=1, help="vLLM engines (Ray actors)")
    parser.add_argument("--batch-size", type=int, default=4, help="rows per Ray Data batch")
    parser.add_argument("--gpus-per-replica", type=float, default=0,
                        help="GPUs per engine worker; 0 runs on CPU")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--address", default=None, help="Ray cluster address (default: local)")
    parser.add_argument("--compare", action="store_true",
                        help="also run without speculation and count identical answers")
    args = parser.parse_args()

    import ray

    model = resolve_model(args.model)
    chats = [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=args.num_prompts)]
    ray.init(address=args.address)
    shape = dict(replicas=args.replicas, batch_size=args.batch_size,
                 gpus_per_replica=args.gpus_per_replica,
                 tensor_parallel_size=args.tensor_parallel_size)
    try:
        rows, wall = run_job(chats, processor_config(model, args.speculative_config, **shape),
                             args.max_tokens)
        reference = None
        if args.compare:
            reference, ref_wall = run_job(chats, processor_config(model, None, **shape),
                                          args.max_tokens)
    finally:
        ray.shutdown()

    for chat, row in zip(chats, rows):
        print(f"--- {chat[0]['content'][:70]!r}\n{row['text']}\n")
    tokens = sum(r["num_tokens"] for r in rows)
    print(f"{args.speculative_config}: {len(rows)} prompts, {tokens} tokens on "
          f"{args.replicas} replica(s) in {wall:.1f} s ({tokens / wall:.1f} tokens/s, "
          "replica start-up included)")
    if reference is not None:
        ref_tokens = sum(r["num_tokens"] for r in reference)
        same = sum(a["text"] == b["text"] for a, b in zip(rows, reference))
        print(f"no speculation: {ref_tokens} tokens in {ref_wall:.1f} s "
              f"({ref_tokens / ref_wall:.1f} tokens/s)")
        print(f"identical to no speculation: {same}/{len(rows)}")


if __name__ == "__main__":
    main()
