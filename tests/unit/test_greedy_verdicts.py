# SPDX-License-Identifier: Apache-2.0
"""A greedy step verified without vLLM's rejection sampler (greedy_shortcut.greedy_verdicts)
gets exactly that sampler's rows, ties included; a step whose rows vLLM would change
before taking their argmax (verdicts_are_row_argmaxes) is left to it. vLLM's own RejectionSampler, with the
CPU platform's kernels, is the reference."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm import SamplingParams
from vllm.platforms.cpu import CpuPlatform
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_echo.plugin.kernel_scan_guard import guard_llvmlite_lib
from vllm_echo.plugin.runner.greedy_shortcut import greedy_verdicts, verdicts_are_row_argmaxes

VOCAB = 64


@pytest.fixture(scope="module")
def samplers():
    guard_llvmlite_lib()  # as the plugin does: numba is loaded in this process
    CpuPlatform.register_triton_kernel_overrides()  # what the CPU engine does at start-up
    sampler = Sampler()
    return sampler, RejectionSampler(sampler)


def _sampling_metadata(batch: int, **changes) -> SamplingMetadata:
    metadata = SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    return dataclasses.replace(metadata, **changes)


def _spec_metadata(drafts: list[list[int]]) -> SpecDecodeMetadata:
    """vLLM's layout: each request's draft rows, then its bonus row."""
    num_drafts = np.array([len(d) for d in drafts])
    cu_sampled = np.cumsum(num_drafts + 1)
    starts = cu_sampled - num_drafts - 1
    target = np.concatenate([s + np.arange(n) for s, n in zip(starts, num_drafts)])

    def ints(values):
        return torch.as_tensor(np.asarray(values), dtype=torch.int32)

    return SpecDecodeMetadata(
        draft_token_ids=ints(np.concatenate([np.asarray(d, dtype=np.int64) for d in drafts])),
        num_draft_tokens=num_drafts.tolist(), cu_num_draft_tokens=ints(np.cumsum(num_drafts)),
        cu_num_sampled_tokens=ints(cu_sampled), target_logits_indices=ints(target),
        bonus_logits_indices=ints(cu_sampled - 1), logits_indices=ints(np.arange(cu_sampled[-1])))


def _runner(samplers, sampling: SamplingMetadata, params: list[SamplingParams]):
    sampler, rejection_sampler = samplers
    req_ids = [f"r{i}" for i in range(len(params))]
    return SimpleNamespace(
        sampler=sampler, rejection_sampler=rejection_sampler,
        input_batch=SimpleNamespace(sampling_metadata=sampling, req_ids=req_ids),
        requests={r: SimpleNamespace(sampling_params=p) for r, p in zip(req_ids, params)})


def _random_step(rng: np.random.Generator, dtype: torch.dtype):
    """Drafts of 0-7 tokens per request; logits are small integers, so most rows have
    tied maxima, and each draft is its row's first maximum 70% of the time."""
    drafts = [rng.integers(0, VOCAB, size=rng.integers(0, 8)).tolist()
              for _ in range(rng.integers(1, 9))]
    if not any(drafts):
        drafts[0] = [int(rng.integers(0, VOCAB))]
    metadata = _spec_metadata(drafts)
    logits = torch.as_tensor(rng.integers(0, 4, size=(len(metadata.logits_indices), VOCAB)),
                             dtype=torch.float32)
    for row, token in zip(metadata.target_logits_indices.tolist(),
                          metadata.draft_token_ids.tolist()):
        if rng.random() < 0.7:
            logits[row, :token] = torch.clamp(logits[row, :token], max=3)
            logits[row, token] = 4
    return metadata, logits.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_rows_are_the_rejection_samplers(samplers, dtype):
    rng = np.random.default_rng(7)
    accepted = 0
    for _ in range(150):
        metadata, logits = _random_step(rng, dtype)
        batch = len(metadata.num_draft_tokens)
        sampling = _sampling_metadata(batch)
        runner = _runner(samplers, sampling, [SamplingParams(temperature=0)] * batch)
        assert verdicts_are_row_argmaxes(runner, metadata)
        expected = samplers[1](metadata, None, logits.clone(), sampling).sampled_token_ids
        got = greedy_verdicts(logits, metadata, [])[0].sampled_token_ids
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected), (metadata.num_draft_tokens, got, expected)
        accepted += int((got[:, 1:] != -1).sum())
    assert accepted > 100  # drafts were accepted, not only rejected


def test_tree_requests_get_their_root_rows_argmax_and_chains_their_verdict(samplers):
    rng = np.random.default_rng(3)
    metadata, logits = _random_step(rng, torch.float32)
    while len(metadata.num_draft_tokens) < 3 or min(metadata.num_draft_tokens) == 0:
        metadata, logits = _random_step(rng, torch.float32)
    batch = len(metadata.num_draft_tokens)
    sampling = _sampling_metadata(batch)
    runner = _runner(samplers, sampling, [SamplingParams(temperature=0)] * batch)
    expected = samplers[1](metadata, None, logits.clone(), sampling).sampled_token_ids
    trees = [0, 2]
    got = greedy_verdicts(logits, metadata, trees)[0].sampled_token_ids
    for i in range(batch):
        if i in trees:
            root_row = int(metadata.bonus_logits_indices[i]) - metadata.num_draft_tokens[i]
            assert got[i].tolist() == [int(logits[root_row].argmax())] + [-1] * (got.shape[1] - 1)
        else:
            assert torch.equal(got[i], expected[i])


class _BanToken:
    """A user's logits processor (not one of vLLM's own) that changes greedy results."""

    def is_argmax_invariant(self):
        return False


@pytest.mark.parametrize("sampling_change, params_change, synthetic", [
    ({}, {}, False),
    ({"all_greedy": False}, {}, False),
    ({"max_num_logprobs": 0}, {}, False),
    ({"logprob_token_ids": {0: [1]}}, {}, False),
    ({"no_penalties": False}, {}, False),
    ({"allowed_token_ids_mask": torch.zeros(2, VOCAB, dtype=torch.bool)}, {}, False),
    ({"bad_words_token_ids": {1: [[5]]}}, {}, False),
    ({"logitsprocs": LogitsProcessors([_BanToken()])}, {}, False),
    ({}, {"min_tokens": 3}, False),
    ({}, {"logit_bias": {5: 10.0}}, False),
    ({}, {}, True),
])
def test_steps_whose_rows_vllm_would_process_are_left_to_it(samplers, sampling_change,
                                                            params_change, synthetic):
    metadata = _spec_metadata([[1, 2], [3]])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0, **params_change)]
    runner = _runner(samplers, _sampling_metadata(2, **sampling_change), params)
    runner.rejection_sampler = SimpleNamespace(synthetic_mode=synthetic)
    exact = not sampling_change and not params_change and not synthetic
    assert verdicts_are_row_argmaxes(runner, metadata) is exact


def test_vllms_own_idle_processors_leave_the_verdicts_to_the_argmax(samplers):
    from vllm.config import VllmConfig
    from vllm.v1.sample.logits_processor.builtin import (LogitBiasLogitsProcessor,
                                                         MinTokensLogitsProcessor)

    config, device = VllmConfig(), torch.device("cpu")
    processors = LogitsProcessors([MinTokensLogitsProcessor(config, device, False),
                                   LogitBiasLogitsProcessor(config, device, False)])
    runner = _runner(samplers, _sampling_metadata(2, logitsprocs=processors),
                     [SamplingParams(temperature=0)] * 2)
    assert verdicts_are_row_argmaxes(runner, _spec_metadata([[1, 2], [3]]))
