# SPDX-License-Identifier: Apache-2.0
"""Bad speculative settings stop a server with one line, not a traceback.

vLLM builds the engine config inside the server's event loop, so a
``SpeculativeConfigError`` raised there reaches the interpreter's top level and
would be printed under a 30-line traceback through vLLM and uvloop. The hook
prints such an error as one line; every other exception keeps Python's output.
Programs that catch the error (``LLM(...)`` in a try block) see a ValueError as
before.
"""

from __future__ import annotations

import sys

from vllm_echo.config import SpeculativeConfigError

_MARK = "_vllm_echo_excepthook"


def install_excepthook() -> None:
    previous = sys.excepthook
    if getattr(previous, _MARK, False):
        return

    def excepthook(exc_type, exc, tb):
        if isinstance(exc, SpeculativeConfigError):
            print(f"vllm-echo: {exc}", file=sys.stderr, flush=True)
            return
        previous(exc_type, exc, tb)

    setattr(excepthook, _MARK, True)
    sys.excepthook = excepthook
