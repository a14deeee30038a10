# SPDX-License-Identifier: Apache-2.0
"""How much Token Recycling's table could add at batch 1: a bound from a recorded trace.

    python benchmarks/recycled_bound.py                       # the Spec-Bench trace
    python benchmarks/recycled_bound.py TRACE --widths 2 1    # another trace, tree shape
    python benchmarks/recycled_bound.py --smoke --json F      # CI

No model runs: the trace (simulate.py --record) holds each prompt's greedy output and,
per output position, the top-64 of the logits that produced it. The trace's requests
are split in two halves. The recycled table (vllm_echo.algos.recycled, the engine's
own) is first filled from one half's recorded top-k, as if the engine had served those
requests before (never from the requests replayed: that would replay their answers),
then the other half is replayed at batch 1, and the halves swap.

Every step verifies the request's own retrieved chain (ECHO's m-gram index, its first
``--chain`` tokens) and, in the "with the recycled tree" rows, also the recycled tree
under the same root, verified with the chain as one tree (simulate.py's greedy
verification), and emits the accepted path + 1. The table learns from every
emitted position's top-k, more than the engine does (one row per request and step).
Verifying the tree every step is the cost side of the bound; its token side is the
tokens per forward, which no gate can raise. The modelled speed uses simulate.py's
batch-1 CPU step-cost curve.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simulate  # noqa: E402
import simulate_costs  # noqa: E402
import simulate_replay  # noqa: E402

from vllm_echo.algos.recycled import RecycledTable  # noqa: E402
from vllm_echo.algos.verify import verify_greedy  # noqa: E402
from vllm_echo.config import ECHO_MAX_NGRAM  # noqa: E402

TABLE_K = 8  # candidates kept per token, as the engine's table


def _learn(table: RecycledTable, row: dict, positions: range) -> None:
    """Row for the token before each output position: the top-k that produced it."""
    before = [row["prompt_ids"][-1], *row["output_ids"]]
    prev = np.array([before[p] for p in positions], np.int32)
    if len(prev):
        table.update(prev, np.array([row["topk_ids"][p][:TABLE_K] for p in positions]))


def replay_half(warm: list[dict], rows: list[dict], vocab: int, widths: tuple[int, ...],
                chain_len: int, with_tree: bool) -> tuple[int, int, float]:
    """(tokens, forwards, modelled time in batch-1 steps) of ``rows``."""
    table = RecycledTable(vocab, TABLE_K)
    for row in warm:
        _learn(table, row, range(len(row["output_ids"])))
    tokens = forwards = 0
    time = 0.0
    for row in rows:
        state = simulate_replay.Replay(row, max_ngram=ECHO_MAX_NGRAM)
        out = np.asarray(row["output_ids"], np.int32)
        _learn(table, row, range(1))
        tokens, forwards, time = tokens + 1, forwards + 1, time + 1.0  # the prefill
        t = 1
        while t < len(out):
            index = state.index_at(t - 1)
            draft = index.lookup(state.full[:state.prompt_len + t][-ECHO_MAX_NGRAM:])[:chain_len]
            parents = np.arange(-1, len(draft) - 1, dtype=np.int32)
            if with_tree:  # the tree beside the chain, under the same root
                tree, tree_parents = table.draft(int(out[t - 1]), widths, 64)
                parents = np.concatenate((parents, np.where(tree_parents >= 0,
                                                            tree_parents + len(draft), -1)))
                draft = np.concatenate((draft, tree))
            path, _ = verify_greedy(draft, parents, state.target_argmax(t - 1, draft, parents))
            accepted, verified = len(path), len(draft)
            emitted = min(accepted + 1, len(out) - t)
            _learn(table, row, range(t, t + emitted))
            tokens, forwards = tokens + emitted, forwards + 1
            time += simulate_costs.step_cost(1 + verified)
            t += emitted
    return tokens, forwards, time


def bound(rows: list[dict], widths_list: list[tuple[int, ...]], chain_len: int) -> list[dict]:
    vocab = 1 + max(max(r["prompt_ids"] + r["output_ids"]
                        + [t for top in r["topk_ids"] for t in top]) for r in rows)
    halves = (rows[:len(rows) // 2], rows[len(rows) // 2:])
    out = []
    for widths in [None, *widths_list]:
        sums = np.zeros(3)
        for warm, test in (halves, halves[::-1]):
            sums += replay_half(warm, test, vocab, widths or (1,), chain_len, widths is not None)
        tokens, forwards, time = sums
        out.append({"recycled_tree_widths": list(widths) if widths else None,
                    "tokens_per_forward": tokens / forwards,
                    "modeled_speedup": tokens / time})
    base = out[0]["modeled_speedup"]
    for row in out:
        row["over_own_chain"] = row["modeled_speedup"] / base
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", type=Path, default=simulate.DEFAULT_TRACE)
    p.add_argument("--widths", type=int, nargs="+", action="append", default=None,
                   help="children per node by depth of one recycled tree (repeatable); "
                        "default: 1 / 2 / 2 1 / 3 1 1 / 4 2 1")
    p.add_argument("--chain", type=int, default=4, help="own retrieved chain's length")
    p.add_argument("--limit", type=int, default=None, help="the trace's first N requests")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="4 requests, two tree shapes")
    args = p.parse_args(argv)
    if args.smoke:
        args.limit, args.widths = 4, [[1], [2, 1]]
    widths = [tuple(w) for w in (args.widths or [[1], [2], [2, 1], [3, 1, 1], [4, 2, 1]])]
    _, rows = simulate.load_trace(args.trace, args.limit)
    results = bound(rows, widths, args.chain)
    print(f"{len(rows)} requests of {args.trace.name}, batch 1, own chain of {args.chain}:")
    for r in results:
        name = ("own chain" if r["recycled_tree_widths"] is None
                else f"+ recycled tree {r['recycled_tree_widths']}")
        print(f"  {name:28s} tok/fwd {r['tokens_per_forward']:.3f}  modeled x none "
              f"{r['modeled_speedup']:.3f}  x own chain {r['over_own_chain']:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"trace": str(args.trace), "requests": len(rows),
                                         "chain": args.chain, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
