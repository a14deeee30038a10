# SPDX-License-Identifier: Apache-2.0
"""The rejection sampler fixes: the torch expansion that replaces vLLM's broken CPU expand
kernel, the empty-row guard, the top-p from candidates and the noise for drafting requests."""

import pytest
import torch

from vllm_echo.plugin.runner.sampler_fixes import expand_batch_to_tokens


def test_expansion_follows_vllms_documented_example():
    # vLLM's docstring: x = [a, b, c], cu_num_tokens = [2, 5, 6] -> [a, a, b, b, b, c]
    got = expand_batch_to_tokens(torch.tensor([0.7, 0.5, 1.3]),
                                 torch.tensor([2, 5, 6], dtype=torch.int32), 6)
    assert torch.equal(got, torch.tensor([0.7, 0.7, 0.5, 0.5, 0.5, 1.3]))


def test_replacement_dtype_and_requests_without_drafts():
    # greedy temperature (-1) becomes 1 as in apply_sampling_constraints; requests with
    # no draft tokens contribute nothing; dtype is kept (int32 top-k stays int32)
    temps = expand_batch_to_tokens(torch.tensor([-1.0, 0.7, -1.0]),
                                   torch.tensor([1, 1, 3]), 3, replace_from=-1, replace_to=1)
    assert torch.equal(temps, torch.tensor([1.0, 1.0, 1.0]))
    top_k = expand_batch_to_tokens(torch.tensor([20, 0, 5], dtype=torch.int32),
                                   torch.tensor([0, 2, 3]), 3)
    assert top_k.dtype == torch.int32 and top_k.tolist() == [0, 0, 5]


def test_top_k_on_a_step_without_draft_tokens():
    # A step where no request has drafts gives the rejection sampler zero target rows;
    # vLLM's CPU top-k path takes max() of the empty k and raises. Guarded: rows
    # come back unchanged, and non-empty rows are still filtered by vLLM's function.
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    from vllm_echo.plugin.runner.sampler_fixes import skipping_empty_rows

    empty, no_k = torch.empty(0, 8), torch.empty(0, dtype=torch.int32)
    with pytest.raises(RuntimeError):
        apply_top_k_top_p(empty.clone(), no_k, None)
    guarded = skipping_empty_rows(apply_top_k_top_p)
    assert guarded(empty, no_k, None).shape == (0, 8)
    row = torch.arange(8, dtype=torch.float32).unsqueeze(0)
    kept = guarded(row.clone(), torch.tensor([2], dtype=torch.int32), None)
    assert torch.isfinite(kept).sum() == 2 and torch.isfinite(kept[0, 6:]).all()


def _module(**functions):
    import types

    module = types.ModuleType("rejection_sampler_stand_in")
    module.__dict__.update(functions)
    return module


def test_patching_replaces_both_functions_once():
    # vLLM 0.32's signatures (the fresh-interpreter test below patches vLLM's module)
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    from vllm_echo.plugin.runner import sampler_fixes

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        raise AssertionError("replaced")

    module = _module(apply_top_k_top_p=apply_top_k_top_p,
                     expand_batch_to_tokens=expand_batch_to_tokens,
                     sample_recovered_tokens=_recovered_tokens)
    sampler_fixes.patch_rejection_sampler(module)
    assert module.expand_batch_to_tokens is sampler_fixes.expand_batch_to_tokens  # CPU here
    assert module.sample_recovered_tokens.__wrapped__ is _recovered_tokens
    guarded = module.apply_top_k_top_p
    # the empty-row guard around the top-p from candidates (CPU here) around vLLM's
    assert guarded.__wrapped__.__wrapped__ is apply_top_k_top_p
    sampler_fixes.patch_rejection_sampler(module)  # idempotent: not wrapped twice
    assert module.apply_top_k_top_p is guarded


def test_a_changed_vllm_keeps_its_functions_with_one_log_line(caplog, monkeypatch):
    from vllm_echo.plugin.runner import sampler_fixes

    monkeypatch.setattr(sampler_fixes, "_reported", set())

    def apply_top_k_top_p(logits, top_k, top_p):  # renamed parameters
        return logits

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0,
                               out=None):  # a new parameter
        return x

    def sample_recovered_tokens(max_spec_len, num_tokens, *args):  # renamed parameter
        return None

    module = _module(apply_top_k_top_p=apply_top_k_top_p,
                     expand_batch_to_tokens=expand_batch_to_tokens,
                     sample_recovered_tokens=sample_recovered_tokens)
    with caplog.at_level("WARNING", logger="vllm.vllm_echo"):
        sampler_fixes.patch_rejection_sampler(module)
        sampler_fixes.patch_rejection_sampler(module)
        sampler_fixes.patch_rejection_sampler(_module())  # names gone
    assert module.apply_top_k_top_p is apply_top_k_top_p
    assert module.expand_batch_to_tokens is expand_batch_to_tokens
    assert module.sample_recovered_tokens is sample_recovered_tokens
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines  # one per function, not one per call
    assert "apply_top_k_top_p" in lines[0] and "sample_recovered_tokens" in lines[1]
    assert "expand_batch_to_tokens" in lines[2]


def test_installed_before_vllm_imports_the_sampler():
    """In a fresh interpreter, as in a vLLM process where the plugin loads first:
    installing imports no vLLM module, and vLLM's import of the rejection sampler
    comes back patched (the hook then leaves sys.meta_path)."""
    import subprocess
    import sys

    code = """
import sys
from vllm_echo.plugin.runner import sampler_fixes as f
f.install_sampler_fixes()
f.install_sampler_fixes()  # idempotent: one hook
hooks = [x for x in sys.meta_path if isinstance(x, f._PatchOnImport)]
assert len(hooks) == 1 and not any(m.startswith("vllm.") for m in sys.modules), sys.modules
from vllm.v1.sample import rejection_sampler as rs
assert rs.expand_batch_to_tokens is f.expand_batch_to_tokens
assert getattr(rs.apply_top_k_top_p, f._MARK)
assert getattr(rs.sample_recovered_tokens, f._MARK)
assert not any(isinstance(x, f._PatchOnImport) for x in sys.meta_path)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("scale", [0.3, 1.0, 4.0, 12.0, 40.0])
def test_top_p_from_candidates_keeps_the_tokens_vllms_sort_keeps(scale):
    # Continuous random logits (no ties) from flat (the nucleus is most of the
    # vocabulary: vLLM's sort decides) to peaked (a few tokens: the candidates decide),
    # p from 0.1 to 1, -inf entries as a grammar mask leaves them; the kept tokens
    # are exactly vLLM's.
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    from vllm_echo.plugin.runner.nucleus import nucleus_thresholds, top_p_from_candidates

    generator = torch.Generator().manual_seed(int(scale * 10))
    logits = torch.randn(6, 49152, generator=generator) * scale
    logits[2, ::3] = -float("inf")
    p = torch.tensor([0.95, 0.1, 0.9, 1.0, 0.5, 0.99])
    expected = apply_top_k_top_p_pytorch(logits.clone(), None, p.clone())
    got = top_p_from_candidates(apply_top_k_top_p_pytorch)(logits.clone(), None, p.clone())
    assert torch.equal(torch.isfinite(got), torch.isfinite(expected))
    assert torch.equal(got[torch.isfinite(got)], logits[torch.isfinite(expected)])
    _, decided = nucleus_thresholds(logits, p)
    assert not decided[3]  # p = 1 keeps everything: vLLM's function
    if scale >= 12.0:  # peaked rows are decided without the sort
        assert decided[[0, 1, 4]].all()


def test_top_p_from_candidates_hands_other_calls_to_vllm():
    # top-k (with or without top-p), no top-p and zero rows all go to the fallback,
    # with the same arguments; a top-p-only call on rows that fit does not.
    from vllm_echo.plugin.runner.nucleus import top_p_from_candidates

    calls = []

    def fallback(logits, k, p):
        calls.append((logits.shape[0], k is None, p is None))
        return logits

    apply = top_p_from_candidates(fallback)
    peaked = torch.zeros(2, 1000)
    peaked[:, 7] = 50.0
    apply(peaked.clone(), torch.tensor([5, 5]), torch.tensor([0.9, 0.9]))
    apply(peaked.clone(), torch.tensor([5, 5]), None)
    apply(torch.zeros(0, 1000), None, torch.zeros(0))
    assert calls == [(2, False, False), (2, False, True), (0, True, False)]
    calls.clear()
    kept = apply(peaked.clone(), None, torch.tensor([0.9, 0.9]))
    assert calls == [] and torch.isfinite(kept).sum(dim=1).tolist() == [1, 1]
    mixed = torch.stack([peaked[0], torch.zeros(1000)])  # the flat row falls back alone
    apply(mixed, None, torch.tensor([0.9, 0.9]))
    assert calls == [(1, True, False)]


def _recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids,
                      draft_probs, target_probs, sampling_metadata, device):
    """vLLM 0.32's ``sample_recovered_tokens`` (rejection_sampler.py:678) without drafter
    probabilities, its kernel in torch (vLLM's dispatches only inside an engine): noise
    for every request, seeded rows redrawn from their generators, and at each draft
    position the argmax of the target's probabilities, the draft's zeroed, over the noise."""
    q = torch.empty((len(num_draft_tokens), target_probs.shape[-1]), device=device)
    q.exponential_()
    for i, generator in sampling_metadata.generators.items():
        if num_draft_tokens[i] > 0:
            q[i].exponential_(generator=generator)
    inv_q = q.reciprocal()
    out = torch.empty_like(draft_token_ids)
    start = 0
    for request, end in enumerate(cu_num_draft_tokens.tolist()):
        for t in range(start, end):
            probs = target_probs[t].clone()
            probs[draft_token_ids[t]] = 0
            out[t] = int((probs * inv_q[request]).argmax())
        start = end
    return out


def test_noise_for_drafting_requests_recovers_the_same_tokens():
    # Seeded requests 0-3, of which 1 and 3 have no drafts: the function on the whole
    # batch and the wrapped one (called on requests 0 and 2 only) draw the same noise
    # from each generator and recover the same token at every draft position.
    import dataclasses

    from vllm.v1.sample.rejection_sampler import sample_recovered_tokens

    from vllm_echo.plugin.runner.access import signature_drift
    from vllm_echo.plugin.runner.sampler_fixes import (RECOVERED_PARAMS,
                                                       noise_for_drafting_requests)

    assert signature_drift(sample_recovered_tokens, RECOVERED_PARAMS) is None  # vLLM 0.32's

    @dataclasses.dataclass
    class Metadata:  # the one field the function reads
        generators: dict

    def metadata(requests=4):
        return Metadata({i: torch.Generator().manual_seed(100 + i) for i in range(requests)})

    num_draft_tokens = [2, 0, 3, 0]
    cu = torch.tensor([2, 2, 5, 5], dtype=torch.int32)
    probs = torch.softmax(torch.randn(5, 1000, generator=torch.Generator().manual_seed(0)), -1)
    drafts = torch.tensor([3, 9, 27, 81, 243], dtype=torch.int32)
    calls = []

    def recording(max_spec_len, num_draft_tokens, *args, **kwargs):
        calls.append(list(num_draft_tokens))
        return _recovered_tokens(max_spec_len, num_draft_tokens, *args, **kwargs)

    cpu = torch.device("cpu")
    expected = _recovered_tokens(3, num_draft_tokens, cu, drafts, None, probs, metadata(), cpu)
    got = noise_for_drafting_requests(recording)(3, num_draft_tokens, cu, drafts, None, probs,
                                                 metadata(), cpu)
    assert calls == [[2, 3]]  # the noise was drawn for two requests, not four
    assert torch.equal(got, expected)
    # every request drafting: the call as it was
    noise_for_drafting_requests(recording)(1, [1, 1], torch.tensor([1, 2]), drafts[:2], None,
                                           probs[:2], metadata(2), cpu)
    assert calls[-1] == [1, 1]
