# SPDX-License-Identifier: Apache-2.0
"""Which pool of the shared draft sources a request belongs to, and who may say so.

The scheduler marks every new request (patches.py entry 11) with a ``PoolMark``: the
pool of its ``cache_salt`` (algos/pools.py; no salt: the unsalted pool), stored in its
sampling params' ``extra_args`` under ``CACHE_SALT_KEY``. The worker trusts nothing
else there. A client cannot make a PoolMark: ``vllm_xargs`` reach ``extra_args`` as
JSON and travel from the API server to the engine core by msgpack, which carries only
strings, numbers, lists, dicts and None; from the scheduler to the workers they travel
by pickle (Ray too), which keeps the PoolMark. Whatever a client sent under the key is
replaced, so salts stay server-owned.

A request without a PoolMark (the patch is not in effect, or a client value got
through) drafts from no shared pool and teaches none: failing closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_echo.algos.pools import pool_id

# Where the scheduler puts a request's PoolMark in its sampling params' extra_args.
CACHE_SALT_KEY = "vllm_echo_cache_salt"


@dataclass(frozen=True)
class PoolMark:
    """A request's pool, as the scheduler set it: the only value the worker trusts."""

    pool: int


def mark_request(params: Any, salt: str | None) -> bool:
    """Put the PoolMark of ``salt`` into ``params.extra_args``, replacing whatever is
    under CACHE_SALT_KEY. True when that was a client's value (anything but a PoolMark),
    so the caller can say it was ignored."""
    extra = params.extra_args or {}
    from_client = CACHE_SALT_KEY in extra and not isinstance(extra[CACHE_SALT_KEY], PoolMark)
    params.extra_args = {**extra, CACHE_SALT_KEY: PoolMark(pool_id(salt))}
    return from_client


def pool_of(sampling_params: Any) -> int | None:
    """The request's pool from its PoolMark; None without one (no shared pool)."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    mark = extra.get(CACHE_SALT_KEY)
    return mark.pool if isinstance(mark, PoolMark) else None
