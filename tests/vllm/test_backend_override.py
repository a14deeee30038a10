# SPDX-License-Identifier: Apache-2.0
"""The CPU attention override lives exactly while its runner loads the model
(attention/tree_support.py): a registry that refuses it leaves chain mode and one log
line, and a start that fails leaves no override behind."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_echo.plugin.attention import tree_support
from vllm_echo.plugin.runner.tree_state import TreeAttention, TreeContext

pytest.importorskip("vllm.v1.attention.backends.registry")
from vllm.v1.attention.backends import registry  # noqa: E402

BACKEND = registry.AttentionBackendEnum.CPU_ATTN
NATIVE = "vllm_echo.plugin.attention.cpu_tree_attention.TreeCPUAttentionBackend"


class Runner:
    """Stands for vLLM's model runner: ``load_model`` builds the model (here, records
    which CPU_ATTN class it would get, or fails)."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.loaded_with: str | None = None

    def load_model(self):
        self.loaded_with = BACKEND.get_path()
        if self.fail:
            raise RuntimeError("the model failed to load")


@pytest.fixture(autouse=True)
def no_override_around():
    assert not BACKEND.is_overridden()
    yield
    if BACKEND.is_overridden():
        BACKEND.clear_override()
        pytest.fail("the test left CPU_ATTN overridden")


def test_the_override_lasts_while_the_model_loads():
    context, runner = TreeContext(), Runner()
    assert tree_support._route_cpu_attention_while_loading(runner, context, NATIVE) is None
    assert not BACKEND.is_overridden()  # nothing registered before load_model
    runner.load_model()
    assert runner.loaded_with == NATIVE
    assert not BACKEND.is_overridden()


def test_a_failed_model_load_leaves_no_override():
    context, runner = TreeContext(), Runner(fail=True)
    tree_support._route_cpu_attention_while_loading(runner, context, NATIVE)
    with pytest.raises(RuntimeError, match="failed to load"):
        runner.load_model()
    assert runner.loaded_with == NATIVE
    assert not BACKEND.is_overridden()


def test_a_failing_registry_call_degrades_to_chain_mode_with_one_line(monkeypatch, caplog):
    def register_backend(*args, **kwargs):
        raise TypeError("register_backend() takes 1 positional argument")

    monkeypatch.setattr(registry, "register_backend", register_backend)
    context, runner = TreeContext(attention=TreeAttention(mode="cpu")), Runner()
    tree_support._route_cpu_attention_while_loading(runner, context, NATIVE)
    with caplog.at_level(logging.WARNING, logger="vllm.vllm_echo"):
        runner.load_model()  # the engine still starts
    assert context.attention.mode is None  # chain mode
    assert runner.loaded_with != NATIVE
    lines = [r for r in caplog.records if "chain mode" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert "register_backend" in lines[0].getMessage()


@pytest.mark.engine
def test_a_failed_engine_start_leaves_no_override(model_path):
    """A real in-process engine (in a fresh interpreter) whose model fails to load."""
    script = Path(__file__).with_name("failed_start.py")
    done = subprocess.run([sys.executable, str(script), model_path], capture_output=True,
                          text=True, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] and "injected model load failure" in result["reason"], result
    assert not result["overridden_before"]
    assert not result["overridden_after"], result
