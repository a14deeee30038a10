# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.tree import path_to
from vllm_echo.algos.verify import verify_greedy, verify_greedy_chains, verify_sampling

# LogitSpec-style tree: chain [c1, c2, c3], branch [x, y], branch [z].
C1, C2, C3, X, Y, Z = 10, 11, 12, 20, 21, 30
LOGITSPEC_TOKENS = [C1, C2, C3, X, Y, Z]
LOGITSPEC_PARENTS = [-1, 0, 1, -1, 3, -1]

# Upper 1e-4 quantile of the standard normal, for the chi-square threshold.
Z_1E4 = 3.719


# ----------------------------------------------------------------- greedy ---


def logitspec_argmax(**rows):
    """argmax over rows [root, c1, c2, c3, x, y, z]; unset rows predict 99."""
    names = ["root", "c1", "c2", "c3", "x", "y", "z"]
    return [rows.get(name, 99) for name in names]


@pytest.mark.parametrize("argmax, path, next_token", [
    (logitspec_argmax(root=C1, c1=C2, c2=C3, c3=42), [0, 1, 2], 42),
    (logitspec_argmax(root=C1, c1=C2, c2=7), [0, 1], 7),
    (logitspec_argmax(root=C1, c1=55), [0], 55),
    (logitspec_argmax(root=X, x=Y, y=42), [3, 4], 42),
    (logitspec_argmax(root=X, x=C2), [3], C2),
    (logitspec_argmax(root=Z, z=8), [5], 8),
    (logitspec_argmax(root=77), [], 77),
])
def test_greedy_logitspec(argmax, path, next_token):
    assert verify_greedy(LOGITSPEC_TOKENS, LOGITSPEC_PARENTS,
                         argmax) == (path, next_token)


def test_greedy_empty_tree_returns_root_argmax():
    assert verify_greedy([], [], [4]) == ([], 4)


def test_greedy_rejected_parent_blocks_matching_child():
    # Node 1 matches its parent's row but node 0 itself is rejected.
    assert verify_greedy([1, 2], [-1, 0], [3, 2, 0]) == ([], 3)


def test_greedy_tie_goes_to_smallest_last_index():
    assert verify_greedy([5, 5], [-1, -1], [5, 8, 9]) == ([0], 8)
    # Two depth-2 paths both match; node 2 < node 3 ends the winner.
    assert verify_greedy([5, 5, 6, 6], [-1, -1, 0, 1],
                         [5, 6, 6, 1, 2]) == ([0, 2], 1)


def test_greedy_prefers_deeper_path_over_smaller_index():
    # Node 0 and node 1 both match; only node 1 has a matching child.
    assert verify_greedy([5, 5, 7], [-1, -1, 1], [5, 9, 7, 3]) == ([1, 2], 3)


def test_greedy_rejects_wrong_argmax_length():
    with pytest.raises(ValueError, match="target_argmax"):
        verify_greedy([1, 2], [-1, 0], [1, 2])


def brute_force_greedy(tokens, parents, argmax):
    """Check every node's full path; longest wins, then smallest index."""
    best_path, best_node = [], -1
    for j in range(len(tokens)):
        path = path_to(parents, j)
        rows = [0] + [node + 1 for node in path[:-1]]
        if all(tokens[node] == argmax[row] for node, row in zip(path, rows)):
            if len(path) > len(best_path):
                best_path, best_node = path, j
    return best_path, argmax[best_node + 1]


def test_greedy_random_trees_match_brute_force():
    rng = np.random.default_rng(1)
    for n in [1, 3, 8, 30]:
        for _ in range(50):
            parents = [int(rng.integers(-1, j)) for j in range(n)]
            tokens = rng.integers(0, 3, size=n).tolist()
            argmax = rng.integers(0, 3, size=n + 1).tolist()
            assert verify_greedy(tokens, parents, argmax) == \
                brute_force_greedy(tokens, parents, argmax)


# --------------------------------------------------------------- sampling ---


class PrefixModel:
    """Synthetic target: a fixed next-token distribution per prefix.

    Distributions are drawn lazily and memoised, so repeated prefixes (such
    as duplicate sibling tokens) always see identical rows, as they would
    with a real model. Some entries are zeroed to mimic top-k/top-p.
    """

    def __init__(self, vocab_size, seed):
        self.vocab_size = vocab_size
        self._rng = np.random.default_rng(seed)
        self._rows = {}

    def probs(self, prefix):
        prefix = tuple(prefix)
        if prefix not in self._rows:
            p = self._rng.dirichlet(np.full(self.vocab_size, 0.8))
            p[self._rng.random(self.vocab_size) < 0.2] = 0.0
            if p.sum() == 0.0:
                p[self._rng.integers(self.vocab_size)] = 1.0
            self._rows[prefix] = p / p.sum()
        return self._rows[prefix]

    def tree_rows(self, tokens, parents):
        rows = [self.probs(())]
        for j in range(len(tokens)):
            rows.append(self.probs([tokens[i] for i in path_to(parents, j)]))
        return np.stack(rows)


def chi_square_threshold(dof):
    # Wilson-Hilferty approximation of the upper 1e-4 chi-square quantile.
    k = float(dof)
    return k * (1 - 2 / (9 * k) + Z_1E4 * np.sqrt(2 / (9 * k)))**3


def assert_matches(observed, expected_probs):
    """Chi-square goodness of fit; impossible cells must stay empty."""
    observed = np.asarray(observed, dtype=np.float64).ravel()
    expected = np.asarray(expected_probs, dtype=np.float64).ravel()
    expected = expected * observed.sum()
    possible = expected > 0
    assert observed[~possible].sum() == 0, "sampled a zero-probability event"
    stat = ((observed[possible] - expected[possible])**2 /
            expected[possible]).sum()
    threshold = chi_square_threshold(possible.sum() - 1)
    assert stat < threshold, f"chi2 = {stat:.1f} >= {threshold:.1f}"
    return stat


def sample_two_tokens(model, tokens, parents, num_samples, seed):
    """Counts of (first, second) emitted tokens over repeated verification.

    When only one token is emitted the second comes from the next engine
    step, i.e. the target distribution after the first token.
    """
    rows = model.tree_rows(tokens, parents)
    verify_rng = np.random.default_rng(seed)
    next_step_rng = np.random.default_rng(seed + 1)
    counts = np.zeros((model.vocab_size, model.vocab_size), dtype=np.int64)
    for _ in range(num_samples):
        path, next_token = verify_sampling(tokens, parents, rows, verify_rng)
        emitted = [tokens[node] for node in path] + [next_token]
        if len(emitted) == 1:
            emitted.append(
                next_step_rng.choice(model.vocab_size,
                                     p=model.probs(emitted)))
        counts[emitted[0], emitted[1]] += 1
    return counts


def expected_two_tokens(model):
    first = model.probs(())
    return np.stack([first[x] * model.probs([x]) for x in range(len(first))])


VOCAB_SIZE = 6

SAMPLING_TREES = {
    "star": ([0, 1, 2], [-1, -1, -1]),
    "chain": ([3, 3, 3], [-1, 0, 1]),
    # c1 and z share token 1, so the second root child with token 1 is
    # never visited.
    "logitspec": ([1, 2, 3, 4, 0, 1], LOGITSPEC_PARENTS),
    "duplicate_siblings": ([2, 2, 4, 2, 1, 3, 5, 1],
                           [-1, -1, -1, -1, 0, 1, 2, 4]),
    "covers_vocab": ([0, 1, 2, 3, 4, 5, 0, 0], [-1, -1, -1, -1, -1, -1, 0, 1]),
}


@pytest.mark.parametrize("name", sorted(SAMPLING_TREES))
def test_sampling_preserves_two_step_marginals(name):
    tokens, parents = SAMPLING_TREES[name]
    model = PrefixModel(VOCAB_SIZE, seed=sum(map(ord, name)))
    counts = sample_two_tokens(model, tokens, parents, 12_000, seed=7)
    expected = expected_two_tokens(model)
    assert_matches(counts.sum(axis=1), expected.sum(axis=1))
    assert_matches(counts, expected)


def test_chi_square_check_detects_a_wrong_distribution():
    # Power check: the same sample size must reject a modestly wrong target.
    tokens, parents = SAMPLING_TREES["duplicate_siblings"]
    model = PrefixModel(VOCAB_SIZE, seed=3)
    counts = sample_two_tokens(model, tokens, parents, 12_000, seed=7)
    first = model.probs(())
    wrong = 0.9 * first + 0.1 * (first > 0) / (first > 0).sum()
    with pytest.raises(AssertionError, match="chi2"):
        assert_matches(counts.sum(axis=1), wrong)


def test_sampling_accepts_certain_token_and_continues():
    probs = np.array([
        [0.0, 0.0, 1.0, 0.0],  # root: certainly token 2
        [0.5, 0.5, 0.0, 0.0],  # after node 0 (token 1): never reached
        [0.0, 0.0, 0.0, 1.0],  # after node 1 (token 2): certainly token 3
    ])
    rng = np.random.default_rng(0)
    for _ in range(50):
        assert verify_sampling([1, 2], [-1, -1], probs, rng) == ([1], 3)


def test_sampling_never_accepts_zero_probability_drafts():
    probs = np.array([[0.0, 0.0, 0.3, 0.7], [1, 0, 0, 0], [1, 0, 0, 0]])
    rng = np.random.default_rng(0)
    outcomes = {(tuple(path), token) for path, token in (
        verify_sampling([0, 1], [-1, -1], probs, rng) for _ in range(200))}
    assert outcomes == {((), 2), ((), 3)}


def test_sampling_when_drafts_cover_all_mass():
    # Rejecting token 0 leaves all residual mass on token 1: accept it.
    probs = np.array([[0.5, 0.5, 0.0], [0, 0, 1.0], [0, 0, 1.0]])
    rng = np.random.default_rng(0)
    outcomes = {(tuple(path), token) for path, token in (
        verify_sampling([0, 1], [-1, -1], probs, rng) for _ in range(200))}
    assert outcomes == {((0, ), 2), ((1, ), 2)}


def test_sampling_empty_tree_samples_root_row():
    probs = np.array([[0.0, 1.0, 0.0]])
    assert verify_sampling([], [], probs, np.random.default_rng(0)) == ([], 1)


def test_sampling_rejects_bad_shapes():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="target_probs"):
        verify_sampling([1], [-1], np.ones((1, 4)) / 4, rng)
    with pytest.raises(ValueError, match="vocabulary"):
        verify_sampling([9], [-1], np.ones((2, 4)) / 4, rng)
    with pytest.raises(ValueError, match="no probability mass"):
        verify_sampling([1], [-1], np.zeros((2, 4)), rng)


def test_sampling_is_reproducible_with_seed():
    tokens, parents = SAMPLING_TREES["logitspec"]
    rows = PrefixModel(VOCAB_SIZE, seed=0).tree_rows(tokens, parents)
    runs = [[
        verify_sampling(tokens, parents, rows, rng)
        for _ in range(20)
    ] for rng in (np.random.default_rng(5), np.random.default_rng(5))]
    assert runs[0] == runs[1]


def test_expected_two_tokens_is_a_distribution():
    model = PrefixModel(VOCAB_SIZE, seed=0)
    np.testing.assert_allclose(expected_two_tokens(model).sum(), 1.0)


# ---------------------------------------------------------- greedy chains ---


def test_greedy_chains_keep_drafts_to_the_first_mismatch():
    # request 0: 3 drafts, 2 accepted; request 1: no draft; request 2: all accepted
    rows = verify_greedy_chains(draft_ids=[5, 6, 7, 8, 9], num_drafts=[3, 0, 2],
                                target_argmax=[5, 6, 1, 8, 9], last_tokens=[40, 41, 42],
                                width=4)
    assert rows.tolist() == [[5, 6, 1, -1], [41, -1, -1, -1], [8, 9, 42, -1]]


def test_greedy_chains_first_draft_rejected_gives_its_argmax():
    rows = verify_greedy_chains([5, 6], [2], [3, 6], [40], width=3)
    assert rows.tolist() == [[3, -1, -1]]


def test_greedy_chains_match_a_loop_on_random_batches():
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = rng.integers(0, 6, size=rng.integers(1, 7))
        drafts = rng.integers(0, 4, size=n.sum())
        argmax = np.where(rng.random(n.sum()) < 0.6, drafts, rng.integers(0, 4, size=n.sum()))
        last = rng.integers(100, 200, size=n.size)
        width = int(n.max()) + 1 + int(rng.integers(0, 2))
        rows = verify_greedy_chains(drafts, n, argmax, last, width)
        start = 0
        for i, k in enumerate(n):
            expected = []
            for j in range(k):
                expected.append(int(argmax[start + j]))
                if drafts[start + j] != argmax[start + j]:
                    break
            else:
                expected.append(int(last[i]))
            assert rows[i].tolist() == expected + [-1] * (width - len(expected))
            start += k


def test_greedy_chains_reject_bad_shapes():
    with pytest.raises(ValueError, match="entries"):
        verify_greedy_chains([1, 2], [3], [1, 2], [0], width=4)
    with pytest.raises(ValueError, match="width"):
        verify_greedy_chains([1, 2], [2], [1, 2], [0], width=2)
