# SPDX-License-Identifier: Apache-2.0
"""Run by test_backend_override.py in a fresh interpreter: an in-process engine with
tree verification on CPU whose model fails to load. Prints one JSON line: whether the
start failed, and whether CPU_ATTN is overridden before and after."""

import json
import os
import sys

if __name__ == "__main__":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine and worker in this process
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]  # engine_helpers imports tests/timing.py
    from engine_helpers import ENGINE_KWARGS
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker import cpu_model_runner

    from vllm_echo.engines import build_llm

    def get_model(**kwargs):
        raise RuntimeError("injected model load failure")

    cpu_model_runner.get_model = get_model
    backend = AttentionBackendEnum.CPU_ATTN
    before = backend.is_overridden()
    try:
        build_llm({"method": "logitspec", "tree": True}, model=sys.argv[1], **ENGINE_KWARGS)
        failed, reason = False, ""
    except Exception as exc:  # noqa: BLE001 - the point is that it fails
        failed, reason = True, f"{type(exc).__name__}: {exc}"
    print(json.dumps({"failed": failed, "reason": reason[-300:],
                      "overridden_before": before, "overridden_after": backend.is_overridden(),
                      "path_after": backend.get_path() if backend.is_overridden() else None}))
