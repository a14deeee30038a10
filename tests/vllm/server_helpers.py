# SPDX-License-Identifier: Apache-2.0
"""Start and stop vLLM's OpenAI-compatible server on 127.0.0.1 for tests."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests
from timing import record_start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class Server:
    url: str
    model: str
    pid: int

    def rss_bytes(self) -> int:
        """Resident memory of the server and its engine processes together."""
        import psutil

        root = psutil.Process(self.pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])

    def metrics(self) -> dict[str, float]:
        """/metrics as {"name{labels}": value} (comments dropped)."""
        text = requests.get(f"{self.url}/metrics", timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def metric_sum(self, prefix: str) -> float:
        """Sum of every series whose name (labels included) starts with ``prefix``."""
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))


@contextlib.contextmanager
def openai_server(model: str, speculative_config: dict | None = None, *extra: str,
                  max_model_len: int = 2048, kv_cache_bytes: int = 256 * 2**20,
                  timeout_s: float = 300):
    """Yield a ``Server`` started with ``vllm serve MODEL ...``, the command users run
    (on CPU it works once scripts/register_vllm_cli.py has run, as bootstrap does)."""
    port = free_port()
    vllm_cli = os.path.join(os.path.dirname(sys.executable), "vllm")
    cmd = [vllm_cli, "serve", model,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", str(max_model_len), "--seed", "0",
           "--kv-cache-memory-bytes", str(kv_cache_bytes), *extra]
    if speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(speculative_config)]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{_tail(log.name)}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy after {timeout_s}s:\n{_tail(log.name)}")
            time.sleep(1)
        record_start("server", time.monotonic() - started)
        yield Server(url, model, proc.pid)
        if proc.poll() is not None:
            raise RuntimeError(f"server died during the test:\n{_tail(log.name)}")
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


def post(server: Server, route: str, body: dict) -> dict:
    reply = requests.post(f"{server.url}/v1/{route}",
                          json={"model": server.model, "seed": 0, **body}, timeout=600)
    if reply.status_code != 200:
        raise RuntimeError(f"HTTP {reply.status_code} from /v1/{route}: {reply.text[:500]}")
    return reply.json()


def stream(server: Server, route: str, body: dict, max_chunks: int | None = None) -> str:
    """Text of a streamed request; with ``max_chunks``, hang up after that many
    chunks (a client abort) and return what arrived."""
    body = {"model": server.model, "seed": 0, **body, "stream": True}
    parts = []
    with requests.post(f"{server.url}/v1/{route}", json=body, stream=True,
                       timeout=600) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code} from /v1/{route}: {reply.text[:500]}")
        for line in reply.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            parts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            if max_chunks is not None and len(parts) >= max_chunks:
                break
    return "".join(parts)


def chat(server: Server, content: str, max_tokens: int = 64, **body) -> str:
    reply = post(server, "chat/completions",
                 {"messages": [{"role": "user", "content": content}], "temperature": 0,
                  "max_tokens": max_tokens, **body})
    return reply["choices"][0]["message"]["content"]
