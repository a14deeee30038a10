# SPDX-License-Identifier: Apache-2.0
"""Per-request retrieval state is freed: no growth across hundreds of requests."""

import numpy as np
import pytest
from engine_helpers import engine

from vllm_echo.plugin.proposers.logitspec import worker_stats

pytestmark = pytest.mark.engine


def test_state_is_freed_across_300_requests(model_path):
    from vllm import SamplingParams, TokensPrompt

    rng = np.random.default_rng(0)
    # Repetitive prompts so the index finds matches and drafts are made.
    prompts = [TokensPrompt(prompt_token_ids=(rng.integers(100, 120, 6).tolist() * 2))
               for _ in range(300)]
    max_num_seqs = 128
    with engine(model_path, {"method": "logitspec", "tree": True, "num_speculative_tokens": 3},
                max_num_seqs=max_num_seqs) as llm:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4,
                                                    ignore_eos=True), use_tqdm=False)
        assert all(len(o.outputs[0].token_ids) == 4 for o in outs)
        during = [s for s in llm.collective_rpc(worker_stats) if s][0]
        # One more request: its propose() call releases everything that finished before.
        llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
        after = [s for s in llm.collective_rpc(worker_stats) if s][0]
    assert during["drafts_tree"] > 0
    assert 0 < during["peak_tracked_requests"] <= max_num_seqs
    assert after["tracked_requests"] <= 1 and after["trees_held"] <= 1
