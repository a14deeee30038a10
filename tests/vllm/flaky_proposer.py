# SPDX-License-Identifier: Apache-2.0
"""A LogitSpec proposer with injected faults, loaded by vLLM's worker process
through ``{"method": "custom_class", "model": "flaky_proposer.FlakyProposer"}``
(tests/vllm is on sys.path, which spawned vLLM processes inherit)."""

import itertools
import time

from vllm_echo.plugin import proposer, tree_runner


def every_third(fn):
    calls = itertools.count()

    def flaky(*args, **kwargs):
        if next(calls) % 3 == 1:
            raise RuntimeError("injected fault")
        return fn(*args, **kwargs)
    return flaky


class FlakyProposer(proposer.LogitSpecProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        # This runs inside the worker: the module-level functions used there fail
        # on every third call.
        proposer.build_forest = every_third(proposer.build_forest)
        tree_runner.verify_greedy = every_third(tree_runner.verify_greedy)


def slow_every_third(fn):
    calls = itertools.count()

    def slow(*args, **kwargs):
        if next(calls) % 3 == 1:
            time.sleep(1.5 * proposer.PROPOSE_DEADLINE_S)
        return fn(*args, **kwargs)
    return slow


class SlowProposer(proposer.LogitSpecProposer):
    """Drafting for one request in three takes longer than the step's deadline."""

    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        proposer.build_forest = slow_every_third(proposer.build_forest)
