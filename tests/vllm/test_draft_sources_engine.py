# SPDX-License-Identifier: Apache-2.0
"""Other requests' outputs and recycled candidates inside vLLM: greedy text identical to
no speculation, the recycled table learning from the target's logits, and a request's
cache_salt reaching the worker (its outputs land in, and are drafted from, that salt's
pool only)."""

import numpy as np
import pytest
from engine_helpers import engine

from vllm_echo.algos.pools import UNSALTED_POOL, pool_id
from vllm_echo.plugin.proposers.logitspec import worker_stats
from vllm_echo.plugin.tenancy import CACHE_SALT_KEY

pytestmark = pytest.mark.engine

MAX_TOKENS = 64
SPEC = {"method": "echo", "shared_outputs": True, "recycled": True}


def _drafts_by_pool(worker, context, salts):
    """For collective_rpc: the shared store's chain after ``context`` in each salt's pool."""
    sources = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if sources is None:
        return None
    store = sources.sources.store
    ctx = np.asarray(context, np.int32)
    return {salt: store.draft(pool_id(salt), ctx, 8)[0].tolist() for salt in salts}


def _recycled_rows(worker):
    """For collective_rpc: how many tokens the unsalted pool's recycled table has learned
    a row for."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if drafter is None:
        return None
    table = drafter.sources.recycled.get(UNSALTED_POOL)
    return 0 if table is None else int((table.table[:, 0] >= 0).sum())


def test_sources_on_greedy_identical_and_salted(model_path, spec_bench_16, greedy_reference):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    with engine(model_path, SPEC) as llm:
        outs = llm.chat([p.as_chat() for p in spec_bench_16], params, use_tqdm=False)
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
        learned = [n for n in llm.collective_rpc(_recycled_rows) if n is not None][0]
        # A salted request: its output is drafted from its salt's pool, no other.
        salted = llm.generate({"prompt_token_ids": list(outs[0].prompt_token_ids),
                               "cache_salt": "tenant-1"}, params, use_tqdm=False)[0]
        tokens = list(salted.prompt_token_ids) + list(salted.outputs[0].token_ids)
        start = len(salted.prompt_token_ids) + 8
        found = [s for s in llm.collective_rpc(
            _drafts_by_pool, args=(tokens[:start], ["tenant-1", "tenant-2"])) if s][0]
        # An unsalted request naming a salt nobody has used in extra_args (what a
        # server client's vllm_xargs becomes): the plugin's mark wins, so its output
        # goes to the unsalted pool and that salt's pool stays empty.
        spoofed = llm.generate({"prompt_token_ids": list(outs[1].prompt_token_ids)},
                               SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                              extra_args={CACHE_SALT_KEY: "tenant-3"}),
                               use_tqdm=False)[0]
        spoof_tokens = list(spoofed.prompt_token_ids) + list(spoofed.outputs[0].token_ids)
        spoof_found = [s for s in llm.collective_rpc(
            _drafts_by_pool, args=(spoof_tokens[:len(spoofed.prompt_token_ids) + 8],
                                   ["tenant-3"])) if s][0]
    got = [list(o.outputs[0].token_ids) for o in outs]
    mismatched = [i for i, (a, b) in enumerate(zip(got, greedy_reference))
                  if a != b[:MAX_TOKENS]]
    assert not mismatched, f"outputs differ from no-spec for prompts {mismatched}"
    assert list(salted.outputs[0].token_ids) == greedy_reference[0][:MAX_TOKENS]
    # the table learned from the target's logits (whether its candidates pay is ECHO's
    # call, from the measured step cost)
    assert learned > 100, learned
    assert stats["shared_outputs_bytes"] > 0 and stats["recycled_bytes"] > 0, stats
    assert found["tenant-1"] == tokens[start:start + len(found["tenant-1"])]
    assert found["tenant-1"], found
    assert found["tenant-2"] == [], found
    assert list(spoofed.outputs[0].token_ids) == greedy_reference[1][:MAX_TOKENS]
    assert spoof_found["tenant-3"] == [], spoof_found
