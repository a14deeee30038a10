# SPDX-License-Identifier: Apache-2.0
"""vLLM's worker start-up kernel scan survives numba being imported first."""

import numba  # noqa: F401  (loads llvmlite.binding.ffi, as a user script may)
import pytest


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the scan touches deprecated torch names
def test_vllm_kernel_scan_with_numba_loaded():
    from llvmlite.binding import ffi
    from vllm.triton_utils.dispatcher import _rebind_kernels

    from vllm_echo.plugin.kernel_scan_guard import guard_llvmlite_lib

    assert guard_llvmlite_lib()
    assert guard_llvmlite_lib()  # idempotent
    with pytest.raises(AttributeError):
        ffi.lib.__dict__  # noqa: B018
    assert callable(ffi.lib.LLVMPY_GetVersionInfo)  # C symbols still resolve
    _rebind_kernels([])  # vLLM's scan of every module: raised AttributeError unguarded
