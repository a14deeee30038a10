# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from vllm_echo.algos.tree import (ancestor_mask, children_lists, in_place_prefix, is_chain,
                                  out_of_place, path_to, tree_depths, validate_parents,
                                  validate_tree)

# LogitSpec-style tree: chain [c1, c2, c3], branch [x, y], branch [z].
LOGITSPEC_PARENTS = [-1, 0, 1, -1, 3, -1]
CHAIN_PARENTS = [-1, 0, 1, 2]
STAR_PARENTS = [-1, -1, -1]


def brute_force_mask(parents):
    """Row r sees column c iff c is r or reachable by walking parents."""
    n = len(parents)
    mask = np.zeros((n + 1, n + 1), dtype=bool)
    mask[:, 0] = True
    for j in range(n):
        node = j
        while node != -1:
            mask[j + 1, node + 1] = True
            node = parents[node]
    return mask


@pytest.mark.parametrize("tokens, parents", [
    ([], []),
    ([5], [-1]),
    ([1, 2, 3], [-1, 0, 1]),
    ([1, 2, 3], [-1, -1, -1]),
    ([1, 2, 3, 4, 5, 6], LOGITSPEC_PARENTS),
    (np.array([7, 7], dtype=np.int32), np.array([-1, 0], dtype=np.int32)),
])
def test_validate_tree_accepts_well_formed(tokens, parents):
    validate_tree(tokens, parents)


@pytest.mark.parametrize("tokens, parents, message", [
    ([1, 2], [-1], "same length"),
    ([1], [0], r"parents\[0\]"),
    ([1, 2], [-1, 1], r"parents\[1\] = 1"),
    ([1, 2, 3], [-1, 2, 0], r"parents\[1\] = 2"),
    ([1, 2], [-1, -2], r"parents\[1\] = -2"),
    ([[1]], [[-1]], "1-D"),
    ([1.5], [-1], "integers"),
    ([1, -3], [-1, 0], "negative"),
])
def test_validate_tree_rejects_malformed(tokens, parents, message):
    with pytest.raises(ValueError, match=message):
        validate_tree(tokens, parents)


def test_depths():
    assert tree_depths([]).tolist() == []
    assert tree_depths(CHAIN_PARENTS).tolist() == [1, 2, 3, 4]
    assert tree_depths(STAR_PARENTS).tolist() == [1, 1, 1]
    assert tree_depths(LOGITSPEC_PARENTS).tolist() == [1, 2, 3, 1, 2, 1]
    assert tree_depths(LOGITSPEC_PARENTS).dtype == np.int32


def test_ancestor_mask_logitspec():
    expected = np.array([
        # root c1 c2 c3 x  y  z
        [1, 0, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0, 0],  # c1
        [1, 1, 1, 0, 0, 0, 0],  # c2
        [1, 1, 1, 1, 0, 0, 0],  # c3
        [1, 0, 0, 0, 1, 0, 0],  # x
        [1, 0, 0, 0, 1, 1, 0],  # y
        [1, 0, 0, 0, 0, 0, 1],  # z
    ], dtype=bool)
    np.testing.assert_array_equal(ancestor_mask(LOGITSPEC_PARENTS), expected)


def test_ancestor_mask_edge_cases():
    np.testing.assert_array_equal(ancestor_mask([]), [[True]])
    np.testing.assert_array_equal(ancestor_mask(CHAIN_PARENTS),
                                  np.tril(np.ones((5, 5), dtype=bool)))
    star = np.eye(4, dtype=bool)
    star[:, 0] = True
    np.testing.assert_array_equal(ancestor_mask(STAR_PARENTS), star)


def test_ancestor_mask_random_trees_match_brute_force():
    rng = np.random.default_rng(0)
    for n in [1, 2, 5, 17, 64]:
        for _ in range(5):
            parents = [int(rng.integers(-1, j)) for j in range(n)]
            np.testing.assert_array_equal(ancestor_mask(parents),
                                          brute_force_mask(parents))


def test_path_to():
    assert path_to(LOGITSPEC_PARENTS, 0) == [0]
    assert path_to(LOGITSPEC_PARENTS, 2) == [0, 1, 2]
    assert path_to(LOGITSPEC_PARENTS, 4) == [3, 4]
    assert path_to(LOGITSPEC_PARENTS, 5) == [5]
    with pytest.raises(ValueError, match="out of range"):
        path_to(LOGITSPEC_PARENTS, 6)
    with pytest.raises(ValueError, match="out of range"):
        path_to([], 0)


def test_is_chain():
    assert is_chain([])
    assert is_chain([-1])
    assert is_chain(CHAIN_PARENTS)
    assert not is_chain(STAR_PARENTS)
    assert not is_chain(LOGITSPEC_PARENTS)
    assert not is_chain([-1, 0, 0])
    # the callers' arrays: int32 parents, a plan's first accepted nodes, any length
    assert is_chain(np.array([-1, 0, 1], np.int32))
    assert is_chain(np.array(LOGITSPEC_PARENTS, np.int32)[:3])
    assert not is_chain(np.array(LOGITSPEC_PARENTS, np.int32)[:4])
    assert not is_chain([0])  # malformed: no chain
    assert not is_chain([-1, 1])


def test_in_place_prefix_of_root_paths():
    # root paths of LOGITSPEC_PARENTS: node k in place at depth k + 1 iff path[k] == k
    assert in_place_prefix([]) == 0
    assert in_place_prefix([0, 1, 2]) == 3  # the first branch: all in place
    assert in_place_prefix([0, 1]) == 2
    assert in_place_prefix([3, 4]) == 0  # the second branch: none
    assert in_place_prefix([5]) == 0
    assert in_place_prefix([0, 2]) == 1  # left the first branch at depth 2
    for path in ([0, 1, 2], [3, 4], [5], [0, 2], []):
        assert in_place_prefix(path) == len(path) - int(out_of_place(np.array(path)).sum())


def test_out_of_place_marks_each_place():
    # what each place of a chain holds after waves moved other nodes there
    np.testing.assert_array_equal(out_of_place(np.array([0, 1, 2])), [False, False, False])
    np.testing.assert_array_equal(out_of_place(np.array([3, 4, 2])), [True, True, False])
    np.testing.assert_array_equal(out_of_place(np.array([0, 4, 5, 3])),
                                  [False, True, True, False])
    assert out_of_place(np.array([], np.int64)).shape == (0,)


def test_children_lists_are_row_indexed():
    assert children_lists([]) == [[]]
    assert children_lists(LOGITSPEC_PARENTS) == [[0, 3, 5], [1], [2], [], [4],
                                                 [], []]


def test_validate_parents_returns_int64():
    assert validate_parents(np.array([-1, 0], dtype=np.int32)).dtype == np.int64
