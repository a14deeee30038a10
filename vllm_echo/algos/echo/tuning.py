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

    # A timed decode cycle whose idle gap after drafting is over this many times the
    # step's own work is not a cost sample (the engine waited for requests): lower also
    # drops busy steps with slow scheduling, higher lets idle time price tokens.
    idle_gap_ratio: float = 3.0
    # The start-up probe (dummy verification forwards at 1, 2, 4, ... tokens): passes over
    # the sizes, each keeping its fastest (more shrug off stalls, start slower), and on a
    # CPU the largest size timed (larger measures big steps instead of extrapolating,
    # starts slower: 2.5 s at 128 on 2 cores; a CPU's curve is a line by then). Elsewhere
    # it times up to the engine's largest step: past its largest size the curve goes on at
    # its last slope, and a curve still flat there (a GPU below its knee) prices every
    # larger step as free (replay on the assumed GPU hinge, batch 64: 0.14x none probing
    # up to 128 tokens, 1.32x up to the largest step).
    probe_repeats: int = 3
    probe_largest_cpu: int = 128

    # -- the candidate forest (its capacity is a user setting: config_shim's platform
    # defaults) --
    # Nodes a forest keeps for other requests' outputs and recycled candidates: more
    # tries them deeper, leaves less room to the request's own text and next-next heads.
    other_sources_room: int = 16
    # Candidates kept per token in the recycled table (Token Recycling keeps 8): more
    # branches to choose from, memory (vocab x k x 4 bytes a pool) and forest room.
    recycled_k: int = 8
    # Children per node by depth in the recycled tree (Token Recycling's static tree, cut
    # to what a CPU step verifies): wider tries more guesses per step, each one costs.
    recycled_widths: tuple[int, ...] = (2, 1, 1)

    # -- the one exploration device --
    # Steps in a row without a draft before one drafts anyway: recovery speed vs wasted steps.
    probe_after: int = 16
    # Nodes such a probe verifies (its best ones): learns more per probe vs costs more.
    probe_nodes: int = 4
