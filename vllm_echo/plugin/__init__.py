# SPDX-License-Identifier: Apache-2.0
"""vLLM glue: the only subpackage of vllm_echo that imports vLLM.

``register`` is the ``vllm.general_plugins`` entry point. vLLM calls it in the
front end, the engine core and every worker (Ray workers included), so it is
idempotent, cheap (no numba compile, no CUDA) and inert unless a speculative config
names one of our methods, with one exception: the rejection sampler's fixes
(runner/sampler_fixes.py, patches.py entry 6), which apply to every speculative
method, so that vLLM's own verify sampled requests correctly on CPU too, and change
nothing without speculation. They wait for vLLM to import its rejection sampler
rather than import it here (about a second in a front end that never needs it).
"""

from __future__ import annotations

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from vllm_echo.plugin.compat import check_vllm_version
    from vllm_echo.plugin.errors import install_excepthook
    from vllm_echo.plugin.kernel_scan_guard import guard_llvmlite_lib
    from vllm_echo.plugin.register_patches import (patch_create_engine_config,
                                                   patch_create_speculative_config,
                                                   patch_new_request_salt)
    from vllm_echo.plugin.runner.sampler_fixes import install_sampler_fixes

    check_vllm_version()
    guard_llvmlite_lib()
    install_sampler_fixes()  # every speculative method's (patches.py, entry 6)
    patch_create_speculative_config()
    patch_create_engine_config()
    patch_new_request_salt()
    install_excepthook()
