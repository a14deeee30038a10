# SPDX-License-Identifier: Apache-2.0
"""The top-k of the logits row behind each request's last token (next-next candidates)."""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_echo.algos.top_logprobs import top_logprobs, top_logprobs_bfloat16


class LastLogitsTopK:
    """Top-k token ids of the logits row that produced each request's last token.

    The ``_sample`` wrapper records the step's logits and those rows every step;
    ``propose()`` reads them in the same step (the batch order does not change in
    between: the runner condenses its batch only at the start of the next step).
    The top-k and its log-probabilities are computed on first read, so a step
    whose proposer drafts nothing (ECHO when no draft can pay) does not pay for a
    top-k and a log-sum-exp over the vocabulary; on CPU both run as one compiled
    pass per row (vllm_echo/algos/top_logprobs.py). ``release()`` drops the logits.
    """

    def __init__(self, k: int):
        self.k = k
        self.req_ids: list[str] = []
        self._pending: tuple[Any, Any] | None = None  # (logits, rows) of this step
        self._token_ids: np.ndarray | None = None  # [num_reqs, k], best first
        self._logprobs: np.ndarray | None = None   # [num_reqs, k], log softmax of raw logits

    def record(self, logits: Any, rows: Any, req_ids: list[str]) -> None:
        self.req_ids = req_ids
        self._pending = (logits, rows)
        self._token_ids = self._logprobs = None

    def release(self) -> None:
        self._pending = None
        self._token_ids = self._logprobs = None

    def rows_for(self, req_ids: list[str]) -> np.ndarray | None:
        if self.req_ids != req_ids[: len(self.req_ids)]:
            return None
        self._compute()
        return self._token_ids

    @property
    def logprobs(self) -> np.ndarray | None:
        self._compute()
        return self._logprobs

    def _compute(self) -> None:
        if self._token_ids is not None or self._pending is None:
            return
        import torch

        logits, rows = self._pending
        self._pending = None
        if logits.device.type == "cpu":
            if logits.dtype == torch.bfloat16 and logits.is_contiguous():
                # Widened row by row inside the kernel, not copied to float32 here.
                self._token_ids, self._logprobs = top_logprobs_bfloat16(
                    logits.view(torch.uint16).numpy(), rows.numpy(), self.k)
                return
            if logits.dtype != torch.float32 or not logits.is_contiguous():
                logits, rows = logits[rows].float(), torch.arange(len(rows))
            self._token_ids, self._logprobs = top_logprobs(logits.numpy(), rows.numpy(),
                                                           self.k)
            return
        last = logits[rows].float()
        top = torch.topk(last, min(self.k, last.shape[-1]), dim=-1)
        self._logprobs = (top.values - torch.logsumexp(last, dim=-1, keepdim=True)).cpu().numpy()
        self._token_ids = top.indices.to(torch.int32).cpu().numpy()

