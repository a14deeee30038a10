#!/usr/bin/env bash
# The first run on a fresh machine: set everything up, then compare no speculation,
# ngram, logitspec and echo on the embedded model. Arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# shellcheck disable=SC1091
. "${VLLM_ECHO_VENV:-.venv}/bin/activate"
python examples/offline_generate.py "$@"
