# SPDX-License-Identifier: Apache-2.0
"""The drafter's counters: what each draft source drafted and what was accepted."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_echo.algos.forest import SOURCE_LOGITS, SOURCE_RETRIEVAL

SOURCE_TREE = 3
SOURCE_CHAIN = 4  # ECHO: a root path its planner chose, verified natively as a chain
SOURCE_SHARED = 5  # other requests' outputs (chain mode's fallback)
SOURCE_RECYCLED = 6  # the recycled-candidates table (chain mode's fallback)
SOURCE_PREDICTION = 7  # the request's predicted output (chain mode: before all others)
SOURCE_NAMES = {SOURCE_RETRIEVAL: "retrieval", SOURCE_LOGITS: "logits", SOURCE_TREE: "tree",
                SOURCE_CHAIN: "chain", SOURCE_SHARED: "shared", SOURCE_RECYCLED: "recycled",
                SOURCE_PREDICTION: "prediction"}


@dataclass
class DraftStats:
    """Per-worker counters, readable with ``LLM.collective_rpc`` (see base.worker_stats).

    Drafts are counted by source: "retrieval" (chain from the m-gram index),
    "logits" (chain led by a next-next candidate: the index found nothing),
    "shared" / "recycled" (chain from other requests' outputs / the recycled table),
    "prediction" (chain from the request's predicted output), "tree" (a forest verified
    as a tree), "chain" (ECHO: a root path of the forest, verified natively). Accepted
    tokens are attributed to the source of the draft they came from (ECHO's planner
    also counts them by node family). ``prediction`` counts, in every mode, requests
    with a prediction, request-steps whose draft held predicted tokens, those tokens
    and how many of them were accepted.
    """

    steps: int = 0
    drafts: dict = field(default_factory=lambda: dict.fromkeys(SOURCE_NAMES.values(), 0))
    tokens: dict = field(default_factory=lambda: dict.fromkeys(SOURCE_NAMES.values(), 0))
    accepted: dict = field(default_factory=lambda: dict.fromkeys(SOURCE_NAMES.values(), 0))
    peak_tracked_requests: int = 0  # most requests holding retrieval state at once
    # Requests without the scheduler's pool mark (patches.py entry 11) while shared
    # sources are on: they drafted from no shared pool.
    unmarked_requests: int = 0
    prediction: dict = field(default_factory=lambda: dict.fromkeys(
        ("requests", "drafts", "tokens", "accepted"), 0))

    def flat(self) -> dict[str, int]:
        out = {"steps": self.steps, "peak_tracked_requests": self.peak_tracked_requests,
               "unmarked_requests": self.unmarked_requests,
               **{f"prediction_{k}": v for k, v in self.prediction.items()}}
        for kind in ("drafts", "tokens", "accepted"):
            for source, value in getattr(self, kind).items():
                out[f"{kind}_{source}"] = value
        return out
