# SPDX-License-Identifier: Apache-2.0
"""Soak: a local server with ECHO under steady concurrent load for a bounded time.

    python benchmarks/soak.py                       # echo, concurrency 32, 5 minutes
    python benchmarks/soak.py --method logitspec --concurrency 16 --duration 60

Starts the OpenAI server on 127.0.0.1 (as benchmarks/online.py does), keeps
--concurrency streaming chat requests in flight for --duration seconds, and
reports requests completed, errors (must be 0), p50/p99 request latency, the
resident memory of the server's processes after warm-up and at the end, and the
plugin's own counters from /metrics (after a last lone request, at most that one
request may still hold drafter state). Exit status 1 on any error or leftover
state. Not part of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402
import online  # noqa: E402


def rss_mib(pid: int) -> float:
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20


def plugin_metrics(server: online.Server) -> dict[str, float]:
    _, text = online._http_get(server.url + "/metrics")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm_echo:"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="echo", choices=sorted(online.METHODS))
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=300, help="seconds of load")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--warmup-requests", type=int, default=64)
    p.add_argument("--model", default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    from tqdm import tqdm

    from vllm_echo import prompts
    from vllm_echo.models import resolve_model

    server_args = argparse.Namespace(
        model=resolve_model(args.model), dtype="float32", max_model_len=2048,
        kv_cache_gib=1.0, concurrency=[args.concurrency])
    spec = online.METHODS[args.method]
    out = args.out or bench_common.RESULTS_DIR / time.strftime("soak-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    messages = [q.as_chat() for q in prompts.load(prompts.SPEC_BENCH)]
    report: dict = {"benchmark": "soak", "method": args.method, "speculative_config": spec,
                    "concurrency": args.concurrency, "duration_s": args.duration,
                    "environment": bench_common.environment("float32")}
    latencies: list[float] = []
    with online.Server(server_args, spec, out / "server.log") as server:
        server.wait_ready(600)
        with tqdm(total=args.warmup_requests, desc="warm-up", file=sys.stderr) as bar:
            asyncio.run(online.run_level(server.url, messages, args.concurrency,
                                         args.warmup_requests, 600, args.max_tokens, bar))
        report["rss_mib_start"] = rss_mib(server.proc.pid)
        with tqdm(desc="soak", file=sys.stderr) as bar:
            level = asyncio.run(_soak(server.url, messages, args, latencies, bar))
        # Per-request state is released at the next engine step: one lone request
        # after the load leaves at most its own state behind.
        asyncio.run(online.run_level(server.url, messages, 1, 1, 60, 4, _NoBar()))
        time.sleep(2)  # the worker publishes its statistics twice a second
        report["rss_mib_end"] = rss_mib(server.proc.pid)
        report["plugin_metrics"] = plugin_metrics(server)
    report.update(level)
    report["latency_ms"] = {k: None if v is None else 1e3 * v
                            for k, v in online._stats(latencies).items()}
    bench_common.write_json(out / "results.json", report)
    leftover = report["plugin_metrics"].get("vllm_echo:tracked_requests", 0)
    print(json.dumps({k: report[k] for k in ("completed", "errors", "latency_ms",
                                             "rss_mib_start", "rss_mib_end")}, indent=1))
    print(f"requests still holding drafter state after the run: {leftover:.0f}; "
          f"results in {out}")
    return 1 if report["errors"] or leftover > 1 else 0


class _NoBar:
    def update(self, n: int) -> None:
        pass


async def _soak(url: str, messages: list, args, latencies: list[float], bar) -> dict:
    import aiohttp

    start = time.perf_counter()
    completed, errors = 0, []
    counter = iter(range(10**9))

    async def client(session) -> None:
        nonlocal completed
        while time.perf_counter() - start < args.duration:
            i = next(counter)
            try:
                result = await online.one_request(session, url, messages[i % len(messages)],
                                                  args.max_tokens)
                latencies.append(result["latency"])
                completed += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
            bar.update(1)

    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
        await asyncio.gather(*(client(session) for _ in range(args.concurrency)))
    return {"completed": completed, "errors": len(errors), "error_samples": errors[:5],
            "wall_s": time.perf_counter() - start}


if __name__ == "__main__":
    sys.exit(main())
