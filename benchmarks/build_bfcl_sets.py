# SPDX-License-Identifier: Apache-2.0
"""Build the two tool-use prompt sets in vllm_echo/data from the Berkeley Function
Calling Leaderboard (BFCL) data of the PyPI package ``bfcl-eval`` (the files are
shipped; this script documents how they were made and reproduces them).

    pip download --no-deps bfcl-eval==2026.3.23 -d /tmp/bfcl      # the wheel only, not installed
    python benchmarks/build_bfcl_sets.py --wheel /tmp/bfcl/bfcl_eval-2026.3.23-py3-none-any.whl
    python benchmarks/build_bfcl_sets.py --wheel ... --check     # exits 1 if a shipped file differs

- ``tool_call_question.jsonl``: single-turn tool calls from the categories
  ``simple_python``, ``multiple``, ``parallel`` and ``live_simple`` (40 each, evenly
  spaced over the rows that have one user message and fit): one user turn that gives the
  function schemas as JSON, asks for the calls as a JSON list, then states the request.
- ``agent_loop_question.jsonl``: 30 ``multi_turn_base`` conversations, spread over the
  combinations of APIs they involve: ``turns`` (the user turns, in order) and
  ``functions`` (the schemas of the involved APIs less the conversation's excluded
  functions). ``benchmarks/workloads.py`` makes the system message from them, and
  ``offline.py --multi-turn`` plays the conversations turn by turn.

Schemas are converted to JSON Schema types as BFCL does for OpenAI-style tools
(``dict`` -> ``object``, ``float`` -> ``number``, ...); the multi-turn schemas lose
their ``response`` part, which describes what a call returns, not how to call it.
The wheel is read as a zip file: nothing is installed or imported from it.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402
import workloads  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "vllm_echo" / "data"
BFCL_VERSION = "2026.3.23"
TOOL_CATEGORIES = ("simple_python", "multiple", "parallel", "live_simple")
TOOL_ROWS_PER_CATEGORY = 40
TOOL_MAX_TOKENS = 1500  # user turn; with the template and 128 output tokens < 2048
AGENT_ROWS = 30
AGENT_MAX_TOKENS = 7000  # the whole conversation at 128 tokens per answer; < 8192
AGENT_ANSWER_TOKENS = 128
# BFCL's own mapping to OpenAPI / JSON Schema types (bfcl_eval/constants/type_mappings.py)
TYPES = {"integer": "integer", "number": "number", "float": "number", "string": "string",
         "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array",
         "dict": "object", "object": "object", "tuple": "array", "any": "string",
         "byte": "integer", "short": "integer", "long": "integer", "double": "number",
         "char": "string", "ArrayList": "array", "Array": "array", "HashMap": "object",
         "Hashtable": "object", "Queue": "array", "Stack": "array", "Any": "string",
         "String": "string", "Bigint": "integer"}
# bfcl_eval/constants/executable_backend_config.py: MULTI_TURN_FUNC_DOC_FILE_MAPPING
API_DOCS = {"GorillaFileSystem": "gorilla_file_system.json", "MathAPI": "math_api.json",
            "MessageAPI": "message_api.json", "TwitterAPI": "posting_api.json",
            "TicketAPI": "ticket_api.json", "TradingBot": "trading_bot.json",
            "TravelAPI": "travel_booking.json", "VehicleControlAPI": "vehicle_control.json"}


def json_schema(node):
    """A copy of a BFCL parameter schema with JSON Schema type names, recursively."""
    node = copy.deepcopy(node)

    def cast(schema: dict) -> None:
        if not isinstance(schema, dict):
            return
        if "type" in schema:
            schema["type"] = TYPES.get(schema["type"], "string")
        for child in (schema.get("properties") or {}).values():
            cast(child)
        if isinstance(schema.get("items"), dict):
            cast(schema["items"])

    cast(node)
    return node


def tool_schema(function: dict) -> dict:
    return {"name": function["name"], "description": function.get("description", ""),
            "parameters": json_schema(function["parameters"])}


class Wheel:
    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path)
        names = self.zip.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        version = next(line.split(":", 1)[1].strip()
                       for line in self.zip.read(meta).decode().splitlines()
                       if line.startswith("Version:"))
        if version != BFCL_VERSION:
            raise SystemExit(f"{path}: bfcl-eval {version}, this script reads {BFCL_VERSION}")

    def rows(self, name: str) -> list[dict]:
        text = self.zip.read(f"bfcl_eval/data/{name}").decode("utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def evenly(items: list, count: int) -> list:
    if len(items) <= count:
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


def tool_call(wheel: Wheel, count_tokens) -> list[dict]:
    out, seen = [], set()
    for category in TOOL_CATEGORIES:
        fitting = []
        for row in wheel.rows(f"BFCL_v4_{category}.json"):
            messages = row["question"][0]
            if len(row["question"]) != 1 or [m["role"] for m in messages] != ["user"]:
                continue
            question = messages[0]["content"].strip()
            text = workloads.tool_call_prompt([tool_schema(f) for f in row["function"]],
                                              question)
            if question in seen or count_tokens(text) > TOOL_MAX_TOKENS:
                continue
            seen.add(question)
            fitting.append({"question_id": row["id"], "category": category, "turns": [text]})
        out += evenly(fitting, TOOL_ROWS_PER_CATEGORY)
    return out


def agent_loop(wheel: Wheel, count_tokens) -> list[dict]:
    docs = {api: [json.loads(line) for line in
                  wheel.zip.read(f"bfcl_eval/data/multi_turn_func_doc/{name}").decode()
                  .splitlines() if line.strip()]
            for api, name in API_DOCS.items()}
    by_combination: dict[str, list[dict]] = {}
    for row in wheel.rows("BFCL_v4_multi_turn_base.json"):
        turns = [m["content"] for turn in row["question"] for m in turn if m["role"] == "user"]
        if len(turns) != len(row["question"]) or not turns:
            continue  # a turn without exactly one user message (none in the base set)
        apis = sorted(row["involved_classes"])
        excluded = set(row.get("excluded_function") or [])
        functions = [tool_schema(f) for api in apis for f in docs[api]
                     if f["name"] not in excluded]
        conversation = {"question_id": row["id"], "category": "+".join(apis), "turns": turns,
                        "functions": functions}
        system = workloads.agent_system_prompt(functions)
        tokens = count_tokens(system) + sum(count_tokens(t) + AGENT_ANSWER_TOKENS + 16
                                            for t in turns)
        if tokens <= AGENT_MAX_TOKENS:
            by_combination.setdefault(conversation["category"], []).append(conversation)
    picked, depth = [], 0
    while len(picked) < AGENT_ROWS and any(depth < len(v) for v in by_combination.values()):
        for items in by_combination.values():
            if depth < len(items) and len(picked) < AGENT_ROWS:
                picked.append(items[depth])
        depth += 1
    order = {row["id"]: i for i, row in enumerate(wheel.rows("BFCL_v4_multi_turn_base.json"))}
    return sorted(picked, key=lambda r: order[r["question_id"]])


def build(wheel_path: Path) -> dict[str, list[dict]]:
    from transformers import AutoTokenizer

    from vllm_echo.models import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())

    def count_tokens(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    wheel = Wheel(wheel_path)
    return {"tool_call_question.jsonl": tool_call(wheel, count_tokens),
            "agent_loop_question.jsonl": agent_loop(wheel, count_tokens)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", type=Path, required=True,
                   help=f"bfcl_eval-{BFCL_VERSION}-py3-none-any.whl (pip download --no-deps "
                        f"bfcl-eval=={BFCL_VERSION})")
    p.add_argument("--check", action="store_true", help="compare with the shipped files")
    args = p.parse_args(argv)
    return bench_common.write_or_check_jsonl(build(args.wheel), DATA, args.check)


if __name__ == "__main__":
    sys.exit(main())
