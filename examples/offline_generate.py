# SPDX-License-Identifier: Apache-2.0
"""Offline generation with LogitSpec vs no speculation on the embedded model.

    python examples/offline_generate.py [--model PATH] [--num-prompts 8] [--method logitspec]

Prints both outputs per prompt, whether they match, tokens per target forward pass
and wall time. Tokens per target forward = output tokens / (request, step) pairs,
where each step emits 1 + accepted drafts per request: pairs = output - accepted.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from vllm_echo import prompts
from vllm_echo.models import resolve_model


def run(model: str, chats, speculative_config, max_tokens: int):
    from vllm import LLM, SamplingParams

    llm = LLM(model, speculative_config=speculative_config, dtype="float32",
              enforce_eager=True, max_model_len=2048, gpu_memory_utilization=0.3, seed=0,
              disable_log_stats=False)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    llm.chat(chats[:1], params, use_tqdm=False)  # warm-up: JIT and first-step costs
    accepted_before = _accepted(llm)
    start = time.perf_counter()
    outs = llm.chat(chats, params, use_tqdm=False)
    wall = time.perf_counter() - start
    accepted = _accepted(llm) - accepted_before
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return [o.outputs[0].text for o in outs], tokens, tokens / max(tokens - accepted, 1), wall


def _accepted(llm) -> int:
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_accepted_tokens":
            return int(metric.value)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF folder or name (default: embedded)")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--method", default="logitspec", choices=["logitspec", "echo"])
    parser.add_argument("--spec", default="{}", help="extra speculative_config keys (JSON)")
    args = parser.parse_args()

    model = resolve_model(args.model)
    chosen = prompts.load(prompts.SPEC_BENCH, n=args.num_prompts)
    chats = [p.as_chat() for p in chosen]
    spec = {"method": args.method, **json.loads(args.spec)}
    base_text, base_tokens, base_tpf, base_wall = run(model, chats, None, args.max_tokens)
    spec_text, spec_tokens, spec_tpf, spec_wall = run(model, chats, spec, args.max_tokens)

    for p, a, b in zip(chosen, base_text, spec_text):
        print(f"=== [{p.category}] {p.text[:70]!r}")
        print(f"--- no speculation:\n{a}\n--- {args.method}:\n{b}")
        print(f"--- identical: {a == b}\n")
    same = sum(a == b for a, b in zip(base_text, spec_text))
    print(f"{'config':<16}{'tokens':>8}{'tokens/forward':>16}{'wall s':>9}{'tok/s':>8}")
    print(f"{'no speculation':<16}{base_tokens:>8}{base_tpf:>16.2f}{base_wall:>9.2f}"
          f"{base_tokens / base_wall:>8.1f}")
    print(f"{args.method:<16}{spec_tokens:>8}{spec_tpf:>16.2f}{spec_wall:>9.2f}"
          f"{spec_tokens / spec_wall:>8.1f}")
    print(f"identical outputs: {same}/{len(chosen)}")


if __name__ == "__main__":
    main()
