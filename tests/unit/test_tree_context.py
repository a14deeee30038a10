# SPDX-License-Identifier: Apache-2.0
"""Each engine's tree state (tree_state.TreeContext) stays its own: two runners in one
process, each with its hooks and context, prepare, verify and count only their own
trees (no vLLM engine: stand-in runners with the attributes the hooks read)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm.v1.outputs import SamplerOutput

from vllm_echo.plugin.runner.last_logits import LastLogitsTopK
from vllm_echo.plugin.runner.sample_hook import install_sample_hook
from vllm_echo.plugin.runner.prepare_hook import install_prepare_hook
from vllm_echo.plugin.runner.tree_verdicts import finish_tree_step
from vllm_echo.plugin.runner.tree_state import (AcceptedPaths, StepTrees, TreeAttention,
                                                TreeContext, TreeDraft, attach_to_runner,
                                                context_of_runner, tree_rows)

VOCAB = 32
CONTEXT_LEN = 5  # tokens of the request already in the KV cache
# root -> n0 -> n1, and root -> n2: rows 0 (root), 1, 2, 3 of the step
PARENTS = np.array([-1, 0, -1], dtype=np.int32)


class StandInRunner:
    """One greedy request in the batch; ``_sample`` (the rejection sampler's call)
    returns vLLM's chain sample of the root."""

    def __init__(self, req_id: str):
        self.req_id = req_id
        self.positions = torch.zeros(8, dtype=torch.long)
        self.query_start_loc = SimpleNamespace(np=np.array([0, 4]))
        self.input_batch = SimpleNamespace(
            req_ids=[req_id], req_id_to_index={req_id: 0},
            num_computed_tokens_cpu=np.array([CONTEXT_LEN]),
            sampling_metadata=SimpleNamespace(all_greedy=True, max_num_logprobs=None,
                                              logprob_token_ids=None, no_penalties=True,
                                              allowed_token_ids_mask=None,
                                              bad_words_token_ids={},
                                              logitsprocs=SimpleNamespace(
                                                  non_argmax_invariant=[])),
            update_async_output_token_ids=lambda: None)
        self.requests = {req_id: SimpleNamespace(
            sampling_params=SimpleNamespace(min_tokens=0, logit_bias=None))}
        self.rejection_sampler = SimpleNamespace(synthetic_mode=False)
        self.rejection_sampler_calls = 0

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        return "prepared"

    def _sample(self, logits, spec_decode_metadata):
        self.rejection_sampler_calls += 1
        sampled = torch.full((1, 4), -1, dtype=torch.int32)
        sampled[0, 0] = int(logits[0].argmax())
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None)


def _counts(context: TreeContext) -> dict[str, int]:
    return {k: context.counters[k]
            for k in ("tree_verifications", "tree_compactions", "greedy_verified_steps")}


def _hooked(req_id: str, tree_context: TreeContext, compactions: list) -> StandInRunner:
    runner = StandInRunner(req_id)

    def compact(tree, row_offset, path, step):
        compactions.append((tree.req_id, path))

    def fail(where, exc):
        raise AssertionError(f"{where}: {exc}")

    install_prepare_hook(runner, tree_context, fail, fail)
    install_sample_hook(runner, tree_context, LastLogitsTopK(2), fail, fail, compact=compact)
    return runner


def _schedule(runner: StandInRunner, token_ids: list[int]):
    scheduler_output = SimpleNamespace(scheduled_spec_decode_tokens={runner.req_id: token_ids})
    return runner._prepare_inputs(scheduler_output, np.array([4]))


def _logits(argmax_per_row: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(argmax_per_row), VOCAB)
    logits[torch.arange(len(argmax_per_row)), argmax_per_row] = 1.0
    return logits


def _sample(runner: StandInRunner, argmax_per_row: list[int],
            draft_ids: tuple[int, ...] = (10, 11, 20)) -> list[int]:
    metadata = SimpleNamespace(max_spec_len=3, num_draft_tokens=[3],
                               draft_token_ids=torch.tensor(draft_ids, dtype=torch.int32),
                               target_logits_indices=torch.tensor([0, 1, 2]),
                               bonus_logits_indices=torch.tensor([3]))
    output = runner._sample(_logits(argmax_per_row), metadata)
    return output.sampled_token_ids[0].tolist()


def test_two_engines_keep_their_own_trees_steps_verdicts_and_counters():
    context_a, context_b = TreeContext(accepted_paths=AcceptedPaths(record=True)), TreeContext()
    compactions: list = []
    runner_a = _hooked("a", context_a, compactions)
    runner_b = _hooked("b", context_b, compactions)
    assert context_of_runner(runner_a) is context_a and context_of_runner(runner_b) is context_b

    context_a.trees["a"] = TreeDraft(np.array([10, 11, 20], dtype=np.int32), PARENTS)
    context_b.trees["b"] = TreeDraft(np.array([30, 31, 40], dtype=np.int32), PARENTS)
    assert "b" not in context_a.trees and "a" not in context_b.trees

    assert _schedule(runner_a, [10, 11, 20]) == "prepared"
    assert [t.req_id for t in context_a.step.trees] == ["a"]
    assert context_b.step is None
    step_a = context_a.step
    _schedule(runner_b, [30, 31, 40])
    assert [t.req_id for t in context_b.step.trees] == ["b"]
    assert context_a.step is step_a  # B's step did not replace A's
    # RoPE positions base + depth, each on its own runner
    assert runner_a.positions[:4].tolist() == [5, 6, 7, 6]
    assert runner_b.positions[:4].tolist() == [5, 6, 7, 6]

    # A: the root's argmax is the second branch (node 2), whose row gives the bonus
    assert _sample(runner_a, [20, 0, 0, 7]) == [20, 7, -1, -1]
    assert context_a.step is None and context_b.step is not None
    assert _counts(context_a) == {"tree_verifications": 1, "tree_compactions": 1,
                                  "greedy_verified_steps": 1}
    assert _counts(context_b) == {"tree_verifications": 0, "tree_compactions": 0,
                                  "greedy_verified_steps": 0}
    assert context_a.accepted_paths.by_request == {"a": [2]}
    assert runner_a.rejection_sampler_calls == 0  # a step of greedy trees only

    # B: the first branch, already in place
    assert _sample(runner_b, [30, 31, 9, 0]) == [30, 31, 9, -1]
    assert context_b.step is None
    assert _counts(context_b) == {"tree_verifications": 1, "tree_compactions": 0,
                                  "greedy_verified_steps": 1}
    assert _counts(context_a) == {"tree_verifications": 1, "tree_compactions": 1,
                                  "greedy_verified_steps": 1}
    assert context_b.accepted_paths.by_request == {}  # B's proposer asked for no verdicts
    assert compactions == [("a", [2]), ("b", [0, 1])]  # each step compacts its own tree


def test_a_context_without_trees_leaves_the_step_empty():
    context = TreeContext()
    runner = _hooked("a", context, [])
    _schedule(runner, [10, 11, 20])
    assert context.step is None
    # the drafts read as a chain, verified greedily without the rejection sampler
    assert _sample(runner, [20, 0, 0, 7]) == [20, -1, -1, -1]
    assert _sample(runner, [10, 11, 0, 7]) == [10, 11, 0, -1]
    assert runner.rejection_sampler_calls == 0
    runner.input_batch.sampling_metadata.no_penalties = False  # vLLM's own verdict then
    assert _sample(runner, [20, 0, 0, 7]) == [20, -1, -1, -1]
    assert runner.rejection_sampler_calls == 1
    assert _counts(context) == {"tree_verifications": 0, "tree_compactions": 0,
                                "greedy_verified_steps": 2}


def test_a_flex_step_whose_mask_was_never_built_accepts_no_draft():
    context = TreeContext(attention=TreeAttention(mode="flex"))
    draft = TreeDraft(np.array([10, 11, 20], dtype=np.int32), PARENTS)
    rows = tree_rows("a", 0, 0, CONTEXT_LEN, draft, [10, 11, 20])
    context.step = StepTrees([rows], torch.arange(4))  # mask_tables never set
    sampled = torch.tensor([[10, 11, 3, -1]])  # vLLM's chain verdict over causal rows
    errors = []
    metadata = SimpleNamespace(num_draft_tokens=[3], bonus_logits_indices=torch.tensor([3]))
    finish_tree_step(context, _logits([10, 11, 3, 0]), metadata, sampled, ["a"],
                     lambda *args: None, lambda where, exc: errors.append(where),
                     SimpleNamespace(all_greedy=True))
    assert sampled[0].tolist() == [10, -1, -1, -1]  # only the root's sample stands
    assert errors == ["tree step"]
    assert context.counters["tree_verifications"] == 0


def test_attention_metadata_finds_the_context_of_the_engine_whose_builders_made_it():
    """FLEX_ATTENTION's mask hook has no reference to its engine: the metadata holds its
    builder's persistent_doc_ids, which attach_to_builders maps to the engine's context."""
    flex_attention = pytest.importorskip("vllm.v1.attention.backends.flex_attention")
    from vllm_echo.plugin.attention.flex_tree_attention import _context_of, attach_to_builders

    def runner_with_builder():
        builder = flex_attention.FlexAttentionMetadataBuilder.__new__(
            flex_attention.FlexAttentionMetadataBuilder)  # no vLLM state: the buffer only
        builder.persistent_doc_ids = torch.zeros(8, dtype=torch.int32)
        group = SimpleNamespace(metadata_builders=[builder])
        return SimpleNamespace(attn_groups=[[group]]), builder

    (runner_a, builder_a), (runner_b, builder_b) = runner_with_builder(), runner_with_builder()
    context_a, context_b = TreeContext(), TreeContext()
    assert attach_to_builders(runner_a, context_a) is None
    assert attach_to_builders(runner_b, context_b) is None
    metadata = lambda builder: SimpleNamespace(persistent_doc_ids=builder.persistent_doc_ids)
    assert _context_of(metadata(builder_a)) is context_a
    assert _context_of(metadata(builder_b)) is context_b
    other = SimpleNamespace(persistent_doc_ids=torch.zeros(8, dtype=torch.int32))
    assert _context_of(other) is None  # another engine's metadata: vLLM's mask only
    assert attach_to_builders(SimpleNamespace(attn_groups=[]), context_a) is not None


def test_cpu_tree_attention_reads_the_step_of_its_own_engine():
    cpu_tree_attention = pytest.importorskip("vllm_echo.plugin.attention.cpu_tree_attention")
    impl_cls = cpu_tree_attention.TreeCPUAttentionImpl
    # impls are built by vLLM; only the context lookup is exercised here
    impl_a, impl_b, impl_other = (impl_cls.__new__(impl_cls) for _ in range(3))
    context_a, context_b = TreeContext(), TreeContext()
    impl_a.tree_context, impl_b.tree_context = context_a, context_b
    context_a.step = StepTrees([], torch.arange(0))
    assert impl_a._tree_step() is context_a.step
    assert impl_b._tree_step() is None
    assert impl_other._tree_step() is None  # an engine without trees: plain CPU_ATTN
