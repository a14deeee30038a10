# SPDX-License-Identifier: Apache-2.0
"""LogitSpec proposers with injected faults, loaded by vLLM's worker process
through ``{"method": "custom_class", "model": "flaky_proposer.FlakyProposer"}``
(tests/vllm is on sys.path, which spawned vLLM processes inherit)."""

import hashlib
import itertools
import time

from vllm_echo.plugin.attention import cpu_tree_attention, flex_tree_attention
from vllm_echo.plugin.proposers import failures, logitspec, sources
from vllm_echo.plugin.runner import access, tree_verdicts


def every_third(fn, fault):
    """``fn`` with ``fault()`` run before every third call (the 2nd, 5th, ...)."""
    calls = itertools.count()

    def flaky(*args, **kwargs):
        if next(calls) % 3 == 1:
            fault()
        return fn(*args, **kwargs)
    return flaky


def every_third_alternating(fn, fault, other_fault):
    """``fn`` with a fault before every third call, ``fault()`` and ``other_fault()``
    in turn (calls 2, 8, 14, ... and 5, 11, 17, ...)."""
    thirds = itertools.count()
    return every_third(fn, lambda: (fault if next(thirds) % 2 == 0 else other_fault)())


def _raise():
    raise RuntimeError("injected fault")


def _stall():
    time.sleep(1.5 * failures.PROPOSE_DEADLINE_S)


def dropping_a_layer_capture(compact):
    """``compact_accepted_path`` that, on every other compaction with nodes to move,
    first forgets one attention layer's captured K/V (as if that layer's capture had
    not run)."""
    calls = itertools.count()

    def compact_with_missing_layer(tree, row_offset, path, step):
        moves = any(j != k for k, j in enumerate(path))
        if moves and next(calls) % 2 == 0 and step.cpu.captured:
            step.cpu.captured.pop(next(iter(step.cpu.captured)))
        return compact(tree, row_offset, path, step)
    return compact_with_missing_layer


class FlakyProposer(logitspec.LogitSpecProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        # This runs inside the worker: the module-level functions used there fail
        # on every third call (drafting a forest either fails or, in turn, takes
        # longer than the step's deadline), and every other KV compaction misses a
        # layer.
        sources.build_forest_nodes = every_third_alternating(sources.build_forest_nodes,
                                                             _raise, _stall)
        tree_verdicts.verify_greedy = every_third(tree_verdicts.verify_greedy, _raise)
        cpu_tree_attention.compact_accepted_path = dropping_a_layer_capture(
            cpu_tree_attention.compact_accepted_path)


class DriftedRunnerProposer(logitspec.LogitSpecProposer):
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


def _flex_faults():
    """FLEX_ATTENTION's tree path, in this process: every third mask build finds no
    tables (the step's mask is never built: its trees must accept no draft), every
    third one after that fails building them, and every other slot compaction fails."""
    context_of, tables = flex_tree_attention._context_of, flex_tree_attention.step_mask_tables
    calls = itertools.count()

    def context_sometimes_lost(metadata):
        return None if next(calls) % 3 == 1 else context_of(metadata)

    flex_tree_attention._context_of = context_sometimes_lost
    flex_tree_attention.step_mask_tables = every_third(tables, _raise)
    compact, compactions = flex_tree_attention.compact_accepted_path, itertools.count()

    def compact_sometimes_failing(tree, row_offset, path, step):
        moves = any(j != k for k, j in enumerate(path))
        if moves and next(compactions) % 2 == 0:
            raise RuntimeError("injected slot compaction fault")
        return compact(tree, row_offset, path, step)

    flex_tree_attention.compact_accepted_path = compact_sometimes_failing


class FlexFaultsProposer(logitspec.LogitSpecProposer):
    """FLEX_ATTENTION trees with missing mask tables, failing mask builds and failing
    slot compactions (_flex_faults)."""

    def __init__(self, vllm_config):
        _flex_faults()
        super().__init__(vllm_config)


class OneRankFlexFaultsProposer(logitspec.LogitSpecProposer):
    """Under tensor parallel, the FLEX faults of _flex_faults on rank 1 only: the other
    ranks' masks and compactions all succeed. Each rank also keeps a digest of the
    tokens it sampled (what ``propose`` receives every step), so a test can see that
    the ranks emitted the same tokens (``sampled_digest`` in the snapshot)."""

    def __init__(self, vllm_config):
        from vllm.distributed.parallel_state import get_tp_group

        if get_tp_group().rank_in_group == 1:
            _flex_faults()
        super().__init__(vllm_config)
        self._digest = hashlib.sha256()

    def propose(self, sampled_token_ids, *args, **kwargs):
        self._digest.update(repr(sampled_token_ids).encode())
        return super().propose(sampled_token_ids, *args, **kwargs)

    def snapshot(self):
        return {**super().snapshot(), "sampled_digest": self._digest.hexdigest()}


class BrokenRegistryProposer(logitspec.LogitSpecProposer):
    """A vLLM whose attention backend registry rejects the override (its API changed):
    the engine must run in chain mode."""

    def __init__(self, vllm_config):
        from vllm.v1.attention.backends import registry

        def register_backend(*args, **kwargs):
            raise TypeError("register_backend() got an unexpected keyword argument")

        registry.register_backend = register_backend
        super().__init__(vllm_config)
