# SPDX-License-Identifier: Apache-2.0
"""The torch expansion that replaces vLLM's broken CPU expand kernel."""

import pytest
import torch

from vllm_echo.plugin.runner.sampler_fixes import expand_batch_to_tokens


def test_expansion_follows_vllms_documented_example():
    # vLLM's docstring: x = [a, b, c], cu_num_tokens = [2, 5, 6] -> [a, a, b, b, b, c]
    got = expand_batch_to_tokens(torch.tensor([0.7, 0.5, 1.3]),
                                 torch.tensor([2, 5, 6], dtype=torch.int32), 6)
    assert torch.equal(got, torch.tensor([0.7, 0.7, 0.5, 0.5, 0.5, 1.3]))


def test_replacement_dtype_and_requests_without_drafts():
    # greedy temperature (-1) becomes 1 as in apply_sampling_constraints; requests with
    # no draft tokens contribute nothing; dtype is kept (int32 top-k stays int32)
    temps = expand_batch_to_tokens(torch.tensor([-1.0, 0.7, -1.0]),
                                   torch.tensor([1, 1, 3]), 3, replace_from=-1, replace_to=1)
    assert torch.equal(temps, torch.tensor([1.0, 1.0, 1.0]))
    top_k = expand_batch_to_tokens(torch.tensor([20, 0, 5], dtype=torch.int32),
                                   torch.tensor([0, 2, 3]), 3)
    assert top_k.dtype == torch.int32 and top_k.tolist() == [0, 0, 5]


def test_top_k_on_a_step_without_draft_tokens():
    # A step where no request has drafts gives the rejection sampler zero target rows;
    # vLLM's CPU top-k path takes max() of the empty k and raises. Guarded: rows
    # come back unchanged, and non-empty rows are still filtered by vLLM's function.
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    from vllm_echo.plugin.runner.sampler_fixes import skipping_empty_rows

    empty, no_k = torch.empty(0, 8), torch.empty(0, dtype=torch.int32)
    with pytest.raises(RuntimeError):
        apply_top_k_top_p(empty.clone(), no_k, None)
    guarded = skipping_empty_rows(apply_top_k_top_p)
    assert guarded(empty, no_k, None).shape == (0, 8)
    row = torch.arange(8, dtype=torch.float32).unsqueeze(0)
    kept = guarded(row.clone(), torch.tensor([2], dtype=torch.int32), None)
    assert torch.isfinite(kept).sum() == 2 and torch.isfinite(kept[0, 6:]).all()
