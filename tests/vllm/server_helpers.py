# SPDX-License-Identifier: Apache-2.0
"""Start and stop vLLM's OpenAI-compatible server on 127.0.0.1 for tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def openai_server(model: str, speculative_config: dict | None = None, *extra: str,
                  timeout_s: float = 300):
    """Yield the base URL of a server started as ``vllm serve`` would be (the CPU
    wheel has no working ``vllm`` CLI, so the same entry module is run directly)."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", "2048", "--seed", "0",
           "--kv-cache-memory-bytes", str(256 * 2**20), *extra]
    if speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(speculative_config)]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{_tail(log.name)}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy after {timeout_s}s:\n{_tail(log.name)}")
            time.sleep(1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        os.unlink(log.name)


def _tail(path: str, n: int = 40) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(f.readlines()[-n:])


def chat(url: str, model: str, content: str, max_tokens: int = 64) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "temperature": 0, "max_tokens": max_tokens, "seed": 0}
    reply = requests.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    reply.raise_for_status()
    return reply.json()["choices"][0]["message"]["content"]
