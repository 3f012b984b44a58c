#!/usr/bin/env bash
# GPU work for one call, run from the repository root on the GPU machine with the binaries
# built for it in gpu-run/ (and the Fashion-MNIST files in gpu-run/fashion-mnist);
# `bash bench/gpu_stage.sh build-gpu` puts them there from a CUDA build.
#   bash bench/gpu_check.sh [section...]     (default: tests conformance train)
# Sections: tests (the test suite, the C API test on cuda:0 and the GPU-fault programs), sanitizers (compute-sanitizer's
# memcheck, racecheck and synccheck over CUDA tests and the conformance cases; SANITIZER_TOOLS
# picks tools, SANITIZER_SECONDS bounds each test run),
# conformance (the PyTorch-made cases on cpu and cuda), train (a default training run with
# eval and predict), cnn (cnn-gn and cnn-bn trained with the defaults, eval, predict),
# cnnbench (bench/conv and one CNN epoch beside PyTorch eager and torch.compile),
# kernelbench (the five benchmark models), mlp (the MLP epoch benchmark beside PyTorch), infer
# (a classifier's batch forward and one-image latency beside PyTorch), onnx (ONNX's node tests on
# the CPU and cuda:0), onnxexport (PyTorch exports against onnxruntime, and their speed),
# resnetinfer (ResNet-50
# inference beside torchvision eager and torch.compile), decode (GPT-2 124M prefill and batch-1
# decoding beside transformers eager and torch.compile), customop (the
# custom-op example with its CUDA kernels, staged from BUILD_DIR/custom-op),
# norms (the normalization benchmark), normsfresh (the same with each case in a fresh process,
# median and range of NORMS_RUNS runs, the GPU's clock, temperature and power logged), transformer (bench/attention and the transformer-shape
# norms beside PyTorch's back ends), attention (the attention tests with the Hopper kernels'
# own, their HGMMA/UTMALDG instruction counts, bench/attention beside
# ../shared/tools/attn_peer.py and, at head dim 256, bench/transformer_torch.py; ATTENTION_FILTER picks cases, ATTENTION_PEERS=0 skips PyTorch), gemm (the Linear + GroupNorm + min + bias model against
# its GEMM, beside PyTorch), compare (the benchmarks of the baseline
# build staged by BASELINE=DIR bash bench/gpu_stage.sh and of this one, alternating: those of
# bench/norms, bench/gemm_gn_min and, with the data staged, bench/mlp_epoch that the baseline
# has; COMPARE_ROUNDS rounds of mlp_epoch, default 3), precision (`normcore train` of
# mlp-layernorm, cnn-gn and cnn-bn and `normcore train-lm`, defaults, in fp32, bf16 and fp16,
# to their test accuracy and validation loss; the runs share the GPU, so their times are not
# benchmarks; train-lm needs the corpus in gpu-run/fortunes), precisionbench (one MLP and one
# CNN epoch and 500 GPT steps per precision, normcore then PyTorch eager and torch.compile),
# graphs (the CUDA-graph tests, then MLP and CNN epochs and 500 GPT steps with and without
# CUDA graphs beside PyTorch eager and torch.compile; GRAPH_CASES picks "model:precision"
# epochs, GRAPH_GPT=0 skips the GPT), distributed (the distributed tests on NCCL, one rank
# through the launcher against plain training, and with several GPUs a `train --nproc`
# run on all of them), archs (bench/cuda_arch_cost.sh: the library's CUDA sources compiled
# for sm_90 alone and for the portable default set, their CPU time and size), gpt2 (GPT-2 124M
# training steps, `train-lm --model gpt2 --benchmark`, at each batch of GPT2_BATCHES beside
# PyTorch's torch.compile, then the byte-vocabulary model beside PyTorch and llm.c at B = 16;
# GPT2_PEERS=0 leaves the peers out, GPT2_BYTES=0 the byte-vocabulary model, GPT2_RECOMPUTE and
# GPT2_ATTENTION list --recompute modes and --attention engines to run, GPT2_PROFILE=1 adds ncu's
# kernel table of a 2-layer step), gpt2dp (GPT-2 124M data-parallel on every GPU: graphed,
# direct and sharded, their checkpoints compared, beside PyTorch DDP, ZeRO-1 and FSDP), gpt2curve (GPT-2 124M trained by PyTorch and by train-lm from
# the same initial weights on the same windows, their train losses every 50 steps side by side),
# hfgpt2 (transformers' GPT-2 checkpoints loaded by normcore and normcore's saved ones by
# transformers, bench/hf_gpt2_reference.py), resnet (torchvision's ResNets loaded by load_resnet,
# logits against torchvision's, bench/resnet_reference.py).
# Logs go to $OUT (or /tmp/normcore-gpu).
set -u
root=$(pwd)
run=$root/gpu-run
data=$run/fashion-mnist
out=${OUT:-/tmp/normcore-gpu}
mkdir -p "$out"
export LD_LIBRARY_PATH=$run
# The library and the programs linked statically against it travel compressed.
for packed in "$run"/*.xz; do
  case $packed in *.tar.xz | "$run/*.xz") continue ;; esac
  xz -dkf "$packed" && chmod +x "${packed%.xz}"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date -u
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(tests conformance train)

for section in "${sections[@]}"; do
  case $section in
    tests)
      echo "== test suite"
      "$run/normcore_tests" > "$out/tests.log" 2>&1
      echo "exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]" "$out/tests.log"
      echo "== the C API from C, on cuda:0"
      "$run/normcore_c_api_test" "$out" cuda tests/data/images/t10k-0-ankle-boot.pgm tests/data/onnx/torch_cnn \
        > "$out/c-api.log" 2>&1
      echo "exit $?"; tail -3 "$out/c-api.log"
      echo "== GPU faults, one process each"
      for mode in launch-error illegal-address illegal-address-blocking; do
        "$run/normcore_cuda_faults" $mode > "$out/faults-$mode.log" 2>&1
        echo "exit $?"; grep -E "^(FAIL|  )|failed$" "$out/faults-$mode.log"
      done
      ;;
    customop)
      # examples/custom_op built against the installed library (BUILD_DIR=build-gpu
      # scripts/test-install.sh builds it with its CUDA kernels): gradcheck on the CPU and
      # the GPU, the kernels against the CPU loop.
      echo "== the custom-op example"
      "$run/custom_op"
      echo "exit $?"
      ;;
    sanitizers)
      # memcheck runs the whole suite but the tests that run out of memory on purpose (memcheck
      # counts their failing allocations as errors). racecheck and synccheck look at shared
      # memory and barriers, which only the copy (transpose), reduction, normalization, fused
      # and Hopper attention kernels use: they run the tests that reach those kernels.
      all='-CudaFaults.*OutOfMemory*:CudaRuntime.AllocationLargerThanTheGpu*'
      shared='CudaBackend.CopyConvertsEveryDTypePairAtEveryLayout:CudaBackend.Reduce*:CudaBackend.ArgReduce*'
      shared+=':CudaBackend.ReductionsPropagateNan:CudaBackend.PublicOpsOnCudaTensorsMatchCpu:NormCuda.*'
      shared+=':FusedGemmGroupNormMinBias.Cuda*:Nn.CudaForwardMatchesCpu:OptimCuda.*:Conformance.AllCasesPassOnCuda'
      shared+=':AttentionHopper.*'
      for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck}; do
        tests=$shared
        [ $tool = memcheck ] && tests=$all
        echo "== compute-sanitizer --tool $tool over CUDA tests"
        timeout ${SANITIZER_SECONDS:-600} compute-sanitizer --tool $tool "$run/normcore_tests" --gtest_filter="$tests" \
          > "$out/$tool-tests.log" 2>&1
        echo "exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED|SKIPPED) +\]" "$out/$tool-tests.log"
        echo "== compute-sanitizer --tool $tool over the conformance cases on cuda"
        compute-sanitizer --tool $tool "$run/normcore" conformance tests/data/conformance --device cuda \
          > "$out/$tool-conformance.log" 2>&1
        echo "exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" "$out/$tool-conformance.log"
      done
      ;;
    conformance)
      echo "== normcore conformance tests/data/conformance --device all"
      "$run/normcore" conformance tests/data/conformance --device all
      echo "exit $?"
      ;;
    train)
      echo "== normcore train (defaults) on cuda"
      "$run/normcore" train --data "$data" --device cuda --out "$out/ckpt.safetensors" > "$out/train.log" 2>&1
      echo "exit $?"; grep -vE "step [0-9]+/" "$out/train.log" | tail -16
      "$run/normcore" eval --checkpoint "$out/ckpt.safetensors" --data "$data" --device cuda | head -1
      "$run/normcore" predict --checkpoint "$out/ckpt.safetensors" --device cuda tests/data/images/*.pgm \
        tests/data/images/*.png
      ;;
    kernelbench)
      echo "== the five benchmark models"
      for program in "$run"/kernelbench_*; do
        echo "-- $(basename "$program")"
        "$program" --device cuda
        echo "exit $?"
      done
      ;;
    cnn)
      # Both CNNs with `normcore train`'s defaults, each to its test accuracy, then eval and
      # predict of one checkpoint.
      for model in cnn-gn cnn-bn; do
        echo "== normcore train --model $model (defaults) on cuda"
        start=$(date +%s)
        "$run/normcore" train --model $model --data "$data" --device cuda --out "$out/$model.safetensors" \
          > "$out/$model.log" 2>&1
        echo "exit $? after $(( $(date +%s) - start )) s"; grep -vE "step [0-9]+/" "$out/$model.log" | tail -14
      done
      "$run/normcore" eval --checkpoint "$out/cnn-bn.safetensors" --data "$data" --device cuda | head -1
      "$run/normcore" predict --checkpoint "$out/cnn-gn.safetensors" --device cuda tests/data/images/*.pgm
      echo "== weights both ways: PyTorch's cnn-bn for tests/data, normcore's checkpoints into PyTorch"
      python3 tests/data/make_pytorch_cnn.py make "$out/pytorch_cnn.safetensors" "$data"
      python3 tests/data/make_pytorch_cnn.py load "$out/cnn-bn.safetensors" "$data" cnn-bn
      python3 tests/data/make_pytorch_cnn.py load "$out/cnn-gn.safetensors" "$data" cnn-gn
      ;;
    cnnbench)
      echo "== benchmark: conv2d, BatchNorm and GroupNorm on ResNet-like shapes, normcore then PyTorch"
      "$run/conv"
      python3 bench/conv_torch.py
      echo "== benchmark: one CNN epoch, normcore then PyTorch eager and torch.compile"
      for model in cnn-gn cnn-bn; do
        "$run/mlp_epoch" --model $model --device cuda --epochs 2 --data "$data" 2>&1 | grep -v "^ *step"
        python3 bench/mlp_epoch_torch.py --model $model --device cuda --epochs 2 --data "$data"
        python3 bench/mlp_epoch_torch.py --model $model --compile --device cuda --epochs 2 --data "$data" 2>&1 | tail -2
      done
      ;;
    mlp)
      echo "== benchmark: one MLP epoch, normcore then PyTorch"
      "$run/mlp_epoch" --device cuda --epochs 3 --data "$data"
      python3 bench/mlp_epoch_torch.py --device cuda --epochs 3 --data "$data"
      ;;
    archs)
      echo "== build cost: the CUDA sources for sm_90 alone and for the portable set"
      bash bench/cuda_arch_cost.sh "$run/nvcc-commands.txt" "90" "80-real;86-real;89-real;90"
      ;;
    infer)
      echo "== benchmark: inference, a batch of 128 and one image, normcore then PyTorch, alternating"
      for round in 1 2 3; do
        for model in mlp cnn-bn; do
          "$run/infer" --device cuda --model "$model" --reps 50
          python3 bench/infer_torch.py --device cuda --model "$model" --reps 50
        done
      done
      ;;
    resnetinfer)
      # torchvision's ResNet-50 on 224 x 224 images, batch 1 and 64: normcore eager and as
      # CUDA graphs, then torchvision eager and under torch.compile (minutes: it compiles).
      echo "== benchmark: ResNet-50 inference, normcore then PyTorch"
      "$run/resnet_infer" --model resnet50 --batch 1,64 --reps 50 | grep -v '^{'
      python3 bench/resnet_infer_torch.py --model resnet50 --batch 1,64 --reps 50 2>&1 | grep -v '^{' | grep -v Warning
      ;;
    decode)
      # GPT-2 124M serving one sequence (random weights): the prefill of 1,024 tokens and 256
      # greedy tokens after an 8-token prompt, f32 and bf16; normcore graphed and direct, then
      # transformers eager and with a static cache under torch.compile (minutes: it compiles);
      # then on two CPU cores. DECODE_GPU=0 or DECODE_CPU=0 leaves a part out.
      echo "== benchmark: GPT-2 124M prefill and batch-1 decoding, normcore then transformers"
      [ "${DECODE_GPU:-1}" = 1 ] && "$run/gpt2_decode" --tokens 256 --prompt-tokens 1024 --reps 5 | grep -v '^{'
      [ "${DECODE_GPU:-1}" = 1 ] && python3 bench/gpt2_decode_torch.py --tokens 256 --prompt-tokens 1024 --reps 5 \
        ${DECODE_TORCH_ARGS:-} 2>&1 | grep -v '^{' | grep -v Warning
      if [ "${DECODE_CPU:-1}" = 1 ]; then
        # The same on two CPU cores (taskset) and two threads each, f32: 64 tokens after the
        # 8-token prompt, a prefill of 256.
        echo "-- on two CPU cores: normcore, then transformers eager"
        taskset -c 0,1 "$run/gpt2_decode" --device cpu --threads 2 --tokens 64 --prompt-tokens 256 --reps 3 | grep -v '^{'
        taskset -c 0,1 python3 bench/gpt2_decode_torch.py --device cpu --threads 2 --tokens 64 --prompt-tokens 256 \
          --reps 3 2>&1 | grep -v '^{' | grep -v Warning
      fi
      ;;
    norms)
      echo "== benchmark: the normalization kernels"
      "$run/norms" --json "$out/norms.json"
      ;;
    normsfresh)
      echo "== benchmark: the normalization kernels, each case in a fresh process, median of ${NORMS_RUNS:-3} runs"
      python3 bench/norms_fresh.py "$run/norms" --runs "${NORMS_RUNS:-3}" --json "$out/norms-fresh.json" \
        2> "$out/norms-fresh.log"
      ;;
    attention)
      echo "== attention: the Hopper kernels' tests, their SASS, then bench/attention beside PyTorch's back ends"
      "$run/normcore_tests" --gtest_filter='AttentionHopper*:AttentionCuda*:AttentionCudnn*' > "$out/attention-tests.log" 2>&1
      grep -A8 'Failure$' "$out/attention-tests.log" | head -${ATTENTION_FAILURE_LINES:-80}
      tail -3 "$out/attention-tests.log"
      if command -v cuobjdump > /dev/null; then
        echo "-- warpgroup MMA (HGMMA) and tensor-copy (UTMALDG) instructions in the library's Hopper kernels"
        cuobjdump -sass "$run/libnormcore.so" | awk '/Function : .*hopper/ {on = 1} /Function : / && !/hopper/ {on = 0}
          on && /HGMMA/ {h++} on && /UTMALDG/ {u++} END {printf "HGMMA %d, UTMALDG %d\n", h, u}'
      fi
      "$run/attention" --filter "${ATTENTION_FILTER:-}" --json "$out/attention.json"
      if [ "${ATTENTION_PEERS:-1}" = 1 ]; then
        python3 "$run/peers/tools/attn_peer.py"
        python3 bench/transformer_torch.py --only attention --reps 10 --shapes 4x16x4096x256,16x8x1024x256
      fi
      ;;
    transformer)
      echo "== benchmark: attention and the transformer norms, normcore then PyTorch"
      "$run/attention" --json "$out/attention.json"
      "$run/norms" --no-sweep --filter 16384 --json "$out/norms-transformer.json"
      python3 bench/transformer_torch.py > "$out/transformer_torch.log" 2>&1
      grep -v '^{' "$out/transformer_torch.log"
      ;;
    gemm)
      echo "== benchmark: Linear + GroupNorm + min + bias against its GEMM, normcore then PyTorch"
      "$run/gemm_gn_min" --json "$out/gemm_gn_min.json"
      python3 bench/gemm_gn_min_torch.py --json "$out/gemm_gn_min_torch.json"
      ;;
    compare)
      echo "== benchmarks of the baseline build and of this one, alternating"
      base=/tmp/normcore-baseline
      mkdir -p "$base" && tar -xJf "$run/baseline.tar.xz" -C "$base" || exit 1
      if [ -x "$base/mlp_epoch" ] && [ -d "$data" ]; then
        for round in $(seq ${COMPARE_ROUNDS:-3}); do
          for tree in baseline current; do
            dir=$run
            [ $tree = baseline ] && dir=$base
            echo "-- mlp_epoch, $tree, round $round"
            LD_LIBRARY_PATH=$dir "$dir/mlp_epoch" --device cuda --epochs 3 --data "$data" 2>&1 | grep -v "^ *step"
          done
        done
      fi
      [ -x "$base/norms" ] || continue
      for round in 1 2; do
        for tree in baseline current; do
          dir=$run
          [ $tree = baseline ] && dir=$base
          echo "-- norms, $tree, round $round"
          LD_LIBRARY_PATH=$dir "$dir/norms" --json "$out/compare-norms-$tree-$round.json" \
            > "$out/compare-norms-$tree-$round.log" 2>&1
          echo "exit $?"
        done
      done
      for tree in baseline current; do
        dir=$run
        [ $tree = baseline ] && dir=$base
        echo "-- gemm_gn_min, $tree"
        LD_LIBRARY_PATH=$dir "$dir/gemm_gn_min" --json "$out/compare-gemm-$tree.json" > "$out/compare-gemm-$tree.log" 2>&1
        echo "exit $?"
      done
      ;;
    precision)
      echo "== normcore train and train-lm (defaults) in fp32, bf16 and fp16, side by side on the GPU"
      pids=()
      if [ -d "$run/fortunes" ]; then
        for p in fp32 bf16 fp16; do
          "$run/normcore" train-lm --data "$run/fortunes" --device cuda --precision $p --sample 0 \
            --out "$out/gpt-$p.safetensors" > "$out/train-lm-$p.log" 2>&1 &
          pids+=($!)
        done
      fi
      for model in mlp-layernorm cnn-gn cnn-bn; do
        for p in fp32 bf16 fp16; do
          "$run/normcore" train --model $model --data "$data" --device cuda --precision $p \
            --out "$out/$model-$p.safetensors" > "$out/train-$model-$p.log" 2>&1 &
          pids+=($!)
        done
        wait "${pids[@]: -3}"
      done
      wait
      for model in mlp-layernorm cnn-gn cnn-bn; do
        for p in fp32 bf16 fp16; do
          echo "-- $model $p: $(grep -E '^epoch [0-9]+/' "$out/train-$model-$p.log" | tail -1)"
        done
      done
      for p in fp32 bf16 fp16; do
        [ -f "$out/train-lm-$p.log" ] || continue
        echo "-- train-lm $p: $(grep -E '^step [0-9]+/' "$out/train-lm-$p.log" | tail -1)"
        grep -E "error|Error" "$out/train-lm-$p.log" | head -3
      done
      ;;
    precisionbench)
      echo "== benchmark: training steps per precision, normcore then PyTorch eager and torch.compile"
      for model in mlp cnn-gn; do
        for p in fp32 bf16 fp16; do
          "$run/mlp_epoch" --model $model --precision $p --device cuda --epochs 2 --data "$data" 2>&1 | grep -v "^ *step" | head -1
          python3 bench/mlp_epoch_torch.py --model $model --precision $p --device cuda --epochs 2 --data "$data" | grep -E "^pytorch"
          python3 bench/mlp_epoch_torch.py --model $model --precision $p --compile --device cuda --epochs 2 \
            --data "$data" 2>&1 | tail -2 | head -1
        done
      done
      if [ -d "$run/fortunes" ]; then
        for p in fp32 bf16; do
          gpt=(--data "$run/fortunes" --device cuda --precision $p --steps 500 --eval-interval 250)
          echo "-- GPT 500 steps, $p"
          "$run/normcore" train-lm "${gpt[@]}" --sample 0 --out "$out/gpt-bench.safetensors" | grep -E "^step 500/"
          python3 bench/gpt_train_torch.py "${gpt[@]}" 2>&1 | grep -E "^step 500/"
          python3 bench/gpt_train_torch.py "${gpt[@]}" --compile 2>&1 | grep -E "^step 500/"
        done
      fi
      ;;
    graphs)
      echo "== CUDA graphs: the graph tests"
      "$run/normcore_tests" --gtest_filter='CudaGraph.*:GraphedStep.*' > "$out/graph-tests.log" 2>&1
      echo "exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]" "$out/graph-tests.log"
      echo "== benchmark: epochs without and with CUDA graphs, then PyTorch eager, torch.compile and its CUDA-graph mode"
      for case in ${GRAPH_CASES:-mlp:fp32 mlp:bf16 cnn-gn:bf16}; do
        model=${case%%:*} p=${case##*:}
        for g in off on; do
          "$run/mlp_epoch" --model $model --precision $p --cuda-graph $g --device cuda --epochs 2 --data "$data" | grep -v '^{'
        done
        python3 bench/mlp_epoch_torch.py --model $model --precision $p --device cuda --epochs 2 --data "$data" | grep -E "^pytorch"
        for mode in default reduce-overhead; do
          python3 bench/mlp_epoch_torch.py --model $model --precision $p --compile --compile-mode $mode --device cuda \
            --epochs 2 --data "$data" 2>&1 | grep -E "^pytorch" | head -1
        done
      done
      if [ "${GRAPH_GPT:-1}" = 1 ] && [ -d "$run/fortunes" ]; then
        gpt=(--data "$run/fortunes" --device cuda --precision bf16 --steps 500 --eval-interval 250)
        echo "-- GPT 500 steps, bf16"
        for g in off on; do
          "$run/normcore" train-lm "${gpt[@]}" --cuda-graph $g --sample 0 --out "$out/gpt-graph.safetensors" | grep -E "^step 500/"
        done
        python3 bench/gpt_train_torch.py "${gpt[@]}" 2>&1 | grep -E "^step 500/"
        python3 bench/gpt_train_torch.py "${gpt[@]}" --compile 2>&1 | grep -E "^step 500/"
      fi
      ;;
    distributed)
      echo "== data-parallel: the distributed tests (NCCL on the GPUs there are)"
      timeout 300 "$run/normcore_tests" --gtest_filter='DistributedCuda.*:ProcessGroup*:DataParallel.*:ShardedOptimizer.*:TcpStore.*:AutogradHooks.*:Nccl.*' \
        > "$out/distributed-tests.log" 2>&1
      echo "exit $?"; grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) +\]" "$out/distributed-tests.log"
      echo "== one rank through the launcher (NCCL, DistributedDataParallel) against plain training"
      dp=(--data "$data" --model mlp-layernorm --epochs 1 --seed 3)
      "$run/normcore" train "${dp[@]}" --cuda-graph off --device cuda:0 --out "$out/plain.safetensors" |
        grep -E "^epoch 1/1:"
      MASTER_PORT=29533 "$run/normcore" launch --nproc 1 -- "$run/normcore" train "${dp[@]}" --cuda-graph off --device cuda \
        --out "$out/dp1.safetensors" | grep -E "over nccl|epoch 1/1:"
      python3 bench/compare_checkpoints.py "$out/plain.safetensors" "$out/dp1.safetensors"
      echo "identical parameters: exit $?"
      echo "== the same, steps as CUDA graphs (the all-reduces replayed in them)"
      "$run/normcore" train "${dp[@]}" --cuda-graph on --device cuda:0 \
        --out "$out/plain-graphed.safetensors" | grep -E "^epoch 1/1:"
      MASTER_PORT=29535 "$run/normcore" launch --nproc 1 -- "$run/normcore" train "${dp[@]}" --cuda-graph on \
        --device cuda --out "$out/dp1-graphed.safetensors" | grep -E "with CUDA graphs|epoch 1/1:"
      python3 bench/compare_checkpoints.py "$out/plain-graphed.safetensors" "$out/dp1-graphed.safetensors"
      echo "identical parameters: exit $?"
      gpus=$(nvidia-smi -L | wc -l)
      if [ "$gpus" -ge 2 ]; then
        echo "== train --nproc $gpus, defaults (mlp-layernorm, 12 epochs, batch 128 per rank)"
        MASTER_PORT=29534 "$run/normcore" train --data "$data" --nproc "$gpus" --out "$out/dp.safetensors" \
          | grep -E "over nccl|epoch [0-9]+/[0-9]+:"
      fi
      ;;
    gpt2dp)
      # GPT-2 124M (B = 16 a GPU, bf16) data-parallel on every GPU of the machine: one GPU, then
      # all of them with the steps graphed, direct (timing how long backward's end waits for
      # the all-reduces) and graphed with the optimizer state sharded; a 2-layer model's
      # checkpoints after 30 steps of each (deterministic) compared: graphed against
      # direct, sharded against whole, optimizer state included; then PyTorch under torchrun
      # on one GPU (torch.compile) and on all (DDP, DDP with torch.compile,
      # ZeroRedundancyOptimizer, FSDP): bench/gpt_ddp_torch.py. GPT2DP_PEERS=0 leaves PyTorch out.
      gpus=$(nvidia-smi -L | wc -l)
      shards=$(mktemp -d)
      (cd "$shards" && python3 "$run/peers/llmc/mkdata.py" 2000000) > /dev/null
      lm=("$run/normcore" train-lm --model gpt2 --data "$shards/train.bin" --val-data "$shards/val.bin" --device cuda
        --precision bf16 --batch-size 16 --lr 6e-4 --warmup 10)
      echo "== GPT-2 124M, B = 16 a GPU: one GPU, then $gpus"
      "${lm[@]}" --benchmark 20 | grep -E "^benchmark"
      port=29640
      modes=("graphed:" "direct:--cuda-graph off" "sharded:--shard-optimizer on")
      for mode in "${modes[@]}"; do
        echo "-- $gpus GPUs, ${mode%%:*}"
        # shellcheck disable=SC2086 # the mode's options split into words
        MASTER_PORT=$((port++)) timeout 90 "${lm[@]}" --nproc "$gpus" ${mode#*:} --benchmark 20 | grep -E "benchmark"
      done
      # --attention native: with --deterministic on, the auto engine takes cuDNN's attention
      # backward on Hopper, and two ranks on it made no progress (docs/DESIGN.md, data parallelism).
      echo "== 2 layers, 30 steps on $gpus GPUs, --deterministic on --attention native: the checkpoints"
      for mode in "${modes[@]}"; do
        # shellcheck disable=SC2086
        MASTER_PORT=$((port++)) timeout 90 "${lm[@]}" --layers 2 --nproc "$gpus" ${mode#*:} --steps 30 --eval-interval 30 \
          --eval-batches 1 --deterministic on --attention native --out "$out/dp-${mode%%:*}.safetensors" |
          grep -E "step 30/30"
      done
      python3 bench/compare_checkpoints.py "$out/dp-graphed.safetensors" "$out/dp-direct.safetensors" --skip none.
      echo "graphed as direct: exit $?"
      python3 bench/compare_checkpoints.py "$out/dp-sharded.safetensors" "$out/dp-graphed.safetensors" --skip none.
      echo "sharded as whole: exit $?"
      if [ "${GPT2DP_PEERS:-1}" = 1 ]; then
        echo "== PyTorch under torchrun: one GPU (torch.compile), then $gpus"
        export PYTHONUNBUFFERED=1
        timeout 300 torchrun --master-port $((port++)) --nproc_per_node 1 bench/gpt_ddp_torch.py --compile 2>&1 |
          grep -E "^torch|Error"
        for mode in "ddp" "ddp --compile" "zero1" "fsdp"; do
          # shellcheck disable=SC2086
          timeout 300 torchrun --master-port $((port++)) --nproc_per_node "$gpus" bench/gpt_ddp_torch.py --mode $mode 2>&1 |
            grep -E "^torch|Error"
        done
      fi
      ;;
    gpt2)
      # GPT-2 124M (vocabulary 50257 padded to 50304, T = 1024, bf16, AdamW, random tokens) at
      # each batch of GPT2_BATCHES: normcore's training step, then PyTorch's (torch.compile),
      # then llm.c's at B = 16.
      echo "== benchmark: GPT-2 124M training steps, normcore then PyTorch torch.compile, then llm.c"
      shards=$(mktemp -d)
      (cd "$shards" && python3 "$run/peers/llmc/mkdata.py" 2000000)
      # GPT2_RECOMPUTE: normcore's --recompute modes, run in turn (e.g. "none gelu none gelu");
      # GPT2_ATTENTION: its --attention engines, each with every mode (e.g. "auto native").
      for b in ${GPT2_BATCHES:-16}; do
        echo "-- B = $b"
        for a in ${GPT2_ATTENTION:-auto}; do
          for r in ${GPT2_RECOMPUTE:-none}; do
            echo "normcore --recompute $r --attention $a"
            "$run/normcore" train-lm --model gpt2 --data "$shards/train.bin" --val-data "$shards/val.bin" \
              --device cuda --precision bf16 --batch-size $b --lr 6e-4 --warmup 10 --recompute $r --attention $a \
              --benchmark ${GPT2_STEPS:-20} | grep -E "^benchmark"
          done
        done
        [ "${GPT2_PEERS:-1}" = 1 ] && python3 "$run/peers/tools/gpt_peer.py" --vocab 50304 --batch $b --compile 2>&1 | tail -1
      done
      if [ "${GPT2_PEERS:-1}" = 1 ] && [ "${GPT2_BYTES:-1}" = 1 ]; then
        echo "-- the 12-layer byte-vocabulary model (vocabulary 256), B = 16: normcore, PyTorch eager, torch.compile"
        "$run/normcore" train-lm --data "$run/fortunes" --device cuda --precision bf16 --layers 12 --heads 12 --embed 768 \
          --context 1024 --dropout 0 --batch-size 16 --benchmark ${GPT2_STEPS:-20} | grep -E "^benchmark"
        python3 "$run/peers/tools/gpt_peer.py" --vocab 256 --batch 16 2>&1 | tail -1
        python3 "$run/peers/tools/gpt_peer.py" --vocab 256 --batch 16 --compile 2>&1 | tail -1
      fi
      if [ "${GPT2_PEERS:-1}" = 1 ]; then
        echo "-- llm.c, B = 16 (its device memory in use: cudaMemGetInfo once everything is allocated)"
        sed 's/num_parameters|precision"/num_parameters|precision|memory usage"/; s/head -2/head -4/' \
          "$run/peers/llmc/run.sh" > "$run/peers/llmc/run_mem.sh"
        bash "$run/peers/llmc/run_mem.sh" 16
      fi
      if [ "${GPT2_PROFILE:-0}" = 1 ]; then
        # ncu times every kernel of four eager steps (3 warm-up, 1 timed) of GPT-2's widths with
        # 2 layers (a layer's kernels are those of each of the 12); the table sums them by name.
        echo "== ncu: the kernels of a GPT-2-wide step (2 layers, B = 16, bf16, eager), by total time"
        ncu --metrics gpu__time_duration.sum --csv --print-units base "$run/normcore" train-lm --model gpt2 \
          --layers 2 --data "$shards/train.bin" --val-data "$shards/val.bin" --device cuda --precision bf16 \
          --batch-size 16 --cuda-graph off --benchmark 1 > "$out/ncu-gpt2.csv" 2> "$out/ncu-gpt2.log"
        python3 - "$out/ncu-gpt2.csv" <<'PY'
import csv, collections, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = [r for r in csv.DictReader(lines) if r.get("Metric Name") == "gpu__time_duration.sum"]
by_name, count = collections.defaultdict(float), collections.Counter()
for r in rows:
    name = r["Kernel Name"].split("(")[0][:90]
    by_name[name] += float(r["Metric Value"].replace(",", "")) / 4 / 1e6
    count[name] += 1
total = sum(by_name.values())
print(f"{len(rows)} kernels, {total:.2f} ms of kernels per step (4 steps)")
for name, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[:32]:
    print(f"{100 * ms / total:5.1f}% {ms:7.3f} ms {count[name] // 4:4d}x  {name}")
PY
      fi
      ;;
    gpt2curve)
      # GPT-2 124M from PyTorch's initial weights on the same windows in the same order, bf16,
      # CURVE_STEPS steps (300): the train losses train-lm prints every 50 steps beside PyTorch's
      # (bench/gpt2_curve_torch.py), and their relative differences. CURVE_TRAIN and CURVE_VAL name
      # token shards (default: random GPT-2 ids from llm.c's mkdata.py).
      steps=${CURVE_STEPS:-300}
      train=${CURVE_TRAIN:-} val=${CURVE_VAL:-}
      if [ -z "$train" ]; then
        shards=$(mktemp -d)
        (cd "$shards" && python3 "$run/peers/llmc/mkdata.py" 2000000)
        train=$shards/train.bin val=$shards/val.bin
      fi
      curve=(--batch-size 16 --steps "$steps" --lr 1e-3 --min-lr 1e-4 --warmup 100 --eval-interval 50)
      echo "== GPT-2 124M, the same initial weights and windows: PyTorch, then normcore ($steps steps, bf16)"
      python3 bench/gpt2_curve_torch.py --data "$train" --init "$out/curve-init.safetensors" "${curve[@]}" \
        > "$out/curve-torch.log" 2>&1
      echo "exit $?"; head -1 "$out/curve-torch.log"
      "$run/normcore" train-lm --model gpt2 --data "$train" --val-data "$val" --init "$out/curve-init.safetensors" \
        --shuffle off --precision bf16 --device cuda --sample 0 --out "$out/curve.safetensors" "${curve[@]}" \
        > "$out/curve-normcore.log" 2>&1
      echo "exit $?"
      python3 - "$out/curve-torch.log" "$out/curve-normcore.log" <<'PY'
import re, sys
def losses(path):
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step (\d+)/\d+: train loss ([0-9.]+)", open(path).read(), re.M)}
torch_losses, normcore_losses = losses(sys.argv[1]), losses(sys.argv[2])
worst = 0.0
for step in sorted(torch_losses):
    if step not in normcore_losses:
        print(f"step {step}: no normcore loss"); worst = float("inf"); continue
    t, n = torch_losses[step], normcore_losses[step]
    worst = max(worst, abs(n - t) / t)
    print(f"step {step:4d}: PyTorch {t:.4f}, normcore {n:.4f}, {100 * (n - t) / t:+.2f}%")
print(f"largest difference {100 * worst:.2f}% ({'within' if worst <= 0.01 else 'NOT within'} 1%)")
PY
      ;;
    hfgpt2)
      # transformers' GPT2LMHeadModels (random weights, three sizes) loaded by load_hf_gpt2:
      # logits and greedy continuations on the CPU and the GPU; then normcore's save_hf_gpt2
      # files loaded by transformers.
      echo "== Hugging Face GPT-2: transformers' checkpoints in normcore, normcore's in transformers"
      python3 bench/hf_gpt2_reference.py make "$out/hf"
      NORMCORE_HF_GPT2_DIR="$out/hf" "$run/normcore_tests" --gtest_filter='HfGpt2*' > "$out/hf-tests.log" 2>&1
      echo "exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]|Failure|error" "$out/hf-tests.log" | head -20
      python3 bench/hf_gpt2_reference.py check "$out/hf"
      ;;
    onnx)
      # ONNX's node tests (Debian's libonnx-testdata, staged by gpu_stage.sh) through the
      # importer on the CPU and on cuda:0: PASS or FAIL with the reason per test and device.
      echo "== the importer's own tests (CPU and cuda:0)"
      "$run/normcore_onnx_tests" > "$out/onnx-unit.log" 2>&1
      echo "exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]" "$out/onnx-unit.log"
      echo "== ONNX node tests, onnx-test --device all"
      mkdir -p "$out/onnx"
      tar -xJf "$run/onnx-node-tests.tar.xz" -C "$out/onnx"
      "$run/normcore" onnx-test "$out/onnx/node" --device all > "$out/onnx-tests.log" 2>&1
      echo "exit $?"; tail -1 "$out/onnx-tests.log"
      grep -c "^PASS .* cuda" "$out/onnx-tests.log" | sed 's/^/passed on cuda: /'
      grep -c "^PASS .* cpu" "$out/onnx-tests.log" | sed 's/^/passed on cpu: /'
      rm -rf "$out/onnx"
      ;;
    onnxexport)
      # Models exported by torch.onnx.export (bench/onnx_exports.py: an MLP, a CNN, torchvision's
      # ResNet-18 and -50, a GPT-2 124M) run by normcore against onnxruntime's outputs on the CPU
      # and cuda:0; then the speed cases (ResNet-50 batch 1 and 64, the GPT at 1 x 128 tokens)
      # in onnxruntime and in normcore's onnx-run, on the GPU and on 1 and 2 CPU threads.
      echo "== ONNX exports of PyTorch models, normcore against onnxruntime"
      python3 bench/onnx_exports.py "$out/onnx" --time 2>&1 | grep -v -i warn
      # Logits of random-weight models reach hundreds: 1e-3 absolute is f32 summation noise there.
      "$run/normcore" onnx-test "$out/onnx/checks" --device all --atol 1e-3 | cut -c1-300
      mkdir -p "$out/onnx-keep"  # the small exports, flat (what comes back is at most three levels deep)
      for m in mlp cnn; do
        cp "$out/onnx/checks/$m/model.onnx" "$out/onnx-keep/$m.onnx"
        cp "$out/onnx/checks/$m/test_data_set_0/input_0.pb" "$out/onnx-keep/$m.input_0.pb"
        cp "$out/onnx/checks/$m/test_data_set_0/output_0.pb" "$out/onnx-keep/$m.output_0.pb"
      done
      for case in resnet50_b1 resnet50_b64 gpt; do
        for tf32 in off on; do
          for graph in off on; do
            echo "normcore $case on cuda, tf32 $tf32, CUDA graph $graph: $("$run/normcore" onnx-run \
              "$out/onnx/speed/$case/model.onnx" --random --device cuda --repeat 50 --tf32=$tf32 --cuda-graph=$graph |
              grep -E "^(median|CUDA graph)" | tr '\n' ' ')"
          done
        done
        [ $case = resnet50_b64 ] && continue
        for threads in 1 2; do
          echo "normcore $case on $threads CPU threads: $(NORMCORE_NUM_THREADS=$threads "$run/normcore" onnx-run \
            "$out/onnx/speed/$case/model.onnx" --random --device cpu --repeat 5 | tail -1)"
        done
        # Where one CPU thread's time goes, per op type.
        NORMCORE_NUM_THREADS=1 "$run/normcore" onnx-run "$out/onnx/speed/$case/model.onnx" --random --device cpu \
          --profile 3 | sed -n '/^profile/,$p' | head -14
      done
      # The CPU cases again, normcore and onnxruntime in alternating bursts after rests (the
      # cores slow down after a second or so of AVX-512 products).
      python3 bench/onnx_cpu_race.py "$run/normcore" "$out/onnx" --rounds "${RACE_ROUNDS:-3}"
      rm -rf "$out/onnx"
      ;;
    resnet)
      # torchvision's ResNets (random weights and batch statistics) in normcore: eval-mode
      # logits on the CPU and the GPU against torchvision's (bench/resnet_reference.py).
      echo "== torchvision ResNets loaded by load_resnet, logits against torchvision's"
      python3 bench/resnet_reference.py "$out/resnet"
      NORMCORE_RESNET_DIR="$out/resnet" "$run/normcore_tests" --gtest_filter='ResNet*' > "$out/resnet-tests.log" 2>&1
      echo "exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]|Failure|error" "$out/resnet-tests.log" | head -20
      ;;
    *)
      echo "unknown section '$section'" >&2
      exit 2
      ;;
  esac
done
