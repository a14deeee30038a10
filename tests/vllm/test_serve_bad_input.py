# SPDX-License-Identifier: Apache-2.0
"""Bad --speculative-config input stops the server before the engine, with a clear last line."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("config,words", [
    ('{"method":"echo","delta":2}', ["delta=2", "(0.5, 1)"]),
    ('{"method":"logitspec","spam":1}', ["unknown key", "'spam'", "allowed"]),
    ('{"method":"logitspec","capacity":"big"}', ["capacity='big'", "integer"]),
    ('{"method":"echo",', ["--speculative-config", "cannot be converted"]),
])
def test_bad_speculative_config_fails_fast_and_names_the_problem(model_path, config, words):
    proc = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
         "--host", "127.0.0.1", "--port", "0", "--speculative-config", config],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, last
