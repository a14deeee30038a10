# SPDX-License-Identifier: Apache-2.0
"""A LogitSpec proposer with injected faults, loaded by vLLM's worker process
through ``{"method": "custom_class", "model": "flaky_proposer.FlakyProposer"}``
(tests/vllm is on sys.path, which spawned vLLM processes inherit)."""

import itertools
import time

from vllm_echo.plugin import proposer, tree_runner


def every_third(fn, fault):
    """``fn`` with ``fault()`` run before every third call (the 2nd, 5th, ...)."""
    calls = itertools.count()

    def flaky(*args, **kwargs):
        if next(calls) % 3 == 1:
            fault()
        return fn(*args, **kwargs)
    return flaky


def _raise():
    raise RuntimeError("injected fault")


def _stall():
    time.sleep(1.5 * proposer.PROPOSE_DEADLINE_S)


class FlakyProposer(proposer.LogitSpecProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        # This runs inside the worker: the module-level functions used there fail
        # on every third call.
        proposer.build_forest = every_third(proposer.build_forest, _raise)
        tree_runner.verify_greedy = every_third(tree_runner.verify_greedy, _raise)


class SlowProposer(proposer.LogitSpecProposer):
    """Drafting for one request in three takes longer than the step's deadline."""

    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        proposer.build_forest = every_third(proposer.build_forest, _stall)
