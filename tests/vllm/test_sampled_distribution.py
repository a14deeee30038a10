# SPDX-License-Identifier: Apache-2.0
"""Sampled requests keep the target's distribution when drafts are verified (fp32).

A thousand seeded requests per case on one prompt whose continuations are uncertain:
colours in random order, so each next colour has high entropy and a LogitSpec tree
holds several likely colours as siblings. A request's first token comes from
prefill, the next ones through verified drafts: recursive rejection over tree
siblings against the processed target distribution (verdicts.target_probs, the
per-request RNG), or vLLM's rejection sampler for ECHO's chains. The cases:
temperature 1.0, temperature with top-k and top-p, and with top-p alone. Every other
request carries a predicted output (Predicted Outputs), another random order of the
colours.

The reference is what vLLM samples from without speculation: the processed logprobs
(temperature, top-k, top-p applied) of a no-spec engine at every prefix that enough
requests reach. Each next token is counted per prefix and the counts are tested
against that exact distribution (Pearson's chi-square, summed over prefixes): no
second sample is needed, so the test is as strong as a two-sample test twice its
size. A verifier that forgets to remove a rejected sibling from the residual fails
it by a wide margin.
"""

from __future__ import annotations

import collections
import math
import random

import numpy as np
import pytest
import torch
from engine_helpers import engine
from flat_cost_echo import speculative_config as flat_cost_echo

from vllm_echo.plugin.predicted_outputs import PREDICTION_KEY
from vllm_echo.plugin.proposers.logitspec import worker_stats

pytestmark = pytest.mark.engine

NUM_PER_KIND = 1000
MAX_TOKENS = 3
KINDS = {"temperature": dict(temperature=1.0),
         "top_k_top_p": dict(temperature=0.9, top_k=10, top_p=0.95),
         # top-p alone: the CPU nucleus from the largest logits (runner/nucleus.py) in
         # vLLM's rejection sampler (ECHO's chains) and in the tree verdicts
         "top_p": dict(temperature=0.9, top_p=0.8)}
MIN_GROUP = 50     # prefixes reached by fewer requests are not tested
MIN_EXPECTED = 5   # Pearson's rule: every bin expects at least this many
ALPHA = 1e-3
COLOURS = ("red", "blue", "green", "yellow")
SPECS = {  # name: speculative config, engine arguments, sampling kinds
    # span 1: the retrieved chain is one colour, and the next-next heads (the other
    # colours, from the top-k of the logits that produced the last one) hang beside
    # it, so a tree of capacity 4 is three likely siblings at the root
    "logitspec": ({"method": "logitspec", "capacity": 4, "span": 1}, {}, tuple(KINDS)),
    # the same trees under FLEX_ATTENTION's tree mask and slot compaction (CI time: one kind)
    "logitspec-flex": ({"method": "logitspec", "capacity": 4, "span": 1, "tree_attention": "flex"},
                       {}, ("temperature",)),
    # ECHO under a flat step-cost curve up to a knee (tests/vllm/flat_cost_echo.py), so
    # that it drafts whatever this machine's step costs: batches of 16 leave it room
    # below the knee; its chains (the CPU default) go to vLLM's rejection sampler, with
    # and without top-p (the nucleus from candidates)
    "echo": ({"method": "echo", "span": 1}, {"max_num_seqs": 16}, ("temperature", "top_p")),
}


def colour_prediction(tokenizer) -> list[int]:
    """Another random order of the colours: a predicted output (Predicted Outputs) that
    every context's last two colours anchor in, and whose next colour is sometimes
    the one sampled."""
    rng = random.Random(1)
    return tokenizer(" " + " ".join(rng.choice(COLOURS) for _ in range(60)),
                     add_special_tokens=False)["input_ids"]


def colour_prompt(tokenizer) -> list[int]:
    """Colours in random order, one token each, cut one token past the first
    128-token KV block: every request after the first hits the prefix cache and
    prefills one token."""
    rng = random.Random(0)
    text = "Colors: " + " ".join(rng.choice(COLOURS) for _ in range(200))
    return tokenizer(text)["input_ids"][:129]


def _next_token_probs(llm, prefixes: list[list[int]], kind: str) -> list[dict[int, float]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, logprobs=20, **KINDS[kind])
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prefixes], params,
                        use_tqdm=False)
    return [{t: math.exp(lp.logprob) for t, lp in o.outputs[0].logprobs[0].items()}
            for o in outs]


@pytest.fixture(scope="module")
def reference(no_spec_llm):
    """The prompt, and for each (kind, prefix) that at least MIN_GROUP requests are
    expected to reach, the top-20 of its next-token distribution as no-spec vLLM
    samples it (top-k 10 keeps the whole support inside the top 20; the session's
    no-spec engine returns processed logprobs)."""
    llm = no_spec_llm
    prompt = colour_prompt(llm.get_tokenizer())
    dists: dict[tuple[str, tuple[int, ...]], dict[int, float]] = {}
    for kind in KINDS:
        reach = {(): 1.0}
        for _ in range(MAX_TOKENS):
            tested = {p: q for p, q in reach.items() if q * NUM_PER_KIND >= MIN_GROUP}
            if not tested:
                break
            probs = _next_token_probs(llm, [prompt + list(p) for p in tested], kind)
            reach = {}
            for (prefix, q), dist in zip(tested.items(), probs):
                dists[kind, prefix] = dist
                reach.update({prefix + (t,): q * p for t, p in dist.items()})
    return prompt, dists


def chi_square(counts: dict[tuple[int, ...], collections.Counter],
               dists: dict[tuple[int, ...], dict[int, float]]) -> tuple[float, int, list]:
    """Pearson's statistic and degrees of freedom summed over the prefixes reached by
    at least MIN_GROUP samples, and the (prefix, token) pairs sampled outside the
    target's support. Bins: each token expecting MIN_EXPECTED or more, and the rest
    (merged into the smallest bin when it expects fewer)."""
    stat, dof, outside = 0.0, 0, []
    for prefix, dist in dists.items():
        observed = counts.get(prefix, collections.Counter())
        n = sum(observed.values())
        if n < MIN_GROUP:
            continue
        # when the listed tokens carry all the mass, any other token is outside too
        unlisted = 0.0 if sum(dist.values()) > 1 - 1e-6 else 1.0
        outside += [(prefix, t) for t in observed if dist.get(t, unlisted) == 0.0]
        bins = [t for t, p in dist.items() if p * n >= MIN_EXPECTED]
        obs = [observed[t] for t in bins]
        exp = [dist[t] * n for t in bins]
        rest_obs, rest_exp = n - sum(obs), n - sum(exp)
        if rest_exp >= MIN_EXPECTED:
            obs.append(rest_obs)
            exp.append(rest_exp)
        else:
            smallest = int(np.argmin(exp))
            obs[smallest] += rest_obs
            exp[smallest] += rest_exp
        stat += sum((o - e) ** 2 / e for o, e in zip(obs, exp))
        dof += len(obs) - 1
    return stat, dof, outside


def p_value(stat: float, dof: int) -> float:
    """Upper tail of the chi-square distribution."""
    return torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                   torch.tensor(stat / 2, dtype=torch.float64)).item()


def _prefix_counts(samples: list[tuple[int, ...]]) -> dict[tuple[int, ...], collections.Counter]:
    counts: dict[tuple[int, ...], collections.Counter] = collections.defaultdict(
        collections.Counter)
    for tokens in samples:
        for d, t in enumerate(tokens):
            counts[tokens[:d]][t] += 1
    return counts


def _sample_from(dists, rng, n, sharpen=1.0) -> list[tuple[int, ...]]:
    """n token sequences drawn from the reference, each step's distribution raised
    to the power ``sharpen`` and renormalised. The mass outside a prefix's top 20 is
    one pseudo-token (-1), which ends the sequence."""
    out = []
    for _ in range(n):
        prefix: tuple[int, ...] = ()
        while prefix in dists and len(prefix) < MAX_TOKENS:
            dist = dists[prefix]
            tokens = [*dist, -1]
            p = np.array([*dist.values(), max(0.0, 1.0 - sum(dist.values()))]) ** sharpen
            prefix += (tokens[rng.choice(len(tokens), p=p / p.sum())],)
        out.append(prefix)
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_statistic_has_power_where_it_is_used(reference, kind):
    """On samples of the engine tests' size, the statistic accepts draws from the
    reference itself and rejects draws at a temperature 30% too low."""
    _, dists = reference
    dists = {prefix: d for (k, prefix), d in dists.items() if k == kind}
    rng = np.random.default_rng(0)
    right = chi_square(_prefix_counts(_sample_from(dists, rng, NUM_PER_KIND)), dists)
    wrong = chi_square(_prefix_counts(_sample_from(dists, rng, NUM_PER_KIND, 1 / 0.7)), dists)
    assert p_value(*right[:2]) > ALPHA, right
    assert p_value(*wrong[:2]) < ALPHA, wrong


@pytest.mark.parametrize("name", list(SPECS))
def test_sampled_tokens_follow_the_target_distribution(model_path, reference, name):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt, dists = reference
    spec, engine_kwargs, kinds = SPECS[name]
    if spec["method"] == "echo":
        spec, additional = flat_cost_echo(spec)
        engine_kwargs = {**engine_kwargs, "additional_config": additional}
    samples = {}
    with engine(model_path, spec, **engine_kwargs) as llm:
        # every other request carries a predicted output: drafts from it are verified
        # like any other, so the distribution must not move
        predicted = {PREDICTION_KEY: colour_prediction(llm.get_tokenizer())}
        # one call per kind: a batch with top-p requests sorts every row's vocabulary
        for kind in kinds:
            offset = list(KINDS).index(kind)  # each kind's seeds, whichever kinds run
            params = [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True,
                                     seed=offset * NUM_PER_KIND + i, **KINDS[kind],
                                     extra_args=predicted if i % 2 else None)
                      for i in range(NUM_PER_KIND)]
            outs = llm.generate([TokensPrompt(prompt_token_ids=prompt)] * NUM_PER_KIND, params,
                                use_tqdm=False)
            samples[kind] = [tuple(o.outputs[0].token_ids) for o in outs]
        stats = [s for s in llm.collective_rpc(worker_stats) if s][0]
    for kind in kinds:
        assert all(len(s) == MAX_TOKENS for s in samples[kind])
        stat, dof, outside = chi_square(_prefix_counts(samples[kind]),
                                        {p: d for (k, p), d in dists.items() if k == kind})
        assert not outside, f"{kind}: tokens sampled outside the target's support: {outside}"
        assert dof >= 5, (kind, dof)
        assert p_value(stat, dof) > ALPHA, f"{kind}: chi-square {stat:.1f} on {dof} dof, {stats}"
    if spec["method"] == "logitspec":
        # trees were verified (the scheduled drafts of the others were a plain chain),
        # and some accepted a sibling that was not the first branch (its KV was
        # compacted): the rejection walk's residuals ran
        assert stats["tree_verifications"] >= NUM_PER_KIND // 5, stats
        assert stats["tree_compactions"] > 0, stats
    assert stats["accepted_tree"] + stats["accepted_chain"] > 0, stats
    assert 0 < stats["prediction_requests"] <= len(kinds) * NUM_PER_KIND // 2, stats
    assert stats["prediction_accepted"] > 0, stats
    faults = {k: n for k, n in stats["failures"].items() if k != "propose:TimeoutError"}
    assert not faults, stats["failures"]
