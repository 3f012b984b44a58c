#!/usr/bin/env bash
# Builds the CPU-only library and the threading tests (tests/core/test_concurrency.cpp,
# tests/kernels/test_parallel.cpp) with ThreadSanitizer (the `tsan` preset in CMakePresets.json, into
# build-tsan/) and runs them; any data race reported fails the run. Installs what it needs
# first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
bash scripts/install-deps.sh
# shellcheck disable=SC2046
phase "configure (build-tsan)" cmake --preset tsan $(launcher_args)
phase "build (build-tsan)" cmake --build --preset tsan -j "${JOBS:-$(nproc)}"
# halt_on_error: the first report fails the run; second_deadlock_stack: both stacks of a
# lock-order report.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
  phase "tests (build-tsan)" setarch "$(uname -m)" -R build-tsan/tests/normcore_thread_tests
