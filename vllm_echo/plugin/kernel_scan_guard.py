# SPDX-License-Identifier: Apache-2.0
"""Keep vLLM's CPU kernel-override scan from tripping over numba's llvmlite.

At worker start-up vLLM (0.32) rebinds Triton kernels to CPU stand-ins by walking
every attribute of every loaded module (triton_utils/dispatcher.py:125-139) and, for
any value that answers ``hasattr(value, "__dict__")``, calling
``vars(value).get("kernel")``. llvmlite's ``ffi.lib`` wraps *any* missing attribute
as a C function, ``__dict__`` included, so ``vars()`` returns a function wrapper and
the scan raises ``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``:
the engine never starts. That happens whenever numba was imported before the
worker started, e.g. by a user script that imports vllm_echo's algorithms (numba)
at top level: spawned workers re-import the script first.

The guard makes the wrapper refuse dunder names, which are never C symbols.
"""

from __future__ import annotations

import sys

_MARK = "_vllm_echo_dunder_guard"


def guard_llvmlite_lib() -> bool:
    """Patch llvmlite's library wrapper if llvmlite is loaded; True if guarded."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is None:
        return False  # not loaded yet: the scan cannot meet it
    wrapper_cls = type(ffi.lib)
    original = wrapper_cls.__getattr__
    if getattr(original, _MARK, False):
        return True

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return original(self, name)

    setattr(__getattr__, _MARK, True)
    wrapper_cls.__getattr__ = __getattr__
    return True
