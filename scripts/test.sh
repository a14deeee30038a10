#!/usr/bin/env bash
# Run the test suite on a fresh machine: set up (scripts/bootstrap.sh), compile-check
# the CUDA sources when nvcc exists, then pytest. Extra arguments go to pytest.
#   bash scripts/test.sh           everything (what CI runs, with .ci/run): ~40 min on 2 cores
#   bash scripts/test.sh --quick   only tests that start no vLLM process (unit tests,
#                                  benchmark logic, rendered tables, import rules): < 3 min
#   --timing-json PATH             each test's seconds and vLLM starts to PATH (tests/timing.py)
#
# The full run: first the tensor-parallel tier alone (three worker processes an engine,
# most of the machine's memory), then every other test in two lanes, two pytest
# processes at once, each lane's vLLM compute threads bound to its half of the cores
# (VLLM_CPU_OMP_THREADS_BIND). Tests that start vLLM wait much of their time, so the
# lanes finish in about 70% of one process's time; scripts/test_lanes.py balances them
# from tests/module_seconds.json. One lane on a one-core machine, or with
# VLLM_ECHO_TEST_LANES=1. Each lane's output is printed when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
timing=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --timing-json) timing="$2"; shift 2 ;;
    --timing-json=*) timing="${1#*=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
bash scripts/bootstrap.sh
VENV="${VLLM_ECHO_VENV:-.venv}"
# shellcheck disable=SC1091
. "$VENV/bin/activate"

# pytest with this phase's timing file; rc 5 (nothing collected) is a failure
run_pytest() {
  local name="$1"; shift
  local rc=0
  python -m pytest "$@" "${args[@]}" ${timing:+--timing-json "$timing.$name"} || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests ($name): treating as a failure" >&2
    rc=1
  fi
  return "$rc"
}

rc=0
if [ "$quick" = 1 ]; then
  # markers of the tests that start vLLM: pytest.ini
  run_pytest quick tests -m "not engine and not server and not ray and not tp" || rc=$?
else
  PYTHON="$VENV/bin/python" bash csrc/compile_check.sh
  run_pytest tp tests -m tp || rc=$?
  cores=$(nproc)
  lanes="${VLLM_ECHO_TEST_LANES:-$(( cores >= 2 ? 2 : 1 ))}"
  mapfile -t lane_modules < <(python scripts/test_lanes.py --lanes "$lanes")
  logs="$(mktemp -d)"
  pids=()
  binds=()
  for i in "${!lane_modules[@]}"; do
    first=$(( i * cores / lanes ))
    last=$(( (i + 1) * cores / lanes - 1 ))
    bind="$first-$last"
    [ "$lanes" -gt 1 ] || bind="${VLLM_CPU_OMP_THREADS_BIND:-auto}"
    binds+=("$bind")
    # shellcheck disable=SC2086  # the lane's modules, one word each
    VLLM_CPU_OMP_THREADS_BIND="$bind" run_pytest "lane$i" -m "not tp" ${lane_modules[$i]} \
      > "$logs/lane$i.log" 2>&1 &
    pids+=("$!")
  done
  for i in "${!pids[@]}"; do
    lane_rc=0
    wait "${pids[$i]}" || lane_rc=$?
    echo "== lane $i (cores ${binds[$i]}, rc $lane_rc): ${lane_modules[$i]}"
    cat "$logs/lane$i.log"
    [ "$lane_rc" -eq 0 ] || rc=$lane_rc
  done
fi
if [ -n "$timing" ]; then
  python - "$timing" <<'PY'
import glob, json, sys
rows = [r for part in sorted(glob.glob(sys.argv[1] + ".*")) for r in json.load(open(part))]
open(sys.argv[1], "w").write(json.dumps(rows, indent=1) + "\n")
PY
fi
exit "$rc"
