# SPDX-License-Identifier: Apache-2.0
"""Which scheduled drafts are verified as trees (tree_state.tree_rows)."""

import numpy as np

from vllm_echo.algos.tree import uncovered_paths
from vllm_echo.plugin.runner.tree_state import TreeDraft, tree_rows

# root -> 10 -> 11 -> 12, and a sibling branch root -> 20 -> 21
DRAFT = TreeDraft(np.array([10, 11, 12, 20, 21], dtype=np.int32),
                  np.array([-1, 0, 1, -1, 3], dtype=np.int32))


def rows(draft, scheduled):
    return tree_rows("r", 0, 0, 7, draft, scheduled)


def test_a_scheduled_prefix_of_the_tree_is_verified_as_a_tree():
    got = rows(DRAFT, [10, 11, 12, 20])
    assert got is not None
    assert got.parents.tolist() == [-1, 0, 1, -1]
    # the sibling branch is verified as its own root path; the first branch is causal
    assert uncovered_paths(got.parents) == [([3], 1)]


def test_other_tokens_a_chain_prefix_or_an_overlong_list_run_as_chains():
    assert rows(DRAFT, [10, 11, 99, 20]) is None  # a stale table entry
    assert rows(DRAFT, [10, 11, 12]) is None      # a chain prefix verifies natively
    assert rows(DRAFT, [10, 11, 12, 20, 21, 5]) is None
    assert rows(DRAFT, []) is None


def test_parents_that_are_not_a_parent_first_tree_run_as_chains():
    for parents in ([-1, 0, 2, -1, 3], [-1, 0, 1, -2, 3], [-1, 0, 1, 4, 3]):
        draft = TreeDraft(DRAFT.token_ids, np.array(parents, dtype=np.int32))
        assert rows(draft, DRAFT.token_ids.tolist()) is None, parents
