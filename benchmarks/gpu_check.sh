#!/usr/bin/env bash
# The built-in engine and the trainer on a GPU (benchmarks/gpu_check.py says what it checks):
# token-exactness, decode tokens/s and a trainer step of the default model. Runs from a
# checkout with no install of reinforge, no network and no vLLM; stopped after 470 s.
# PYTHON names the interpreter (default python3).
#
#   benchmarks/gpu_check.sh [--device cuda] [--model smollm2-135m] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
timeout 470 "${PYTHON:-python3}" benchmarks/gpu_check.py "$@" || status=$?
if [ "$status" -eq 124 ]; then
  echo "gpu_check: stopped after 470 s" >&2
fi
exit "$status"
