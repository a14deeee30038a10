# SPDX-License-Identifier: Apache-2.0
"""offline.py's prompts: category-spread prompts (or conversations) that fit
max_model_len, rendered once with the model's chat template (each worker checks the
rendering against ``llm.chat``), and the KV cache that holds a batch of them."""

from __future__ import annotations

import json
from pathlib import Path

import bench_common
import workloads
from offline_steps import render
from offline_worker import WARMUP_MESSAGE  # light: its vLLM imports are inside functions


def kv_bytes_per_token(model: str, dtype: str) -> int:
    cfg = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * heads * head_dim * (4 if dtype == "float32" else 2)


def kv_cache_bytes(lengths: list[int], batch: int, args, per_token: int) -> int:
    """Room for the ``batch`` longest requests at once (no preemption), with slack for
    drafts and block rounding; never less than one max_model_len request (vLLM's check).
    ``lengths``: the prompts' lengths in tokens (with --multi-turn, each conversation's
    estimated length at its last turn)."""
    longest = sorted(lengths, reverse=True)[:batch]
    tokens = sum(longest) + len(longest) * (args.max_tokens + 192)
    return int(max(1.1 * tokens, args.max_model_len + 256) * per_token)


def _renderer(model: str):
    """messages -> prompt ids with the model's chat template (as llm.chat renders them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return lambda messages: render(tokenizer, messages)


def prepare_prompts(args, model: str, count: int):
    """Category-spread prompts that fit max_model_len, rendered to token ids."""
    render_chat = _renderer(model)
    rendered: dict[str, list[int]] = {}

    def fits(p) -> bool:
        rendered[p.text] = render_chat(p.as_chat())
        return len(rendered[p.text]) + args.max_tokens <= args.max_model_len

    chosen, skipped = bench_common.load_prompts_fitting(args.dataset, count, fits)
    # The warm-up prompt is never measured, and no measured prompt repeats.
    workloads.check_no_repeats([WARMUP_MESSAGE], [p.text for p in chosen])
    warm = render_chat([{"role": "user", "content": WARMUP_MESSAGE}])
    return chosen, [rendered[p.text] for p in chosen], warm, skipped


# Per turn, the tokens of an answer's chat-template frame (besides its max_tokens).
TURN_FRAME_TOKENS = 16


def prepare_conversations(args, model: str, count: int):
    """--multi-turn: category-spread conversations (benchmarks/workloads.py) that fit
    max_model_len at their last turn with every answer max_tokens long, estimated as
    the system message and all user turns rendered plus ``max_tokens +
    TURN_FRAME_TOKENS`` per turn. Returns (conversations, estimated lengths, warm-up
    ids, skipped)."""
    render_chat = _renderer(model)
    chosen, lengths, skipped, seen = [], [], 0, set()
    for c in bench_common.spread_order(workloads.load_conversations(args.dataset)):
        if len(chosen) == count:
            break
        if c.turns in seen:
            continue
        seen.add(c.turns)
        length = len(render_chat(c.messages())) + len(c.turns) * (args.max_tokens
                                                              + TURN_FRAME_TOKENS)
        if length <= args.max_model_len:
            chosen.append(c)
            lengths.append(length)
        else:
            skipped += 1
    workloads.check_no_repeats([WARMUP_MESSAGE], [c.turns for c in chosen])
    warm = render_chat([{"role": "user", "content": WARMUP_MESSAGE}])
    return chosen, lengths, warm, skipped
