# SPDX-License-Identifier: Apache-2.0
import os
import sys

# tests/unit holds a plain-Python reference transcription imported by several tests.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "unit"))

pytest_plugins = ["timing"]  # tests/timing.py: --timing-json, vLLM starts per test
