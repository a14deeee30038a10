#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: set up (scripts/bootstrap.sh), compile-check
# the CUDA sources when nvcc exists, then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
VENV="${VLLM_ECHO_VENV:-.venv}"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
PYTHON="$VENV/bin/python" bash csrc/compile_check.sh
set +e
python -m pytest tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
