# SPDX-License-Identifier: Apache-2.0
"""Pool marks: the scheduler marks every request with its cache_salt's pool, whatever a
client put under the plugin's key, and the worker trusts nothing but a mark."""

from __future__ import annotations

import logging
import pickle
from types import SimpleNamespace

import pytest
from vllm import SamplingParams
from vllm.v1.core.sched.output import NewRequestData

from vllm_echo.algos.pools import UNSALTED_POOL, pool_id
from vllm_echo.plugin import register_patches
from vllm_echo.plugin.tenancy import CACHE_SALT_KEY, PoolMark, mark_request, pool_of


def _params(extra_args=None):
    return SimpleNamespace(extra_args=extra_args)


@pytest.mark.parametrize("sent", ["tenant-a", {"pool": 5}, 123, ["tenant-a"], None])
def test_a_client_value_under_the_key_is_replaced_by_the_servers_mark(sent):
    params = _params({CACHE_SALT_KEY: sent, "other": 1})
    assert mark_request(params, "tenant-b") is True
    assert params.extra_args == {CACHE_SALT_KEY: PoolMark(pool_id("tenant-b")), "other": 1}
    assert pool_of(params) == pool_id("tenant-b")


def test_salted_and_unsalted_requests_both_get_marks():
    salted, unsalted, no_extra = _params({"other": 1}), _params({}), _params(None)
    assert mark_request(salted, "tenant-a") is False
    assert mark_request(unsalted, None) is False
    assert mark_request(no_extra, None) is False
    assert pool_of(salted) == pool_id("tenant-a") != UNSALTED_POOL
    assert pool_of(unsalted) == pool_of(no_extra) == UNSALTED_POOL
    assert salted.extra_args["other"] == 1


def test_marking_a_marked_request_again_is_not_a_client_value():
    params = _params(None)
    mark_request(params, "tenant-a")
    assert mark_request(params, "tenant-a") is False  # e.g. a request scheduled again
    assert pool_of(params) == pool_id("tenant-a")


@pytest.mark.parametrize("extra_args", [None, {}, {"other": 1}, {CACHE_SALT_KEY: "tenant-a"},
                                        {CACHE_SALT_KEY: pool_id("tenant-a")},
                                        {CACHE_SALT_KEY: {"pool": pool_id("tenant-a")}}])
def test_without_a_mark_a_request_has_no_pool(extra_args):
    assert pool_of(_params(extra_args)) is None
    assert pool_of(None) is None


def test_the_mark_survives_the_pickle_to_the_workers():
    params = SamplingParams(temperature=0, extra_args={CACHE_SALT_KEY: "spoofed"})
    mark_request(params, "tenant-a")
    assert pool_of(pickle.loads(pickle.dumps(params))) == pool_id("tenant-a")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_scheduler_patch_marks_every_request_and_warns_once(monkeypatch):
    # vLLM's own from_request (even if the plugin was registered in this process), with
    # the class restored after the test
    func = NewRequestData.__dict__["from_request"].__func__
    monkeypatch.setattr(NewRequestData, "from_request",
                        classmethod(getattr(func, "__wrapped__", func)))
    register_patches.patch_new_request_salt()
    records = _Records()
    logger = logging.getLogger("vllm.vllm_echo")
    logger.addHandler(records)
    monkeypatch.setattr(logger, "disabled", False)

    def new_request(salt, extra_args):
        request = SimpleNamespace(
            request_id="r", prompt_token_ids=[1, 2], mm_features=[], pooling_params=None,
            sampling_params=SamplingParams(temperature=0, extra_args=extra_args),
            num_computed_tokens=0, lora_request=None, prompt_embeds=None,
            prompt_is_token_ids=None, replay_start=0, cache_salt=salt)
        return NewRequestData.from_request(request, ([0],)).sampling_params

    try:
        assert pool_of(new_request("tenant-a", None)) == pool_id("tenant-a")
        assert pool_of(new_request(None, {"x": 1})) == UNSALTED_POOL
        assert records.messages == []
        spoofed = new_request(None, {CACHE_SALT_KEY: "tenant-a"})
        assert pool_of(spoofed) == UNSALTED_POOL
        assert pool_of(new_request("tenant-b", {CACHE_SALT_KEY: "tenant-a"})) == \
            pool_id("tenant-b")
    finally:
        logger.removeHandler(records)
    assert len(records.messages) == 1, records.messages
    assert CACHE_SALT_KEY in records.messages[0] and "ignored" in records.messages[0]
