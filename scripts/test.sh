#!/usr/bin/env bash
# Run the test suite on a fresh machine: set up (scripts/bootstrap.sh), compile-check
# the CUDA sources when nvcc exists, then pytest. Extra arguments go to pytest.
#   bash scripts/test.sh           everything (what CI runs, with .ci/run): ~47 min on 2 cores
#   bash scripts/test.sh --quick   only tests that start no vLLM process (unit tests,
#                                  benchmark logic, rendered tables, import rules): < 3 min
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
bash scripts/bootstrap.sh
VENV="${VLLM_ECHO_VENV:-.venv}"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
set +e
if [ "$quick" = 1 ]; then
  # markers of the tests that start vLLM: pytest.ini
  python -m pytest tests -m "not engine and not server and not ray and not tp" "$@"
else
  PYTHON="$VENV/bin/python" bash csrc/compile_check.sh
  python -m pytest tests "$@"
fi
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
