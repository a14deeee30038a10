# SPDX-License-Identifier: Apache-2.0
"""Both methods draft through one per-request loop (base.Proposer._propose): a
request whose drafting fails goes without drafts this step, the others keep theirs."""

from types import SimpleNamespace

import numpy as np
import pytest

from vllm_echo.config import ADDITIONAL_CONFIG_KEY
from vllm_echo.plugin.proposers import echo as echo_proposer
from vllm_echo.plugin.proposers import failures, logitspec, sources

K = 4
# Three requests whose contexts repeat, so the m-gram index always has a continuation;
# the second one's context starts with a marker token that the injected fault fails on.
MARKER = 999
ROWS = np.array([[1, 2, 3, 4, 5, 6] * 4,
                 [MARKER, 2, 3, 4, 5, 6] + [1, 2, 3, 4, 5, 6] * 3,
                 [7, 8, 9, 10, 11, 12] * 4], dtype=np.int32)


def _proposer(cls, method):
    settings = {"method": method, "tree": False, "num_speculative_tokens": K}
    config = SimpleNamespace(additional_config={ADDITIONAL_CONFIG_KEY: settings},
                             speculative_config=SimpleNamespace(num_speculative_tokens=K),
                             model_config=SimpleNamespace(max_model_len=2048,
                                                          get_vocab_size=lambda: 1000),
                             instance_id="")
    proposer = cls(config)
    req_ids = ["a", "b", "c"]
    proposer._runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=req_ids,
                                    req_id_to_index={r: i for i, r in enumerate(req_ids)}),
        requests={r: object() for r in req_ids})
    return proposer


def _failing_on_marker(fn):
    def draft(index, *args, **kwargs):
        if index.tokens[0] == MARKER:
            raise RuntimeError("injected fault")
        return fn(index, *args, **kwargs)
    return draft


def _propose(proposer):
    lengths = np.array([ROWS.shape[1] - 1] * 3)  # the last token is the one just sampled
    return proposer.propose([[int(row[-2])] for row in ROWS], lengths, ROWS)


@pytest.mark.parametrize("method", ["logitspec", "echo"])
def test_a_failing_request_drops_only_its_own_drafts(monkeypatch, method):
    # Not the step's drafting deadline: a slow first call (logging the fault) is no fault.
    monkeypatch.setattr(failures, "PROPOSE_DEADLINE_S", 60.0)
    cls = logitspec.LogitSpecProposer if method == "logitspec" else echo_proposer.EchoProposer
    proposer = _proposer(cls, method)
    proposer._warm_up()
    if method == "echo":
        proposer.planner.cost.set_curve([1, 64], [0.01, 0.01])  # drafting is free
    # where each method's drafting calls it (chain mode: LogitSpec's chain, ECHO's forest)
    module, name = (logitspec, "first_chain") if method == "logitspec" else \
        (sources, "build_forest_nodes")
    with monkeypatch.context() as patch:
        patch.setattr(module, name, _failing_on_marker(getattr(module, name)))
        drafts = _propose(proposer)
    assert drafts[1] == []
    assert drafts[0] and drafts[2], drafts  # the rest of the batch still speculates
    assert drafts[0] == [6, 1, 2, 3][:len(drafts[0])]
    assert proposer.failures.counts == {"propose:RuntimeError": 1}
    # The next step, without the fault, drafts for all three again.
    assert all(_propose(proposer))
