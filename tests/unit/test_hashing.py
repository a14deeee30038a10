# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest
import xxhash

from vllm_echo.algos.hashing import xxh64_tokens, xxh64_tokens_py


@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_xxh64_matches_xxhash_package_bit_for_bit(seed):
    rng = np.random.default_rng(seed % 1000)
    # every length through two 32-byte stripes, plus long inputs
    for n in list(range(0, 40)) + [64, 257]:
        tokens = rng.integers(-2**31, 2**31 - 1, n, dtype=np.int64).astype(np.int32)
        expected = xxhash.xxh64_intdigest(tokens.astype("<i4").tobytes(), seed)
        assert xxh64_tokens_py(tokens, seed) == expected, n


def test_xxh64_of_a_window_hashes_only_that_window():
    tokens = np.arange(100, dtype=np.int32)
    got = int(xxh64_tokens(tokens, 10, 3, np.uint64(0)))
    assert got == xxhash.xxh64_intdigest(tokens[10:13].tobytes(), 0)
