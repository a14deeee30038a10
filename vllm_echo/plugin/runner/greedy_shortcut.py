# SPDX-License-Identifier: Apache-2.0
"""Steps whose verdicts need less than vLLM's rejection sampler: no drafts at all, or
greedy requests whose verdicts are their logits rows' argmaxes."""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from vllm_echo.algos.verify import verify_greedy_chains


def no_drafts_in_step(metadata: Any, input_batch: Any) -> bool:
    """True when the plain sampler gives exactly the rejection sampler's result: no
    request has a draft token and no logprobs are requested (their layout differs)."""
    sampling = input_batch.sampling_metadata
    return (metadata.max_spec_len == 0 and sampling.max_num_logprobs is None
            and not sampling.logprob_token_ids)


def verdicts_are_row_argmaxes(runner: Any, metadata: Any) -> bool:
    """True when the rejection sampler's result is fixed by each logits row's argmax:
    every request greedy, no logprobs (their layout differs), no synthetic acceptance,
    nothing that RejectionSampler.apply_logits_processors changes draft rows with
    (penalties, allowed-token masks, bad words, min_tokens, a thinking budget), and
    nothing that the sampler changes bonus rows with (those, logit_bias, a logits
    processor that is not vLLM's own)."""
    from vllm.v1.sample.logits_processor.builtin import (LogitBiasLogitsProcessor,
                                                         MinTokensLogitsProcessor)

    sampling = runner.input_batch.sampling_metadata
    if not (sampling.all_greedy and sampling.max_num_logprobs is None
            and not sampling.logprob_token_ids and sampling.no_penalties
            and sampling.allowed_token_ids_mask is None and not sampling.bad_words_token_ids
            and not getattr(getattr(runner, "rejection_sampler", None), "synthetic_mode", True)):
        return False
    thinking_budget = getattr(sampling, "thinking_budget_state_holder", None)
    if thinking_budget is not None and thinking_budget.has_tracked_requests():
        return False
    if any(type(processor) not in (LogitBiasLogitsProcessor, MinTokensLogitsProcessor)
           for processor in sampling.logitsprocs.non_argmax_invariant):
        return False
    requests = runner.requests
    for req_id in runner.input_batch.req_ids[:len(metadata.num_draft_tokens)]:
        params = requests[req_id].sampling_params
        if params is None or params.min_tokens or params.logit_bias:
            return False
    return True


def greedy_verdicts(logits: Any, metadata: Any, tree_requests: list[int]) -> tuple[Any, Any]:
    """The rejection sampler's result where verdicts_are_row_argmaxes, from one argmax
    over every logits row (no row copied): chains keep their drafts up to the first
    that differs from its row's argmax, then that argmax or, all kept, the bonus
    row's (verify_greedy_chains); a tree request's row is its root row's argmax,
    which its tree verdict replaces. Returns the output and the rows' argmaxes, which
    tree verification reads too."""
    from vllm.v1.outputs import SamplerOutput

    argmaxes = row_argmax(logits)
    num_drafts = np.asarray(metadata.num_draft_tokens, dtype=np.int64)
    chain_drafts = num_drafts.copy()
    chain_drafts[tree_requests] = 0
    last_rows = metadata.bonus_logits_indices.cpu().numpy() - (num_drafts - chain_drafts)
    draft_ids = metadata.draft_token_ids.cpu().numpy()
    target_rows = metadata.target_logits_indices.cpu().numpy()
    if tree_requests:
        in_chain = np.repeat(chain_drafts > 0, num_drafts)
        draft_ids, target_rows = draft_ids[in_chain], target_rows[in_chain]
    rows = verify_greedy_chains(draft_ids, chain_drafts, argmaxes[target_rows],
                                argmaxes[last_rows], metadata.max_spec_len + 1)
    sampled = torch.from_numpy(rows).to(device=logits.device, dtype=torch.int32)
    return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None), argmaxes


def sample_bonus_rows(runner: Any, logits: Any, metadata: Any) -> Any:
    """A step without drafts (no_drafts_in_step): the rejection sampler's result is
    its sample of the bonus rows, taken by the same call minus the full-vocabulary
    logprobs it would compute and discard (rejection_sampler.py:141-160)."""
    rows = metadata.bonus_logits_indices
    if logits.shape[0] != rows.shape[0]:  # else no draft rows: every row is a bonus row
        logits = logits[rows]
    return runner.sampler(logits=logits, sampling_metadata=runner.input_batch.sampling_metadata,
                          predict_bonus_token=True)

def row_argmax(rows: torch.Tensor) -> np.ndarray:
    """Each logits row's argmax (the first one on ties), in fp32: on CPU an argmax over
    bf16 logits is several times slower, and vLLM's CPU greedy sampler op (the one it
    samples greedy requests with) several times faster than torch's."""
    rows = rows.float()
    greedy_argmax = _cpu_greedy_argmax() if rows.device.type == "cpu" else None
    if greedy_argmax is not None:
        return greedy_argmax(rows.contiguous()).numpy()
    return rows.argmax(dim=-1).cpu().numpy()


@functools.cache
def _cpu_greedy_argmax() -> Callable | None:
    try:
        return torch.ops._C.greedy_argmax
    except (AttributeError, RuntimeError):
        return None
