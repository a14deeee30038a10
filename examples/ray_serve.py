# SPDX-License-Identifier: Apache-2.0
"""Ray Serve LLM with ECHO behind the OpenAI API.

    python examples/ray_serve.py [--model PATH] [--model-id smollm2-echo]
        [--speculative-config '{"method": "echo"}'] [--with-no-spec]
        [--host 127.0.0.1] [--port 8000] [--replicas 1]
        [--gpus-per-replica 1 --tensor-parallel-size 2] [--address auto]

``ray.serve.llm`` (``LLMConfig`` -> ``build_openai_app``) starts vLLM engines as
Serve replicas and passes ``engine_kwargs`` to them, so the plugin is selected with
``speculative_config={"method": "echo"}``. With ``--with-no-spec`` the same model is
also served without speculation as ``<model-id>-no-spec``, to compare answers. Runs
as is on a CPU host (fp32, eager, CPU bundles); on GPU clusters give
``--gpus-per-replica`` (GPUs per engine worker) and ``--tensor-parallel-size``.
Install vllm-echo and ``ray[data,serve]`` on every node.

    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "smollm2-echo", "messages": [{"role": "user", "content": "Hi"}]}'
"""

from __future__ import annotations

import argparse
import json
import os
import time

from vllm_echo.models import resolve_model

CPU_ENGINE_KWARGS = dict(dtype="float32", enforce_eager=True,
                         kv_cache_memory_bytes=512 * 2**20)


def llm_config(model: str, model_id: str, speculative_config: dict | None, *,
               replicas: int = 1, gpus_per_replica: float = 0, tensor_parallel_size: int = 1,
               engine_kwargs: dict | None = None):
    """An ``LLMConfig`` serving ``model`` as ``model_id``; CPU bundles when
    ``gpus_per_replica`` is 0 (Ray Serve LLM then runs vLLM's CPU backend)."""
    from ray.serve.llm import LLMConfig

    kwargs = dict(max_model_len=2048, seed=0, tensor_parallel_size=tensor_parallel_size,
                  speculative_config=speculative_config)
    if gpus_per_replica:
        bundle = {"CPU": 1, "GPU": gpus_per_replica}
    else:
        bundle = {"CPU": 1}
        kwargs.update(CPU_ENGINE_KWARGS)
    kwargs.update(engine_kwargs or {})
    return LLMConfig(
        model_loading_config=dict(model_id=model_id, model_source=model),
        engine_kwargs=kwargs,
        deployment_config=dict(num_replicas=replicas),
        placement_group_config={"bundles": [bundle] * tensor_parallel_size})


def build_app(configs: list):
    """One OpenAI-compatible app (``/v1/chat/completions``, ``/v1/models`` ...) for all."""
    from ray.serve.llm import build_openai_app

    return build_openai_app({"llm_configs": configs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local HF folder (default: embedded)")
    parser.add_argument("--model-id", default="smollm2-echo", help="name clients ask for")
    parser.add_argument("--speculative-config", type=json.loads, default={"method": "echo"})
    parser.add_argument("--with-no-spec", action="store_true",
                        help="also serve the model without speculation as <model-id>-no-spec")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--gpus-per-replica", type=float, default=0,
                        help="GPUs per engine worker; 0 runs on CPU")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--address", default=None, help="Ray cluster address (default: local)")
    args = parser.parse_args()

    import ray
    from ray import serve

    model = resolve_model(args.model)
    shape = dict(replicas=args.replicas, gpus_per_replica=args.gpus_per_replica,
                 tensor_parallel_size=args.tensor_parallel_size)
    configs = [llm_config(model, args.model_id, args.speculative_config, **shape)]
    if args.with_no_spec:
        configs.append(llm_config(model, f"{args.model_id}-no-spec", None, **shape))
    # Serve LLM books 2 logical CPUs per replica (replica and engine) and 1 for the
    # OpenAI ingress; a local cluster gets at least that many, so it fits small hosts.
    needed = 2 * args.replicas * len(configs) + 1
    ray.init(address=args.address,
             num_cpus=None if args.address else max(os.cpu_count() or 1, needed))
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build_app(configs), blocking=False)
    names = [c.model_loading_config.model_id for c in configs]
    print(f"serving {names} on http://{args.host}:{args.port}/v1 (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
