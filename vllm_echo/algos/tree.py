# SPDX-License-Identifier: Apache-2.0
"""Engine-agnostic helpers for draft token trees.

A draft tree for one request is ``(token_ids, parents)``: two int arrays of
length ``n`` holding the draft nodes only. ``parents[j] == -1`` means node
``j`` hangs off the ROOT (the request's last sampled token, which is not in
the arrays); otherwise ``0 <= parents[j] < j``, so parents always precede
their children. The verification rows are ``[root, node0, node1, ...]``,
hence node ``j`` lives in row ``j + 1``.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

ArrayLike = Union[np.ndarray, Sequence[int]]

ROOT = -1


def _as_int_vector(values: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        # An empty list has a float dtype in numpy; it is still a valid tree.
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":  # signed or unsigned integers (cheaper than issubdtype)
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def validate_parents(parents: ArrayLike) -> np.ndarray:
    """Check parent-first order and return ``parents`` as an int64 array."""
    arr = _as_int_vector(parents, "parents")
    own_index = np.arange(arr.size)
    bad = (arr < ROOT) | (arr >= own_index)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"parents[{j}] = {int(arr[j])} is invalid: each parent must be -1 "
            f"(the root) or an earlier node index in [0, {j})")
    return arr


def validate_tree(token_ids: ArrayLike, parents: ArrayLike) -> None:
    """Raise ValueError unless ``(token_ids, parents)`` is a well-formed tree."""
    tokens = _as_int_vector(token_ids, "token_ids")
    par = validate_parents(parents)
    if tokens.shape != par.shape:
        raise ValueError(
            f"token_ids and parents must have the same length, got "
            f"{tokens.size} and {par.size}")
    if (tokens < 0).any():
        j = int(np.flatnonzero(tokens < 0)[0])
        raise ValueError(f"token_ids[{j}] = {int(tokens[j])} is negative")


def tree_depths(parents: ArrayLike) -> np.ndarray:
    """Depth of every draft node; children of the root have depth 1."""
    par = validate_parents(parents)
    depths = np.empty(par.size, dtype=np.int32)
    # Parent-first order guarantees depths[p] is final before it is read.
    for j, p in enumerate(par.tolist()):
        depths[j] = 1 if p == ROOT else depths[p] + 1
    return depths


def ancestor_mask(parents: ArrayLike) -> np.ndarray:
    """Attention mask over rows ``[root, nodes...]``, shape ``(n+1, n+1)``.

    Row ``r`` sees column ``c`` iff ``c == r`` or ``c`` is an ancestor of
    ``r``; the root (row/column 0) is an ancestor of every node.
    """
    par = validate_parents(parents)
    n = par.size
    mask = np.zeros((n + 1, n + 1), dtype=bool)
    mask[0, 0] = True
    for j, p in enumerate(par.tolist()):
        # A node sees exactly what its parent sees, plus itself.
        mask[j + 1] = mask[p + 1]
        mask[j + 1, j + 1] = True
    return mask


def path_to(parents: ArrayLike, j: int) -> list[int]:
    """Node indices from the root's child down to node ``j`` (inclusive)."""
    par = validate_parents(parents)
    if not 0 <= j < par.size:
        raise ValueError(f"node index {j} out of range for {par.size} nodes")
    path = []
    node = int(j)
    while node != ROOT:
        path.append(node)
        node = int(par[node])
    path.reverse()
    return path


def is_chain(parents: ArrayLike) -> bool:
    """True iff the nodes form one chain from the root (the empty tree included).

    With parent-first order a chain can only be laid out as ``[-1, 0, 1, ..., n-2]``.
    ``parents`` is not validated (the callers' are, or are built valid): any other
    array is no chain.
    """
    par = np.asarray(parents)
    return bool(np.array_equal(par, np.arange(-1, par.size - 1)))


def out_of_place(nodes: np.ndarray) -> np.ndarray:
    """Per place ``k`` of a chain (depth ``k + 1``), whether ``nodes[k]``, the node put
    there, is not node ``k``: the node the flat order has there, whose row and KV slot
    vLLM, which verifies a chain, reads. A node out of place must be moved."""
    return nodes != np.arange(len(nodes))


def in_place_prefix(path: Sequence[int]) -> int:
    """How many of a root path's first nodes are in place (``out_of_place``'s test, on
    the short list the per-step verdicts hold). Node indices increase along a path, so
    every node after the first one out of place is out of place too."""
    return next((k for k, j in enumerate(path) if j != k), len(path))


def children_lists(parents: ArrayLike) -> list[list[int]]:
    """Children of every row in node order; entry 0 is the root's children.

    Indexed by row (``node + 1``) so the root needs no special case.
    """
    par = validate_parents(parents)
    children: list[list[int]] = [[] for _ in range(par.size + 1)]
    for j, p in enumerate(par.tolist()):
        children[p + 1].append(j)
    return children


def causal_prefix_length(parents: ArrayLike) -> int:
    """Nodes at the head of the flat order that form a chain from the root (node j the
    child of node j - 1): the rows causal attention over the flat order gets right."""
    par = validate_parents(parents)
    off_chain = np.flatnonzero(par != np.arange(par.size) - 1)
    return int(off_chain[0]) if off_chain.size else int(par.size)


def uncovered_paths(parents: ArrayLike) -> list[tuple[list[int], int]]:
    """The root paths that verify, as chains, every node causal attention gets wrong.

    Returns ``(path, num_new)`` per path, leaves in node order: ``path`` lists node
    indices from the root's child down to a leaf, and its last ``num_new`` nodes are
    the ones no earlier path (nor the causal prefix) covered. Each node off the causal
    prefix is new in exactly one path, at the depth it sits at, so a chain over
    ``path`` computes its attention exactly.
    """
    par = validate_parents(parents)
    covered = np.zeros(par.size, dtype=bool)
    covered[:causal_prefix_length(par)] = True
    has_child = np.zeros(par.size, dtype=bool)
    has_child[par[par >= 0]] = True
    out = []
    for leaf in np.flatnonzero(~has_child & ~covered).tolist():
        path = path_to(par, leaf)
        num_new = 0
        while num_new < len(path) and not covered[path[-1 - num_new]]:
            num_new += 1
        covered[path] = True
        out.append((path, num_new))
    return out
