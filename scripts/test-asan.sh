#!/usr/bin/env bash
# Builds the CPU-only library and tests with AddressSanitizer and UndefinedBehaviorSanitizer
# (the `asan` preset in CMakePresets.json, into build-asan/) and runs the whole suite under
# them; any finding fails the run. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset asan
cmake --build --preset asan -j "${JOBS:-$(nproc)}"
ctest --preset asan -j "${JOBS:-$(nproc)}"
