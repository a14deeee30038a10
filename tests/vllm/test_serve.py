# SPDX-License-Identifier: Apache-2.0
"""`vllm serve --speculative-config '{"method":"logitspec"}'` on 127.0.0.1."""

from server_helpers import chat, openai_server

PROMPT = ("Repeat this list twice, separated by a blank line: apples, pears, plums, "
          "cherries, grapes, lemons, limes, melons.")


def test_served_chat_completion_identical_to_no_spec_server(model_path):
    with openai_server(model_path) as url:
        expected = chat(url, model_path, PROMPT)
    with openai_server(model_path, {"method": "logitspec", "num_speculative_tokens": 4}) as url:
        got = chat(url, model_path, PROMPT)
    assert expected and got == expected
