# SPDX-License-Identifier: Apache-2.0
"""examples/offline_generate.py as a module (it is a script, not in a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_example():
    spec = importlib.util.spec_from_file_location(
        "offline_generate_example", REPO / "examples" / "offline_generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
