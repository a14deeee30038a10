# SPDX-License-Identifier: Apache-2.0
"""Bad speculative settings stop the server before the engine, with one clear line."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.server


# Two starts of the server: a setting the plugin refuses and JSON vLLM cannot parse.
# Every other refused setting gives its message through the same path, checked without
# a server in test_plugin.test_bad_settings_fail_before_the_engine_starts.
@pytest.mark.parametrize("args,words", [
    (['{"method":"logitspec","spam":1}'], ["unknown key", "'spam'", "allowed"]),
    (['{"method":"echo",'], ["--speculative-config", "cannot be converted"]),
])
def test_bad_speculative_config_fails_fast_with_one_line(model_path, args, words):
    config, *extra = args
    proc = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
         "--host", "127.0.0.1", "--port", "0", "--speculative-config", config, *extra],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, last
