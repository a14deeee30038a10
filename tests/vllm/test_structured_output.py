# SPDX-License-Identifier: Apache-2.0
"""Structured output (a JSON schema, a regex, a choice) under speculation: greedy
tokens identical to the same engine without speculation (fp32).

vLLM advances each request's grammar through its draft tokens, cuts a draft at the
first token the grammar refuses and masks every verified row with the grammar's
bitmask; our drafter sends structured requests through chain verification
(verdicts.tree_unsafe_reason). The session's no-spec engine gives the references; the
session's engine of each method answers the same requests in one call. The prompts
restate what the answer must contain, so retrieval drafts it and drafts are really
accepted (checked: the test cannot pass because nothing was drafted), and every output
is checked against its constraint (it cannot pass on unconstrained text either).
"""

from __future__ import annotations

import json
import re

import pytest
from engine_helpers import accepted_tokens, drafter_stats, faults, since

pytestmark = pytest.mark.engine

MAX_TOKENS = 48

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
RECORDS = [
    "Alice Johnson is 34 years old and lives in Lisbon.",
    "Bob Martinez, aged 58, moved to Toronto last year.",
]
DATE_REGEX = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
SENTENCE_REGEX = r"[A-Z][a-z]+( [a-z]+){3,12}\."
CITIES = ["The Eiffel Tower is in Paris, the capital of France.",
          "The Eiffel Tower is in Rome, the capital of Italy.",
          "The Eiffel Tower is in Madrid, the capital of Spain."]
SENTIMENTS = ["positive", "negative", "neutral"]


def _requests():
    """(kind, chat, StructuredOutputsParams kwargs, check of the output text)."""
    def parses(text):
        value = json.loads(text)
        assert set(value) == {"name", "age", "city"} and isinstance(value["age"], int), value

    out = [("json", f"{record} Write this record as a JSON object with the keys name, age "
                    f"and city.", {"json": PERSON_SCHEMA}, parses)
           for record in RECORDS]
    out += [
        ("regex", "The meeting was moved from 2024-03-18 to 2024-03-21. On which date, in "
                  "the form YYYY-MM-DD, will the meeting take place?",
         {"regex": DATE_REGEX}, lambda t: re.fullmatch(DATE_REGEX, t) or pytest.fail(t)),
        ("regex", "Describe the sea in one short sentence of small words.",
         {"regex": SENTENCE_REGEX}, lambda t: re.fullmatch(SENTENCE_REGEX, t) or pytest.fail(t)),
        ("choice", "Where is the Eiffel Tower? The Eiffel Tower is in Paris, the capital of "
                   "France. Answer with one sentence.",
         {"choice": CITIES}, lambda t: t in CITIES or pytest.fail(t)),
        ("choice", "Is the sentiment of this review positive, negative or neutral? 'I loved "
                   "the food and the staff were wonderful.'",
         {"choice": SENTIMENTS}, lambda t: t in SENTIMENTS or pytest.fail(t)),
    ]
    return out


def _generate(llm):
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    requests = _requests()
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(**constraint))
              for _, _, constraint, _ in requests]
    outs = llm.chat([[{"role": "user", "content": text}] for _, text, _, _ in requests],
                    params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].text, o.outputs[0].finish_reason)
            for o in outs]


@pytest.fixture(scope="module")
def reference(no_spec_llm):
    return _generate(no_spec_llm)


def test_reference_outputs_satisfy_their_constraints(reference):
    for (kind, _, _, check), (_, text, finish) in zip(_requests(), reference):
        assert finish == "stop", (kind, text)  # completed within MAX_TOKENS
        check(text)


@pytest.mark.parametrize("method", ["logitspec-chain", "echo"])
def test_structured_output_identical_to_no_speculation(shared_engine, reference, method):
    # the methods' CPU defaults (shared engines, conftest.SHARED_SPECS)
    llm = shared_engine(method)
    before = drafter_stats(llm)
    got = _generate(llm)
    stats = since(before, drafter_stats(llm))
    for (kind, _, _, check), (tokens, text, _), (expected, _, _) in zip(
            _requests(), got, reference):
        assert tokens == expected, f"{kind}: {text!r} differs from no speculation"
        check(text)
    # drafts were proposed and verified for these requests, as chains
    assert accepted_tokens(stats) > 0, stats
    assert stats["tree_verifications"] == 0, stats
    assert not faults(stats), stats["failures"]
