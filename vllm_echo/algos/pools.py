# SPDX-License-Identifier: Apache-2.0
"""Pools: which requests share the engine-wide draft sources (a tenant each).

A pool is a 63-bit id of vLLM's ``cache_salt``, the field that also isolates prefix
caching between tenants; requests without a salt share pool 0. Importing this module
is cheap (xxhash only, no numba): vLLM's scheduler process marks every request with
its pool.
"""

from __future__ import annotations

import xxhash

UNSALTED_POOL = 0


def pool_id(salt: str | None) -> int:
    """UNSALTED_POOL for None, else a stable nonzero 63-bit id of the salt."""
    if salt is None:
        return UNSALTED_POOL
    h = xxhash.xxh64_intdigest(salt.encode("utf-8")) & ((1 << 63) - 1)
    return h or 1
