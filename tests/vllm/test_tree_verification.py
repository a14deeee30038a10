# SPDX-License-Identifier: Apache-2.0
"""LogitSpec forests verified as token trees inside vLLM's CPU backend (fp32)."""

import pytest
from engine_helpers import REFERENCE_MAX_TOKENS, drafter_stats, engine, faults, since

from vllm_echo.engines import spec_decode_counters

pytestmark = pytest.mark.engine

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


@pytest.fixture(scope="module")
def tree_llm(model_path):
    """One engine for the greedy native-tree tests below that read only the drafter's
    counters (each as differences: engine_helpers.since); prefill chunks of at most
    256 tokens, so prefills share steps with decodes."""
    with engine(model_path, TREE, max_num_batched_tokens=256) as llm:
        yield llm


def _check_trees_verified(stats):
    assert stats["drafts_tree"] > 0 and stats["accepted_tree"] > 0, stats
    # Paths off the first branch were accepted: depth positions, the tree mask and
    # KV compaction all had to be right for the text to stay identical.
    assert stats["tree_compactions"] > 0, stats


def test_tree_one_request_at_a_time_identical_to_no_speculation(tree_llm, spec_bench_16,
                                                                greedy_reference):
    # chunked prefill and prefix caching stay on (vLLM's defaults); 6 prompts
    before = drafter_stats(tree_llm)
    got = [_tokens(tree_llm.chat([p.as_chat()], _greedy(), use_tqdm=False))[0]
           for p in spec_bench_16[:6]]
    stats = since(before, drafter_stats(tree_llm))
    _assert_same(got, [r[:MAX_TOKENS] for r in greedy_reference[:6]])
    _check_trees_verified(stats)
    # steps whose one request verified a tree skipped the rejection sampler
    assert stats["greedy_verified_steps"] > 0, stats


def test_tree_batch_compiled_identical_to_no_speculation(model_path, spec_bench_16,
                                                         greedy_reference):
    # vLLM's default compiled mode, what LLM(model, speculative_config=...) gives a
    # user: the tree positions written after _prepare_inputs must reach the compiled
    # graph, and the tree attention runs at its custom-op boundary.
    with engine(model_path, TREE, max_num_seqs=16, enforce_eager=False) as llm:
        got = _tokens(llm.chat([p.as_chat() for p in spec_bench_16], _greedy(),
                               use_tqdm=False))
        stats, counters = drafter_stats(llm), spec_decode_counters(llm)
    _assert_same(got, [r[:MAX_TOKENS] for r in greedy_reference])
    _check_trees_verified(stats)
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0


def test_mixed_batch_trees_chains_and_no_drafts(tree_llm, spec_bench_16, no_spec_llm):
    """One engine step holds tree requests, chain requests (penalties need chain
    verification) and requests without drafts (still in prefill, or nothing found)."""
    chats = [p.as_chat() for p in spec_bench_16[:8]]
    params = [_greedy(repetition_penalty=1.2) if i % 3 == 0 else _greedy() for i in range(8)]
    expected = _tokens(no_spec_llm.chat(chats, params, use_tqdm=False))
    before = drafter_stats(tree_llm)
    got = _tokens(tree_llm.chat(chats, params, use_tqdm=False))
    stats = since(before, drafter_stats(tree_llm))
    _assert_same(got, expected)
    assert stats["drafts_tree"] > 0 and stats["drafts_retrieval"] + stats["drafts_logits"] > 0


def test_preemption_under_kv_pressure_keeps_outputs(model_path, spec_bench_16, greedy_reference):
    # 10 KV blocks of 128 tokens, which the first 9 prompts (53-210 tokens) fill; their
    # 96-token outputs then outgrow those blocks together, so requests get preempted
    # and resumed with trees in flight. (An engine of its own: vLLM's preemption
    # counter is read from the process's metrics, which the newest engine owns.)
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
def sampled_reference(no_spec_llm, spec_bench_16):
    chats, params = _sampled_batch(spec_bench_16)
    return _tokens(no_spec_llm.chat(chats, params, use_tqdm=False))


@pytest.fixture(scope="module")
def sampled_tree_llm(model_path):
    """Trees for sampled requests, prefill unchunked: vLLM 0.32 on CPU fails a step
    whose batch holds a seeded request with a partial prefill (it rewinds the request's
    generator with set_offset, which CPU generators refuse), with or without drafts."""
    with engine(model_path, TREE) as llm:
        yield llm


@pytest.mark.parametrize("method", ["logitspec-tree", "echo"])
def test_sampled_requests_in_a_mixed_batch(request, shared_engine, spec_bench_16,
                                           sampled_reference, method):
    """Greedy, deterministic-sampled (top_k=1, or top_p so small only the top token
    survives) and random-sampled requests (temperature, top_p, top_k) in one batch.
    The deterministic ones must match no speculation exactly, which fails without
    the CPU sampler fix (sampler_fixes.py: vLLM expanded per-token temperature /
    top-k / top-p from uninitialised memory, giving garbage text and top_k crashes)."""
    llm = (request.getfixturevalue("sampled_tree_llm") if method == "logitspec-tree"
           else shared_engine("echo"))
    chats, params = _sampled_batch(spec_bench_16)
    before = drafter_stats(llm)
    got = _tokens(llm.chat(chats, params, use_tqdm=False))
    # Again in the same engine (prefix-cached, so scheduled differently): steps
    # in which no request has drafts but a top-k request runs used to kill the
    # engine (sampler_fixes.skipping_empty_rows).
    again = _tokens(llm.chat(chats, params, use_tqdm=False))
    stats = since(before, drafter_stats(llm))
    deterministic = [i for i in range(9) if i % 4 != 3]
    for run in (got, again):
        _assert_same([run[i] for i in deterministic], [sampled_reference[i] for i in deterministic])
        assert all(len(t) == MAX_TOKENS for t in run)
    if method == "logitspec-tree":
        # LogitSpec drafts depend only on the request's own text, so a seeded request
        # draws the same random numbers and reproduces. ECHO's drafts depend on the
        # batch and on what the planner has learned, so its seeded samples are exact
        # in distribution but not reproducible across calls (docs/cpu.md, "Seeded sampling").
        assert again == got
    # ECHO picks trees or root-path chains per request and step; either one speculated.
    sources = ("tree",) if method == "logitspec-tree" else ("tree", "chain")
    assert sum(stats[f"drafts_{s}"] for s in sources) > 0, stats
    assert sum(stats[f"accepted_{s}"] for s in sources) > 0, stats
    assert not faults(stats), stats["failures"]
