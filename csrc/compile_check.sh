#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Compile csrc/*.cu (nvcc) and csrc/*.cpp (host compiler) to object files
# against the installed torch's headers, mirroring the flags that
# torch.utils.cpp_extension uses. No GPU and no linking is needed, so this
# catches header/API breakage on any machine with nvcc.
#
#   PYTHON=path/to/python csrc/compile_check.sh
#   CUDA_ARCHS="80 90" csrc/compile_check.sh     # SM versions to compile for
set -euo pipefail

csrc_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_dir="$(dirname "$csrc_dir")"

if ! command -v nvcc >/dev/null 2>&1; then
    echo "compile_check: nvcc not found on PATH; skipping CUDA compile check"
    exit 0
fi

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo_dir/.venv/bin/python" ]]; then
        PYTHON="$repo_dir/.venv/bin/python"
    else
        PYTHON=python3
    fi
fi

# One line per flag, so paths with spaces survive the round trip.
mapfile -t torch_flags < <("$PYTHON" - <<'EOF'
import sysconfig

import torch
from torch.utils import cpp_extension

for path in cpp_extension.include_paths():
    print(f"-I{path}")
print(f"-I{sysconfig.get_paths()['include']}")
print(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
print("-DTORCH_API_INCLUDE_EXTENSION_H")
print("-DTORCH_EXTENSION_NAME=_C")
EOF
)
mapfile -t nvcc_common < <("$PYTHON" -c \
    'from torch.utils import cpp_extension as c; print(*c.COMMON_NVCC_FLAGS, sep="\n")')

gencode=()
for arch in ${CUDA_ARCHS:-80 90}; do
    gencode+=("-gencode=arch=compute_${arch},code=sm_${arch}")
done

out_dir="$(mktemp -d)"
trap 'rm -rf "$out_dir"' EXIT

status=0
shopt -s nullglob
for src in "$csrc_dir"/*.cu; do
    echo "compile_check: nvcc $(basename "$src")"
    nvcc -c "$src" -o "$out_dir/$(basename "$src").o" \
        -std=c++20 -O3 --compiler-options=-fPIC \
        "${nvcc_common[@]}" "${gencode[@]}" "${torch_flags[@]}" \
        || status=1
done
for src in "$csrc_dir"/*.cpp; do
    echo "compile_check: c++ $(basename "$src")"
    "${CXX:-c++}" -c "$src" -o "$out_dir/$(basename "$src").o" \
        -std=c++20 -O3 -fPIC -Wall -Wextra "${torch_flags[@]}" \
        || status=1
done

if [[ $status -ne 0 ]]; then
    echo "compile_check: FAILED" >&2
    exit 1
fi
echo "compile_check: OK"
