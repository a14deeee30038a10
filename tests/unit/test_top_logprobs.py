# SPDX-License-Identifier: Apache-2.0
"""The compiled top-k and log-softmax of logits rows, against exact references."""

import numpy as np
import pytest

from vllm_echo.algos.top_logprobs import top_logprobs, top_logprobs_bfloat16


def _reference(logits: np.ndarray, rows, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable ranking (ties: the lower id first) and a float64 log-softmax."""
    picked = logits[rows].astype(np.float64)
    ids = np.argsort(-picked, axis=1, kind="stable")[:, :k]
    peak = picked.max(axis=1, keepdims=True)
    norm = peak + np.log(np.exp(picked - peak).sum(axis=1, keepdims=True))
    return ids, np.take_along_axis(picked, ids, axis=1) - norm


@pytest.mark.parametrize("scale", [0.5, 4.0, 20.0])
def test_matches_the_exact_top_k_and_log_softmax(scale):
    rng = np.random.default_rng(int(scale * 10))
    logits = (rng.standard_normal((5, 49152)) * scale).astype(np.float32)
    rows = np.array([4, 0, 2, 0])
    ids, logp = top_logprobs(logits, rows, 64)
    want_ids, want_logp = _reference(logits, rows, 64)
    assert ids.dtype == np.int32 and logp.dtype == np.float32
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(logp, want_logp, atol=1e-5, rtol=0)


def test_ties_rank_the_lower_id_first_and_any_order_of_values_works():
    logits = np.zeros((3, 50), np.float32)
    logits[0, [31, 7, 12]] = 2.0  # a tie at the top
    logits[1] = np.arange(50)  # ascending: every token displaces the heap's root
    logits[2] = np.arange(50)[::-1]
    ids, logp = top_logprobs(logits, [0, 1, 2], 5)
    assert ids.tolist() == [[7, 12, 31, 0, 1], [49, 48, 47, 46, 45], [0, 1, 2, 3, 4]]
    np.testing.assert_allclose(logp, _reference(logits, [0, 1, 2], 5)[1], atol=1e-5)


@pytest.mark.parametrize("k", [1, 8, 64])
def test_ties_across_blocks_of_a_full_vocabulary(k):
    # few distinct values: the k-th largest is tied in many blocks, and only the
    # lower ids of the tie may enter
    rng = np.random.default_rng(k)
    logits = rng.integers(0, 6, (2, 49152)).astype(np.float32)
    logits[1, rng.integers(0, 49152, 200)] = 7.0
    logits[1, -3:] = 9.0  # the best tokens in the last, partial block of the row
    logits = np.concatenate([logits, np.zeros((2, 5), np.float32)], axis=1)
    ids, logp = top_logprobs(logits, [0, 1], k)
    want_ids, want_logp = _reference(logits, [0, 1], k)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(logp, want_logp, atol=1e-5, rtol=0)


@pytest.mark.parametrize("scale", [0.5, 20.0])
def test_bfloat16_bits_give_the_result_of_their_float32_values(scale):
    rng = np.random.default_rng(7)
    exact = (rng.standard_normal((3, 49152)) * scale).astype(np.float32)
    bits = (exact.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 by truncation
    bits[1, 100:300] = 0xFF80  # -inf: masked tokens
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    rows = np.array([2, 1, 2])
    ids, logp = top_logprobs_bfloat16(bits, rows, 64)
    want_ids, want_logp = top_logprobs(widened, rows, 64)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(logp, want_logp)
    with pytest.raises(ValueError, match="uint16"):
        top_logprobs_bfloat16(bits.astype(np.int16), rows, 64)


def test_masked_tokens_carry_no_mass_and_k_is_capped_by_the_vocabulary():
    logits = np.array([[-np.inf, 1.0, -np.inf, 0.0]], np.float32)
    ids, logp = top_logprobs(logits, [0], 8)
    assert ids.tolist() == [[1, 3, 0, 2]]
    np.testing.assert_allclose(logp[0, :2], np.log([np.e / (np.e + 1), 1 / (np.e + 1)]),
                               atol=1e-6)
    assert np.isneginf(logp[0, 2:]).all()


def test_no_distribution_gives_nan_not_an_error():
    ids, logp = top_logprobs(np.full((1, 3), -np.inf, np.float32), [0], 2)
    assert ids.shape == (1, 2) and np.isnan(logp).all()


@pytest.mark.parametrize("logits, rows, k, message", [
    (np.zeros((2, 4), np.float64), [0], 2, "float32"),
    (np.zeros(4, np.float32), [0], 2, "2-D"),
    (np.zeros((2, 4), np.float32), [2], 2, "rows"),
    (np.zeros((2, 4), np.float32), [0], 0, "k must be"),
])
def test_bad_input_is_named(logits, rows, k, message):
    with pytest.raises(ValueError, match=message):
        top_logprobs(logits, rows, k)
