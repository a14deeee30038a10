# SPDX-License-Identifier: Apache-2.0
"""Drafts from other requests' outputs and recycled candidates, through the proposers'
per-request loop (no engine): what each source learns, isolation by cache_salt, and
how their branches join a request's forest."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_echo.algos.draft_sources import (ORIGIN_RECYCLED, ORIGIN_SHARED, Branches,
                                           with_branches)
from vllm_echo.algos.forest import ForestNodes
from vllm_echo.config import ADDITIONAL_CONFIG_KEY
from vllm_echo.plugin.patches import CACHE_SALT_KEY
from vllm_echo.plugin.proposers import echo as echo_proposer
from vllm_echo.plugin.proposers import logitspec

K = 4
VOCAB = 200


def _proposer(cls, **settings):
    settings = {"method": cls.method, "tree": False, "num_speculative_tokens": K, **settings}
    config = SimpleNamespace(
        additional_config={ADDITIONAL_CONFIG_KEY: settings},
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=2048, get_vocab_size=lambda: VOCAB),
        instance_id="")
    proposer = cls(config)
    proposer._warm_up()
    return proposer


def _request(prompt_len: int, salt: str | None):
    extra = {CACHE_SALT_KEY: salt} if salt is not None else None
    return SimpleNamespace(prompt_token_ids=list(range(prompt_len)),
                           sampling_params=SimpleNamespace(extra_args=extra))


def _step(proposer, batch: dict, top_k: dict | None = None):
    """One decode step: ``batch`` maps request id -> (owner, token row); each row's last
    token was just sampled. ``top_k`` maps request id -> the logits row behind it."""
    req_ids = list(batch)
    proposer._runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=req_ids,
                                    req_id_to_index={r: i for i, r in enumerate(req_ids)}),
        requests={r: owner for r, (owner, _) in batch.items()})
    width = max(len(row) for _, row in batch.values())
    rows = np.zeros((len(batch), width), np.int32)
    for i, (_, row) in enumerate(batch.values()):
        rows[i, :len(row)] = row
    if top_k is not None:
        logits = torch.stack([torch.as_tensor(top_k[r], dtype=torch.float32) for r in req_ids])
        proposer._last_logits.record(logits, torch.arange(len(req_ids)), req_ids)
    lengths = np.array([len(row) for _, row in batch.values()])
    return dict(zip(req_ids, proposer.propose([[int(row[-1])] for _, row in batch.values()],
                                              lengths, rows)))


# A's answer, which B and C's contexts end in the middle of. Their prompts hold no copy
# of it, so only the shared store can continue them.
ANSWER = [150, 151, 152, 153, 154, 155, 156, 157]
PROMPT = [5, 6, 7, 8]


@pytest.mark.parametrize("cls", [logitspec.LogitSpecProposer, echo_proposer.EchoProposer])
def test_outputs_are_shared_only_within_a_cache_salt(monkeypatch, cls):
    monkeypatch.setattr(logitspec, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(cls, shared_outputs=True, shared_outputs_mib=1)
    if cls is echo_proposer.EchoProposer:
        proposer.planner.cost.set_curve([1, 64], [0.01, 0.01])  # verification is free
    _step(proposer, {"a": (_request(len(PROMPT), "tenant-1"), PROMPT + ANSWER)})
    asking = PROMPT + [1, 2] + ANSWER[:4]  # prompt PROMPT + [1, 2, 150, 151, 152], one output
    drafts = {}
    for _ in range(2):  # echo: the first plan learns which sources pay
        drafts = _step(proposer, {
            "same-salt": (_request(len(asking) - 1, "tenant-1"), asking),
            "other-salt": (_request(len(asking) - 1, "tenant-2"), asking),
            "no-salt": (_request(len(asking) - 1, None), asking)})
    assert drafts["same-salt"] == ANSWER[4:4 + K]
    for req in ("other-salt", "no-salt"):
        assert not set(drafts[req]) & set(ANSWER), (req, drafts[req])
    snapshot = proposer.snapshot()
    assert snapshot["shared_outputs_bytes"] == proposer.sources.store.nbytes <= 1 << 20


def test_the_prompt_is_not_shared(monkeypatch):
    monkeypatch.setattr(logitspec, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(logitspec.LogitSpecProposer, shared_outputs=True, shared_outputs_mib=1)
    secret = [90, 91, 92, 93, 94, 95]
    _step(proposer, {"a": (_request(len(secret) + 1, None), secret + [1, 2])})
    drafts = _step(proposer, {"b": (_request(3, None), [7, 90, 91, 92])})
    assert drafts["b"] == []


def test_the_recycled_table_learns_the_targets_top_k(monkeypatch):
    monkeypatch.setattr(logitspec, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(logitspec.LogitSpecProposer, recycled=True, topk=8)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(VOCAB).astype(np.float32)
    # Row "a": ... 40, 41; the logits behind 41 were computed at input token 40.
    _step(proposer, {"a": (_request(2, None), [3, 40, 41])}, top_k={"a": logits})
    expected = np.argsort(-logits, kind="stable")[:8]
    np.testing.assert_array_equal(proposer.sources.recycled.table[40], expected)
    assert (proposer.sources.recycled.table[np.arange(VOCAB) != 40] == -1).all()
    # A request ending in 40 with no continuation of its own: the table's greedy path.
    # Its own logits row (for the head fallback) puts a different token first.
    other = np.zeros(VOCAB, np.float32)
    other[7] = 5.0
    drafts = _step(proposer, {"b": (_request(1, None), [9, 40])}, top_k={"b": other})
    assert drafts["b"][0] == expected[0]
    assert proposer.stats.drafts["recycled"] == 1


def test_branches_join_after_the_retrieved_chain_before_heads():
    # own forest: a retrieved chain of 2 (1, 2), then two next-next branches (3 and 4 -> 5)
    own = ForestNodes(*(np.array(v, np.int32) for v in (
        [1, 2, 3, 4, 5], [-1, 0, -1, -1, 3], [3, 3, 0, 0, 2], [-1, -1, 0, 1, -1])))
    extra = Branches(np.array([7, 8, 9, 10], np.int32), np.array([-1, 0, -1, 2], np.int32),
                     np.array([ORIGIN_SHARED, ORIGIN_SHARED, ORIGIN_RECYCLED,
                               ORIGIN_RECYCLED], np.int8))
    nodes, origin = with_branches(own, extra, 20)  # room for all
    np.testing.assert_array_equal(nodes.token_ids, [1, 2, 3, 4, 5, 7, 8, 9, 10])
    np.testing.assert_array_equal(nodes.parents, [-1, 0, -1, -1, 3, -1, 5, -1, 7])
    np.testing.assert_array_equal(nodes.rank, [-1, -1, 0, 1, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(origin, [0, 0, 0, 0, 0, 1, 1, 2, 2])
    nodes, origin = with_branches(own, extra, 7)  # the heads give way first
    np.testing.assert_array_equal(nodes.token_ids, [1, 2, 3, 7, 8, 9, 10])
    np.testing.assert_array_equal(nodes.parents, [-1, 0, -1, -1, 3, -1, 5])
    np.testing.assert_array_equal(origin, [0, 0, 0, 1, 1, 2, 2])
    nodes, origin = with_branches(own, extra, 3)  # then the other sources
    np.testing.assert_array_equal(nodes.token_ids, [1, 2, 7])
    np.testing.assert_array_equal(origin, [0, 0, 1])


def test_echo_scores_each_source_on_its_own():
    from vllm_echo.algos.echo import AcceptanceModel, Candidates

    model = AcceptanceModel()
    model.other_origins = (ORIGIN_SHARED,)
    forest = Candidates(np.array([1, 2, 3], np.int32), np.array([-1, -1, -1], np.int32),
                        np.array([2, 0, 0], np.int32), np.array([-1, -1, -1], np.int32),
                        np.empty(0, np.float32),
                        origin=np.array([0, ORIGIN_SHARED, ORIGIN_RECYCLED], np.int8))
    buckets = model.pool([forest]).buckets
    assert len(set(buckets.tolist())) == 3
    kinds = model.kinds(buckets)
    np.testing.assert_array_equal(kinds, [0, 2, 3])
    # A shared bucket that keeps failing drags only shared nodes down.
    for _ in range(50):
        model.observe(buckets[1:2], np.array([True]), np.array([False]))
    probs = model.node_probabilities(forest)
    assert probs[1] < 0.1 < probs[0] and probs[2] > 0.1
