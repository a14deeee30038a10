# SPDX-License-Identifier: Apache-2.0
"""AcceptanceModel: P(accepted) is the product of conditional rates along the path;
rates are Beta posteriors learned from uncensored labels only."""

import numpy as np
import pytest

from vllm_echo.algos.echo import AcceptanceModel, Candidates, EchoPlanner, EchoTuning
from vllm_echo.algos.echo.acceptance import labels

EXACT = dict(acceptance_decay=1.0)  # no forgetting: counts are plain counts


def _forest(tokens, parents, match_len=None, rank=None, head_logp=()):
    n = len(tokens)
    return Candidates(np.array(tokens, np.int32), np.array(parents, np.int32),
                      np.array(match_len or [3] * n, np.int32),
                      np.array(rank or [-1] * n, np.int32), np.array(head_logp, np.float32))


def test_probabilities_are_products_of_the_prior_rates_along_paths():
    model = AcceptanceModel(EchoTuning(retrieved_prior=(1, 1), head_prior=(1, 9),
                                       match_edges=(1,)))
    # retrieved chain 5-6-7 under the root; a head (rank 1) with a retrieved child
    forest = _forest([5, 6, 7, 8, 9], [-1, 0, 1, -1, 3], rank=[-1, -1, -1, 1, -1],
                     match_len=[3, 3, 3, 0, 3], head_logp=[-0.1, -1.0])
    assert model.node_probabilities(forest) == pytest.approx([0.5, 0.25, 0.125, 0.1, 0.05])


def test_buckets_by_depth_match_length_and_head_probability():
    model = AcceptanceModel(EchoTuning(depth_edges=(1, 2, 4), match_edges=(1, 3, 8),
                                       head_p_edges=(0.3, 0.1)))
    parents = np.array([-1, 0, 1, 2, -1, -1, -1, -1, -1])
    match_len = np.array([2, 2, 5, 5, 8, 1, 0, 0, 0])
    rank = np.array([-1, -1, -1, -1, -1, -1, 0, 1, 2])
    logp = np.log([0.5, 0.2, 0.01])
    # retrieved: depth bucket (1 | 2-3 | 4+) x match class (m 1-2 | 3-7 | 8+); heads after
    assert model.buckets(parents, match_len, rank, logp).tolist() == [
        0, 3, 4, 7, 2, 0, 9, 10, 11]


def test_labels_count_only_verified_nodes_whose_parent_was_accepted():
    #   root -> A(5) -> C(6) -> E(7)       accepted: A, C; the target then emitted 7
    #        -> B(8) -> D(9)               B is rejected, so D's verdict is unknown
    #        -> F(5)                       a duplicate of A: accepted too
    parents = np.array([-1, -1, 0, 1, 2, -1])
    tokens = np.array([5, 8, 6, 9, 7, 5])
    every = np.arange(6)
    trial, success = labels(parents, tokens, np.array([0, 2]), 7, every)
    assert trial.tolist() == [True, True, True, False, True, True]
    assert success.tolist() == [True, False, True, False, True, True]
    # E was not verified (the draft stopped at C): E gives no label, though its parent
    # was accepted and the target's next token is known
    trial, success = labels(parents, tokens, np.array([0, 2]), 7, np.array([0, 1, 2, 3, 5]))
    assert trial.tolist() == [True, True, True, False, False, True]
    # nothing accepted: only the root's children are trials, against the bonus token
    trial, success = labels(parents, tokens, np.array([], np.int64), 8, every)
    assert trial.tolist() == [True, True, False, False, False, True]
    assert success.tolist() == [False, True, False, False, False, False]


def test_beta_posterior_counts_uncensored_trials():
    tuning = EchoTuning(retrieved_prior=(1, 1), match_edges=(1,), depth_edges=(1, 2, 3, 4),
                        **EXACT)
    planner = EchoPlanner(tuning, trees=True, k_max=2)  # verifies the 2 best nodes
    # root -> 5 -> 6 -> 7 -> 8 (one retrieved chain, depths 1..4)
    forest = _forest([5, 6, 7, 8], [-1, 0, 1, 2])
    _, (plan,) = planner.plan([forest], 8, 1)
    assert plan.token_ids.tolist() == [5, 6]
    planner.observe([(plan, [0, 1], 7)])  # both accepted, then the target emitted 7
    trials, successes = planner.acceptance.trials, planner.acceptance.successes
    # depths 3 and 4 (nodes 7 and 8) were not verified: no trial
    assert trials[:4].tolist() == [1, 1, 0, 0]
    assert successes[:4].tolist() == [1, 1, 0, 0]
    rates = planner.acceptance.rates
    assert rates[0] == pytest.approx(2 / 3) and rates[3] == pytest.approx(0.5)
    # a rejection at depth 1: the posterior of Beta(1, 1) after 1 success and 1 failure
    _, (plan,) = planner.plan([forest], 8, 1)
    planner.observe([(plan, [], 9)])
    assert planner.acceptance.rates[0] == pytest.approx(2 / 4)
    assert planner.acceptance.trials[1] == 1  # depth 2: its parent was rejected


def test_counts_decay_toward_the_prior():
    model = AcceptanceModel(EchoTuning(retrieved_prior=(1, 1), acceptance_decay=0.5))
    bucket = np.array([0])
    model.observe(bucket, np.array([True]), np.array([True]))
    model.observe(bucket, np.array([True]), np.array([False]))
    # counts: successes 1 * 0.5 = 0.5, trials 1 * 0.5 + 1 = 1.5
    assert model.rates[0] == pytest.approx((1 + 0.5) / (2 + 1.5))
