# SPDX-License-Identifier: Apache-2.0
import pytest

from vllm_echo.config import EchoSettings


def test_defaults_follow_the_logitspec_reference():
    s = EchoSettings()
    assert (s.max_ngram, s.span, s.topk, s.capacity) == (3, 20, 64, 64)


def test_echo_matches_longer_m_grams_unless_told():
    assert EchoSettings.from_dict({"method": "echo"}).max_ngram == 8
    assert EchoSettings.from_dict({"method": "echo", "max_ngram": 3}).max_ngram == 3
    assert EchoSettings.from_dict({"method": "logitspec"}).max_ngram == 3
    settings = EchoSettings.from_dict({"method": "echo"})
    assert EchoSettings.from_dict(settings.to_dict()) == settings


@pytest.mark.parametrize("raw,words", [
    ({"method": "logitspec", "spam": 1}, ["unknown key", "'spam'", "allowed", "max_ngram"]),
    ({"method": "logitspec", "max_ngram": "3"}, ["max_ngram", "'3'", "integer"]),
    ({"method": "logitspec", "max_ngram": True}, ["max_ngram", "integer"]),
    ({"method": "logitspec", "span": 0}, ["span=0", "out of range", "allowed"]),
    ({"method": "logitspec", "topk": -1}, ["topk=-1", "allowed"]),
    ({"method": "logitspec", "capacity": 1}, ["capacity=1", "[2, 129]"]),
    ({"method": "logitspec", "tree": "yes"}, ["tree='yes'", "true or false"]),
    ({"method": "logitspec", "tree_attention": "cuda"}, ["tree_attention='cuda'",
                                                         "'native' or 'flex'"]),
    ({"method": "logitspec", "k_max": 8}, ["'k_max'", "method 'echo' only"]),
    ({"method": "echo", "k_max": 0}, ["k_max=0", "integer >= 1"]),
    ({"method": "echo", "k_max": True}, ["k_max=True", "integer >= 1"]),
    # the old core's settings are gone: unknown keys, with the ones allowed listed
    ({"method": "echo", "calibration_steps": 64}, ["unknown key", "'calibration_steps'",
                                                   "allowed", "k_max"]),
    ({"method": "echo", "delta": 0.7, "gating": "dense"}, ["'delta', 'gating'"]),
    ({"method": "logitspec", "num_speculative_tokens": 0}, ["num_speculative_tokens=0"]),
    ({"method": "medusa"}, ["method='medusa'", "logitspec, echo"]),
])
def test_bad_input_names_key_value_and_what_is_allowed(raw, words):
    with pytest.raises(ValueError) as err:
        EchoSettings.from_dict(raw)
    for word in words:
        assert word in str(err.value)


def test_topk_larger_than_vocabulary_is_rejected():
    with pytest.raises(ValueError, match=r"topk=64 is larger than the model's vocabulary \(50\)"):
        EchoSettings().check_vocab(50)


@pytest.mark.parametrize("method", ["logitspec", "echo"])
def test_round_trip_through_dict(method):
    s = EchoSettings(method=method, num_speculative_tokens=7, span=5)
    assert EchoSettings.from_dict(s.to_dict()) == s
