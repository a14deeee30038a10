# SPDX-License-Identifier: Apache-2.0
"""Every number that changes an ECHO decision, in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EchoTuning:
    """ECHO's tunables; defaults checked in replay (benchmarks/simulate.py --ablations)."""

    # -- acceptance model (per-node P(accepted)) --
    # Beta(a, b) prior of a retrieved token's conditional rate: weaker follows data sooner.
    retrieved_prior: tuple[float, float] = (1.0, 1.0)
    # Beta prior of a next-next head's rate (runner-up tokens): a higher mean drafts them early.
    head_prior: tuple[float, float] = (0.2, 1.8)
    # Beta prior of a token from other requests' outputs: a higher mean drafts them early.
    shared_prior: tuple[float, float] = (1.0, 1.0)
    # Beta prior of a recycled candidate (the target's earlier top-k after the same token).
    recycled_prior: tuple[float, float] = (0.5, 1.5)
    # Beta prior of a token of the request's predicted output, which its client vouches
    # for: confident drafts long chains from the first step, weaker stops a wrong one sooner.
    prediction_prior: tuple[float, float] = (6.0, 1.0)
    # Lower edges of retrieved tokens' depth buckets: finer tells depths apart, coarser pools.
    depth_edges: tuple[int, ...] = (1, 2, 3, 4, 6, 9, 14)
    # Lower edges of retrieved tokens' match-length classes (the m of the lookup): finer
    # tells 1-gram guesses from copied passages, coarser pools. (1,): no classes.
    match_edges: tuple[int, ...] = (1, 2, 3, 5, 8)
    # Lower edges of a head's last-logit probability buckets, high to low (finer vs pooled).
    head_p_edges: tuple[float, ...] = (0.3, 0.1, 0.03, 0.01, 0.003)
    # Per-step decay of the Beta counts: nearer 1 is steadier, lower follows workloads faster.
    acceptance_decay: float = 0.99

    # -- step cost curve --
    # EWMA weight of a step in the line added to the base curve: follows drift vs noise.
    overhead_rate: float = 0.02
    # EWMA weight of a step in its size bucket's correction: follows shape vs noise.
    bucket_rate: float = 0.1
    # Steps a bucket needs before its correction counts in full: fewer reacts to noise sooner.
    bucket_prior_steps: float = 4.0
    # Growth of bucket sizes past 16 tokens: finer follows the curve, coarser pools steps.
    bucket_growth: float = 1.25
    # With a measured curve, a timed step counts at most this fraction above or below the
    # modelled time (0: as timed): shrugs off hiccups (a slow first call, the VM pausing)
    # vs follows real jumps slower.
    outlier_band: float = 0.15
    # No measured curve: a token's prior price, in the first step's time per token (high: timid).
    prior_token_cost: float = 0.03
    # Weight (squared tokens) of the base curve's slope against timed sizes' spread: trust vs data.
    prior_slope_weight: float = 64.0
    # What a step with drafts costs beyond its tokens, as a share of a plain step
    # (vLLM's speculative path; measured 10-15% on the CPU): higher drafts only surer
    # nodes, lower lets weak first drafts through.
    drafted_share: float = 0.05

    # -- the one exploration device --
    # Steps in a row without a draft before one drafts anyway: recovery speed vs wasted steps.
    probe_after: int = 16
    # Nodes such a probe verifies (its best ones): learns more per probe vs costs more.
    probe_nodes: int = 4
