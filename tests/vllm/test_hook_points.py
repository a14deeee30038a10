# SPDX-License-Identifier: Apache-2.0
"""The runner hook points as the installed vLLM declares them, and how the probe
judges a changed signature (no engine: signatures only)."""

import functools
import inspect

from vllm_echo.plugin.runner.access import (PREPARE_PARAMS, SAMPLE_PARAMS, ArgumentReader,
                                           signature_drift)


def test_installed_vllm_matches_the_hooks():
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    # bound the way load_model sees them (self given)
    assert signature_drift(functools.partial(CPUModelRunner._sample, None), SAMPLE_PARAMS) is None
    assert signature_drift(functools.partial(CPUModelRunner._prepare_inputs, None),
                           PREPARE_PARAMS) is None


def test_installed_vllm_runs_the_probe_forward_with_attention():
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from vllm_echo.plugin.runner.cost_probe import accepts

    assert accepts(CPUModelRunner._dummy_run, "force_attention")
    assert not accepts(lambda num_tokens: None, "force_attention")
    assert accepts(lambda num_tokens, **kwargs: None, "force_attention")
    assert not accepts(None, "force_attention")


def test_signature_drift_and_argument_lookup():
    def renamed(logits, spec_metadata):
        pass

    def new_optional(logits, spec_decode_metadata, *, options=None):
        pass

    def new_required(logits, spec_decode_metadata, *, options):
        pass

    assert "does not start with" in signature_drift(renamed, SAMPLE_PARAMS)
    assert signature_drift(new_optional, SAMPLE_PARAMS) is None
    assert "new required parameters ['options']" in signature_drift(new_required, SAMPLE_PARAMS)
    assert signature_drift(None, SAMPLE_PARAMS) == "missing"

    read = ArgumentReader(inspect.signature(new_optional), SAMPLE_PARAMS)
    for _ in range(2):  # the second time from what the first call of each shape found
        assert read((1, 2), {}) == (1, 2)
        assert read(("a", "b"), {}) == ("a", "b")
        assert read((1, ), {"spec_decode_metadata": 2, "options": 3}) == (1, 2)
        assert read((), {"options": 3, "spec_decode_metadata": 2, "logits": 1}) == (1, 2)
        assert read((1, 2, 3), {}) is None  # not a call of it
        assert read((1, ), {"logits": 2}) is None  # logits twice
        assert read((1, 2), {"unknown": 3}) is None
    assert ArgumentReader(inspect.signature(renamed), SAMPLE_PARAMS)((1, 2), {}) is None
