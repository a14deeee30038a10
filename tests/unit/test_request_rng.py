# SPDX-License-Identifier: Apache-2.0
"""The random numbers of sampled tree verdicts (tree_verdicts.request_rng): derived from
the request's seed or id and its position, never drawn from a torch generator, so they
work with a generator on any device, agree on every tensor-parallel rank and leave
vLLM's sampler streams alone."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_echo.plugin.runner.tree_state import StepTrees, TreeContext, TreeDraft, tree_rows
from vllm_echo.plugin.runner.tree_verdicts import finish_tree_step, request_rng

VOCAB = 32


class DeviceGenerator:
    """A seeded request's generator on a device numpy cannot read (vLLM keeps them on
    the GPU): it answers ``initial_seed`` and nothing else."""

    def __init__(self, seed: int, device: str = "cuda"):
        self.device = torch.device(device)
        self._seed = seed

    def initial_seed(self) -> int:
        return self._seed

    def __getattr__(self, name):
        raise RuntimeError(f"drew from the request's {self.device} generator ({name})")


def _tree(req_id: str = "req-1", context_len: int = 10, req_idx: int = 0):
    draft = TreeDraft(np.array([10, 11, 20], np.int32), np.array([-1, 0, -1], np.int32))
    return tree_rows(req_id, req_idx, 0, context_len, draft, [10, 11, 20])


def _draws(rng: np.random.Generator) -> list[float]:
    return rng.random(4).tolist()


@pytest.mark.parametrize("device", ["cuda", "meta"])
def test_a_seeded_request_draws_from_its_seed_and_position(device):
    sampling = SimpleNamespace(generators={0: DeviceGenerator(1234, device)})
    rng = request_rng(sampling, _tree(context_len=10), engine_seed=0)
    assert isinstance(rng, np.random.Generator)
    first = _draws(rng)
    assert _draws(request_rng(sampling, _tree(context_len=10), engine_seed=7)) == first
    assert _draws(request_rng(sampling, _tree("other-id", 10), engine_seed=0)) == first
    assert _draws(request_rng(sampling, _tree(context_len=11), engine_seed=0)) != first
    other_seed = SimpleNamespace(generators={0: DeviceGenerator(1235, device)})
    assert _draws(request_rng(other_seed, _tree(context_len=10), engine_seed=0)) != first


def test_an_unseeded_request_draws_from_the_engine_seed_its_id_and_position():
    sampling = SimpleNamespace(generators={})
    state = torch.get_rng_state()
    first = _draws(request_rng(sampling, _tree("req-1", 10), engine_seed=3))
    assert _draws(request_rng(sampling, _tree("req-1", 10), engine_seed=3)) == first
    assert _draws(request_rng(sampling, _tree("req-2", 10), engine_seed=3)) != first
    assert _draws(request_rng(sampling, _tree("req-1", 11), engine_seed=3)) != first
    assert _draws(request_rng(sampling, _tree("req-1", 10), engine_seed=4)) != first
    assert torch.equal(torch.get_rng_state(), state)  # torch's global stream is untouched


def _sampled_tree_step(generators: dict, engine_seed: int = 0) -> tuple[list[int], list]:
    """One sampled tree step: nodes 10 -> 11 and 20 under the root. The target puts
    (nearly) all its mass on 10, then on 11, and is uniform after 11, so the path is
    [10, 11] and the next token is the verdict's own random draw."""
    context = TreeContext(engine_seed=engine_seed)
    context.step = StepTrees([_tree()], torch.arange(4))
    logits = torch.zeros(4, VOCAB)
    logits[0, 10] = logits[1, 11] = 50.0
    sampling = SimpleNamespace(all_greedy=False, temperature=torch.tensor([1.0]),
                               top_k=None, top_p=None, generators=generators)
    metadata = SimpleNamespace(num_draft_tokens=[3], bonus_logits_indices=torch.tensor([3]))
    sampled = torch.tensor([[10, 11, 5, -1]])  # vLLM's chain verdict, replaced by ours
    errors: list = []
    finish_tree_step(context, logits, metadata, sampled, ["req-1"], lambda *args: None,
                     lambda where, exc: errors.append((where, exc)), sampling)
    return sampled[0].tolist(), errors


def test_a_seeded_sampled_tree_accepts_with_a_device_generator_and_reproduces():
    state = torch.get_rng_state()
    row, errors = _sampled_tree_step({0: DeviceGenerator(99)})
    assert errors == []
    assert row[:2] == [10, 11] and 0 <= row[2] < VOCAB
    assert _sampled_tree_step({0: DeviceGenerator(99)})[0] == row
    next_tokens = {_sampled_tree_step({0: DeviceGenerator(seed)})[0][2] for seed in range(6)}
    assert len(next_tokens) > 1  # the seed decides the sample
    assert torch.equal(torch.get_rng_state(), state)


def test_an_unseeded_sampled_tree_gives_the_same_row_wherever_it_runs():
    """Two ranks (or two runs) verifying the same request at the same position agree,
    whatever torch's global generator did in between."""
    row, errors = _sampled_tree_step({}, engine_seed=5)
    assert errors == [] and row[:2] == [10, 11]
    torch.rand(100)  # another rank's global stream is elsewhere
    assert _sampled_tree_step({}, engine_seed=5)[0] == row
