# SPDX-License-Identifier: Apache-2.0
"""Bad speculative settings stop the server before the engine, with one clear line."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args,words", [
    (['{"method":"echo","delta":2}'], ["unknown key", "'delta'", "allowed"]),
    (['{"method":"logitspec","spam":1}'], ["unknown key", "'spam'", "allowed"]),
    (['{"method":"logitspec","capacity":"big"}'], ["capacity='big'", "integer"]),
    (['{"method":"echo","k_max":0}'], ["k_max=0", "integer >= 1"]),
    (['{"method":"echo","disable_by_batch_size":"many"}'],
     ["disable_by_batch_size='many'", "integer >= 2"]),
    (['{"method":"echo","model":"some/drafter"}'], ["'model'", "remove it"]),
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
