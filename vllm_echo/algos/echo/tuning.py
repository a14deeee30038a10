# SPDX-License-Identifier: Apache-2.0
"""Every number that changes an ECHO decision, in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EchoTuning:
    """ECHO's tunables. Defaults are checked in replay (benchmarks/simulate.py)."""

    # -- acceptance model (per-node P(accepted)) --
    # Beta(a, b) prior of a retrieved token's rate given its parent was accepted: weak
    # (fast to follow the data) against strong (stable over the first verdicts).
    retrieved_prior: tuple[float, float] = (1.0, 1.0)
    # Beta prior of a next-next head's rate: heads are the target's runner-up tokens,
    # accepted far less often than retrieved continuations (a high mean drafts them early).
    head_prior: tuple[float, float] = (0.2, 1.8)
    # Lower edges of the depth buckets of retrieved tokens: finer learns each depth
    # apart, coarser pools sparse deep depths.
    depth_edges: tuple[int, ...] = (1, 2, 3, 4, 6, 9, 14)
    # Retrieved tokens whose m-gram match is longer than this get their own buckets
    # (0: no split): a long match is a copied passage and goes on more often.
    match_split: int = 4
    # Lower edges of a head's last-logit probability buckets, high to low.
    head_p_edges: tuple[float, ...] = (0.3, 0.1, 0.03, 0.01, 0.003)
    # Per-step decay of the Beta counts: nearer 1 averages over more steps, lower
    # follows a changing workload faster (0.99: about the last 100 steps).
    acceptance_decay: float = 0.99

    # -- step cost curve --
    # Weight of a new step in the line the timed steps add to the base curve (EWMA):
    # higher follows drift faster, lower is steadier against noisy steps.
    overhead_rate: float = 0.02
    # Weight of a new step in its size bucket's correction (EWMA, same trade).
    bucket_rate: float = 0.1
    # A bucket's correction is shrunk toward 0 until it has this many (decayed) steps:
    # more makes a few noisy steps move the curve less.
    bucket_prior_steps: float = 4.0
    # Size buckets grow by this factor past 16 tokens: finer follows the curve's shape,
    # coarser pools more steps per bucket.
    bucket_growth: float = 1.25
    # Without a measured curve, a verified token costs this share of the first timed
    # step's time per token, until steps of different sizes say otherwise (high: drafts
    # little at first, and may never learn that more pays).
    prior_token_cost: float = 0.03
    # Weight of the base curve's slope against the timed steps' spread of sizes, in
    # squared tokens: higher trusts the measured (or prior) slope longer.
    prior_slope_weight: float = 64.0

    # -- the one exploration device --
    # After this many steps in a row without a draft, the next step drafts anyway
    # (lower: learns faster whether drafting pays again, at more wasted steps).
    probe_after: int = 16
    # Nodes such a probe step verifies (the best ones).
    probe_nodes: int = 4
