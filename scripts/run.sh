#!/usr/bin/env bash
# Installs what is needed (Debian packages, Fashion-MNIST included), builds normcore and
# runs the main job: a short `normcore train` on the best available device (a GPU when
# there is one, else the CPU). Extra arguments go to `normcore train` and override the
# short run's settings, e.g. `bash scripts/run.sh --epochs 12` for the full default run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh -DNORMCORE_BUILD_TESTS=OFF -DNORMCORE_BUILD_BENCHMARKS=OFF
"./${BUILD_DIR:-build}/normcore" train --epochs 3 "$@"
