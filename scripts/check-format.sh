#!/usr/bin/env bash
# Checks that the C++, CUDA and C files a change touches are formatted as .clang-format says
# (clang-format --dry-run -Werror), reading only those files: the ones that differ from the
# merge base with main (the working tree included), else from HEAD~1 (a fresh clone without
# main), else every file (a clone of one commit). clang-format -i FILE... fixes what it names.
#   check-format.sh [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
# Not formatted yet, so not checked: kernels/cuda/hopper/, kernels/cuda/attention/ and bench/,
# which change elsewhere at the moment (include them once that work has landed: format them
# in a commit of their own and drop them from this pattern), and text/unicode_classes.cpp,
# which scripts/make_unicode_classes.py generates.
excluded='^(kernels/cuda/hopper/|kernels/cuda/attention/|bench/|text/unicode_classes\.cpp$)'
patterns=('*.cpp' '*.h' '*.cu' '*.cuh' '*.c')

if [ $# -gt 0 ]; then
  base=$1
elif base=$(git merge-base HEAD main 2> /dev/null || git merge-base HEAD origin/main 2> /dev/null); then
  :
elif git rev-parse -q --verify HEAD~1 > /dev/null; then
  base=HEAD~1
else
  base=
fi
if [ -n "$base" ]; then
  files=$(git diff --name-only --diff-filter=ACMR "$base" -- "${patterns[@]}" | grep -vE "$excluded" || true)
else
  files=$(git ls-files -- "${patterns[@]}" | grep -vE "$excluded" || true)
fi
if [ -z "$files" ]; then
  echo "check-format: no C++, CUDA or C file changed${base:+ since $base}"
  exit 0
fi
count=$(echo "$files" | wc -l)
# shellcheck disable=SC2086
if ! echo "$files" | xargs clang-format --dry-run -Werror; then
  echo "check-format: the files above need clang-format -i (.clang-format)" >&2
  exit 1
fi
echo "check-format: $count changed files formatted${base:+ (since $base)}"
