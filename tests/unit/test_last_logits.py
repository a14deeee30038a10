# SPDX-License-Identifier: Apache-2.0
"""The step's last-logits top-k: computed on first read, dropped after drafting."""

import numpy as np
import torch

from vllm_echo.plugin.runner.last_logits import LastLogitsTopK


def test_top_k_of_the_recorded_rows_on_first_read():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0],    # request 0, draft row
                           [5.0, 0.0, 4.0, 1.0],    # request 0, its last token's row
                           [1.0, 2.0, 3.0, 4.0]])   # request 1
    sink = LastLogitsTopK(k=2)
    sink.record(logits, torch.tensor([1, 2]), ["a", "b"])
    logits_seen = logits.clone()
    assert sink.rows_for(["a", "b", "c"]).tolist() == [[0, 2], [3, 2]]  # new request c
    want = (logits_seen[[1, 2]] - torch.logsumexp(logits_seen[[1, 2]], -1, keepdim=True))
    # CPU: the compiled log-sum-exp (vllm_echo/algos/top_logprobs.py), within 1e-5
    np.testing.assert_allclose(sink.logprobs, torch.topk(want, 2).values.numpy(), atol=1e-5)
    assert sink.rows_for(["b", "a"]) is None  # another batch order: nothing valid


def test_release_drops_the_logits():
    sink = LastLogitsTopK(k=1)
    sink.record(torch.zeros(1, 3), torch.tensor([0]), ["a"])
    sink.release()
    assert sink.rows_for(["a"]) is None and sink.logprobs is None


def test_bf16_and_strided_logits_give_the_float32_result():
    full = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    full[0, 30] = full[0, 5] = full[0].max() + 1  # a tie: the lower index ranks first
    # bf16 (widened in the kernel), a padded-vocabulary view and a strided bf16 view
    # (both copied to float32 first)
    for logits in (full.to(torch.bfloat16), full[:, :32], full.to(torch.bfloat16)[:, :32]):
        sink = LastLogitsTopK(k=3)
        sink.record(logits, torch.tensor([2, 0]), ["a", "b"])
        rows = logits[[2, 0]].float()
        # bf16 rounding makes more ties; torch.topk breaks them in no fixed order
        stable = torch.sort(rows, dim=-1, descending=True, stable=True).indices[:, :3]
        assert sink.rows_for(["a", "b"]).tolist() == stable.tolist()
        want = torch.topk(torch.log_softmax(rows.double(), -1), 3).values
        np.testing.assert_allclose(sink.logprobs, want.numpy(), atol=1e-5)
