# SPDX-License-Identifier: Apache-2.0
"""Per-step drafting cost: vllm-echo's incremental index vs vLLM's NgramProposer.

    python benchmarks/micro_proposer.py                 # batch 1/32/64 x context 1k/4k/8k
    python benchmarks/micro_proposer.py --smoke         # CI
    python benchmarks/micro_proposer.py --sources       # engine-free draft sources, batch 1

One step = what a decode step asks of the drafter for every request of the batch:
  * vllm-echo: ``NgramIndex.extend`` with the one new token, then the draft:
    ``build_forest`` (logitspec tree / echo, capacity 64) or ``first_chain`` (chain, K=4);
  * vLLM: ``NgramProposer.propose`` over the batch (rescans each whole context).
Both see identical synthetic batches: tokens drawn i.i.d. from a Zipf(1.1) law over a
49152-token vocabulary (SmolLM2's size) under a fixed random rank-to-id map, and the
same top-64 candidate ids per request. Numba kernels are compiled before timing
(vLLM's own warm-up in NgramProposer.__init__ compiles nothing: it has no valid request).
Also reported: NgramIndex bytes per context token.

``--sources`` times instead the two engine-free sources at batch 1, per step:
``OutputStore.add`` of the new token + ``OutputStore.draft(.., 8)`` +
``RecycledTable.update`` (one row, random top-8) + ``RecycledTable.draft(.., (4, 2, 1), 16)``,
with the store (default 32 MiB) already holding ``--requests`` earlier requests' outputs:
256-token windows at random offsets of the bundled prompts (vllm_echo/data/*.jsonl) split
on whitespace, spread over 4 pools, so windows overlap and repeat as outputs do.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common  # noqa: E402

VOCAB = 49152
TOPK = 64


def zipf_tokens(rng: np.random.Generator, size: int, s: float = 1.1) -> np.ndarray:
    weights = 1.0 / np.arange(1, VOCAB + 1) ** s
    ranks = rng.choice(VOCAB, size=size, p=weights / weights.sum())
    return rng.permutation(VOCAB).astype(np.int32)[ranks]


class Batch:
    """``batch`` requests of ``context`` tokens, plus ``steps`` tokens to append."""

    def __init__(self, batch: int, context: int, steps: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.batch, self.context, self.steps = batch, context, steps
        self.tokens = zipf_tokens(rng, batch * (context + steps)).reshape(batch, -1)
        self.candidates = zipf_tokens(rng, batch * TOPK).reshape(batch, TOPK)


def time_echo(b: Batch, max_ngram: int, draft: Callable) -> tuple[list[float], float]:
    """Seconds of each step (extend + draft over the batch); index bytes per token."""
    from vllm_echo.algos.ngram_index import NgramIndex

    indexes = []
    for r in range(b.batch):
        index = NgramIndex(max_ngram, 20, capacity_hint=b.context + b.steps)
        index.extend(b.tokens[r, :b.context])
        indexes.append(index)
    bytes_per_token = sum(ix.nbytes / ix.length for ix in indexes) / len(indexes)
    times = []
    for s in range(b.steps):
        col = b.context + s
        start = time.perf_counter()
        for r, index in enumerate(indexes):
            index.extend(b.tokens[r, col:col + 1])
            draft(index, b.candidates[r])
        times.append(time.perf_counter() - start)
    return times, bytes_per_token


def vllm_ngram_proposer(k: int, lo: int, hi: int, max_model_len: int, max_num_seqs: int):
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    # The fields NgramProposer.__init__ reads; a full VllmConfig would need a model.
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(prompt_lookup_min=lo, prompt_lookup_max=hi,
                                           num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        parallel_config=SimpleNamespace(tensor_parallel_size=1))
    return NgramProposer(config)


def time_vllm(b: Batch, proposer) -> list[float]:
    """Seconds of each step (one ``propose`` over the batch)."""
    token_ids = np.zeros((b.batch, proposer.max_model_len), dtype=np.int32)
    token_ids[:, :b.tokens.shape[1]] = b.tokens
    times = []
    for s in range(b.steps):
        num_tokens = np.full(b.batch, b.context + s + 1, dtype=np.int32)
        sampled = [[int(t)] for t in b.tokens[:, b.context + s]]
        start = time.perf_counter()
        proposer.propose(proposer.k, sampled, num_tokens, token_ids)
        times.append(time.perf_counter() - start)
    return times


def echo_methods() -> dict[str, tuple[int, Callable]]:
    """name: (max_ngram, draft): LogitSpec's m, and ECHO's default m for its forests."""
    from vllm_echo.algos.forest import build_forest, first_chain
    from vllm_echo.config import ECHO_MAX_NGRAM, LOGITSPEC_MAX_NGRAM

    def forest(ix, c):
        return build_forest(ix, c, 64)

    return {
        "vllm-echo forest c64 (extend+build_forest)": (LOGITSPEC_MAX_NGRAM, forest),
        f"vllm-echo forest c64, m={ECHO_MAX_NGRAM} (echo)": (ECHO_MAX_NGRAM, forest),
        "vllm-echo chain K=4 (extend+first_chain)":
            (LOGITSPEC_MAX_NGRAM, lambda ix, c: first_chain(ix, c, 4)),
    }


def _row(method: str, b: Batch, times: list[float], bytes_per_token: float | None) -> dict:
    # Median: robust to the scheduler preempting a step on a shared machine.
    med = float(np.median(times))
    return {"method": method, "batch": b.batch, "context": b.context,
            "ms_per_step": 1e3 * med, "ms_per_step_mean": 1e3 * float(np.mean(times)),
            "ns_per_context_token": 1e9 * med / (b.batch * b.context),
            "index_bytes_per_token": bytes_per_token}


def run(batches: list[int], contexts: list[int], steps: int) -> dict[str, Any]:
    max_len = max(contexts) + steps + 16
    vllm_configs = {"vLLM NgramProposer k=4 m1..3": (4, 1, 3),
                    "vLLM NgramProposer k=8 m2..5": (8, 2, 5)}
    proposers = {name: vllm_ngram_proposer(*cfg, max_len, max(batches))
                 for name, cfg in vllm_configs.items()}
    echo = echo_methods()
    # Compile every kernel outside the timed region (numba JIT on first real call).
    warm = Batch(2, 64, 2, seed=1)
    for max_ngram, draft in echo.values():
        time_echo(warm, max_ngram, draft)
    for proposer in proposers.values():
        time_vllm(warm, proposer)

    rows = []
    for context in contexts:
        for batch in batches:
            b = Batch(batch, context, steps)
            for name, (max_ngram, draft) in echo.items():
                times, bpt = time_echo(b, max_ngram, draft)
                rows.append(_row(name, b, times, bpt))
            for name, proposer in proposers.items():
                rows.append(_row(name, b, time_vllm(b, proposer), None))
    return {"benchmark": "micro_proposer", "steps_per_config": steps,
            "token_distribution": f"zipf(1.1) over {VOCAB}", "topk": TOPK,
            "environment": bench_common.environment(), "results": rows}


def word_corpus() -> np.ndarray:
    """Every bundled prompt's words as ids (first-seen order), concatenated."""
    import json

    ids: dict[str, int] = {}
    out = []
    for path in sorted((bench_common.REPO_ROOT / "vllm_echo" / "data").glob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                turns = json.loads(line).get("turns", [])
                for word in " ".join(t for t in turns if isinstance(t, str)).split():
                    out.append(ids.setdefault(word, len(ids)))
    return np.array(out, dtype=np.int32)


def run_sources(requests: int, length: int, steps: int, seed: int = 0) -> dict[str, Any]:
    from vllm_echo.algos import recycled, shared_outputs
    from vllm_echo.algos.recycled import RecycledTable
    from vllm_echo.algos.shared_outputs import OutputStore, pool_id

    recycled.warm_up()
    shared_outputs.warm_up()
    rng = np.random.default_rng(seed)
    corpus = word_corpus()
    vocab = int(corpus.max()) + 1
    pools = [0] + [pool_id(f"tenant-{i}") for i in range(3)]
    store = OutputStore()
    start = time.perf_counter()
    for r in range(requests):
        off = int(rng.integers(0, corpus.size - length))
        store.add(pools[r % len(pools)], corpus[off:off + length], 0)
    fill_s = time.perf_counter() - start
    table = RecycledTable(vocab, 8)
    table.update(np.arange(vocab, dtype=np.int32),
                 rng.integers(0, vocab, (vocab, 8), dtype=np.int32))
    off = int(rng.integers(0, corpus.size - length - steps))
    row = corpus[off:off + length + steps].copy()  # the request being decoded
    pool = pools[1]
    store.add(pool, row[:length], 0)
    topk = rng.integers(0, vocab, (steps, 1, 8), dtype=np.int32)
    times, drafted, nodes = [], 0, 0
    for s in range(steps):
        n = length + s + 1
        t0 = time.perf_counter()
        store.add(pool, row[:n], n - 1)
        chain, _ = store.draft(pool, row[:n], 8)
        table.update(row[n - 2:n - 1], topk[s])
        tree, _ = table.draft(int(row[n - 1]), (4, 2, 1), 16)
        times.append(time.perf_counter() - t0)
        drafted += chain.size
        nodes += tree.size
    ms = 1e3 * np.asarray(times)
    return {"benchmark": "micro_proposer --sources", "requests": requests,
            "request_tokens": length, "steps": steps, "vocab": vocab,
            "fill_s": fill_s, "ms_per_step_median": float(np.median(ms)),
            "ms_per_step_p99": float(np.percentile(ms, 99)),
            "store_nbytes": store.nbytes, "store_slots": store.slots,
            "store_entries": store.entries, "store_evictions": store.evictions,
            "table_nbytes": table.nbytes, "mean_chain_len": drafted / steps,
            "mean_tree_nodes": nodes / steps,
            "environment": bench_common.environment()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32, 64])
    p.add_argument("--contexts", nargs="+", type=int, default=[1024, 4096, 8192])
    p.add_argument("--steps", type=int, default=50, help="timed steps per configuration")
    p.add_argument("--json", type=Path, default=None,
                   help="default benchmarks/results/micro_proposer-<time>.json")
    p.add_argument("--smoke", action="store_true", help="CI: batch 1 and 4, context 1024, 3 steps")
    p.add_argument("--sources", action="store_true",
                   help="time the shared-outputs store + recycled table instead (batch 1)")
    p.add_argument("--requests", type=int, default=10_000,
                   help="--sources: earlier requests' outputs in the store")
    args = p.parse_args(argv)
    if args.sources:
        steps = 20 if args.smoke else max(args.steps, 1000)
        report = run_sources(200 if args.smoke else args.requests, 256, steps)
        print(bench_common.markdown_table(
            ["requests in store", "ms/step median", "ms/step p99", "store MiB", "entries",
             "evictions", "table MiB", "chain len", "tree nodes"],
            [[report["requests"], f"{report['ms_per_step_median']:.4f}",
              f"{report['ms_per_step_p99']:.4f}", f"{report['store_nbytes'] / 2**20:.2f}",
              report["store_entries"], report["store_evictions"],
              f"{report['table_nbytes'] / 2**20:.2f}", f"{report['mean_chain_len']:.2f}",
              f"{report['mean_tree_nodes']:.1f}"]]))
        out = args.json or bench_common.RESULTS_DIR / time.strftime(
            "micro_sources-%Y%m%d-%H%M%S.json")
        bench_common.write_json(out, report)
        print(f"results in {out}")
        return 0
    if args.smoke:
        args.batch_sizes, args.contexts, args.steps = [1, 4], [1024], 3
    report = run(args.batch_sizes, args.contexts, args.steps)
    print(bench_common.markdown_table(
        ["method", "batch", "context", "ms/step (median)", "ns/context token",
         "index B/token"],
        [[r["method"], r["batch"], r["context"], f"{r['ms_per_step']:.4f}",
          f"{r['ns_per_context_token']:.2f}", r["index_bytes_per_token"]]
         for r in report["results"]]))
    out = args.json or bench_common.RESULTS_DIR / time.strftime("micro_proposer-%Y%m%d-%H%M%S.json")
    bench_common.write_json(out, report)
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
