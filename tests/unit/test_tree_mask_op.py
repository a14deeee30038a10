# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest
import torch

from vllm_echo.ops.tree_mask import (build_tree_mask,
                                     build_tree_mask_reference,
                                     num_mask_words, unpack_mask)


def random_parents(rng, num_nodes, shape):
    """Request-local parents including the root (local node 0, parent -1)."""
    if num_nodes == 0:
        return []
    if shape == "chain":
        return list(range(-1, num_nodes - 1))
    if shape == "star":
        return [-1] + [0] * (num_nodes - 1)
    if shape == "random":
        return [-1] + [int(rng.integers(0, j)) for j in range(1, num_nodes)]
    if shape == "bushy":
        # Parents drawn from the most recent few nodes: deep and branching.
        return [-1] + [
            int(rng.integers(max(0, j - 3), j)) for j in range(1, num_nodes)
        ]
    raise AssertionError(shape)


def make_batch(trees, base_positions):
    cu = np.cumsum([0] + [len(t) for t in trees])
    parents = [p for tree in trees for p in tree]
    return (torch.tensor(parents, dtype=torch.int32),
            torch.tensor(cu, dtype=torch.int32),
            torch.tensor(base_positions, dtype=torch.int64))


def brute_force(trees, base_positions):
    """Positions and unpacked masks by walking each node's parent chain."""
    max_nodes = max((len(t) for t in trees), default=0)
    positions, rows = [], []
    for tree, base in zip(trees, base_positions):
        for r in range(len(tree)):
            row = [False] * max_nodes
            depth, node = -1, r
            while node != -1:
                row[node] = True
                node = tree[node]
                depth += 1
            positions.append(base + depth)
            rows.append(row)
    return positions, rows


def check_against_brute_force(trees, base_positions, max_nodes=None):
    parents, cu, base = make_batch(trees, base_positions)
    positions, mask = build_tree_mask_reference(parents, cu, base, max_nodes)
    expected_positions, expected_rows = brute_force(trees, base_positions)
    width = max((len(t) for t in trees), default=0)
    words = num_mask_words(width if max_nodes is None else max_nodes)

    assert positions.dtype == torch.int64 and mask.dtype == torch.int32
    assert mask.shape == (parents.numel(), words)
    assert positions.tolist() == expected_positions
    unpacked = unpack_mask(mask, words * 32)
    assert unpacked[:, :width].tolist() == expected_rows
    assert not unpacked[:, width:].any(), "bits beyond the tree are set"


@pytest.mark.parametrize("shape", ["chain", "star", "random", "bushy"])
@pytest.mark.parametrize("num_drafts", [0, 1, 31, 32, 64])
def test_single_request_shapes(shape, num_drafts):
    rng = np.random.default_rng(num_drafts)
    check_against_brute_force([random_parents(rng, num_drafts + 1, shape)],
                              [17])


def test_mixed_batches_match_brute_force():
    rng = np.random.default_rng(1234)
    shapes = ["chain", "star", "random", "bushy"]
    for _ in range(40):
        batch_size = int(rng.integers(1, 7))
        trees = [
            random_parents(rng, int(rng.integers(1, 90)),
                           shapes[int(rng.integers(len(shapes)))])
            for _ in range(batch_size)
        ]
        base = rng.integers(0, 10_000, size=batch_size).tolist()
        check_against_brute_force(trees, base)


def test_depth_one_tree_layout():
    # Root plus three children: every child sees the root and itself.
    positions, mask = build_tree_mask_reference(
        *make_batch([[-1, 0, 0, 0]], [5]))
    assert positions.tolist() == [5, 6, 6, 6]
    assert mask.squeeze(1).tolist() == [0b0001, 0b0011, 0b0101, 0b1001]


def test_high_bit_words_are_negative_int32():
    # A 32-node chain sets bit 31 in the last row, i.e. the int32 sign bit.
    _, mask = build_tree_mask_reference(*make_batch([list(range(-1, 31))],
                                                    [0]))
    assert mask[-1, 0].item() == -1
    assert unpack_mask(mask, 32)[-1].all()


def test_wider_max_nodes_pads_with_zero_words():
    check_against_brute_force([[-1, 0, 1], [-1, 0]], [0, 3], max_nodes=70)


def test_empty_requests_and_empty_batch():
    check_against_brute_force([[-1, 0], [], [-1]], [4, 9, 11])
    positions, mask = build_tree_mask_reference(*make_batch([], []))
    assert positions.shape == (0, ) and mask.shape == (0, 0)


def test_public_entry_point_falls_back_to_reference_on_cpu():
    rng = np.random.default_rng(7)
    trees = [random_parents(rng, n, "random") for n in (1, 40, 65)]
    batch = make_batch(trees, [0, 100, 200])
    for got, want in zip(build_tree_mask(*batch),
                         build_tree_mask_reference(*batch)):
        assert torch.equal(got, want)
    for got, want in zip(build_tree_mask(*batch, max_nodes=65, validate=False),
                         build_tree_mask_reference(*batch)):
        assert torch.equal(got, want)


def test_unpack_mask_round_trip():
    words = torch.tensor([[-1, 1], [0, -2147483648]], dtype=torch.int32)
    bits = unpack_mask(words, 64)
    assert bits[0, :33].all() and not bits[0, 33:].any()
    assert bits[1].nonzero().flatten().tolist() == [63]
    with pytest.raises(ValueError, match="does not fit"):
        unpack_mask(words, 65)
    with pytest.raises(ValueError, match="int32"):
        unpack_mask(words.long(), 3)


GOOD = dict(parents=[-1, 0, 0, -1, 0], cu=[0, 3, 5], base=[10, 20])


def bad_batch(parents=None, cu=None, base=None, parents_dtype=torch.int32,
              cu_dtype=torch.int32, base_dtype=torch.int64):
    return (torch.tensor(GOOD["parents"] if parents is None else parents,
                         dtype=parents_dtype),
            torch.tensor(GOOD["cu"] if cu is None else cu, dtype=cu_dtype),
            torch.tensor(GOOD["base"] if base is None else base,
                         dtype=base_dtype))


@pytest.mark.parametrize("kwargs, message", [
    (dict(parents_dtype=torch.int64), "parents must have dtype torch.int32"),
    (dict(cu_dtype=torch.int64), "cu_num_nodes must have dtype torch.int32"),
    (dict(base_dtype=torch.int32), "base_positions must have dtype"),
    (dict(parents=[[-1, 0, 0, -1, 0]]), "parents must be 1-D"),
    (dict(cu=[]), "at least one entry"),
    (dict(base=[10]), "base_positions has 1 entries"),
    (dict(cu=[1, 3, 5]), r"cu_num_nodes\[0\] must be 0"),
    (dict(cu=[0, 3, 2, 5], base=[1, 2, 3]), "non-decreasing"),
    (dict(cu=[0, 3, 4]), "does not match"),
    (dict(parents=[0, 0, 0, -1, 0]), r"request 0, local node 0"),
    (dict(parents=[-1, 0, 0, 2, 0]), r"request 1, local node 0"),
    (dict(parents=[-1, 0, 2, -1, 0]), r"local node 2\) is 2"),
    (dict(parents=[-1, -1, 0, -1, 0]), r"local node 1\) is -1"),
    (dict(parents=[-1, 0, 0, -1, 3]), r"request 1, local node 1\) is 3"),
])
def test_bad_inputs_raise_clear_errors(kwargs, message):
    batch = bad_batch(**kwargs)
    for build in (build_tree_mask, build_tree_mask_reference):
        with pytest.raises(ValueError, match=message):
            build(*batch)


def test_bad_max_nodes_and_types():
    batch = bad_batch()
    with pytest.raises(ValueError, match="smaller than the largest request"):
        build_tree_mask(*batch, max_nodes=2)
    with pytest.raises(ValueError, match="max_nodes must be >= 0"):
        build_tree_mask(*batch, max_nodes=-1)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        build_tree_mask(GOOD["parents"], *batch[1:])
