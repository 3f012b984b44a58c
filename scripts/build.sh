#!/usr/bin/env bash
# Configures and builds normcore into ${BUILD_DIR:-build}. The CUDA backend is built when
# nvcc is found (on PATH or in /usr/local/cuda); extra arguments go to cmake's configure.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" -j "$jobs"
