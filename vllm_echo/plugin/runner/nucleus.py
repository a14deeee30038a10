# SPDX-License-Identifier: Apache-2.0
"""vLLM's top-p (nucleus) mask without sorting the vocabulary, where the nucleus is small.

vLLM's CPU ``apply_top_k_top_p`` sorts every row of the vocabulary (49152 tokens for
the embedded model): about 2-4 ms a row on this project's 2-core machine, so a sampled
request with 4 drafts pays ~8 ms a step in the rejection sampler for its draft rows, a
fifth of a whole step. A top-p nucleus is usually a few tokens: the largest
``NUCLEUS_CANDIDATES`` logits (``topk``, ~0.1 ms a row) decide it whenever their mass
reaches ``p``. Rows whose nucleus may be larger, rows with top-k, and ``p >= 1`` go to
vLLM's own function.

Same mask as vLLM's: vLLM sorts ascending and drops a token when the mass of it and
every smaller token is ``<= 1 - p``; here a token is kept when the mass of the tokens
larger than it is ``< p``, the same condition. Only the float rounding of the sums
differs (vLLM sums 49152 terms, here at most ``NUCLEUS_CANDIDATES``), so a token can
flip only when the mass before it is within rounding (~1e-6) of ``p``; tokens tied with
the smallest kept logit are all kept (vLLM's sort keeps an arbitrary subset of them).
"""

from __future__ import annotations

from typing import Callable

import torch

# Trades: the topk's cost (it grows with this) against how often a flat row falls back
# to the full sort. A 135M model's nucleus at T=0.7, top-p 0.95 is a few to a few
# dozen tokens.
NUCLEUS_CANDIDATES = 256


def top_p_from_candidates(fallback: Callable) -> Callable:
    """``apply_top_k_top_p(logits, k, p)`` that masks top-p-only rows from the largest
    candidates and hands every other row to ``fallback`` (vLLM's function, same
    contract: updates ``logits`` in place and returns it)."""

    def apply(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
              *args, **kwargs) -> torch.Tensor:
        if k is not None or p is None or args or kwargs or logits.shape[0] == 0:
            return fallback(logits, k, p, *args, **kwargs)
        thresholds, fits = nucleus_thresholds(logits, p)
        logits.masked_fill_(logits < thresholds, -float("inf"))
        if not bool(fits.all()):
            rows = (~fits).nonzero().squeeze(1)
            logits[rows] = fallback(logits[rows], None, p[rows])
        return logits

    apply.__wrapped__ = fallback
    return apply


def nucleus_thresholds(logits: torch.Tensor, p: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the smallest logit the top-p mask keeps (``-inf`` where it is not
    decided here) as a ``[rows, 1]`` column, and whether it was decided (the nucleus
    ends inside the candidates and ``p < 1``)."""
    n = min(NUCLEUS_CANDIDATES, logits.shape[1])
    top = logits.topk(n, dim=-1).values  # descending
    probs = (top - torch.logsumexp(logits, dim=-1, keepdim=True)).exp()
    before = probs.cumsum(dim=-1) - probs  # the mass of the larger candidates
    p = p.to(probs.dtype).unsqueeze(1)
    keep = before < p
    fits = ~keep[:, -1] & (p.squeeze(1) < 1)
    kept = keep.sum(dim=-1, keepdim=True).clamp_(min=1)
    thresholds = top.gather(1, kept - 1)
    return thresholds.masked_fill_(~fits.unsqueeze(1), -float("inf")), fits
