# SPDX-License-Identifier: Apache-2.0
"""Positions and bit-packed ancestor masks for a batch of token trees.

Schema shared by the CUDA kernel (``torch.ops.vllm_echo.build_tree_mask``)
and the pure-torch reference:

* ``parents`` int32 ``[total_nodes]``: request-local parent indices. Local
  node 0 of each request is its root (parent -1); every other node has
  ``0 <= parent < own local index``.
* ``cu_num_nodes`` int32 ``[B + 1]``: request ``b`` owns flat nodes
  ``cu_num_nodes[b]:cu_num_nodes[b + 1]``.
* ``base_positions`` int64 ``[B]``: position of each request's root.

Outputs ``positions`` int64 ``[total_nodes]`` (base + depth, root depth 0)
and ``mask`` int32 ``[total_nodes, W]`` with ``W = ceil(max_nodes / 32)``:
bit ``c % 32`` of word ``c // 32`` in row ``r`` is set iff local node ``c``
is ``r`` itself or one of its ancestors.
"""

from __future__ import annotations

import functools
import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)

BITS_PER_WORD = 32


def num_mask_words(max_nodes: int) -> int:
    """Width ``W`` of a mask row for trees of up to ``max_nodes`` nodes."""
    return -(-max_nodes // BITS_PER_WORD)


def check_tree_mask_inputs(parents: torch.Tensor,
                           cu_num_nodes: torch.Tensor,
                           base_positions: torch.Tensor,
                           max_nodes: Optional[int] = None,
                           check_values: bool = True) -> int:
    """Validate the op's inputs and return the effective ``max_nodes``.

    Dtype/shape/device checks are free. ``check_values`` also inspects the
    contents (offsets, parent ranges), which copies them to the host and
    therefore synchronises when the tensors live on a GPU; the same is true
    of deriving ``max_nodes`` when it is not given.
    """
    _check_vector(parents, "parents", torch.int32)
    _check_vector(cu_num_nodes, "cu_num_nodes", torch.int32)
    _check_vector(base_positions, "base_positions", torch.int64)
    for name, tensor in (("cu_num_nodes", cu_num_nodes),
                         ("base_positions", base_positions)):
        if tensor.device != parents.device:
            raise ValueError(f"{name} is on {tensor.device} but parents is "
                             f"on {parents.device}")
    if cu_num_nodes.numel() < 1:
        raise ValueError("cu_num_nodes must have at least one entry (B + 1)")
    num_requests = cu_num_nodes.numel() - 1
    if base_positions.numel() != num_requests:
        raise ValueError(
            f"base_positions has {base_positions.numel()} entries but "
            f"cu_num_nodes describes {num_requests} requests")
    if max_nodes is not None and max_nodes < 0:
        raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")

    if not check_values:
        if max_nodes is None:
            max_nodes = _largest_request(cu_num_nodes)
        return max_nodes

    cu = cu_num_nodes.cpu().long()
    total_nodes = parents.numel()
    if cu[0] != 0:
        raise ValueError(f"cu_num_nodes[0] must be 0, got {int(cu[0])}")
    if num_requests and bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_num_nodes must be non-decreasing, got "
                         f"{cu.tolist()}")
    if cu[-1] != total_nodes:
        raise ValueError(f"cu_num_nodes[-1] = {int(cu[-1])} does not match "
                         f"the {total_nodes} entries of parents")
    largest = _largest_request(cu)
    if max_nodes is None:
        max_nodes = largest
    elif max_nodes < largest:
        raise ValueError(f"max_nodes = {max_nodes} is smaller than the "
                         f"largest request ({largest} nodes)")
    _check_parent_ranges(parents.cpu().long(), cu)
    return max_nodes


def build_tree_mask_reference(
        parents: torch.Tensor,
        cu_num_nodes: torch.Tensor,
        base_positions: torch.Tensor,
        max_nodes: Optional[int] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch implementation: CPU fallback and test oracle.

    Works on any device; ``max_nodes`` defaults to the largest request.
    """
    max_nodes = check_tree_mask_inputs(parents, cu_num_nodes, base_positions,
                                       max_nodes)
    return _reference(parents, cu_num_nodes, base_positions, max_nodes)


def build_tree_mask(
        parents: torch.Tensor,
        cu_num_nodes: torch.Tensor,
        base_positions: torch.Tensor,
        max_nodes: Optional[int] = None,
        validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Build tree positions and masks with the CUDA kernel when possible.

    The compiled op is used when ``vllm_echo._C`` imports and the inputs are
    CUDA tensors, otherwise the pure-torch reference. On the hot path pass
    ``max_nodes`` (a host-side int; a larger value only widens the rows) and
    ``validate=False``: both avoid a device-to-host sync. Without
    validation malformed offsets or parents give unspecified (but
    memory-safe) results from the kernel.
    """
    max_nodes = check_tree_mask_inputs(parents,
                                       cu_num_nodes,
                                       base_positions,
                                       max_nodes,
                                       check_values=validate)
    parents = parents.contiguous()
    cu_num_nodes = cu_num_nodes.contiguous()
    base_positions = base_positions.contiguous()
    if parents.is_cuda and _compiled_op_available():
        _log_path_once("CUDA kernel (torch.ops.vllm_echo.build_tree_mask)")
        return torch.ops.vllm_echo.build_tree_mask(parents, cu_num_nodes,
                                                   base_positions, max_nodes)
    _log_path_once("pure-torch reference")
    return _reference(parents, cu_num_nodes, base_positions, max_nodes)


def unpack_mask(mask_words: torch.Tensor, n: int) -> torch.Tensor:
    """Expand packed ``[rows, W]`` int32 words to a ``[rows, n]`` bool mask."""
    if mask_words.dim() != 2 or mask_words.dtype != torch.int32:
        raise ValueError(f"mask_words must be a 2-D int32 tensor, got "
                         f"{mask_words.dtype} with shape "
                         f"{tuple(mask_words.shape)}")
    if not 0 <= n <= mask_words.shape[1] * BITS_PER_WORD:
        raise ValueError(f"n = {n} does not fit in {mask_words.shape[1]} "
                         f"words per row")
    shifts = torch.arange(BITS_PER_WORD,
                          dtype=torch.int32,
                          device=mask_words.device)
    # Arithmetic shift of negative words still leaves the wanted bit at 0.
    bits = (mask_words.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(1)[:, :n].bool()


def _reference(parents: torch.Tensor, cu_num_nodes: torch.Tensor,
               base_positions: torch.Tensor,
               max_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    device = parents.device
    total_nodes = parents.numel()
    num_words = num_mask_words(max_nodes)
    if total_nodes == 0:
        return (torch.empty(0, dtype=torch.int64, device=device),
                torch.empty(0, num_words, dtype=torch.int32, device=device))

    cu = cu_num_nodes.long()
    flat = torch.arange(total_nodes, device=device)
    request = torch.repeat_interleave(
        torch.arange(cu.numel() - 1, device=device), cu[1:] - cu[:-1])
    start = cu[:-1][request]
    parents = parents.long()
    flat_parent = torch.where(parents >= 0, parents + start, -1)

    # Walk every node's ancestor chain at once, one level per iteration;
    # rows drop out when they pass their root, so the loop runs max-depth+1
    # times over a shrinking frontier.
    bits = torch.zeros(total_nodes,
                       num_words * BITS_PER_WORD,
                       dtype=torch.bool,
                       device=device)
    depth = torch.zeros(total_nodes, dtype=torch.int64, device=device)
    rows = flat
    current = flat
    while rows.numel():
        bits[rows, current - start[rows]] = True
        current = flat_parent[current]
        alive = current >= 0
        rows, current = rows[alive], current[alive]
        depth[rows] += 1

    positions = base_positions[request] + depth
    return positions, _pack_bits(bits)


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    weights = torch.ones(BITS_PER_WORD, dtype=torch.int64,
                         device=bits.device) << torch.arange(
                             BITS_PER_WORD, device=bits.device)
    words = (bits.view(bits.shape[0], -1, BITS_PER_WORD).long() *
             weights).sum(-1)
    # Reinterpret the unsigned 32-bit pattern as int32 (two's complement).
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def _check_vector(tensor: torch.Tensor, name: str,
                  dtype: torch.dtype) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got "
                        f"{type(tensor).__name__}")
    if tensor.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got "
                         f"{tensor.dtype}")
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape "
                         f"{tuple(tensor.shape)}")


def _largest_request(cu_num_nodes: torch.Tensor) -> int:
    if cu_num_nodes.numel() < 2:
        return 0
    return int((cu_num_nodes[1:] - cu_num_nodes[:-1]).max())


def _check_parent_ranges(parents: torch.Tensor, cu: torch.Tensor) -> None:
    total_nodes = parents.numel()
    if total_nodes == 0:
        return
    request = torch.repeat_interleave(torch.arange(cu.numel() - 1),
                                      cu[1:] - cu[:-1])
    local = torch.arange(total_nodes) - cu[:-1][request]
    is_root = local == 0
    bad_root = is_root & (parents != -1)
    bad_node = ~is_root & ((parents < 0) | (parents >= local))
    bad = bad_root | bad_node
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        b, j = int(request[i]), int(local[i])
        expected = ("-1 (local node 0 is the root)" if j == 0 else
                    f"in [0, {j}) (parents precede their children)")
        raise ValueError(f"parents[{i}] (request {b}, local node {j}) is "
                         f"{int(parents[i])}; expected {expected}")


@functools.cache
def _compiled_op_available() -> bool:
    try:
        import vllm_echo._C  # noqa: F401  (registers torch.ops.vllm_echo)
    except (ImportError, OSError) as exc:
        logger.info("vllm_echo._C is not available (%s); tree masks use the "
                    "pure-torch reference", exc)
        return False
    _register_fake()
    return True


def _register_fake() -> None:
    # Shape-only implementation so torch.compile can trace through the op.
    @torch.library.register_fake("vllm_echo::build_tree_mask")
    def _(parents, cu_num_nodes, base_positions, max_nodes):
        total_nodes = parents.shape[0]
        positions = parents.new_empty(total_nodes, dtype=torch.int64)
        mask = parents.new_empty((total_nodes, num_mask_words(max_nodes)),
                                 dtype=torch.int32)
        return positions, mask


_logged_paths: set[str] = set()


def _log_path_once(path: str) -> None:
    if path not in _logged_paths:
        _logged_paths.add(path)
        logger.info("build_tree_mask uses the %s", path)
