#!/usr/bin/env bash
# Copies what bench/gpu_check.sh runs from a CUDA build (default build-gpu) into gpu-run/,
# the one folder to carry to a GPU machine: the shared library, the test programs, the
# normcore program (with the ONNX libraries it links, and ONNX's node tests), the benchmark-model programs, the benchmarks, the fortunes corpus and the
# peers of the gpt2 section (../shared); with WITH_DATA=1 also Fashion-MNIST; with
# BASELINE=DIR, a CUDA build of another tree (its library and those of bench/norms,
# bench/gemm_gn_min and bench/mlp_epoch it has, compressed) for gpu_check.sh's compare section.
#   [WITH_DATA=1] [BASELINE=DIR] bash bench/gpu_stage.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
mkdir -p gpu-run
cp -L "$build"/libnormcore.so* gpu-run/
cp "$build"/tests/normcore_tests "$build"/tests/normcore_cuda_faults "$build"/tests/normcore_c_api_test gpu-run/
[ -x "$build"/tests/normcore_onnx_tests ] && cp "$build"/tests/normcore_onnx_tests gpu-run/
cp "$build"/normcore gpu-run/
for program in "$build"/examples/kernelbench_* "$build"/bench/norms "$build"/bench/gemm_gn_min "$build"/bench/mlp_epoch \
  "$build"/bench/conv "$build"/bench/attention "$build"/bench/infer "$build"/bench/resnet_infer "$build"/bench/gpt2_decode "$build"/bench/safetensors_load \
  "$build"/custom-op/custom_op; do
  [ -f "$program" ] && [ -x "$program" ] && cp "$program" gpu-run/
done
# The data set (30 MB) only for the train, cnn, cnnbench and mlp sections: what travels is limited in size.
if [ "${WITH_DATA:-0}" = 1 ] && [ -d /usr/share/datasets/fashion-mnist ]; then
  cp -r /usr/share/datasets/fashion-mnist gpu-run/
fi
# The libraries of the ONNX importer that the normcore program links (Debian's libonnx and
# libprotobuf, which the GPU machine lacks), and ONNX's node tests (27 MB, 2 MB as xz) for the
# onnx section.
if [ -x "$build"/normcore ]; then
  ldd "$build"/normcore | awk '/libonnx|libprotobuf/ {print $3}' | while read -r lib; do cp -L "$lib" gpu-run/; done
fi
if [ -d /usr/include/onnx/backend/test/data/node ]; then
  tar -cJf gpu-run/onnx-node-tests.tar.xz -C /usr/include/onnx/backend/test/data node
fi
# The fortunes corpus (3 MB) for the sections that run train-lm.
[ -d /usr/share/games/fortunes ] && cp -r /usr/share/games/fortunes gpu-run/
# The peers of the gpt2 section: llm.c's trainer and PyTorch's step (../shared, 4 MB).
if [ -d ../shared/anchors/llmc ]; then
  mkdir -p gpu-run/peers
  cp -r ../shared/anchors/llmc ../shared/tools gpu-run/peers/
fi
if [ -n "${BASELINE:-}" ]; then
  base=$(mktemp -d)
  cp -L "$BASELINE"/libnormcore.so* "$base"/
  for program in norms gemm_gn_min mlp_epoch; do
    [ -x "$BASELINE/bench/$program" ] && cp "$BASELINE/bench/$program" "$base"/
  done
  tar -cJf gpu-run/baseline.tar.xz -C "$base" .
  rm -rf "$base"
fi
# The nvcc commands of the library's CUDA sources, for bench/cuda_arch_cost.sh: the tree's
# root, the architecture flags and the object folder left as @ROOT@, @ARCH@ and @OUT@ (and
# ccache, which the build may compile through, left out: the GPU machine times nvcc itself).
ninja -C "$build" -t commands normcore_objects | grep '/nvcc ' |
  sed -E -e 's#^ccache ##' -e "s#$(pwd)#@ROOT@#g" -e 's#--generate-code=[^ ]+##g' -e 's#-MD -MT [^ ]+ -MF [^ ]+##' \
    -e 's# -o [^ ]*/([^/ ]+)$# @ARCH@ -o @OUT@/\1#' > gpu-run/nvcc-commands.txt || true
# The library (50 MB, 8 MB as xz) and the programs that link the static library (the test
# suite, bench/conv: 40-60 MB each, mostly device code) travel compressed; gpu_check.sh
# unpacks them.
xz -T0 -f gpu-run/libnormcore.so
for program in normcore_tests normcore_onnx_tests conv attention; do
  [ -f gpu-run/$program ] && xz -T0 -f gpu-run/$program
done
du -sh gpu-run
