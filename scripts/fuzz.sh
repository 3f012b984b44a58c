#!/usr/bin/env bash
# Builds the libFuzzer targets of the readers of untrusted input with clang, AddressSanitizer and
# UBSan (CPU only, into build-fuzz/) and runs each for FUZZ_SECONDS (default 600), all at
# once. New inputs go to build-fuzz/corpus/<target>, starting from tests/fuzz/corpus/<target>;
# a finding stops its fuzzer and leaves build-fuzz/artifacts/<target>-crash-* (copy it into
# tests/fuzz/corpus/<target> so that the regression tests keep it once fixed).
#   bash scripts/fuzz.sh [target...]      (targets: safetensors idx token_shard checkpoint gpt_checkpoint store bpe
#                                          color_image onnx_model onnx_tensor)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-600}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors idx token_shard checkpoint gpt_checkpoint store bpe color_image onnx_model onnx_tensor)
bash scripts/install-deps.sh clang
sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DNORMCORE_CUDA=OFF -DNORMCORE_FUZZ=ON -DBUILD_SHARED_LIBS=OFF \
  -DNORMCORE_BUILD_EXAMPLES=OFF -DNORMCORE_BUILD_BENCHMARKS=OFF \
  -DCMAKE_CXX_FLAGS="$sanitizers -fsanitize=fuzzer-no-link" -DCMAKE_EXE_LINKER_FLAGS="$sanitizers"
cmake --build build-fuzz -j "${JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"
mkdir -p build-fuzz/artifacts
pids=()
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  cp -n "tests/fuzz/corpus/$t"/* "build-fuzz/corpus/$t/" 2> /dev/null || true
  "build-fuzz/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/artifacts/$t-" "build-fuzz/corpus/$t" > "build-fuzz/fuzz_$t.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
  if wait "${pids[$i]}"; then result="no finding"; else result="FINDING (see build-fuzz/fuzz_${targets[$i]}.log)"; status=1; fi
  echo "fuzz_${targets[$i]}: $result; $(grep -E '^stat::number_of_executed_units' "build-fuzz/fuzz_${targets[$i]}.log" || true)"
done
exit $status
