#!/usr/bin/env bash
# Builds the CPU-only library and tests with AddressSanitizer and UndefinedBehaviorSanitizer
# (the `asan` preset in CMakePresets.json, into build-asan/) and runs the whole suite under
# them; any finding fails the run. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
bash scripts/install-deps.sh
# shellcheck disable=SC2046
phase "configure (build-asan)" cmake --preset asan $(launcher_args)
phase "build (build-asan)" cmake --build --preset asan -j "${JOBS:-$(nproc)}"
phase "tests (build-asan)" ctest --preset asan -j "${JOBS:-$(nproc)}"
