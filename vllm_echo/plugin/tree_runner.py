# SPDX-License-Identifier: Apache-2.0
"""Model-runner side of tree verification: positions, acceptance, KV compaction.

Installed on the runner instance that owns our proposer (see patches.py):
- after ``_prepare_inputs``: find this step's tree requests, give their nodes
  RoPE positions base + depth (slots stay linear, so vLLM's KV allocation is
  untouched), and publish the step to the attention layers;
- inside ``_sample``: after vLLM's own sampling, replace each tree request's
  row with the greedy tree verdict ``[path tokens..., bonus]`` and move the
  accepted path's K/V to the consecutive slots vLLM assumes. This happens before
  the next schedule() can hash the block for prefix caching.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from vllm_echo.algos.verify import verify_greedy, verify_sampling
from vllm_echo.plugin import tree_state, tree_support


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


def install_prepare_hook(runner: Any, on_error: Callable[[str, BaseException], None],
                         timer: Any = None) -> None:
    """``timer`` (runner_hooks.StepTimer) starts timing decode steps here."""
    if getattr(runner, "_vllm_echo_prepare_wrapped", False):
        return
    original = runner._prepare_inputs

    def _prepare_inputs(scheduler_output, num_scheduled_tokens):
        result = original(scheduler_output, num_scheduled_tokens)
        tree_state.STEP = None
        if tree_state.TREES and scheduler_output.scheduled_spec_decode_tokens:
            try:
                tree_state.STEP = _collect_step(runner, scheduler_output)
            except Exception as exc:  # degrade to vLLM's chain semantics
                tree_state.STEP = None
                _restore_positions(runner, num_scheduled_tokens)
                on_error("tree step preparation", exc)
        if timer is not None:
            num_drafts = sum(map(len, scheduler_output.scheduled_spec_decode_tokens.values()))
            total = scheduler_output.total_num_scheduled_tokens
            # Only decode steps (each request runs its last token and its drafts) are
            # timed: the model's N is what drafting adds to. Prefill steps (hundreds of
            # tokens) would decide the fit and price a draft token by the prompt's: at
            # batch 1 in fp32 a line through them priced one at ~3.8% of a step, while
            # 4 drafts cost 1.07x a plain step (../shared/docs/baselines.md).
            if total == len(scheduler_output.num_scheduled_tokens) + num_drafts:
                step = tree_state.STEP
                timer.started(int(total), len(step.trees) if step is not None else 0,
                              num_drafts > 0)
            else:
                timer.skip()
        return result

    runner._prepare_inputs = _prepare_inputs
    runner._vllm_echo_prepare_wrapped = True


def _collect_step(runner: Any, scheduler_output: Any) -> tree_state.StepTrees | None:
    batch = runner.input_batch
    query_start = runner.query_start_loc.np
    trees, all_rows = [], []
    for req_id, scheduled in scheduler_output.scheduled_spec_decode_tokens.items():
        draft = tree_state.TREES.get(req_id)
        if draft is None:
            continue
        i = batch.req_id_to_index[req_id]
        rows = tree_state.tree_rows(req_id, i, int(query_start[i]),
                                    int(batch.num_computed_tokens_cpu[i]), draft, scheduled)
        if rows is None:
            continue
        positions = torch.from_numpy(tree_state.positions_of(rows))
        qs = rows.query_start
        runner.positions[qs:qs + rows.num_rows] = positions.to(runner.positions.device)
        trees.append(rows)
        all_rows.append(np.arange(qs, qs + rows.num_rows))
    if not trees:
        return None
    rows = torch.from_numpy(np.concatenate(all_rows)).to(runner.positions.device)
    step = tree_state.StepTrees(trees, rows)
    if tree_support.compacts_by_slot():  # slot mapping is computed in the original
        step.slots = batch.block_table[0].slot_mapping.gpu[rows]
        step.kv_caches = tree_support.kv_caches()
    return step


def _restore_positions(runner: Any, num_scheduled_tokens: np.ndarray) -> None:
    """Undo partial position overrides: plain num_computed + query position."""
    batch = runner.input_batch
    n = len(num_scheduled_tokens)
    starts = np.repeat(batch.num_computed_tokens_cpu[:n], num_scheduled_tokens)
    offsets = np.concatenate([np.arange(k) for k in num_scheduled_tokens])
    runner.positions[:len(starts)] = torch.from_numpy(starts + offsets).to(runner.positions.device)


def _target_probs(rows: torch.Tensor, sampling: Any, req_idx: int) -> np.ndarray:
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


def _request_rng(sampling: Any, req_idx: int) -> np.random.Generator:
    """Seeded requests stay reproducible: draw from the request's own generator."""
    generator = sampling.generators.get(req_idx)
    seed = torch.randint(0, 2**62, (1,), generator=generator).item()
    return np.random.default_rng(seed)


def verify_step_trees(logits: torch.Tensor, metadata: Any, sampled: torch.Tensor,
                      compact: Callable, on_error: Callable[[str, BaseException], None],
                      sampling: Any = None) -> dict[int, int]:
    """Apply tree verification to the step's tree requests (in place).

    Greedy requests accept the longest path matching the target's argmax; sampled
    requests use recursive rejection over siblings against the processed target
    distribution (drafts are point masses), which keeps that distribution exact.

    Returns, per tree request's batch row, the logits row that produced its last
    token (the bonus), for the next-next capture. Never leaves a wrong row: if
    verification fails a request accepts no draft (the root row's argmax is the
    right next token whatever the tree), and if compaction fails it keeps only the
    accepted nodes that were already in place.
    """
    step = tree_state.STEP
    tree_state.STEP = None
    last_rows: dict[int, int] = {}
    if step is None:
        return last_rows
    offset = 0
    for tree in step.trees:
        n = len(tree.token_ids)
        start = int(metadata.bonus_logits_indices[tree.req_idx]) - n
        argmax = logits[start:start + n + 1].argmax(dim=-1).cpu().numpy()
        # vLLM marks greedy requests with temperature <= 0 (None when all are greedy)
        greedy = (sampling is None or sampling.all_greedy
                  or float(sampling.temperature[tree.req_idx]) <= 0)
        try:
            if metadata.num_draft_tokens[tree.req_idx] != n:
                raise RuntimeError(f"{n} tree nodes prepared but "
                                   f"{metadata.num_draft_tokens[tree.req_idx]} drafts sampled")
            if greedy:
                path, next_token = verify_greedy(tree.token_ids, tree.parents, argmax)
            else:
                probs = _target_probs(logits[start:start + n + 1], sampling, tree.req_idx)
                path, next_token = verify_sampling(tree.token_ids, tree.parents, probs,
                                                   _request_rng(sampling, tree.req_idx))
        except Exception as exc:
            on_error("tree verification", exc)
            path, next_token = [], None
            if not greedy:  # no tree verdict: keep vLLM's own sample of the root row
                next_token = int(sampled[tree.req_idx, 0])
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
        tree_state.COUNTERS["tree_verifications"] += 1
        tree_state.COUNTERS["tree_compactions"] += any(j != k for k, j in enumerate(path))
        last = path[-1] + 1 if path else 0
        if next_token is None:
            next_token = int(argmax[last])
        row = [int(tree.token_ids[j]) for j in path] + [next_token]
        sampled[tree.req_idx].fill_(-1)
        sampled[tree.req_idx, :len(row)] = torch.tensor(row, dtype=sampled.dtype)
        last_rows[tree.req_idx] = start + last
        if tree_state.RECORD_PATHS:
            tree_state.LAST_PATHS[tree.req_id] = path
        offset += tree.num_rows
    return last_rows
