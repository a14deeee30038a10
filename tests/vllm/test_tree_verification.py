# SPDX-License-Identifier: Apache-2.0
"""LogitSpec forests verified as token trees inside vLLM's CPU backend (fp32)."""

import pytest
from engine_helpers import REFERENCE_MAX_TOKENS, engine, spec_counters

from vllm_echo.plugin.proposers.logitspec import worker_stats

MAX_TOKENS = 32
TREE = {"method": "logitspec", "capacity": 8}


def _greedy(max_tokens=MAX_TOKENS, **kw):
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def _tokens(outs):
    return [list(o.outputs[0].token_ids) for o in outs]


def _assert_same(got, expected):
    bad = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
    assert len(got) == len(expected) and not bad, f"outputs differ from no-spec for {bad}"


@pytest.mark.parametrize("batch,enforce_eager", [(1, True), (16, False)],
                         ids=["batch1-eager", "batch16-compiled"])
def test_tree_greedy_identical_to_no_speculation(model_path, spec_bench_16, greedy_reference,
                                                 batch, enforce_eager):
    # chunked prefill and prefix caching stay at their defaults (on); one request at a
    # time runs 6 prompts only (CI time). The batch runs in vLLM's default compiled
    # mode, what LLM(model, speculative_config=...) gives a user: the tree positions
    # written after _prepare_inputs must reach the compiled graph, and the tree
    # attention runs at its custom-op boundary.
    n = 6 if batch == 1 else 16
    with engine(model_path, TREE, max_num_seqs=batch, enforce_eager=enforce_eager) as llm:
        got = _tokens(llm.chat([p.as_chat() for p in spec_bench_16[:n]], _greedy(),
                               use_tqdm=False))
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
        counters = spec_counters(llm)
    _assert_same(got, [r[:MAX_TOKENS] for r in greedy_reference[:n]])
    assert stats["drafts_tree"] > 0 and stats["accepted_tree"] > 0, stats
    # Paths off the first branch were accepted: depth positions, the tree mask and
    # KV compaction all had to be right for the text to stay identical.
    assert stats["tree_compactions"] > 0, stats
    if batch == 1:  # steps whose one request verified a tree skipped the rejection sampler
        assert stats["greedy_verified_steps"] > 0, stats
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0


def test_mixed_batch_trees_chains_and_no_drafts(model_path, spec_bench_16):
    """One engine step holds tree requests, chain requests (penalties need chain
    verification) and requests without drafts (still in prefill, or nothing found)."""
    chats = [p.as_chat() for p in spec_bench_16[:8]]
    params = [_greedy(repetition_penalty=1.2) if i % 3 == 0 else _greedy() for i in range(8)]
    with engine(model_path) as llm:
        expected = _tokens(llm.chat(chats, params, use_tqdm=False))
    with engine(model_path, TREE, max_num_batched_tokens=256) as llm:
        got = _tokens(llm.chat(chats, params, use_tqdm=False))
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
    _assert_same(got, expected)
    assert stats["drafts_tree"] > 0 and stats["drafts_retrieval"] + stats["drafts_logits"] > 0


def test_preemption_under_kv_pressure_keeps_outputs(model_path, spec_bench_16, greedy_reference):
    # 10 KV blocks of 128 tokens, which the first 9 prompts (53-210 tokens) fill; their
    # 96-token outputs then outgrow those blocks together, so requests get preempted
    # and resumed with trees in flight.
    n = 9
    chats = [p.as_chat() for p in spec_bench_16[:n]]
    with engine(model_path, TREE, kv_cache_memory_bytes=60 * 2**20, max_model_len=1024) as llm:
        got = _tokens(llm.chat(chats, _greedy(REFERENCE_MAX_TOKENS), use_tqdm=False))
        preemptions = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    _assert_same(got, greedy_reference[:n])
    assert preemptions > 0, preemptions


def _sampled_batch(spec_bench_16):
    from vllm import SamplingParams

    chats = [p.as_chat() for p in spec_bench_16[:9]]
    kinds = [dict(temperature=0), dict(temperature=0.8, top_k=1),
             dict(temperature=1.0, top_p=0.001),
             dict(temperature=0.7, top_p=0.95, top_k=20)]
    params = [SamplingParams(max_tokens=MAX_TOKENS, seed=i, ignore_eos=True, **kinds[i % 4])
              for i in range(9)]
    return chats, params


@pytest.fixture(scope="module")
def sampled_reference(model_path, spec_bench_16):
    chats, params = _sampled_batch(spec_bench_16)
    with engine(model_path) as llm:
        return _tokens(llm.chat(chats, params, use_tqdm=False))


@pytest.mark.parametrize("spec", [TREE, {"method": "echo"}])
def test_sampled_requests_in_a_mixed_batch(model_path, spec_bench_16, sampled_reference, spec):
    """Greedy, deterministic-sampled (top_k=1, or top_p so small only the top token
    survives) and random-sampled requests (temperature, top_p, top_k) in one batch.
    The deterministic ones must match no speculation exactly, which fails without
    the CPU sampler fix (sampler_fixes.py: vLLM expanded per-token temperature /
    top-k / top-p from uninitialised memory, giving garbage text and top_k crashes)."""
    chats, params = _sampled_batch(spec_bench_16)
    with engine(model_path, spec) as llm:
        got = _tokens(llm.chat(chats, params, use_tqdm=False))
        # Again in the same engine (prefix-cached, so scheduled differently): steps
        # in which no request has drafts but a top-k request runs used to kill the
        # engine (sampler_fixes.skipping_empty_rows).
        again = _tokens(llm.chat(chats, params, use_tqdm=False))
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
    deterministic = [i for i in range(9) if i % 4 != 3]
    for run in (got, again):
        _assert_same([run[i] for i in deterministic], [sampled_reference[i] for i in deterministic])
        assert all(len(t) == MAX_TOKENS for t in run)
    if spec is TREE:
        # LogitSpec drafts depend only on the request's own text, so a seeded request
        # draws the same random numbers and reproduces. ECHO's drafts depend on the
        # batch and on what the planner has learned, so its seeded samples are exact
        # in distribution but not reproducible across calls (docs/cpu.md, "Seeded sampling").
        assert again == got
    # ECHO picks trees or root-path chains per request and step; either one speculated.
    sources = ("tree",) if spec is TREE else ("tree", "chain")
    assert sum(stats[f"drafts_{s}"] for s in sources) > 0, stats
    assert sum(stats[f"accepted_{s}"] for s in sources) > 0, stats
    # A drafting step past its deadline (a busy machine) is the designed fallback.
    faults = {k: n for k, n in stats["failures"].items() if k != "propose:TimeoutError"}
    assert not faults, stats["failures"]
