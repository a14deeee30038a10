# SPDX-License-Identifier: Apache-2.0
"""One configuration of benchmarks/offline.py, run in its own process.

Usage (by offline.py, not by hand): ``python offline_worker.py JOB.json RESULT.json``.

Before the measured prompts the worker warms the engine up with one prompt that is
never measured, unless the job says ``"warmup": false`` (offline.py ``--no-warmup``:
a cold start, e.g. matrix.py's cold-start cell).

With ``"window_steps": N`` (offline.py ``--window-steps``) the worker measures a step
window (offline_steps.py, which drives the engine and counts forwards).

The engine runs in vLLM's default mode (compiled: torch.compile, and CUDA graphs on a
GPU) unless the job says ``"enforce_eager": true`` (offline.py ``--eager``); the result
records the mode the engine ended up in (``execution_mode``).

The engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the parent
before vLLM is imported) so that this process can drive ``llm_engine.step()``
itself and wrap the drafter's ``propose`` to time it.

With ``"interleaved": true`` in the job (offline.py ``--interleave``), the worker
generates one prompt at a time on request instead of all at once: after its warm-up
it writes ``{"ready": true}`` as a JSON line to the file descriptor ``reply_fd``, then
reads commands from stdin, one JSON line each (``{"prompt": i}``: generate job
prompt i, reply with its wall time; ``{"done": true}``: write RESULT.json and exit).
The parent runs every method's worker of a round side by side this way, prompt by
prompt, so that the machine's speed changes hit all methods alike.

With ``"conversations"`` in the job instead of ``"prompt_ids"`` (offline.py
``--multi-turn``), every item is a conversation played turn by turn (offline_steps.py);
interleaved, one command plays one whole conversation.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

from offline_steps import StepSizes, generate_conversations, generate_stepwise

# Warm-up prompt: not one of the benchmark prompts (offline.py checks), so it leaves
# nothing in the prefix cache, or in a drafter that remembers earlier requests, that a
# measured request could hit.
WARMUP_MESSAGE = "Write a short poem about the sea."


# -- drafter timing (runs inside the worker, which is this process) -------------------

def _wrap_propose(worker: Any) -> str | None:
    """For collective_rpc: time every ``drafter.propose`` call; returns the class name."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if drafter is None:
        return None
    if not hasattr(drafter, "_bench_propose"):
        original = drafter.propose
        drafter._bench_propose = [0, 0.0]  # calls, seconds

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                drafter._bench_propose[0] += 1
                drafter._bench_propose[1] += time.perf_counter() - start

        drafter.propose = timed  # instance attribute shadows the class method
    return type(drafter).__name__


def _read_propose(worker: Any) -> list | None:
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return list(getattr(drafter, "_bench_propose", None) or []) or None


# -- metrics ---------------------------------------------------------------------------

def _delta(after: dict, before: dict) -> dict:
    out = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, list):
            old = old or [0] * len(value)
            out[key] = [a - b for a, b in zip(value, old)]
        else:
            out[key] = value - (old or 0)
    return out


def _plugin_stats(llm) -> dict | None:
    """The vllm-echo drafter's own counters, when the drafter is ours."""
    from vllm_echo.engines import drafter_stats

    try:
        return drafter_stats(llm)
    except Exception:  # noqa: BLE001 - optional information
        return None


def _spec_summary(counters: dict, total_tokens: int, forwards: int) -> dict:
    drafts = counters.get("vllm:spec_decode_num_drafts", 0)
    draft_tokens = counters.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
    per_pos = counters.get("vllm:spec_decode_num_accepted_tokens_per_pos") or []
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "accepted_tokens_per_position": per_pos,
        # vLLM's definitions (per-position rate divides by all drafts, not conditional)
        "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "acceptance_rate_per_position": [a / drafts for a in per_pos] if drafts else None,
        # biased: counts only steps that had a draft (see docs/vllm-internals.md §7)
        "mean_acceptance_length_vllm": 1 + accepted / drafts if drafts else None,
        # Accepted draft tokens counted from our own step log (every forward emits
        # exactly one non-draft token), per drafted token: an independent check of
        # vLLM's counter (slightly lower when max_tokens cut an accepted run short).
        "draft_utilization": (total_tokens - forwards) / draft_tokens if draft_tokens else None,
        # share of (request, forward) pairs that carried a draft at all
        "drafted_forward_share": drafts / forwards if forwards else None,
    }


# -- the run ---------------------------------------------------------------------------

def _build_llm(job: dict):
    from vllm_echo.engines import build_llm

    backend = {"attention_backend": job["attention_backend"]} \
        if job.get("attention_backend") else {}
    return build_llm(job["speculative_config"], model=job["model"], dtype=job["dtype"],
                     enforce_eager=bool(job.get("enforce_eager")),
                     max_model_len=job["max_model_len"],
                     kv_cache_memory_bytes=job["kv_cache_bytes"],
                     max_num_seqs=job["batch_size"], **backend)


def _execution_mode(llm) -> dict:
    """The mode the engine runs in, as vLLM settled it (it can turn compilation or CUDA
    graphs off by itself, e.g. for a backend that has none)."""
    config = llm.llm_engine.vllm_config
    compilation = config.compilation_config
    eager = bool(config.model_config.enforce_eager)
    cudagraph = getattr(compilation, "cudagraph_mode", None)
    mode = getattr(compilation, "mode", None)
    return {"enforce_eager": eager, "mode": "eager" if eager else "compiled",
            "compilation_mode": getattr(mode, "name", None if mode is None else str(mode)),
            "cudagraph_mode": getattr(cudagraph, "name",
                                      None if cudagraph is None else str(cudagraph))}


def _num_items(job: dict) -> int:
    """Prompts, or conversations with ``--multi-turn``."""
    return len(job["conversations"] if job.get("conversations") else job["prompt_ids"])


def _generate_all(llm, job: dict, params, tokenizer=None) -> dict:
    """Every prompt (or conversation) of the job at once, or as the interleaved
    protocol asks."""
    if job.get("interleaved"):
        return _generate_on_request(llm, job, params, tokenizer)
    if job.get("conversations"):
        return generate_conversations(llm, tokenizer, job["conversations"], params,
                                       job["batch_size"], job["max_model_len"])
    return generate_stepwise(llm, job["prompt_ids"], params,
                              window_steps=job.get("window_steps"), wave=job["batch_size"])


def _generate_on_request(llm, job: dict, params, tokenizer=None) -> dict:
    """The interleaved protocol (module docstring): one prompt (or conversation) per
    command, each run alone; the result sums the prompts' wall and step times."""
    replies = os.fdopen(job["reply_fd"], "w", encoding="utf-8")

    def reply(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    reply({"ready": True})
    runs: dict[int, dict] = {}
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("done"):
            break
        index = int(command["prompt"])
        if job.get("conversations"):
            runs[index] = generate_conversations(
                llm, tokenizer, [job["conversations"][index]], params, 1,
                job["max_model_len"], first_id=1000 * index)
        else:
            runs[index] = generate_stepwise(llm, [job["prompt_ids"][index]], params, index)
        reply({"prompt": index, "wall_s": runs[index]["wall_s"]})
    ordered = [runs[i] for i in sorted(runs)]
    if len(ordered) != _num_items(job):
        raise RuntimeError(f"interleaved run generated {len(ordered)} of "
                           f"{_num_items(job)} prompts")
    sizes = StepSizes()
    for r in ordered:
        sizes.merge(r["step_sizes"])
    out = {"token_ids": [r["token_ids"][0] for r in ordered], "step_sizes": sizes,
           "forwards": [r["forwards"][0] for r in ordered],
           **{key: sum(r[key] for r in ordered) for key in ("wall_s", "step_s", "engine_steps")}}
    if job.get("conversations"):
        out["turns"] = [r["turns"][0] for r in ordered]
        out["cut_conversations"] = sum(r["cut_conversations"] for r in ordered)
    return out


def run(job: dict) -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from vllm_echo.engines import spec_decode_counters

    try:
        llm = _build_llm(job)
    except Exception as exc:
        if not _config_rejected(exc):
            raise  # any other failure is an error of the method, not its absence
        return {"status": "unavailable", "reason": _short_reason(exc)}

    drafter = llm.collective_rpc(_wrap_propose)[0] if job["speculative_config"] else None

    def params(max_tokens: int, kind) -> Any:
        return SamplingParams(temperature=job["temperature"], top_p=job.get("top_p", 1.0),
                              max_tokens=max_tokens,
                              seed=0 if job["temperature"] > 0 else None, output_kind=kind)

    # Warm-up through llm.chat: compiles numba kernels, and checks that our rendering
    # of the chat template gives exactly the prompt ids llm.chat would send. A cold
    # start ("warmup": false, offline.py --no-warmup) measures the fresh engine instead.
    chat_render_matches = None
    if job.get("warmup", True):
        warm = llm.chat([{"role": "user", "content": WARMUP_MESSAGE}],
                        params(min(16, job["max_tokens"]), RequestOutputKind.FINAL_ONLY),
                        use_tqdm=False)
        chat_render_matches = list(warm[0].prompt_token_ids) == job["warmup_prompt_ids"]
        llm.reset_prefix_cache()

    counters_before = spec_decode_counters(llm)
    plugin_before = _plugin_stats(llm)
    propose_before = llm.collective_rpc(_read_propose)[0] if drafter else None

    decode = params(job["max_tokens"], RequestOutputKind.DELTA)
    tokenizer = None
    if job.get("conversations"):  # the same rendering as offline.py's
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(job["model"])
    gen = _generate_all(llm, job, decode, tokenizer)

    counters = _delta(spec_decode_counters(llm), counters_before)
    plugin_after = _plugin_stats(llm)
    propose_after = llm.collective_rpc(_read_propose)[0] if drafter else None

    total_tokens = sum(len(t) for t in gen["token_ids"])
    window = gen.get("window")
    total_forwards = sum(gen["forwards"])
    by_cat: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for cat, toks, fwd in zip(job["categories"], gen["token_ids"], gen["forwards"]):
        by_cat[cat][0] += len(toks)
        by_cat[cat][1] += fwd

    proposer = None
    if propose_after:
        calls = propose_after[0] - (propose_before or [0, 0.0])[0]
        seconds = propose_after[1] - (propose_before or [0, 0.0])[1]
        proposer = {"class": drafter, "calls": calls, "seconds": seconds,
                    "ms_per_call": 1e3 * seconds / calls if calls else None,
                    "share_of_step_time": seconds / gen["step_s"] if gen["step_s"] else None}
    # Raw snapshots: which fields are counters is the plugin's business.
    plugin = {"after_warmup": plugin_before, "end": plugin_after} if plugin_after else None

    return {
        "status": "ok",
        "num_prompts": _num_items(job),
        # --multi-turn: turns played per conversation, and conversations cut short
        # because their next prompt left no room for max_tokens
        "turns": gen.get("turns"),
        "cut_conversations": gen.get("cut_conversations"),
        "output_tokens": total_tokens,
        "wall_s": gen["wall_s"],
        # With a step window: the window's tokens over its time (its steps only).
        "output_tokens_per_s": (window["emitted"] / window["seconds"] if window
                                else total_tokens / gen["wall_s"] if gen["wall_s"] else None),
        "window": window,
        "engine_steps": gen["engine_steps"],
        "forwards": total_forwards,
        "tokens_per_forward": total_tokens / total_forwards if total_forwards else None,
        "tokens_per_forward_by_category": {c: t / f if f else None
                                           for c, (t, f) in by_cat.items()},
        "spec_decode": _spec_summary(counters, total_tokens, total_forwards)
        if job["speculative_config"] else None,
        "proposer": proposer,
        "plugin_stats": plugin,
        "chat_render_matches": chat_render_matches,  # None without a warm-up
        "warmup": bool(job.get("warmup", True)),
        # vLLM turns async scheduling off for ngram/custom drafters (and always on CPU);
        # on a GPU `none` keeps it, which is part of what the ratio then measures.
        "async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
        "execution_mode": _execution_mode(llm),
        # decode steps by verified tokens (at batch 1: 1 + the step's drafts)
        "step_sizes": gen["step_sizes"].summary(),
        # The batch's first engine step: the first prompts' prefill, the same work for
        # every method (None for interleaved runs, which have one per prompt).
        "first_step": gen.get("first_step"),
        "token_ids": gen["token_ids"],
    }


def _config_rejected(exc: BaseException) -> bool:
    """True when the speculative config itself was refused: by the plugin (a key it
    does not have yet, e.g. an ablation) or by vLLM's SpeculativeConfig (a method
    this vLLM does not know). Other errors while building the engine are failures."""
    from pydantic import ValidationError

    from vllm_echo.config import SpeculativeConfigError

    if isinstance(exc, SpeculativeConfigError):
        return True
    return isinstance(exc, ValidationError) and exc.title == "SpeculativeConfig"


def _short_reason(exc: BaseException) -> str:
    """The line of a (possibly pydantic-wrapped) config error that says what is wrong."""
    text = str(exc)
    for line in text.splitlines():
        if "unknown key" in line or "speculative_config" in line:
            return line.strip()[:400]
    return f"{type(exc).__name__}: {text.strip().splitlines()[0][:400] if text.strip() else ''}"


def main(argv: list[str]) -> int:
    job_path, result_path = Path(argv[0]), Path(argv[1])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    try:
        result = run(job)
    except Exception as exc:  # noqa: BLE001 - the parent reports it; never lose the reason
        traceback.print_exc()
        result = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:1000]}
    result_path.write_text(json.dumps(result), encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM can hang in interpreter shutdown with live engine threads; the result is
    # written, so leave without running atexit hooks.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
