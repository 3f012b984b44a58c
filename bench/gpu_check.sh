#!/usr/bin/env bash
# One call's worth of GPU work, run from the repository root on the GPU machine with the
# binaries built here for sm_90 in gpu-run/ (and the Fashion-MNIST files in
# gpu-run/fashion-mnist): the test suite, a default training run with eval and predict,
# a memcheck of the CUDA tests, the MLP epoch benchmark beside PyTorch, and the PyTorch
# state_dict exchange files.
# Outputs go to $OUT (or /tmp/normcore-gpu).
set -u
root=$(pwd)
run=$root/gpu-run
data=$run/fashion-mnist
out=${OUT:-/tmp/normcore-gpu}
mkdir -p "$out"
export LD_LIBRARY_PATH=$run
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date -u

echo "== test suite"
"$run/normcore_tests" > "$out/tests.log" 2>&1
echo "exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]" "$out/tests.log"

if command -v compute-sanitizer > /dev/null; then
  echo "== compute-sanitizer memcheck: the CUDA tests of modules, optimizers, data and runtime"
  compute-sanitizer --tool memcheck "$run/normcore_tests" \
    --gtest_filter='Nn.Cuda*:OptimCuda*:DataLoader.Cuda*:CudaRuntime.*:CudaBackend.Public*' > "$out/memcheck.log" 2>&1
  echo "exit $?"; grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) +\]" "$out/memcheck.log"
fi

echo "== normcore train (defaults) on cuda"
"$run/normcore" train --data "$data" --device cuda --out "$out/ckpt.safetensors" > "$out/train.log" 2>&1
echo "exit $?"; grep -vE "step [0-9]+/" "$out/train.log" | tail -16
"$run/normcore" eval --checkpoint "$out/ckpt.safetensors" --data "$data" --device cuda | head -1
"$run/normcore" predict --checkpoint "$out/ckpt.safetensors" --device cuda tests/data/images/*.pgm tests/data/images/*.png

echo "== benchmark: one MLP epoch, normcore then PyTorch"
"$run/mlp_epoch" --device cuda --epochs 3 --data "$data"
python3 bench/mlp_epoch_torch.py --device cuda --epochs 3 --data "$data"

echo "== PyTorch state_dict exchange"
python3 tests/data/make_pytorch_mlp.py "$out/pytorch_mlp.safetensors" "$out/ckpt.safetensors" "$data"
