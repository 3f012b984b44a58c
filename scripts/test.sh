#!/usr/bin/env bash
# Installs what is needed, builds normcore with its tests, and runs the whole suite.
# GPU tests report as skipped where no GPU is present. Exit status 0 only when all pass.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
bash scripts/install-deps.sh
bash scripts/build.sh -DNORMCORE_BUILD_TESTS=ON "$@"
build=${BUILD_DIR:-build}
phase "tests ($build)" ctest --test-dir "$build" --output-on-failure -j "${JOBS:-$(nproc)}"
