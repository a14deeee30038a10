# SPDX-License-Identifier: Apache-2.0
"""ECHO under vLLM's Ray executor: one model split over several GPUs (GPU hosts only).

    python examples/ray_tensor_parallel.py --model /path/to/model --tensor-parallel-size 2
        [--speculative-config '{"method": "echo"}']

Multi-node: start Ray on every node (``ray start --head`` / ``ray start
--address=HEAD:6379``), install vllm-echo on every node, then run this on the head.
vLLM starts its workers as Ray actors and loads the plugin in each of them; the
settings travel in vLLM's config (``additional_config``), not in environment
variables, so the workers on other nodes see exactly what was given here. Pipeline
parallelism is refused at start-up: vLLM 0.32's workers fail with any speculative
method there.
"""

from __future__ import annotations

import argparse
import json

from vllm_echo import prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tensor-parallel-size", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--speculative-config", type=json.loads, default={"method": "echo"})
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    llm = LLM(args.model, speculative_config=args.speculative_config,
              distributed_executor_backend="ray",
              tensor_parallel_size=args.tensor_parallel_size)
    chats = [p.as_chat() for p in prompts.load(prompts.SPEC_BENCH, n=args.num_prompts)]
    outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=args.max_tokens))
    for chat, out in zip(chats, outs):
        print(f"--- {chat[0]['content'][:70]!r}\n{out.outputs[0].text}\n")


if __name__ == "__main__":
    main()
