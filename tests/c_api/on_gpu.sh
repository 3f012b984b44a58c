#!/usr/bin/env bash
# Runs the C API test on cuda:0, or exits 77 (skipped) where there is no GPU.
#   on_gpu.sh C_API_TEST DIR IMAGE [ONNX_TEST]
set -euo pipefail
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "no GPU: skipped"
  exit 77
fi
exec "$1" "$2" cuda "${@:3}"
