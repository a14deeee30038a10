# SPDX-License-Identifier: Apache-2.0
"""LogitSpec proposers with injected faults, loaded by vLLM's worker process
through ``{"method": "custom_class", "model": "flaky_proposer.FlakyProposer"}``
(tests/vllm is on sys.path, which spawned vLLM processes inherit)."""

import itertools
import time

from vllm_echo.plugin.attention import cpu_tree_attention
from vllm_echo.plugin.proposers import logitspec as proposer
from vllm_echo.plugin.runner import access, verdicts


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


def dropping_a_layer_capture(compact):
    """``compact_accepted_path`` that, on every other compaction with nodes to move,
    first forgets one attention layer's captured K/V (as if that layer's capture had
    not run)."""
    calls = itertools.count()

    def compact_with_missing_layer(tree, row_offset, path, step):
        moves = any(j != k for k, j in enumerate(path))
        if moves and next(calls) % 2 == 0 and step.captured:
            step.captured.pop(next(iter(step.captured)))
        return compact(tree, row_offset, path, step)
    return compact_with_missing_layer


class FlakyProposer(proposer.LogitSpecProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        # This runs inside the worker: the module-level functions used there fail
        # on every third call, and every other KV compaction misses a layer.
        proposer.build_forest = every_third(proposer.build_forest, _raise)
        verdicts.verify_greedy = every_third(verdicts.verify_greedy, _raise)
        cpu_tree_attention.compact_accepted_path = dropping_a_layer_capture(
            cpu_tree_attention.compact_accepted_path)


class SlowProposer(proposer.LogitSpecProposer):
    """Drafting for one request in three takes longer than the step's deadline."""

    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        proposer.build_forest = every_third(proposer.build_forest, _stall)


class DriftedRunnerProposer(proposer.LogitSpecProposer):
    """The runner's hook points as a later vLLM might declare them, installed on the
    runner before the plugin hooks it: ``_prepare_inputs`` with a renamed parameter
    (the plugin must refuse it: trees off, chain mode) and ``_sample`` with a new
    keyword-only parameter that has a default (the plugin must pass it through)."""

    def load_model(self, model):
        runner = access.find_runner()
        prepare_inputs, sample = runner._prepare_inputs, runner._sample

        def _prepare_inputs(scheduler_output, num_tokens_per_request):
            return prepare_inputs(scheduler_output, num_tokens_per_request)

        def _sample(logits, spec_decode_metadata, *, sampler_options=None):
            assert sampler_options is None
            return sample(logits, spec_decode_metadata)

        runner._prepare_inputs, runner._sample = _prepare_inputs, _sample
        super().load_model(model)
