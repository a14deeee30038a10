# SPDX-License-Identifier: Apache-2.0
"""The tree stage of ``_sample``: verdicts, KV compaction and the rows vLLM reads.

After vLLM's own sampling (its verdict on each tree's nodes read as a chain), every
tree request of the step gets, in order:

1. its verdict: the longest path matching the target's argmax (greedy), or recursive
   rejection over siblings (sampled), which keeps the target distribution exact, with
   random numbers that no torch generator gives (``request_rng``);
2. KV compaction: the accepted path's K/V moved to the consecutive slots vLLM
   assumes, before the next schedule() can hash the block for prefix caching;
3. one agreement among tensor-parallel ranks (``TreeContext.agree``): each rank's
   outcome per request (failed, cut, whole) becomes the worst of all ranks', so a
   failure on one rank is everyone's fallback and the ranks' KV and tokens stay one;
4. its row: ``[path tokens..., next token]``.

Nothing is lost to a failure: a request whose step failed accepts no draft (vLLM's
sample of its root row, which tree attention computed exactly as a chain's), and a
failed compaction keeps the accepted nodes that were already in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import xxhash

from vllm_echo.algos.tree import in_place_prefix
from vllm_echo.algos.verify import verify_greedy, verify_sampling
from vllm_echo.plugin.runner.greedy_shortcut import row_argmax
from vllm_echo.plugin.runner.nucleus import top_p_from_candidates
from vllm_echo.plugin.runner.tree_state import StepTrees, TreeContext, TreeRows

# A request's outcome, ordered so that the minimum over ranks is the safe choice.
FAILED, CUT, WHOLE = 0, 1, 2


@dataclass
class _Verdict:
    tree: TreeRows
    start: int            # logits row of the tree's root
    path: list[int]       # accepted node indices, root first
    next_token: int | None
    argmax: np.ndarray    # argmax of the root row and every node's row
    greedy: bool


def finish_tree_step(tree_context: TreeContext, logits: torch.Tensor, metadata: Any,
                     sampled: torch.Tensor, req_ids: list[str], compact: Callable,
                     on_error: Callable[[str, BaseException], None], sampling: Any,
                     row_argmaxes: np.ndarray | None = None) -> dict[int, int]:
    """Verify, compact, agree and write the rows of the step's tree requests (in
    place in ``sampled``); ``sampling`` None means it could not be read (the step
    fails); ``row_argmaxes``, every logits row's argmax when the sampling hook took
    them already.

    Returns, per tree request's batch row, the logits row that produced its last
    token (the bonus), for the next-next capture.
    """
    step = tree_context.take_step()
    if step is not None and tree_context.attention.compacts_by_slot and (
            step.flex is None or step.flex.mask_tables is None):
        step.failed = True  # no attention metadata of the step got the tree mask
    if sampling is None and step is not None:
        step.failed = True
    if step is not None and step.failed:
        on_error("tree step", RuntimeError(
            "the step's tree positions, mask or attention failed; its trees accept no draft"))
    verdicts: dict[int, _Verdict] = {}
    outcome: dict[int, int] = {}
    if step is not None:
        offset = 0
        for tree in step.trees:
            outcome[tree.req_idx] = FAILED
            if not step.failed:
                try:
                    verdict = _verdict(tree, logits, metadata, sampling, row_argmaxes,
                                       tree_context.engine_seed)
                    outcome[tree.req_idx] = _compact(verdict, offset, step, compact, on_error)
                    verdicts[tree.req_idx] = verdict
                except Exception as exc:
                    on_error("tree verification", exc)
            offset += tree.num_rows
    if tree_context.agree is not None:
        outcome = _agree(tree_context, step, outcome, req_ids, metadata)
    return _write_rows(tree_context, step, outcome, verdicts, sampled)


def _verdict(tree: TreeRows, logits: torch.Tensor, metadata: Any, sampling: Any,
             row_argmaxes: np.ndarray | None, engine_seed: int) -> _Verdict:
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
                                           request_rng(sampling, tree, engine_seed))
    return _Verdict(tree, start, list(path), next_token, argmax, greedy)


def _compact(verdict: _Verdict, offset: int, step: StepTrees, compact: Callable,
             on_error: Callable[[str, BaseException], None]) -> int:
    """Move the accepted path's K/V into place: WHOLE, or CUT when it failed."""
    try:
        compact(verdict.tree, offset, verdict.path, step)
        return WHOLE
    except Exception as exc:
        on_error("KV compaction", exc)
        return CUT


def _agree(tree_context: TreeContext, step: StepTrees | None, outcome: dict[int, int],
           req_ids: list[str], metadata: Any) -> dict[int, int]:
    """Tensor parallel: every rank takes, per request, the worst outcome of all ranks.

    The requests that take part are those with a tree draft scheduled, which every
    rank knows alike (rank 0's trees, the same schedule), whatever failed on it; a
    rank whose step failed (or failed to be prepared) counts all of them FAILED. One collective
    per step with tree drafts, on every rank."""
    num_drafts = metadata.num_draft_tokens
    candidates = [i for i, req_id in enumerate(req_ids[:len(num_drafts)])
                  if num_drafts[i] and req_id in tree_context.trees]
    if not candidates:
        return outcome
    failed = step is not None and step.failed
    mine = np.full(len(candidates), FAILED if failed else WHOLE, dtype=np.int32)
    for k, i in enumerate(candidates):
        mine[k] = outcome.get(i, mine[k])
    agreed = np.asarray(tree_context.agree(mine.copy()))  # agree may reduce in place
    if not np.array_equal(agreed, mine):
        tree_context.counters["tree_outcomes_from_other_ranks"] += 1
    return dict(zip(candidates, agreed.tolist()))


def _write_rows(tree_context: TreeContext, step: StepTrees | None, outcome: dict[int, int],
                verdicts: dict[int, _Verdict], sampled: torch.Tensor) -> dict[int, int]:
    counters = tree_context.counters
    last_rows: dict[int, int] = {}
    trees = {tree.req_idx: tree for tree in step.trees} if step is not None else {}
    if any(code == FAILED for code in outcome.values()):
        counters["tree_steps_failed"] += 1
    for req_idx, code in outcome.items():
        verdict = verdicts.get(req_idx)
        if verdict is None and code != FAILED:
            continue  # verified by vLLM as a chain on every rank: its row stands
        if code == FAILED or verdict is None:
            # vLLM's own sample of the root row; for a request verified as a chain here
            # but a failed tree elsewhere, the same token every rank has
            _set_row(sampled, req_idx, [int(sampled[req_idx, 0])])
            if req_idx in trees and tree_context.accepted_paths.record:
                tree_context.accepted_paths.by_request[trees[req_idx].req_id] = []
            continue
        path, next_token = verdict.path, verdict.next_token
        if code == CUT:
            counters["tree_paths_cut"] += 1
            in_place = in_place_prefix(path)
            if in_place < len(path):
                path = path[:in_place]
                # the verdict's next token belonged to the cut path: resample safely
                next_token = int(verdict.argmax[path[-1] + 1 if path else 0]) \
                    if verdict.greedy else None
                if next_token is None:
                    path, next_token = [], int(sampled[req_idx, 0])
        counters["tree_verifications"] += 1
        counters["tree_compactions"] += in_place_prefix(path) < len(path)
        last = path[-1] + 1 if path else 0
        if next_token is None:
            next_token = int(verdict.argmax[last])
        tree = verdict.tree
        _set_row(sampled, req_idx, [int(tree.token_ids[j]) for j in path] + [next_token])
        if tree_context.accepted_paths.record:
            tree_context.accepted_paths.by_request[tree.req_id] = path
        last_rows[req_idx] = verdict.start + last
    return last_rows


def target_probs(rows: torch.Tensor, sampling: Any, req_idx: int) -> np.ndarray:
    """The distribution vLLM samples request ``req_idx`` from, for each logits row:
    temperature, then top-k / top-p (penalties and min_p keep a request off trees)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    x = rows.float() / float(sampling.temperature[req_idx])
    n = x.shape[0]
    k = None if sampling.top_k is None else sampling.top_k[req_idx].expand(n)
    p = None if sampling.top_p is None else sampling.top_p[req_idx].expand(n)
    if k is not None or p is not None:  # top-p without a sort where it can (nucleus.py)
        x = top_p_from_candidates(apply_top_k_top_p_pytorch)(x, k, p)
    return torch.softmax(x, dim=-1).double().cpu().numpy()


def request_rng(sampling: Any, tree: TreeRows, engine_seed: int) -> np.random.Generator:
    """The random numbers of one request's sampled tree verdict in this step, derived
    without state: from the request's seed (its generator's ``initial_seed()``, which
    works on any device and draws nothing) or, unseeded, from the engine's seed and the
    request id; and the step's ``context_len``.

    Nothing is drawn from a torch generator, so vLLM's sampler streams are what they
    would be without trees, every tensor-parallel rank gets the same numbers whichever
    steps failed where, and a seeded request reproduces."""
    generator = sampling.generators.get(tree.req_idx)
    if generator is not None:
        return np.random.default_rng([generator.initial_seed(), tree.context_len])
    request = xxhash.xxh64_intdigest(tree.req_id.encode("utf-8"))
    return np.random.default_rng([engine_seed, request, tree.context_len])


def accept_no_tree_drafts(tree_context: TreeContext, output: Any) -> None:
    """End the step's trees with no draft accepted (a ``_sample`` call the hook does
    not understand: the same on every rank): each tree request's row becomes vLLM's
    own sample of its root row."""
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
