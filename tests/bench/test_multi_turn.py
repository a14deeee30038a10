# SPDX-License-Identifier: Apache-2.0
"""offline.py --multi-turn without an engine: conversations of a batch advance turn by
turn, each answer in the history before the next user turn; the agent loop's rows
carry their function schemas into the system message."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import offline_steps  # noqa: E402
import workloads  # noqa: E402


class FakeTokenizer:
    """A prompt has one id per character of its messages; an answer decodes to its ids'
    text."""

    def __init__(self):
        self.rendered: list[list[dict]] = []

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        self.rendered.append([dict(m) for m in messages])
        return [0] * sum(len(m["content"]) for m in messages)

    def decode(self, ids, skip_special_tokens):
        return "answer " + " ".join(map(str, ids))


class FakeEngine:
    """Every step, one token to every live request (the step number), up to max_tokens."""

    def __init__(self, max_tokens: int):
        self.max_tokens, self.live, self.step_no, self.batches = max_tokens, {}, 0, []

    def add_request(self, rid, prompt, params):
        if not self.live:
            self.batches.append([])
        self.batches[-1].append(rid)
        self.live[rid] = 0

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        self.step_no += 1
        outputs = []
        for rid in list(self.live):
            self.live[rid] += 1
            outputs.append(SimpleNamespace(request_id=rid, outputs=[
                SimpleNamespace(token_ids=[self.step_no])]))
            if self.live[rid] == self.max_tokens:
                del self.live[rid]
        return outputs


def test_conversations_advance_turn_by_turn() -> None:
    conversations = [{"system": "tools", "turns": ["a1", "a2"]}, {"turns": ["b1"]},
                     {"turns": ["c1", "c2", "c3"]}]
    engine, tokenizer = FakeEngine(max_tokens=2), FakeTokenizer()
    llm = SimpleNamespace(llm_engine=engine)
    gen = offline_steps.generate_conversations(
        llm, tokenizer, conversations, SimpleNamespace(max_tokens=2), batch=2,
        max_model_len=100)
    # groups of 2: (a, b) together for turn 1, then a alone; then c turn by turn
    assert [len(b) for b in engine.batches] == [2, 1, 1, 1, 1]
    assert len({rid for b in engine.batches for rid in b}) == 6  # request ids never reused
    assert gen["turns"] == [2, 1, 3] and gen["cut_conversations"] == 0
    assert [len(t) for t in gen["token_ids"]] == [4, 2, 6]
    # a's second prompt: system, its first turn, the model's answer, its second turn
    second = [m for m in tokenizer.rendered if m[-1]["content"] == "a2"][0]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == "answer 1 2"
    assert gen["first_step"] is None  # every turn has its own prefill


def test_conversation_cut_when_no_room_is_left() -> None:
    engine, tokenizer = FakeEngine(max_tokens=2), FakeTokenizer()
    gen = offline_steps.generate_conversations(
        SimpleNamespace(llm_engine=engine), tokenizer, [{"turns": ["x" * 5, "y" * 5]}],
        SimpleNamespace(max_tokens=2), batch=1, max_model_len=8)
    # turn 1: 5 prompt + 2 answer tokens fit in 8; turn 2 (5 + 10 + 5 + 2) does not
    assert gen["turns"] == [1] and gen["cut_conversations"] == 1


def test_agent_loop_rows_carry_their_schemas() -> None:
    rows = workloads.load_conversations("agent_loop_question.jsonl")
    assert 20 <= len(rows) <= 40
    for row in rows:
        assert row.system and "JSON" in row.system and len(row.turns) >= 1
    raw = json.loads((REPO / "vllm_echo" / "data" / "agent_loop_question.jsonl")
                     .read_text(encoding="utf-8").splitlines()[0])
    assert json.dumps(raw["functions"]) in rows[0].system
    assert rows[0].messages()[0]["role"] == "system"
    assert [m["role"] for m in rows[0].messages(2)] == ["system", "user", "user"]
