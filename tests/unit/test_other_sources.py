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
from vllm_echo.algos.pools import UNSALTED_POOL, pool_id
from vllm_echo.plugin.proposers import echo as echo_proposer
from vllm_echo.plugin.proposers import failures, logitspec
from vllm_echo.plugin.tenancy import CACHE_SALT_KEY, mark_request

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
    if cls is echo_proposer.EchoProposer:
        proposer.planner.cost.set_curve([1, 64], [0.01, 0.01])  # verification is free
    return proposer


def _request(prompt_len: int, salt: str | None):
    """A request as the worker gets it: marked with its salt's pool, as the scheduler's
    patch marks every request."""
    params = SimpleNamespace(extra_args=None)
    mark_request(params, salt)
    return SimpleNamespace(prompt_token_ids=list(range(prompt_len)), sampling_params=params)


def _unmarked_request(prompt_len: int, extra_args: dict | None):
    """A request whose extra_args the scheduler did not mark (``extra_args`` as sent)."""
    return SimpleNamespace(prompt_token_ids=list(range(prompt_len)),
                           sampling_params=SimpleNamespace(extra_args=extra_args))


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
    monkeypatch.setattr(failures, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(cls, shared_outputs=True, shared_outputs_mib=1)
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


@pytest.mark.parametrize("cls", [logitspec.LogitSpecProposer, echo_proposer.EchoProposer])
def test_a_client_sent_salt_reaches_no_pool(monkeypatch, cls):
    """A tenant-1 salt string in extra_args (what a client's vllm_xargs become) is not a
    mark: that request neither drafts tenant-1's outputs nor writes into its pool."""
    monkeypatch.setattr(failures, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(cls, shared_outputs=True, shared_outputs_mib=1)
    _step(proposer, {"a": (_request(len(PROMPT), "tenant-1"), PROMPT + ANSWER)})
    asking = PROMPT + [1, 2] + ANSWER[:4]
    spoofed = _unmarked_request(len(asking) - 1, {CACHE_SALT_KEY: "tenant-1"})
    drafts = {}
    for _ in range(2):  # echo: the first plan learns which sources pay
        drafts = _step(proposer, {"marked": (_request(len(asking) - 1, "tenant-1"), asking),
                                  "spoofed": (spoofed, asking)})
    assert drafts["marked"] == ANSWER[4:4 + K]
    assert not set(drafts["spoofed"]) & set(ANSWER), drafts["spoofed"]
    # What it generates enters no pool; a marked request's outputs do enter its own.
    secret, other = [60, 61, 62, 63, 64, 65], [70, 71, 72, 73, 74, 75]
    _step(proposer, {
        "spoofed-writer": (_unmarked_request(len(PROMPT), {CACHE_SALT_KEY: "tenant-1"}),
                           PROMPT + secret),
        "tenant-2-writer": (_request(len(PROMPT), "tenant-2"), PROMPT + other)})
    store = proposer.sources.store
    for pool in (pool_id("tenant-1"), pool_id("tenant-2"), UNSALTED_POOL):
        assert len(store.draft(pool, np.array(secret[:3], np.int32), 3)[0]) == 0, pool
    assert store.draft(pool_id("tenant-2"), np.array(other[:3], np.int32), 3)[0].tolist() == \
        other[3:6]
    assert proposer.snapshot()["unmarked_requests"] == 2  # once per request, not per step


def test_a_request_without_a_mark_drafts_from_no_pool(monkeypatch):
    monkeypatch.setattr(failures, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(logitspec.LogitSpecProposer, shared_outputs=True, shared_outputs_mib=1)
    _step(proposer, {"a": (_request(len(PROMPT), None), PROMPT + ANSWER)})  # the unsalted pool
    assert proposer.snapshot()["unmarked_requests"] == 0
    asking = PROMPT + [1, 2] + ANSWER[:4]
    drafts = _step(proposer, {"unsalted": (_request(len(asking) - 1, None), asking),
                              "unmarked": (_unmarked_request(len(asking) - 1, None), asking)})
    assert drafts["unsalted"] == ANSWER[4:4 + K]
    assert drafts["unmarked"] == []
    assert proposer.snapshot()["unmarked_requests"] == 1
    assert proposer.stats.drafts["shared"] == 1


def test_unmarked_requests_count_only_with_shared_sources_on(monkeypatch):
    monkeypatch.setattr(failures, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(logitspec.LogitSpecProposer)
    row = PROMPT + [1, 2, 3]
    _step(proposer, {"unmarked": (_unmarked_request(len(PROMPT), None), row)})
    assert proposer.snapshot()["unmarked_requests"] == 0


@pytest.mark.parametrize("cls", [logitspec.LogitSpecProposer, echo_proposer.EchoProposer])
def test_recycled_candidates_are_learned_per_pool(monkeypatch, cls):
    monkeypatch.setattr(failures, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(cls, recycled=True, topk=8)
    logits = np.random.default_rng(0).standard_normal(VOCAB).astype(np.float32)
    _step(proposer, {
        "a": (_request(2, "tenant-1"), [3, 40, 41]),
        "spoofed": (_unmarked_request(2, {CACHE_SALT_KEY: "tenant-1"}), [3, 50, 51])},
        top_k={"a": logits, "spoofed": logits})
    tables = proposer.sources.recycled
    assert tables.pools == [pool_id("tenant-1")]
    table = tables.get(pool_id("tenant-1")).table
    np.testing.assert_array_equal(table[40], np.argsort(-logits, kind="stable")[:8])
    assert (table[50] == -1).all()
    assert proposer.snapshot()["recycled_bytes"] == table.nbytes


def test_recycled_candidates_draft_only_in_their_pool(monkeypatch):
    monkeypatch.setattr(failures, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(logitspec.LogitSpecProposer, recycled=True, topk=8)
    logits = np.random.default_rng(0).standard_normal(VOCAB).astype(np.float32)
    _step(proposer, {"a": (_request(2, "tenant-1"), [3, 40, 41])}, top_k={"a": logits})
    # Requests ending in 40 with no continuation of their own, and no logits behind them.
    drafts = _step(proposer, {"same": (_request(1, "tenant-1"), [9, 40]),
                              "other": (_request(1, "tenant-2"), [9, 40]),
                              "unsalted": (_request(1, None), [9, 40])})
    assert drafts["same"][0] == np.argsort(-logits, kind="stable")[0]
    assert drafts["other"] == drafts["unsalted"] == []


def test_the_prompt_is_not_shared(monkeypatch):
    monkeypatch.setattr(failures, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(logitspec.LogitSpecProposer, shared_outputs=True, shared_outputs_mib=1)
    secret = [90, 91, 92, 93, 94, 95]
    _step(proposer, {"a": (_request(len(secret) + 1, None), secret + [1, 2])})
    drafts = _step(proposer, {"b": (_request(3, None), [7, 90, 91, 92])})
    assert drafts["b"] == []


def test_the_recycled_table_learns_the_targets_top_k(monkeypatch):
    monkeypatch.setattr(failures, "PROPOSE_DEADLINE_S", 60.0)
    proposer = _proposer(logitspec.LogitSpecProposer, recycled=True, topk=8)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(VOCAB).astype(np.float32)
    # Row "a": ... 40, 41; the logits behind 41 were computed at input token 40.
    _step(proposer, {"a": (_request(2, None), [3, 40, 41])}, top_k={"a": logits})
    expected = np.argsort(-logits, kind="stable")[:8]
    table = proposer.sources.recycled.get(UNSALTED_POOL).table
    np.testing.assert_array_equal(table[40], expected)
    assert (table[np.arange(VOCAB) != 40] == -1).all()
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
