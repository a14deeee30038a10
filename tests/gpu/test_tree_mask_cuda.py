# SPDX-License-Identifier: Apache-2.0
"""The compiled CUDA tree-mask op must match the pure-torch reference."""

import numpy as np
import pytest
import torch

from vllm_echo.ops import tree_mask
from vllm_echo.ops.tree_mask import (build_tree_mask,
                                     build_tree_mask_reference)


def _compiled_extension_loads() -> bool:
    try:
        import vllm_echo._C  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not _compiled_extension_loads(),
    reason="needs a CUDA device and the compiled vllm_echo._C extension")

SHAPES = ("chain", "star", "random", "bushy")


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
    return [-1] + [
        int(rng.integers(max(0, j - 3), j)) for j in range(1, num_nodes)
    ]


def random_batch(rng, max_request_nodes):
    batch_size = int(rng.integers(1, 9))
    trees = [
        random_parents(rng, int(rng.integers(1, max_request_nodes + 1)),
                       SHAPES[int(rng.integers(len(SHAPES)))])
        for _ in range(batch_size)
    ]
    cu = np.cumsum([0] + [len(t) for t in trees])
    return (torch.tensor([p for t in trees for p in t], dtype=torch.int32),
            torch.tensor(cu, dtype=torch.int32),
            torch.tensor(rng.integers(0, 1 << 40, size=batch_size),
                         dtype=torch.int64))


def to_cuda(batch):
    return tuple(t.cuda() for t in batch)


def assert_identical(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.cpu(), w.cpu())


# Request sizes straddle word boundaries (32, 64) and the 256-thread block.
@pytest.mark.parametrize("max_request_nodes", [1, 2, 33, 65, 300])
def test_op_matches_reference(max_request_nodes):
    rng = np.random.default_rng(max_request_nodes)
    for _ in range(20):
        batch = random_batch(rng, max_request_nodes)
        counts = batch[1][1:] - batch[1][:-1]
        max_nodes = int(counts.max()) + int(rng.integers(0, 40))
        got = torch.ops.vllm_echo.build_tree_mask(*to_cuda(batch), max_nodes)
        assert_identical(got, build_tree_mask_reference(*batch, max_nodes))


def test_public_entry_point_uses_cuda_kernel(monkeypatch):
    rng = np.random.default_rng(0)
    batch = random_batch(rng, 65)
    want = build_tree_mask_reference(*batch)
    wide = want[1].shape[1] * 32
    want_wide = build_tree_mask_reference(*batch, wide)

    def no_fallback(*args):
        raise AssertionError("fell back to the reference on CUDA")

    monkeypatch.setattr(tree_mask, "_reference", no_fallback)
    assert_identical(build_tree_mask(*to_cuda(batch)), want)
    assert_identical(
        build_tree_mask(*to_cuda(batch), max_nodes=wide, validate=False),
        want_wide)


def test_empty_batch():
    batch = (torch.empty(0, dtype=torch.int32),
             torch.zeros(1, dtype=torch.int32),
             torch.empty(0, dtype=torch.int64))
    positions, mask = torch.ops.vllm_echo.build_tree_mask(*to_cuda(batch), 0)
    assert positions.shape == (0, ) and mask.shape == (0, 0)


def test_runs_on_current_stream_and_in_cuda_graph():
    rng = np.random.default_rng(1)
    batch = to_cuda(random_batch(rng, 40))
    max_nodes = 40
    want = build_tree_mask_reference(*batch, max_nodes)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = torch.ops.vllm_echo.build_tree_mask(*batch, max_nodes)
    stream.synchronize()
    assert_identical(got, want)

    # Capture fails if the kernel is launched on any stream other than the
    # capturing (current) one.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torch.ops.vllm_echo.build_tree_mask(*batch, max_nodes)
    graph.replay()
    torch.cuda.synchronize()
    assert_identical(captured, want)


def test_host_checks():
    rng = np.random.default_rng(2)
    parents, cu, base = to_cuda(random_batch(rng, 10))
    with pytest.raises(RuntimeError, match="must have dtype"):
        torch.ops.vllm_echo.build_tree_mask(parents.long(), cu, base, 10)
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
        torch.ops.vllm_echo.build_tree_mask(parents, cu.cpu(), base, 10)
    with pytest.raises(RuntimeError, match="base_positions has"):
        torch.ops.vllm_echo.build_tree_mask(parents, cu, base[:0], 10)
