#!/usr/bin/env bash
# Configures and builds normcore into ${BUILD_DIR:-build}. The CUDA backend is built when
# nvcc is found (on PATH or in /usr/local/cuda); extra arguments go to cmake's configure.
# Compiles through ccache when it is installed (scripts/common.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
# shellcheck disable=SC2046
phase "configure ($build_dir)" cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release $(launcher_args) "$@"
phase "build ($build_dir)" cmake --build "$build_dir" -j "$jobs"
