# SPDX-License-Identifier: Apache-2.0
"""How offline_worker.py drives an engine: step by step, logging who got tokens when.

Tokens per target forward is counted method-agnostically: with DELTA outputs, every
engine step tells which requests received new tokens; a request that received >= 1
token in a step had one target forward in it (its verification pass, or its last
prefill chunk). tokens/forward = output tokens / such pairs.

A step window (offline.py ``--window-steps N``) stops after the first wave's prefill
(the engine steps until the first ``batch_size`` prompts have each emitted a token: one
step at batch 16, several chunked-prefill steps at batch 64) and N more steps, aborting
unfinished requests; its throughput is the tokens those N steps emitted over their
time: a fixed number of decode steps at a full batch, however many tokens each method
got from them.

Multi-turn (offline.py ``--multi-turn``): every item is a conversation played turn by
turn: its system message and first user turn, the model's answer appended to the
history (chat format) before the next user turn, and so on. Conversations run in
groups of the batch size; within a group all advance together, turn t of each
submitted at once once every turn t - 1 has finished. Tokens, forwards and times sum
over the turns.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict


class StepSizes:
    """Decode steps by size (tokens the step verified: live requests plus their
    drafts): how many, their median time, and how many tokens each emitted. A step
    that emitted one token per live request accepted no draft."""

    def __init__(self):
        self._steps: dict[int, list[tuple[float, int, bool]]] = defaultdict(list)

    def add(self, size: int, seconds: float, emitted: int, live: int) -> None:
        self._steps[size].append((seconds, emitted, emitted == live))

    def merge(self, other: "StepSizes") -> None:
        for size, steps in other._steps.items():
            self._steps[size].extend(steps)

    def summary(self) -> list[dict]:
        out = []
        for size, steps in sorted(self._steps.items()):
            seconds, emitted, nothing = zip(*steps)
            out.append({"tokens": size, "steps": len(steps),
                        "median_ms": 1e3 * statistics.median(seconds),
                        "emitted_per_step": sum(emitted) / len(steps),
                        "steps_by_emitted": dict(sorted(Counter(emitted).items())),
                        "accepted_nothing": sum(nothing)})
        return out


def watch_scheduler(engine) -> dict | None:
    """Wrap the in-process scheduler's ``schedule`` (private: ``engine_core.engine_core``)
    so that each step's verified tokens and whether it admitted a new request (a
    prefill) can be read after ``engine.step()``; None where the engine is not
    in-process."""
    scheduler = getattr(getattr(getattr(engine, "engine_core", None), "engine_core", None),
                        "scheduler", None)
    if scheduler is None:
        return None
    if not hasattr(scheduler, "_bench_last"):
        original = scheduler.schedule
        last = scheduler._bench_last = {}

        def schedule(*args, **kwargs):
            output = original(*args, **kwargs)
            last["tokens"] = output.total_num_scheduled_tokens
            last["prefill"] = bool(output.scheduled_new_reqs)
            return output
        scheduler.schedule = schedule
    return scheduler._bench_last


def generate_stepwise(llm, prompts: list[list[int]], params, first_id: int = 0,
                       window_steps: int | None = None, wave: int = 1) -> dict:
    """Submit all prompts, drive the engine step by step, log who got tokens when.

    ``window_steps``: stop after the first wave's prefill (the steps until the first
    ``wave`` prompts have each emitted a token) and that many more, aborting what is
    unfinished; the result's ``window`` has the tokens those steps emitted and their
    time."""
    engine = llm.llm_engine
    ids = [f"bench-{first_id + i}" for i in range(len(prompts))]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    forwards: dict[str, int] = defaultdict(int)
    sizes, scheduled = StepSizes(), watch_scheduler(engine)
    step_seconds = 0.0
    steps = 0
    first_step = None
    start = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    # per window step: [tokens it verified, ms, tokens it emitted] (hiccups show here)
    window = ({"steps": 0, "seconds": 0.0, "emitted": 0, "per_step": [], "prefill_steps": 0}
              if window_steps else None)
    # the first wave: requests that must have a token before the window opens
    waiting = set(ids[:max(1, min(wave, len(ids)))])
    while engine.has_unfinished_requests():
        if window and window["steps"] == window_steps:
            engine.abort_request(ids)
            break
        t = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - t
        step_seconds += seconds
        steps += 1
        emitted = live = 0
        opened = not waiting
        for out in outputs:
            new = out.outputs[0].token_ids
            if new:
                waiting.discard(out.request_id)
                tokens[out.request_id].extend(new)
                forwards[out.request_id] += 1
                emitted += len(new)
                live += 1
        if scheduled and live and not scheduled["prefill"]:
            sizes.add(scheduled["tokens"], seconds, emitted, live)
        if first_step is None:
            first_step = {"seconds": seconds, "emitted": emitted}
        if window and not opened:
            window["prefill_steps"] += 1
        elif window:
            window["steps"] += 1
            window["seconds"] += seconds
            window["emitted"] += emitted
            window["per_step"].append([scheduled["tokens"] if scheduled else None,
                                       round(1e3 * seconds, 2), emitted])
    wall = time.perf_counter() - start
    return {"token_ids": [tokens[r] for r in ids], "forwards": [forwards[r] for r in ids],
            "wall_s": wall, "step_s": step_seconds, "engine_steps": steps,
            "step_sizes": sizes, "first_step": first_step, "window": window}


def render(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-template prompt ids, as offline.py renders them (and llm.chat would)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def generate_conversations(llm, tokenizer, conversations: list[dict], params, batch: int,
                           max_model_len: int, first_id: int = 0) -> dict:
    """Multi-turn (module docstring): groups of ``batch`` conversations, each group turn
    by turn. A conversation whose next prompt would leave no room for ``max_tokens``
    ends there (counted in ``cut_conversations``)."""
    n = len(conversations)
    histories = [[{"role": "system", "content": c["system"]}] if c.get("system") else []
                 for c in conversations]
    tokens: list[list[int]] = [[] for _ in range(n)]
    forwards, turns_run, cut = [0] * n, [0] * n, set()
    total = {"wall_s": 0.0, "step_s": 0.0, "engine_steps": 0}
    sizes, next_id = StepSizes(), first_id
    for start in range(0, n, batch):
        group = range(start, min(n, start + batch))
        for turn in range(max(len(conversations[i]["turns"]) for i in group)):
            active, prompts = [], []
            for i in group:
                if turn >= len(conversations[i]["turns"]) or i in cut:
                    continue
                histories[i].append({"role": "user", "content": conversations[i]["turns"][turn]})
                ids = render(tokenizer, histories[i])
                if len(ids) + params.max_tokens > max_model_len:
                    cut.add(i)
                    continue
                active.append(i)
                prompts.append(ids)
            if not active:
                continue
            gen = generate_stepwise(llm, prompts, params, next_id)
            next_id += len(active)
            for i, out, fwd in zip(active, gen["token_ids"], gen["forwards"]):
                tokens[i].extend(out)
                forwards[i] += fwd
                turns_run[i] += 1
                histories[i].append({"role": "assistant", "content": tokenizer.decode(
                    out, skip_special_tokens=True)})
            sizes.merge(gen["step_sizes"])
            for key in total:
                total[key] += gen[key]
    # every turn starts with a prefill: no single first step stands for the run
    return {"token_ids": tokens, "forwards": forwards, "turns": turns_run,
            "cut_conversations": len(cut), "step_sizes": sizes, "first_step": None, **total}
