# SPDX-License-Identifier: Apache-2.0
"""Verdicts on the step's drafts: the greedy shortcut past vLLM's rejection sampler,
and tree verification with KV compaction.

Inside ``_sample``, after vLLM's own sampling, each tree request's row is replaced
with its tree verdict ``[path tokens..., bonus]`` and the accepted path's K/V are
moved to the consecutive slots vLLM assumes, before the next schedule() can hash
the block for prefix caching.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from vllm_echo.algos.verify import verify_greedy, verify_greedy_chains, verify_sampling
from vllm_echo.plugin.runner.tree_state import StepTrees, TreeContext, TreeRows


def tree_unsafe_reason(params: Any) -> str | None:
    """Why a request must not be verified as a tree (None: trees are fine).

    These features read the draft list as a chain (penalties, bad words, min
    tokens and allowed-token masks use it as history; grammars advance through it;
    draft logprobs come from chain rows), or need the stochastic verifier.
    """
    if params is None:
        return "no sampling params"
    if params.temperature > 0 and params.min_p:
        return "min_p sampling"
    if params.logprobs is not None:
        return "logprobs requested"
    if (params.presence_penalty or params.frequency_penalty
            or params.repetition_penalty != 1.0):
        return "penalties"
    if params.bad_words or params.min_tokens or params.logit_bias or params.allowed_token_ids:
        return "bad_words/min_tokens/logit_bias/allowed_token_ids"
    if params.structured_outputs is not None:
        return "structured output"
    return None
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
    return runner.sampler(logits=logits[metadata.bonus_logits_indices],
                          sampling_metadata=runner.input_batch.sampling_metadata,
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


def target_probs(rows: torch.Tensor, sampling: Any, req_idx: int) -> np.ndarray:
    """The distribution vLLM samples request ``req_idx`` from, for each logits row:
    temperature, then top-k / top-p (penalties and min_p keep a request off trees)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    x = rows.float() / float(sampling.temperature[req_idx])
    n = x.shape[0]
    k = None if sampling.top_k is None else sampling.top_k[req_idx].expand(n)
    p = None if sampling.top_p is None else sampling.top_p[req_idx].expand(n)
    if k is not None or p is not None:
        x = apply_top_k_top_p_pytorch(x, k, p)
    return torch.softmax(x, dim=-1).double().cpu().numpy()


def request_rng(sampling: Any, req_idx: int) -> np.random.Generator:
    """Seeded requests stay reproducible: draw from the request's own generator."""
    generator = sampling.generators.get(req_idx)
    seed = torch.randint(0, 2**62, (1,), generator=generator).item()
    return np.random.default_rng(seed)


def accept_no_tree_drafts(tree_context: TreeContext, output: Any,
                          on_error: Callable[[str, BaseException], None]) -> None:
    """End the step's trees with no draft accepted: each tree request's row becomes
    vLLM's own sample of its root row, which tree attention and positions computed
    exactly as a chain's (the root sees the context and itself, at the base position)."""
    step = tree_context.take_step()
    if step is None:
        return
    try:
        sampled = output.sampled_token_ids
        for tree in step.trees:
            _set_row(sampled, tree.req_idx, [int(sampled[tree.req_idx, 0])])
    except Exception as exc:  # the output is not vLLM's as we know it: nothing safe is left
        raise RuntimeError("vllm-echo: cannot undo a prepared tree step") from exc


def _set_row(sampled: torch.Tensor, req_idx: int, row: list[int]) -> None:
    sampled[req_idx].fill_(-1)
    sampled[req_idx, :len(row)] = torch.tensor(row, dtype=sampled.dtype)


def verify_step_trees(tree_context: TreeContext, logits: torch.Tensor, metadata: Any,
                      sampled: torch.Tensor, compact: Callable,
                      on_error: Callable[[str, BaseException], None],
                      sampling: Any, row_argmaxes: np.ndarray | None = None) -> dict[int, int]:
    """Apply tree verification to the step's tree requests (in place); ``row_argmaxes``,
    every logits row's argmax when the sampling hook took them already.

    Greedy requests accept the longest path matching the target's argmax; sampled
    requests use recursive rejection over siblings against the processed target
    distribution (drafts are point masses), which keeps that distribution exact.

    Returns, per tree request's batch row, the logits row that produced its last
    token (the bonus), for the next-next capture. Never leaves a wrong row: if
    verification fails (or the step was marked failed) a request accepts no draft
    (vLLM's sample of the root row is right whatever the tree), and if compaction
    fails it keeps only the accepted nodes that were already in place.
    """
    step = tree_context.take_step()
    last_rows: dict[int, int] = {}
    if step is None:
        return last_rows
    if tree_context.compacts_by_slot and step.mask_tables is None:
        step.failed = True  # no attention metadata of the step got the tree mask
    offset = 0
    for tree in step.trees:
        try:
            last_rows[tree.req_idx] = _verify_tree(tree_context, tree, offset, step, logits,
                                                   metadata, sampled, compact, on_error, sampling,
                                                   row_argmaxes)
        except Exception as exc:
            on_error("tree verification", exc)
            _set_row(sampled, tree.req_idx, [int(sampled[tree.req_idx, 0])])
            if tree_context.record_paths:
                tree_context.last_paths[tree.req_id] = []
        offset += tree.num_rows
    return last_rows


def _verify_tree(tree_context: TreeContext, tree: TreeRows, offset: int, step: StepTrees,
                 logits: torch.Tensor, metadata: Any, sampled: torch.Tensor, compact: Callable,
                 on_error: Callable[[str, BaseException], None], sampling: Any,
                 row_argmaxes: np.ndarray | None) -> int:
    """Verify one tree request, compact its KV and write its row; returns the logits
    row of its last token. Raises only before its row is written."""
    if step.failed:
        raise RuntimeError("the step's tree preparation or attention failed")
    n = len(tree.token_ids)
    if metadata.num_draft_tokens[tree.req_idx] != n:
        raise RuntimeError(f"{n} tree nodes prepared but "
                           f"{metadata.num_draft_tokens[tree.req_idx]} drafts sampled")
    start = int(metadata.bonus_logits_indices[tree.req_idx]) - n
    argmax = (row_argmax(logits[start:start + n + 1]) if row_argmaxes is None
              else row_argmaxes[start:start + n + 1])
    # vLLM marks greedy requests with temperature <= 0
    greedy = sampling.all_greedy or float(sampling.temperature[tree.req_idx]) <= 0
    if greedy:
        path, next_token = verify_greedy(tree.token_ids, tree.parents, argmax)
    else:
        probs = target_probs(logits[start:start + n + 1], sampling, tree.req_idx)
        path, next_token = verify_sampling(tree.token_ids, tree.parents, probs,
                                           request_rng(sampling, tree.req_idx))
    try:
        compact(tree, offset, path, step)
    except Exception as exc:
        on_error("KV compaction", exc)
        in_place = next((k for k, j in enumerate(path) if j != k), len(path))
        if in_place < len(path):
            path = path[:in_place]
            # the verdict's next token belonged to the cut path: resample safely
            next_token = int(argmax[path[-1] + 1 if path else 0]) if greedy else None
            if next_token is None:
                path, next_token = [], int(sampled[tree.req_idx, 0])
    tree_context.counters["tree_verifications"] += 1
    tree_context.counters["tree_compactions"] += any(j != k for k, j in enumerate(path))
    last = path[-1] + 1 if path else 0
    if next_token is None:
        next_token = int(argmax[last])
    _set_row(sampled, tree.req_idx, [int(tree.token_ids[j]) for j in path] + [next_token])
    if tree_context.record_paths:
        tree_context.last_paths[tree.req_id] = path
    return start + last
