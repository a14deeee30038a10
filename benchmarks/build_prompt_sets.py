# SPDX-License-Identifier: Apache-2.0
"""Rebuild the three derived prompt sets in vllm_echo/data (the files are shipped; this
script documents how they were made and reproduces them).

    python benchmarks/build_prompt_sets.py            # writes vllm_echo/data/*.jsonl
    python benchmarks/build_prompt_sets.py --check    # exits 1 if a shipped file differs

- ``short_chat_question.jsonl``: the 80 MT-Bench rows of Spec-Bench (first turns).
- ``long_context_question.jsonl``: a Spec-Bench RAG question over its own passages followed
  by the next rows' passages, cut at sentence ends to 1,500-1,700 prompt tokens.
- ``copy_edit_question.jsonl``: a Python function from the standard library (CPython 3.11,
  PSF licence) with an edit whose answer repeats the function: rename a variable, add
  type hints, or add comments. The functions come from the source files under ``Lib/``,
  read from the running interpreter, so build it with Python 3.11.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "vllm_echo" / "data"
SPEC_BENCH = DATA / "spec_bench_question.jsonl"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction",
                       "stem", "humanities")
LONG_TOKENS = (1500, 1700)
COPY_MODULES = ("textwrap", "shlex", "difflib", "statistics", "fractions", "calendar",
                "heapq", "bisect", "colorsys", "fnmatch", "posixpath", "base64", "string",
                "glob", "ipaddress", "quopri", "gettext", "netrc", "tokenize", "html")
COPY_LINES = (10, 40)
COPY_ROWS = 60
EDITS = (
    ("rename", "Rename the variable `{var}` to `{new}` everywhere in this Python function. "
               "Reply with the complete updated function and nothing else.\n\n```python\n"
               "{code}\n```"),
    ("type_hints", "Add type hints to every parameter and the return value of this Python "
                   "function, changing nothing else. Reply with the complete updated "
                   "function only.\n\n```python\n{code}\n```"),
    ("comments", "Add a short comment above each `return` statement of this Python function "
                 "saying what it returns, changing nothing else. Reply with the complete "
                 "updated function only.\n\n```python\n{code}\n```"),
)


def spec_bench_rows() -> list[dict]:
    return [json.loads(line) for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def short_chat(rows: list[dict]) -> list[dict]:
    return [{"question_id": r["question_id"], "category": r["category"],
             "turns": r["turns"][:1]} for r in rows if r["category"] in MT_BENCH_CATEGORIES]


def long_context(rows: list[dict], count_tokens) -> list[dict]:
    rag = [r["turns"][0] for r in rows if r["category"] == "rag"]
    # A RAG prompt is its passages, a newline, then the question.
    parts = [text.rsplit("\n", 1) for text in rag]
    out = []
    for i, (passages, question) in enumerate(parts):
        sentences: list[str] = []
        for j in range(len(parts)):
            sentences += re.split(r"(?<=[.!?])\s+", parts[(i + j) % len(parts)][0])
            if count_tokens(" ".join(sentences)) >= LONG_TOKENS[0]:
                break
        while count_tokens(" ".join(sentences)) > LONG_TOKENS[1]:
            sentences.pop()
        document = " ".join(sentences)
        if count_tokens(document) < LONG_TOKENS[0]:
            continue
        out.append({"question_id": f"long-{i}", "category": "long_rag",
                    "turns": [f"{document}\n{question}"]})
    return out


def copy_edit() -> list[dict]:
    if sys.version_info[:2] != (3, 11):
        raise SystemExit("copy_edit_question.jsonl is built from the Python 3.11 standard "
                         f"library; this is {sys.version.split()[0]}")
    functions = []
    for name in COPY_MODULES:
        module = __import__(name)
        source = Path(inspect.getsourcefile(module)).read_text(encoding="utf-8")
        for node in ast.parse(source).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            code = ast.get_source_segment(source, node)
            lines = code.count("\n") + 1
            names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                            and isinstance(n.ctx, ast.Store) and len(n.id) > 1})
            if COPY_LINES[0] <= lines <= COPY_LINES[1] and names:
                functions.append((name, node.name, code, names))
    out = []
    for i, (module, func, code, names) in enumerate(functions[:COPY_ROWS]):
        kind, template = EDITS[i % len(EDITS)]
        var = names[i % len(names)]
        out.append({"question_id": f"copy-{module}.{func}", "category": kind,
                    "turns": [template.format(var=var, new=f"{var}_value", code=code)]})
    return out


def build() -> dict[str, list[dict]]:
    from transformers import AutoTokenizer

    from vllm_echo.models import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    rows = spec_bench_rows()
    return {
        "short_chat_question.jsonl": short_chat(rows),
        "long_context_question.jsonl": long_context(
            rows, lambda text: len(tokenizer(text)["input_ids"])),
        "copy_edit_question.jsonl": copy_edit(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the shipped files")
    args = p.parse_args(argv)
    return bench_common.write_or_check_jsonl(build(), DATA, args.check)


if __name__ == "__main__":
    sys.exit(main())
