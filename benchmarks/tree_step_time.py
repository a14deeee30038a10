# SPDX-License-Identifier: Apache-2.0
"""Step time of tree verification: the native CPU path, the flex path and a chain.

Every decode step each request verifies a draft of fixed shape and size (capacity C:
C - 1 drafts and the root) whose tokens are never accepted, so every step does the
same work: a tree of two equal branches from the root (half its rows leave the first
branch: the rows the native path recomputes), or a chain of the same C - 1 drafts.
Contexts are synthetic token ids; prefix caching is off. Reported: the median wall
time of an engine step once every request decodes, per (path, C, batch, context),
and each path's ratio to the chain measured in the same round.

Usage::

    python benchmarks/tree_step_time.py [--capacities 8 16 32] [--batches 1 8]
        [--contexts 300 2000] [--dtype bfloat16] [--rounds 2] [--out FILE.json]
    python benchmarks/tree_step_time.py --smoke --out FILE.json   # CI: C=4, batch 1, 64 tokens

Each (path, C) is one in-process engine; the rounds alternate the paths.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the proposer class is ours

from bench_common import environment, write_json  # noqa: E402

from vllm_echo.plugin.proposer import LogitSpecProposer, worker_stats  # noqa: E402
from vllm_echo.plugin.tree_state import TreeDraft  # noqa: E402

PATHS = {  # name: tree, tree_attention
    "chain": (False, None),
    "native": (True, "native"),
    "flex": (True, "flex"),
}
MEASURED_STEPS = 12
# Tokens drafted: ids no context holds (the contexts draw from below this), so no
# draft is ever accepted.
DRAFT_TOKEN = 7


def two_branches(num_drafts: int) -> np.ndarray:
    """Parents of a tree of two chains from the root, the first one longer by one at
    most (parent-first order)."""
    first = (num_drafts + 1) // 2
    parents = [-1] + list(range(first - 1)) + [-1] + list(range(first, num_drafts - 1))
    return np.array(parents[:num_drafts], dtype=np.int32)


class FixedShapeProposer(LogitSpecProposer):
    """Drafts the same shape every step: a two-branch tree of capacity - 1 nodes, or
    (tree off) a chain of as many tokens."""

    def _draft(self, req_id, state, candidates, max_len):
        n = min(self.settings.capacity - 1, max_len)
        tokens = np.full(n, DRAFT_TOKEN, dtype=np.int32)
        if self.tree_enabled:
            self.tree_context.trees[req_id] = TreeDraft(tokens, two_branches(n))
        return tokens, 0


def _engine(capacity: int, path: str, dtype: str, max_model_len: int, max_batch: int):
    from vllm import LLM

    from vllm_echo.config import ADDITIONAL_CONFIG_KEY, EchoSettings

    tree, tree_attention = PATHS[path]
    settings = EchoSettings(num_speculative_tokens=capacity - 1, capacity=capacity, tree=tree,
                            tree_attention=tree_attention)
    return LLM(str(_model()), dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_batch,
               enable_prefix_caching=False, kv_cache_memory_bytes=3 * 2**30, seed=0,
               speculative_config={"method": "custom_class",
                                   "model": f"{__name__}.FixedShapeProposer",
                                   "num_speculative_tokens": capacity - 1},
               additional_config={ADDITIONAL_CONFIG_KEY: settings.to_dict()})


def _model():
    from vllm_echo.models import default_model_path

    return default_model_path()


def decode_step_time(llm, batch: int, context: int, seed: int) -> float:
    """Median seconds of the engine steps in which every request decodes."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(seed)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=MEASURED_STEPS + 4, ignore_eos=True)
    for i in range(batch):
        ids = rng.integers(100, 20000, size=context).tolist()
        engine.add_request(f"{seed}-{i}", TokensPrompt(prompt_token_ids=ids), params)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    # the last MEASURED_STEPS steps are decodes of all requests (1 token each)
    return statistics.median(times[-MEASURED_STEPS:])


def _tree_verifications(llm) -> int:
    return sum(s["tree_verifications"] for s in llm.collective_rpc(worker_stats) if s)


def run(capacities, batches, contexts, dtype, rounds) -> list[dict]:
    rows = []
    # vLLM drafts only while the longest sequence plus a step's drafts and the next
    # step's fit in max_model_len (else it schedules zeros as a chain): leave room
    max_len = max(contexts) + MEASURED_STEPS + 4 + 2 * max(capacities) + 16
    for r in range(rounds):
        for capacity in capacities:
            order = list(PATHS) if r % 2 == 0 else list(reversed(PATHS))
            for path in order:
                llm = _engine(capacity, path, dtype, max_len, max(batches))
                decode_step_time(llm, 1, 64, seed=999)  # compile and warm up
                for batch in batches:
                    for context in contexts:
                        before = _tree_verifications(llm)
                        seconds = decode_step_time(llm, batch, context, seed=len(rows))
                        trees = _tree_verifications(llm) - before
                        # every request verified a tree in every measured step (or none)
                        as_named = trees >= batch * MEASURED_STEPS if PATHS[path][0] \
                            else trees == 0
                        if not as_named:
                            raise RuntimeError(f"{path}: {trees} tree verifications at batch "
                                               f"{batch} over {MEASURED_STEPS}+ steps")
                        rows.append(dict(round=r, path=path, capacity=capacity, batch=batch,
                                         context=context, step_s=seconds))
                        print(f"round {r} {path:6s} C={capacity:2d} B={batch} "
                              f"ctx={context}: {seconds * 1e3:.1f} ms", flush=True)
                llm.llm_engine.engine_core.shutdown()
                del llm
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per cell: median step time of each path and its median ratio to the chain of the
    same round."""
    cells = {}
    for row in rows:
        cells.setdefault((row["capacity"], row["batch"], row["context"]), {}).setdefault(
            row["round"], {})[row["path"]] = row["step_s"]
    out = []
    for (capacity, batch, context), by_round in sorted(cells.items()):
        cell = dict(capacity=capacity, batch=batch, context=context)
        for path in PATHS:
            cell[f"{path}_ms"] = 1e3 * statistics.median(r[path] for r in by_round.values())
            if path != "chain":
                cell[f"{path}_over_chain"] = statistics.median(
                    r[path] / r["chain"] for r in by_round.values())
        out.append(cell)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacities", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--contexts", type=int, nargs="+", default=[300, 2000])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="CI: capacity 4, batch 1, context 64, one round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.capacities, args.batches, args.contexts, args.rounds = [4], [1], [64], 1
    rows = run(args.capacities, args.batches, args.contexts, args.dtype, args.rounds)
    cells = summary(rows)
    print("\n| C | batch | context | chain ms | native ms | flex ms | native / chain | "
          "flex / chain |\n|---|---|---|---|---|---|---|---|")
    for c in cells:
        print(f"| {c['capacity']} | {c['batch']} | {c['context']} | {c['chain_ms']:.1f} | "
              f"{c['native_ms']:.1f} | {c['flex_ms']:.1f} | {c['native_over_chain']:.2f} | "
              f"{c['flex_over_chain']:.2f} |")
    if args.out:
        write_json(args.out, {"environment": environment(args.dtype), "rows": rows,
                              "cells": cells})
    return 0


if __name__ == "__main__":
    sys.exit(main())
