#!/usr/bin/env bash
# Installs what is needed (GPT-2's vocabulary included), builds normcore with its tests, and runs
# the whole suite.
# GPU tests report as skipped where no GPU is present. Exit status 0 only when all pass.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
bash scripts/install-deps.sh
# GPT-2's vocabulary for the tokenizer's tests (they skip without it; CI must not).
if ! bash scripts/gpt2-vocab.sh; then
  [ "${CI:-}" = true ] && exit 1
  echo "normcore: no GPT-2 vocabulary: the tokenizer tests that need it will skip" >&2
fi
bash scripts/build.sh -DNORMCORE_BUILD_TESTS=ON "$@"
build=${BUILD_DIR:-build}
phase "tests ($build)" ctest --test-dir "$build" --output-on-failure -j "${JOBS:-$(nproc)}"
