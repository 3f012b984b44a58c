#!/usr/bin/env bash
# Installs what is needed, builds normcore and runs the main program on the best
# available device (a GPU when there is one, else the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh -DNORMCORE_BUILD_TESTS=OFF
"./${BUILD_DIR:-build}/examples/normcore_demo" "$@"
