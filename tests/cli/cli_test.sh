#!/usr/bin/env bash
# End-to-end checks of the normcore program and the embedding example on the CPU, with a
# small slice of Fashion-MNIST: training learns, the same seed gives the same run, a
# resumed run matches an uninterrupted one, anomaly mode changes nothing in a healthy run,
# eval/predict/embed read the checkpoint, the CNNs train and resume, and bad input gives an error message and a
# non-zero exit status.
#   cli_test.sh NORMCORE_BINARY EMBED_BINARY DATA_DIR IMAGE_DIR WORK_DIR
# With "lm" first, the language-model commands instead, on the fortunes corpus with a tiny
# GPT: train-lm learns, repeats itself for a seed and resumes exactly; generate gives the
# same text for a seed, as the text-generation example does; bad input is refused.
#   cli_test.sh lm NORMCORE_BINARY GENERATE_BINARY FORTUNES_DIR WORK_DIR
# With "tokenize" first, the tokenize command with GPT-2's vocabulary (where
# scripts/gpt2-vocab.sh puts it; exit 77, skipped, without it): ids printed and decoded, the
# end-of-text option, fortune files to token shards and back, a gpt2 model trained on them.
#   cli_test.sh tokenize NORMCORE_BINARY FORTUNES_DIR WORK_DIR
set -euo pipefail
fail() { echo "FAIL: $*"; exit 1; }
expect_error() {
  local pattern=$1; shift
  if "$@" > err.log 2>&1; then fail "no error from: $*"; fi
  grep -q -- "$pattern" err.log || fail "error for '$*' does not mention '$pattern': $(cat err.log)"
}

if [ "${1:-}" = tokenize ]; then
  normcore=$2 data=$3 work=$4
  vocab=${NORMCORE_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/normcore/gpt2}
  if [ ! -f "$vocab/encoder.json" ]; then
    echo "SKIP: GPT-2's vocabulary is not in $vocab (bash scripts/gpt2-vocab.sh fetches it)"
    exit 77
  fi
  mkdir -p "$work"
  cd "$work"
  tok=("$normcore" tokenize --tokenizer "$vocab")
  printf 'Hello world' > hello.txt
  [ "$("${tok[@]}" < hello.txt)" = "15496 995" ] || fail "tokenize gave $("${tok[@]}" < hello.txt) for 'Hello world'"
  printf 'a<|endoftext|>b' > eot.txt
  [ "$("${tok[@]}" --special eot.txt)" = "64 50256 65" ] || fail "tokenize --special: $("${tok[@]}" --special eot.txt)"
  [ "$("${tok[@]}" eot.txt)" = "64 27 91 437 1659 5239 91 29 65" ] || fail "tokenize without --special: $("${tok[@]}" eot.txt)"
  "${tok[@]}" "$data/linux" > linux.ids
  "${tok[@]}" --decode linux.ids | cmp - "$data/linux" || fail "printed ids did not decode to the file"
  # Fortune files as GPT-2 token shards: they decode to the files, and a gpt2-layout model learns from them.
  "${tok[@]}" --out fortunes_train_000.bin "$data/computers" "$data/linux" "$data/science" > train.log
  cat train.log
  grep -qE "^normcore tokenize: [0-9]+ bytes of 3 input\(s\) -> [0-9]+ tokens, written to fortunes_train_000.bin" train.log ||
    fail "tokenize --out printed no summary"
  cat "$data/computers" "$data/linux" "$data/science" > train.txt
  "${tok[@]}" --decode fortunes_train_000.bin | cmp - train.txt || fail "the token shard did not decode to the files"
  "${tok[@]}" --out fortunes_val_000.bin "$data/fortunes" > val.log
  "$normcore" train-lm --data 'fortunes_train_*.bin' --val-data 'fortunes_val_*.bin' --model gpt2 --layers 2 --heads 2 \
    --embed 32 --context 32 --batch-size 8 --steps 5 --eval-interval 5 --eval-batches 2 --device cpu \
    --out lm.safetensors > lm.log
  cat lm.log
  grep -q "1 train shards (.*), 1 validation shards (.*) of vocabulary 50257" lm.log ||
    fail "train-lm did not read the GPT-2 token shards: $(sed -n 2p lm.log)"
  grep -qE "^step 5/5: train loss [0-9.]+, validation loss [0-9.]+" lm.log || fail "train-lm printed no validation loss"
  # The model as a Hugging Face GPT-2 folder, continuing a prompt through the tokenizer:
  # greedy, so twice the same; the tokenizer's files from --tokenizer or the model's folder.
  "$normcore" train-lm --data 'fortunes_train_*.bin' --val-data 'fortunes_val_*.bin' --model gpt2 --layers 2 --heads 2 \
    --embed 32 --context 32 --batch-size 8 --steps 2 --eval-interval 2 --eval-batches 1 --device cpu \
    --out lm2.safetensors --hf-out hf > lm2.log
  grep -q "^Hugging Face GPT-2 checkpoint: hf" lm2.log || fail "train-lm --hf-out wrote no folder: $(tail -2 lm2.log)"
  gen=("$normcore" generate --model hf --prompt "Hello world" --tokens 8 --temperature 0 --device cpu)
  "${gen[@]}" --tokenizer "$vocab" > gen-a.txt
  cp "$vocab/encoder.json" "$vocab/vocab.bpe" hf/
  "${gen[@]}" > gen-b.txt
  cmp gen-a.txt gen-b.txt || fail "generate --model gave two texts: $(cat gen-a.txt) / $(cat gen-b.txt)"
  [ "$(head -c 11 gen-a.txt)" = "Hello world" ] && [ "$(wc -c < gen-a.txt)" -gt 12 ] ||
    fail "generate --model did not continue the prompt: $(cat gen-a.txt)"
  expect_error "config.json" "$normcore" generate --model "$work/none" --tokenizer "$vocab" --prompt x
  # Nucleus sampling: the same seed gives the same text; top-p outside (0, 1] is refused.
  "$normcore" generate --model hf --prompt "Hello" --tokens 8 --temperature 1 --top-p 0.9 --seed 3 --device cpu > p-a.txt
  "$normcore" generate --model hf --prompt "Hello" --tokens 8 --temperature 1 --top-p 0.9 --seed 3 --device cpu > p-b.txt
  cmp p-a.txt p-b.txt || fail "generate --top-p gave two texts for one seed: $(cat p-a.txt) / $(cat p-b.txt)"
  expect_error "top_p must be in (0, 1]" "$normcore" generate --model hf --prompt x --top-p 0 --device cpu
  expect_error "goes with --model" "$normcore" generate --checkpoint lm2.safetensors --tokenizer "$vocab" --prompt x
  # Bad input: each an error naming what is wrong.
  echo 50257 > past.ids
  echo "12 x" > word.ids
  expect_error "outside the vocabulary of 50257" "${tok[@]}" --decode past.ids
  expect_error "'x' in word.ids is not a token id" "${tok[@]}" --decode word.ids
  expect_error "cannot open /nonexistent" "${tok[@]}" /nonexistent
  expect_error "holds none of encoder.json" "$normcore" tokenize --tokenizer "$work" hello.txt
  expect_error "--tokenizer must name a folder" "$normcore" tokenize hello.txt
  expect_error "option --special is on or off" "${tok[@]}" --special=maybe hello.txt
  echo "cli_test tokenize: all checks passed"
  exit 0
fi

if [ "${1:-}" = lm ]; then
  normcore=$2 generate=$3 data=$4 work=$5
  not_gpt=$(cd "$(dirname "$0")/.." && pwd)/data/conformance/linear.safetensors
  mkdir -p "$work"
  cd "$work"
  lm=(--data "$data" --device cpu --layers 2 --heads 2 --embed 32 --context 32 --batch-size 16 --warmup 5
      --lr 0.003 --eval-interval 20 --eval-batches 2 --sample 40)
  # The validation line of a step without its timing, e.g. "step 40/40: train loss 2.9, validation loss 3.0".
  lm_summary() { grep -E "^step $1/[0-9]+: " "$2" | sed -E 's/ \(.*//'; }

  "$normcore" train-lm "${lm[@]}" --steps 40 --seed 1 --out lm-a.safetensors > lm-a.log
  "$normcore" train-lm "${lm[@]}" --steps 40 --seed 1 --out lm-b.safetensors > lm-b.log
  cat lm-a.log
  [ -n "$(lm_summary 40 lm-a.log)" ] || fail "train-lm printed no validation loss at step 40"
  [ "$(lm_summary 40 lm-a.log)" = "$(lm_summary 40 lm-b.log)" ] || fail "the same seed gave different train-lm runs"
  loss20=$(lm_summary 20 lm-a.log | sed -E 's/.*validation loss ([0-9.]+).*/\1/')
  loss40=$(lm_summary 40 lm-a.log | sed -E 's/.*validation loss ([0-9.]+).*/\1/')
  awk -v a="$loss20" -v b="$loss40" 'BEGIN { exit !(b < a && b < 3.7) }' ||
    fail "validation loss did not fall below 3.7: $loss20 at step 20, $loss40 at step 40"
  grep -q "^sample" lm-a.log || fail "train-lm printed no sample"
  "$normcore" train-lm "${lm[@]}" --steps 40 --seed 1 --workers 0 --out lm-w.safetensors > lm-w.log
  [ "$(lm_summary 40 lm-a.log)" = "$(lm_summary 40 lm-w.log)" ] || fail "--workers 0 changed train-lm's run"

  "$normcore" train-lm "${lm[@]}" --steps 40 --stop-after 20 --seed 1 --out lm-c.safetensors --log lm-c.jsonl \
    > lm-c1.log
  grep -q "^step 40/" lm-c1.log && fail "--stop-after 20 ran past step 20"
  "$normcore" train-lm "${lm[@]}" --steps 40 --resume lm-c.safetensors --out lm-c.safetensors --log lm-c.jsonl \
    --plot lm-c.svg > lm-c2.log
  # --log's lines of both parts (the resumed run appends) and --plot's curves of them all.
  [ "$(grep -c '"phase":"validation"' lm-c.jsonl)" -eq 2 ] || fail "--log holds no validation loss per evaluation"
  grep -q '^{"step":40,"phase":"validation","loss":' lm-c.jsonl || fail "--log has no step-40 validation loss"
  grep -q '"phase":"train","loss":.*"lr":.*"tokens_per_s":' lm-c.jsonl || fail "--log has no train records"
  [ "$(grep -c '<polyline' lm-c.svg)" -ge 4 ] || fail "--plot drew $(grep -c '<polyline' lm-c.svg) curves"
  grep -q "resuming after step 20" lm-c2.log || fail "train-lm did not say where it resumed"
  [ "$(lm_summary 40 lm-a.log)" = "$(lm_summary 40 lm-c2.log)" ] ||
    fail "resuming changed the run: $(lm_summary 40 lm-a.log) vs $(lm_summary 40 lm-c2.log)"

  # Data-parallel: two ranks of 8 windows learn, repeat themselves for a seed and resume
  # exactly (each rank draws its own windows and masks from its own seed).
  export MASTER_PORT=$(( 20000 + RANDOM % 20000 ))
  dp_lm=("${lm[@]}" --nproc 2 --batch-size 8 --steps 40)
  "$normcore" train-lm "${dp_lm[@]}" --seed 1 --out lm-dp.safetensors > lm-dp.log
  "$normcore" train-lm "${dp_lm[@]}" --stop-after 20 --seed 1 --out lm-dpc.safetensors > lm-dpc1.log
  "$normcore" train-lm "${dp_lm[@]}" --resume lm-dpc.safetensors --out lm-dpc.safetensors > lm-dpc2.log
  dp_lm_summary() { grep -E "^\[rank 0\] step $1/[0-9]+: " "$2" | sed -E 's/ \(.*//'; }
  grep -q "(rank 0 of 2 over store)" lm-dp.log || fail "train-lm --nproc 2 did not say it runs 2 ranks"
  grep -q "^\[rank 1\] step" lm-dp.log && fail "rank 1 of train-lm printed steps"
  dp_loss=$(dp_lm_summary 40 lm-dp.log | sed -E 's/.*validation loss ([0-9.]+).*/\1/')
  awk -v a="$dp_loss" 'BEGIN { exit !(a < 3.8) }' || fail "data-parallel train-lm reached validation loss $dp_loss"
  [ "$(dp_lm_summary 40 lm-dp.log)" = "$(dp_lm_summary 40 lm-dpc2.log)" ] ||
    fail "resuming data-parallel train-lm changed it: $(dp_lm_summary 40 lm-dp.log) vs $(dp_lm_summary 40 lm-dpc2.log)"
  # The optimizer's state sharded over the ranks: the same run.
  "$normcore" train-lm "${dp_lm[@]}" --seed 1 --shard-optimizer on --out lm-dpz.safetensors > lm-dpz.log
  [ "$(dp_lm_summary 40 lm-dp.log)" = "$(dp_lm_summary 40 lm-dpz.log)" ] ||
    fail "train-lm --shard-optimizer on changed the run: $(dp_lm_summary 40 lm-dp.log) vs $(dp_lm_summary 40 lm-dpz.log)"
  unset MASTER_PORT

  # bf16 autocast learns as well (f32 master weights, checkpoints as in f32).
  "$normcore" train-lm "${lm[@]}" --steps 40 --seed 1 --precision bf16 --out lm-bf16.safetensors > lm-bf16.log
  bf16_loss=$(lm_summary 40 lm-bf16.log | sed -E 's/.*validation loss ([0-9.]+).*/\1/')
  awk -v a="$bf16_loss" -v b="$loss40" 'BEGIN { exit !(a < b + 0.1) }' ||
    fail "bf16 validation loss $bf16_loss is far above f32's $loss40"

  gen=(--checkpoint lm-a.safetensors --device cpu --prompt "The " --seed 3)
  "$normcore" generate "${gen[@]}" --tokens 30 > gen1.txt
  "$normcore" generate "${gen[@]}" --tokens 30 > gen2.txt
  cat gen1.txt
  cmp -s gen1.txt gen2.txt || fail "generate gave different text for the same seed"
  [ "$(head -c 4 gen1.txt)" = "The " ] || fail "generate did not start with the prompt"
  [ "$(wc -c < gen1.txt)" -eq 35 ] || fail "generate wrote $(wc -c < gen1.txt) bytes, expected 4 + 30 + newline"
  "$generate" lm-a.safetensors "The " 30 3 cpu > example.txt || fail "the text-generation example failed"
  cmp -s gen1.txt example.txt || fail "the example and generate disagree: $(cat example.txt)"
  # Past the context (32 bytes) the window slides.
  "$normcore" generate "${gen[@]}" --tokens 80 --temperature 0 > long.txt
  [ "$(wc -c < long.txt)" -eq 85 ] || fail "a generation past the context wrote $(wc -c < long.txt) bytes"

  expect_error "not a normcore GPT checkpoint" "$normcore" generate --checkpoint "$not_gpt" --device cpu
  expect_error "temperature must be" "$normcore" generate "${gen[@]}" --temperature -1
  # GPT-2's sizes, the size options given overriding them (a small model: the test runs on
  # the CPU); its checkpoint generates like any other.
  "$normcore" train-lm "${lm[@]}" --model gpt2 --layers 2 --heads 2 --embed 32 --context 32 --steps 4 \
    --eval-interval 4 --out lm-g.safetensors > lm-g.log
  grep -q "GPT (gpt2 sizes) 2 layers, 2 heads, embed 32, context 32, layernorm, dropout 0 " lm-g.log ||
    fail "train-lm --model gpt2 did not build GPT-2's layout with the sizes given: $(head -1 lm-g.log)"
  [ -n "$(lm_summary 4 lm-g.log)" ] || fail "train-lm --model gpt2 printed no validation loss"
  expect_error "unknown model 'gpt9'" "$normcore" train-lm "${lm[@]}" --steps 2 --model gpt9

  # Token shards in llm.c's format (tests/data/token_shards: bytes of a fortune file as ids):
  # a gpt2-layout model learns from them, repeats itself for a seed and resumes exactly; the
  # vocabulary is --vocab (GPT-2's 50257, padded to 50304 rows, by default).
  shards=$(cd "$(dirname "$0")/.." && pwd)/data/token_shards
  tok_gpt2=(--data "$shards/*_train_*.bin" --val-data "$shards/*_val_*.bin" --model gpt2 --layers 2 --heads 2
            --embed 32 --context 32 --batch-size 16 --warmup 5 --lr 0.003 --eval-interval 20 --eval-batches 2
            --device cpu)
  tok=("${tok_gpt2[@]}" --vocab 256)
  "$normcore" train-lm "${tok[@]}" --steps 40 --seed 1 --out tok-a.safetensors > tok-a.log
  cat tok-a.log
  grep -q "1 train shards (749 windows), 1 validation shards (124 windows) of vocabulary 256" tok-a.log ||
    fail "train-lm did not read the token shards: $(sed -n 2p tok-a.log)"
  tok20=$(lm_summary 20 tok-a.log | sed -E 's/.*validation loss ([0-9.]+).*/\1/')
  tok40=$(lm_summary 40 tok-a.log | sed -E 's/.*validation loss ([0-9.]+).*/\1/')
  awk -v a="$tok20" -v b="$tok40" 'BEGIN { exit !(b < a && b < 4.0) }' ||
    fail "validation loss on token shards did not fall below 4.0: $tok20 at step 20, $tok40 at step 40"
  grep -q "^no sample: the model's tokens are not bytes" tok-a.log || fail "train-lm sampled tokens as bytes"
  # --benchmark times steps alone: a line of ms/step, tokens/s and the loss, no checkpoint.
  "$normcore" train-lm "${tok[@]}" --steps 40 --benchmark 2 --out tok-bench.safetensors > tok-bench.log
  grep -qE "^benchmark: 2 steps, [0-9.]+ ms/step, [0-9]+ tokens/s, loss [0-9.]+$" tok-bench.log ||
    fail "train-lm --benchmark printed no timing: $(tail -1 tok-bench.log)"
  [ ! -e tok-bench.safetensors ] || fail "train-lm --benchmark wrote a checkpoint"
  # --init starts from tok-a's trained weights (a checkpoint's model): after 2 steps the
  # validation loss is far below a fresh model's; with --shuffle off the windows come in
  # order, so two seeds give the same run.
  "$normcore" train-lm "${tok[@]}" --steps 2 --eval-interval 2 --seed 2 --out tok-f.safetensors > tok-f.log
  "$normcore" train-lm "${tok[@]}" --steps 2 --eval-interval 2 --seed 2 --init tok-a.safetensors --shuffle off \
    --out tok-i.safetensors > tok-i.log
  "$normcore" train-lm "${tok[@]}" --steps 2 --eval-interval 2 --seed 3 --init tok-a.safetensors --shuffle off \
    --out tok-j.safetensors > tok-j.log
  fresh=$(lm_summary 2 tok-f.log | sed -E 's/.*validation loss ([0-9.]+).*/\1/')
  init=$(lm_summary 2 tok-i.log | sed -E 's/.*validation loss ([0-9.]+).*/\1/')
  awk -v f="$fresh" -v i="$init" 'BEGIN { exit !(i < f - 0.5) }' ||
    fail "--init did not start from the checkpoint's weights: validation loss $init against a fresh $fresh"
  [ "$(lm_summary 2 tok-i.log)" = "$(lm_summary 2 tok-j.log)" ] ||
    fail "--shuffle off depends on the seed: $(lm_summary 2 tok-i.log) vs $(lm_summary 2 tok-j.log)"
  expect_error "--init $not_gpt: load_state_dict: missing keys" "$normcore" train-lm "${tok[@]}" --steps 1 \
    --init "$not_gpt"
  expect_error "option --shuffle: on or off" "$normcore" train-lm "${tok[@]}" --steps 1 --shuffle sometimes
  expect_error "option --attention: auto, native or cudnn" "$normcore" train-lm "${tok[@]}" --steps 1 --attention flash
  expect_error "option --deterministic: on or off" "$normcore" train-lm "${tok[@]}" --steps 1 --deterministic yes
  # The resume and GPT-2's padded vocabulary (a 50304-row head) are left to the plain run:
  # the sanitizer run (NORMCORE_CLI_TEST_QUICK=1) checks the byte model's resume.
  if [ "${NORMCORE_CLI_TEST_QUICK:-0}" != 1 ]; then
    "$normcore" train-lm "${tok[@]}" --steps 40 --stop-after 20 --seed 1 --out tok-c.safetensors > tok-c1.log
    "$normcore" train-lm "${tok[@]}" --steps 40 --resume tok-c.safetensors --out tok-c.safetensors > tok-c2.log
    [ "$(lm_summary 40 tok-a.log)" = "$(lm_summary 40 tok-c2.log)" ] ||
      fail "resuming on token shards changed the run: $(lm_summary 40 tok-a.log) vs $(lm_summary 40 tok-c2.log)"
    "$normcore" train-lm "${tok_gpt2[@]}" --steps 2 --eval-interval 2 --out tok-g.safetensors > tok-g.log
    grep -q "of vocabulary 50257" tok-g.log || fail "train-lm did not take GPT-2's vocabulary: $(sed -n 2p tok-g.log)"
  fi
  # Bad shards: each an error naming the file or the option.
  expect_error "--val-data must name the validation shards" "$normcore" train-lm --data "$shards/*_train_*.bin" --steps 1
  expect_error "past the vocabulary of 100" "$normcore" train-lm "${tok[@]}" --steps 1 --vocab 100
  head -c 5000 "$shards/fortunes_train_000.bin" > short_train_000.bin
  expect_error "short_train_000.bin" "$normcore" train-lm "${tok[@]}" --steps 1 --data short_train_000.bin
  printf 'not a shard' > bad_train_000.bin
  expect_error "bad_train_000.bin" "$normcore" train-lm "${tok[@]}" --steps 1 --data bad_train_000.bin
  expect_error "no file matches" "$normcore" train-lm "${tok[@]}" --steps 1 --data "$work/none_*.bin"
  expect_error "norm must be" "$normcore" train-lm "${lm[@]}" --steps 2 --norm batchnorm
  expect_error "not divisible by heads" "$normcore" train-lm "${lm[@]}" --steps 2 --embed 30 --heads 4
  expect_error "does not exist" "$normcore" train-lm "${lm[@]}" --steps 2 --data /nonexistent
  expect_error "must be fp32, tf32, bf16 or fp16" "$normcore" train-lm "${lm[@]}" --steps 2 --precision fp8
  expect_error "cuda-graph must be auto, on or off" "$normcore" train-lm "${lm[@]}" --steps 2 --cuda-graph yes
  expect_error "CUDA graphs need a CUDA device" "$normcore" train-lm "${lm[@]}" --steps 2 --cuda-graph on
  echo "cli_test lm: all checks passed"
  exit 0
fi

normcore=$1 embed=$2 data=$3 images=$4 work=$5 classify_c=${6:-}
mkdir -p "$work"
cd "$work"

# Every classifier run evaluates on the first 1,000 test images (a pass over all 10,000 costs
# more than a short run's training). NORMCORE_CLI_TEST_QUICK=1 (the sanitizer run, 10-15x
# slower) trains on fewer images, evaluates on 200 and checks agreement only (the same
# seed, a resume, eval, predict), not how much was learnt: the plain run checks that.
quick=${NORMCORE_CLI_TEST_QUICK:-0}
test_images=1000 cnn_limit=1000 mlp_limit=3000
[ "$quick" = 1 ] && test_images=200 cnn_limit=200 mlp_limit=1000

# An IDX file (gzip) cut to its first n records: the magic number, the count n (big-endian),
# the rest of the header (header bytes in all) and n records of the given size.
cut_idx() {
  local file=$1 header=$2 record=$3 n=$4
  gzip -dc "$file" | head -c $((header + n * record)) > cut.raw || true
  [ "$(wc -c < cut.raw)" -eq $((header + n * record)) ] || fail "$file holds fewer than $n records"
  { head -c 4 cut.raw
    printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((n >> 24 & 255)) $((n >> 16 & 255)) $((n >> 8 & 255)) $((n & 255)))"
    tail -c +9 cut.raw
  } | gzip -1
  rm -f cut.raw
}
small=$work/small-test-set
mkdir -p "$small"
ln -sf "$data/train-images-idx3-ubyte.gz" "$data/train-labels-idx1-ubyte.gz" "$small/"
cut_idx "$data/t10k-images-idx3-ubyte.gz" 16 784 $test_images > "$small/t10k-images-idx3-ubyte.gz"
cut_idx "$data/t10k-labels-idx1-ubyte.gz" 8 1 $test_images > "$small/t10k-labels-idx1-ubyte.gz"

common=(--data "$small" --device cpu --limit $mlp_limit --batch-size 100 --warmup 10)
# learnt THRESHOLD VALUE WHAT: fails unless VALUE > THRESHOLD (skipped in the quick run).
learnt() { [ "$quick" = 1 ] || awk -v a="$2" -v t="$1" 'BEGIN { exit !(a > t) }' || fail "$3"; }

# The summary line of an epoch without its timing, e.g. "epoch 2/2: train loss 0.91, test accuracy 71.3%".
summary() { grep -E "^epoch $1/[0-9]+: " "$2" | sed -E 's/ \(.*//'; }

"$normcore" train "${common[@]}" --epochs 2 --seed 7 --out a.safetensors > a.log
"$normcore" train "${common[@]}" --epochs 2 --seed 7 --out b.safetensors > b.log
cat a.log
[ "$(summary 2 a.log)" = "$(summary 2 b.log)" ] || fail "the same seed gave different runs"
accuracy=$(summary 2 a.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
learnt 70 "$accuracy" "test accuracy $accuracy% after 2 short epochs"

# The batches do not depend on the number of loading threads; augmentation still learns.
"$normcore" train "${common[@]}" --epochs 2 --seed 7 --workers 3 --out w.safetensors > w.log
[ "$(summary 2 a.log)" = "$(summary 2 w.log)" ] || fail "--workers 3 changed the run: $(summary 2 w.log)"
"$normcore" train "${common[@]}" --epochs 2 --seed 7 --augment on --out aug.safetensors > aug.log
aug_accuracy=$(summary 2 aug.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
learnt 65 "$aug_accuracy" "test accuracy $aug_accuracy% with --augment on"
[ "$(summary 2 a.log)" != "$(summary 2 aug.log)" ] || fail "--augment on changed nothing"

"$normcore" train "${common[@]}" --epochs 2 --stop-after 1 --seed 7 --out c.safetensors > c1.log
grep -q "^epoch 2/" c1.log && fail "--stop-after 1 ran a second epoch"
"$normcore" train "${common[@]}" --epochs 2 --resume c.safetensors --out c.safetensors > c2.log
[ "$(summary 2 a.log)" = "$(summary 2 c2.log)" ] || fail "resuming changed the run: $(summary 2 a.log) vs $(summary 2 c2.log)"
grep -q "resuming after epoch 1" c2.log || fail "resume did not say where it resumed"

# Data-parallel: two ranks of 50 images a step (100 in all) on the CPU learn as one process
# does, repeat themselves for a seed, resume exactly (every rank's dropout position comes
# back), and only rank 0 prints and writes the checkpoint.
export MASTER_PORT=$(( 20000 + RANDOM % 20000 ))
"$normcore" train "${common[@]}" --nproc 2 --batch-size 50 --epochs 2 --seed 7 --out dp.safetensors > dp.log
"$normcore" train "${common[@]}" --nproc 2 --batch-size 50 --epochs 2 --seed 7 --out dp-b.safetensors > dp-b.log
dp_summary() { grep -E "^\[rank 0\] epoch $1/[0-9]+: " "$2" | sed -E 's/ \(.*//'; }
grep -q "(rank 0 of 2 over store)" dp.log || fail "train --nproc 2 did not say it runs 2 ranks: $(head -1 dp.log)"
[ -n "$(dp_summary 2 dp.log)" ] || fail "train --nproc 2 printed no summary: $(cat dp.log)"
[ "$(dp_summary 2 dp.log)" = "$(dp_summary 2 dp-b.log)" ] || fail "data-parallel runs with one seed differ"
grep -q "^\[rank 1\] epoch" dp.log && fail "rank 1 printed epoch lines"
dp_accuracy=$(dp_summary 2 dp.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
learnt "$(awk -v b="$accuracy" 'BEGIN { print b - 3 }')" "$dp_accuracy" \
  "data-parallel test accuracy $dp_accuracy% is far below one process's $accuracy%"
"$normcore" train "${common[@]}" --nproc 2 --batch-size 50 --epochs 2 --stop-after 1 --seed 7 --out dp-c.safetensors > dp-c1.log
"$normcore" train "${common[@]}" --nproc 2 --batch-size 50 --epochs 2 --resume dp-c.safetensors --out dp-c.safetensors > dp-c2.log
[ "$(dp_summary 2 dp.log)" = "$(dp_summary 2 dp-c2.log)" ] ||
  fail "resuming a data-parallel run changed it: $(dp_summary 2 dp.log) vs $(dp_summary 2 dp-c2.log)"
# A job that loses a rank after its first epoch and may start again once: the launcher stops
# the other rank and starts both again, they continue from the last checkpoint (--resume
# auto), and the run ends as the uninterrupted one did.
rm -f dp-r.safetensors
"$normcore" launch --nproc 2 --max-restarts 1 --master-port "$MASTER_PORT" -- sh -c \
  'if [ "$NORMCORE_RESTART_COUNT" = 0 ]; then
     "$0" "$@" --stop-after 1 || exit $?
     if [ "$RANK" = 1 ]; then exit 9; fi
     exit 0
   fi
   exec "$0" "$@"' \
  "$normcore" train "${common[@]}" --batch-size 50 --epochs 2 --seed 7 --resume auto --out dp-r.safetensors \
  > dp-r.log 2> dp-r.err || fail "a job started again after losing a rank failed: $(tail -3 dp-r.err)"
grep -q "restarting the job (restart 1 of 1) after rank 1 exited with status 9" dp-r.err ||
  fail "the launcher did not say why it started the job again: $(cat dp-r.err)"
grep -q "^\[rank 0\] normcore train: .*, resuming after epoch 1$" dp-r.log || fail "the second start did not resume: $(cat dp-r.log)"
[ "$(dp_summary 2 dp.log)" = "$(dp_summary 2 dp-r.log)" ] ||
  fail "a job started again ended differently: $(dp_summary 2 dp.log) vs $(dp_summary 2 dp-r.log)"
# The same with rank 1 killed (SIGKILL) inside the second epoch: its watcher waits for the
# first epoch's checkpoint (rank 0 writes it before the second epoch's first step, which
# rank 1 waits for), then kills the rank's process itself (the shell exec'd into it).
rm -f dp-k.safetensors
"$normcore" launch --nproc 2 --max-restarts 1 --master-port "$MASTER_PORT" -- sh -c \
  'if [ "$NORMCORE_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then
     (while [ ! -e dp-k.safetensors ]; do sleep 0.05; done; kill -9 $$) &
   fi
   exec "$0" "$@"' \
  "$normcore" train "${common[@]}" --batch-size 50 --epochs 2 --seed 7 --resume auto --out dp-k.safetensors \
  > dp-k.log 2> dp-k.err || fail "a job started again after a rank was killed failed: $(tail -3 dp-k.err)"
grep -q "restarting the job (restart 1 of 1) after rank 1 was killed by signal 9" dp-k.err ||
  fail "the launcher did not say that rank 1 was killed: $(cat dp-k.err)"
grep -q "^\[rank 0\] normcore train: .*, resuming after epoch 1$" dp-k.log ||
  fail "the job started again did not resume after the first epoch: $(cat dp-k.log)"
[ "$(dp_summary 2 dp.log)" = "$(dp_summary 2 dp-k.log)" ] ||
  fail "a job whose rank was killed ended differently: $(dp_summary 2 dp.log) vs $(dp_summary 2 dp-k.log)"
# The same with rank 1 hanging (SIGSTOP) inside the second epoch: rank 0 finds it within
# --timeout (its collective fails and names the rank and what it waited for), the launcher
# kills the stopped rank after its grace period and starts the job again, which ends as the
# uninterrupted one.
rm -f dp-h.safetensors
hang_start=$(date +%s)
"$normcore" launch --nproc 2 --max-restarts 1 --master-port "$MASTER_PORT" -- sh -c \
  'if [ "$NORMCORE_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then
     (while [ ! -e dp-h.safetensors ]; do sleep 0.05; done; kill -STOP $$) &
   fi
   exec "$0" "$@"' \
  "$normcore" train "${common[@]}" --batch-size 50 --epochs 2 --seed 7 --resume auto --timeout 3 --out dp-h.safetensors \
  > dp-h.log 2> dp-h.err || fail "a job started again after a rank hung failed: $(tail -3 dp-h.err)"
[ $(( $(date +%s) - hang_start )) -lt 60 ] || fail "a hanging rank was not found within the timeout"
grep -q "restarting the job (restart 1 of 1) after rank 0 exited with status" dp-h.err ||
  fail "rank 0 did not fail on the hanging rank: $(cat dp-h.err)"
grep -q "^\[rank 0\] normcore train: all_reduce_coalesced (rank 0 of 2) over the store: rank 1's part did not come within 3000 ms" \
  dp-h.err || fail "rank 0 did not say what it waited for: $(cat dp-h.err)"
[ "$(dp_summary 2 dp.log)" = "$(dp_summary 2 dp-h.log)" ] ||
  fail "a job whose rank hung ended differently: $(dp_summary 2 dp.log) vs $(dp_summary 2 dp-h.log)"
# The optimizer's state sharded over the ranks (ZeRO stage 1): the same run, bit for bit; its
# checkpoint holds the whole state, so a run resumed from it without sharding ends as the
# plain one.
"$normcore" train "${common[@]}" --nproc 2 --batch-size 50 --epochs 2 --seed 7 --shard-optimizer on \
  --out dp-z.safetensors > dp-z.log
grep -q "(rank 0 of 2 over store, optimizer state sharded)" dp-z.log ||
  fail "train --shard-optimizer on did not say so: $(head -1 dp-z.log)"
[ "$(dp_summary 2 dp.log)" = "$(dp_summary 2 dp-z.log)" ] ||
  fail "--shard-optimizer on changed the run: $(dp_summary 2 dp.log) vs $(dp_summary 2 dp-z.log)"
"$normcore" train "${common[@]}" --nproc 2 --batch-size 50 --epochs 2 --stop-after 1 --seed 7 --shard-optimizer on \
  --out dp-z1.safetensors > dp-z1.log
"$normcore" train "${common[@]}" --nproc 2 --batch-size 50 --epochs 2 --resume dp-z1.safetensors \
  --out dp-z1.safetensors > dp-z2.log
[ "$(dp_summary 2 dp.log)" = "$(dp_summary 2 dp-z2.log)" ] ||
  fail "a sharded checkpoint resumed unsharded changed the run: $(dp_summary 2 dp.log) vs $(dp_summary 2 dp-z2.log)"
# Gradients averaged in bf16: another run (the averages rounded), as accurate within a point.
"$normcore" train "${common[@]}" --nproc 2 --batch-size 50 --epochs 2 --seed 7 --reduce-precision bf16 > dp-r.log
[ -n "$(dp_summary 2 dp-r.log)" ] && [ "$(dp_summary 2 dp.log)" != "$(dp_summary 2 dp-r.log)" ] ||
  fail "--reduce-precision bf16 did not change the averages: $(dp_summary 2 dp-r.log)"
accuracy() { dp_summary 2 "$1" | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/'; }
awk -v a="$(accuracy dp.log)" -v b="$(accuracy dp-r.log)" 'BEGIN { exit !(a - b < 1 && b - a < 1) }' ||
  fail "--reduce-precision bf16 trained another model: $(dp_summary 2 dp.log) vs $(dp_summary 2 dp-r.log)"
# Two launchers as two machines (--nnodes 2, two ranks each, meeting over this host's
# loopback with a shared job secret) train as one launcher with four ranks does.
"$normcore" train "${common[@]}" --nproc 4 --batch-size 25 --epochs 2 --seed 7 --out dp4.safetensors > dp4.log
two_nodes=(--nnodes 2 --nproc 2 --master-port $((MASTER_PORT + 1)) -- "$normcore" train "${common[@]}" --batch-size 25
  --epochs 2 --seed 7 --out dp-n.safetensors)
export NORMCORE_JOB_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
"$normcore" launch --node-rank 1 "${two_nodes[@]}" > dp-n1.log 2>&1 &
node1=$!
"$normcore" launch --node-rank 0 "${two_nodes[@]}" > dp-n0.log 2>&1 || fail "launcher 0 of 2 failed: $(tail -3 dp-n0.log)"
wait $node1 || fail "launcher 1 of 2 failed: $(tail -3 dp-n1.log)"
unset NORMCORE_JOB_SECRET
grep -q "(rank 0 of 4 over store)" dp-n0.log || fail "two launchers did not make one job of 4 ranks: $(head -1 dp-n0.log)"
grep -q "epoch" dp-n1.log && fail "ranks 2 and 3 printed epochs: $(cat dp-n1.log)"
[ "$(dp_summary 2 dp4.log)" = "$(dp_summary 2 dp-n0.log)" ] ||
  fail "two launchers of two ranks trained otherwise than one of four: $(dp_summary 2 dp4.log) vs $(dp_summary 2 dp-n0.log)"
expect_error "shard-optimizer must be on or off" "$normcore" train "${common[@]}" --shard-optimizer yes
expect_error "give --nproc 2 or more" "$normcore" train "${common[@]}" --shard-optimizer on
expect_error "reduce-precision must be auto or bf16" "$normcore" train "${common[@]}" --reduce-precision fp16
"$normcore" eval --checkpoint dp.safetensors --data "$small" --device cpu > dp-eval.log
grep -q "test accuracy $dp_accuracy%" dp-eval.log || fail "eval of the data-parallel checkpoint: $(head -1 dp-eval.log)"
expect_error "already a rank" env WORLD_SIZE=2 "$normcore" train "${common[@]}" --nproc 2
expect_error "cuda:LOCAL_RANK" env WORLD_SIZE=2 RANK=0 "$normcore" train "${common[@]}" --device cuda:1
unset MASTER_PORT

# Mixed precision: bf16 learns about as well as f32; an fp16 run stopped and resumed from its
# checkpoint (which holds the loss scaler's state) matches the uninterrupted one. The
# quick run trains bf16 on 500 images for one epoch.
mixed=("${common[@]}")
bf16_epochs=2
if [ "$quick" = 1 ]; then mixed+=(--limit 500); bf16_epochs=1; fi
"$normcore" train "${mixed[@]}" --epochs $bf16_epochs --seed 7 --precision bf16 --out bf16.safetensors > bf16.log
grep -q " in bf16," bf16.log || fail "train did not report --precision bf16: $(head -1 bf16.log)"
if [ "$quick" != 1 ]; then
  bf16_accuracy=$(summary 2 bf16.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
  awk -v a="$bf16_accuracy" -v b="$accuracy" 'BEGIN { exit !(a > b - 3) }' ||
    fail "bf16 test accuracy $bf16_accuracy% is far below f32's $accuracy%"
fi
"$normcore" train "${mixed[@]}" --epochs 2 --seed 7 --precision fp16 --out h.safetensors > h.log
grep -q "loss scale" h.log || fail "an fp16 run did not report its loss scale"
"$normcore" train "${mixed[@]}" --epochs 2 --stop-after 1 --seed 7 --precision fp16 --out h2.safetensors > h1.log
"$normcore" train "${mixed[@]}" --epochs 2 --precision fp16 --resume h2.safetensors --out h2.safetensors > h2.log
[ -n "$(summary 2 h.log)" ] || fail "the fp16 run printed no summary for epoch 2"
[ "$(summary 2 h.log)" = "$(summary 2 h2.log)" ] || fail "resuming fp16 changed the run: $(summary 2 h.log) vs $(summary 2 h2.log)"
expect_error "must be fp32, tf32, bf16 or fp16" "$normcore" train "${common[@]}" --precision f8
expect_error "--augment: must be on or off" "$normcore" train "${common[@]}" --augment yes
expect_error "--workers expects auto or a whole number" "$normcore" train "${common[@]}" --workers -1

# Anomaly mode checks every op and gradient and changes nothing when all are finite.
"$normcore" train "${common[@]}" --epochs 2 --stop-after 1 --seed 7 --detect-anomaly on --out d.safetensors > d.log
[ "$(summary 1 c1.log)" = "$(summary 1 d.log)" ] || fail "anomaly mode changed the run: $(summary 1 d.log)"

"$normcore" eval --checkpoint a.safetensors --data "$small" --device cpu > eval.log
grep -q "test accuracy $accuracy%" eval.log || fail "eval disagrees with train: $(head -1 eval.log)"
grep -q "confusion matrix" eval.log || fail "eval printed no confusion matrix"

"$normcore" predict --checkpoint a.safetensors --device cpu "$images"/*.pgm "$images"/*.png > predict.log
cat predict.log
[ "$(wc -l < predict.log)" -eq "$(ls "$images" | wc -l)" ] || fail "predict did not label every image"
mlp_predicted=$(grep "t10k-2-trouser.pgm: " predict.log | sed -E 's/.*: ([^(]*) \(class.*/\1/')
[ "$quick" = 1 ] || [ "$mlp_predicted" = "Trouser" ] || fail "a trouser was not recognised: $mlp_predicted"
"$embed" a.safetensors "$images"/t10k-2-trouser.pgm | grep -q ": $mlp_predicted (" ||
  fail "the embedding example and predict ($mlp_predicted) disagree"
# The C example (the C API) labels every image as predict does, to the printed digit.
if [ -n "$classify_c" ]; then
  "$classify_c" a.safetensors "$images"/*.pgm "$images"/*.png > classify-c.log || fail "the C example failed"
  sed -E 's/\(class [0-9]+, /(/' predict.log | diff - classify-c.log ||
    fail "the C example and predict disagree (< predict, > the C example)"
fi

# The CNNs train on the CPU as well (a short run); a cnn-bn checkpoint carries BatchNorm's
# running statistics, so resuming, eval, predict and the embedding example agree with it.
cnn=(--data "$small" --device cpu --limit $cnn_limit --batch-size 50 --warmup 5 --lr 0.002)
"$normcore" train "${cnn[@]}" --model cnn-bn --epochs 2 --seed 3 --out cnn.safetensors > cnn.log
cat cnn.log
grep -q "model cnn-bn" cnn.log || fail "train did not build cnn-bn"
grep -q "$test_images test images" cnn.log || fail "train did not read the $test_images-image test set: $(head -1 cnn.log)"
cnn_accuracy=$(summary 2 cnn.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
if [ "$quick" != 1 ]; then
  awk -v a="$cnn_accuracy" 'BEGIN { exit !(a > 60) }' || fail "cnn-bn test accuracy $cnn_accuracy% after 2 short epochs"
fi
"$normcore" train "${cnn[@]}" --model cnn-bn --epochs 2 --stop-after 1 --seed 3 --out cnn-r.safetensors > cnn1.log
"$normcore" train "${cnn[@]}" --epochs 2 --resume cnn-r.safetensors --out cnn-r.safetensors > cnn2.log
[ "$(summary 2 cnn.log)" = "$(summary 2 cnn2.log)" ] || fail "resuming cnn-bn changed the run: $(summary 2 cnn.log) vs $(summary 2 cnn2.log)"
"$normcore" eval --checkpoint cnn.safetensors --data "$small" --device cpu > cnn-eval.log
grep -q "test accuracy $cnn_accuracy%" cnn-eval.log || fail "eval of cnn-bn disagrees with train: $(head -1 cnn-eval.log)"
"$normcore" predict --checkpoint cnn.safetensors --device cpu "$images"/*.pgm > cnn-predict.log
[ "$(wc -l < cnn-predict.log)" -eq "$(ls "$images"/*.pgm | wc -l)" ] || fail "predict with cnn-bn did not label every image"
# The embedding example labels the trouser as predict does.
predicted=$(grep "t10k-2-trouser.pgm: " cnn-predict.log | sed -E 's/.*: ([^(]*) \(class.*/\1/')
"$embed" cnn.safetensors "$images"/t10k-2-trouser.pgm > cnn-embed.log || fail "the embedding example failed with cnn-bn"
grep -q ": $predicted (" cnn-embed.log || fail "the embedding example ($(cat cnn-embed.log)) and predict ($predicted) disagree"
if [ "$quick" != 1 ]; then
  [ "$predicted" = "Trouser" ] || fail "cnn-bn did not recognise the trouser: $predicted"
fi
"$normcore" train "${cnn[@]}" --model cnn-gn --epochs 1 --seed 3 --out cnn-gn.safetensors > cnn-gn.log
cat cnn-gn.log
gn_accuracy=$(summary 1 cnn-gn.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
if [ "$quick" != 1 ]; then
  awk -v a="$gn_accuracy" 'BEGIN { exit !(a > 50) }' || fail "cnn-gn test accuracy $gn_accuracy% after 1 short epoch"
fi

# Bad input: a message naming the problem and a non-zero status, never a crash.
expect_error "unknown option --bogus" "$normcore" train --bogus 1
expect_error "expects a number" "$normcore" train --lr fast
expect_error "unknown optimizer" "$normcore" train "${common[@]}" --optimizer nope
expect_error "detect-anomaly must be on or off" "$normcore" train "${common[@]}" --detect-anomaly yes
expect_error "cuda-graph must be auto, on or off" "$normcore" train "${common[@]}" --cuda-graph 1

# The launcher: every rank runs with its environment and its output prefixed; a failing
# rank stops the others at once and its status is the launcher's.
"$normcore" launch --nproc 3 -- sh -c \
  'echo "hello $RANK of $WORLD_SIZE local $LOCAL_RANK at $MASTER_ADDR:$MASTER_PORT"; echo "err $RANK" >&2' \
  > launch.log 2> launch.err
for r in 0 1 2; do
  grep -qx "\[rank $r\] hello $r of 3 local $r at 127.0.0.1:29500" launch.log ||
    fail "launch: the line of rank $r is missing: $(cat launch.log)"
  grep -qx "\[rank $r\] err $r" launch.err || fail "launch: the stderr line of rank $r is missing: $(cat launch.err)"
done
start=$(date +%s)
status=0
"$normcore" launch --nproc 3 -- sh -c 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60' > launch.log 2> launch.err ||
  status=$?
[ "$status" = 3 ] || fail "launch: a failing rank gave status $status, not 3"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "launch: the other ranks were not stopped"
grep -q "rank 1 exited with status 3" launch.err || fail "launch did not name the failing rank: $(cat launch.err)"
# With --max-restarts the job starts again, as a whole, at most that many times; the ranks
# see the count; the last start's status is the launcher's.
"$normcore" launch --nproc 2 --max-restarts 1 -- sh -c \
  'if [ "$NORMCORE_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 3; fi; echo "start $NORMCORE_RESTART_COUNT"' \
  > launch.log 2> launch.err || fail "launch --max-restarts 1 did not recover: $(cat launch.err)"
[ "$(grep -c "start 1" launch.log)" = 2 ] || fail "launch --max-restarts: both ranks should run again: $(cat launch.log)"
status=0
"$normcore" launch --nproc 2 --max-restarts 2 -- sh -c 'exit 4' > launch.log 2> launch.err || status=$?
[ "$status" = 4 ] || fail "launch --max-restarts 2 of a job that always fails gave status $status, not 4"
[ "$(grep -c "restarting the job" launch.err)" = 2 ] || fail "launch --max-restarts 2 did not start twice more: $(cat launch.err)"
expect_error "no command to run" "$normcore" launch --nproc 2
expect_error "expects a whole number >= 1" "$normcore" launch --nproc 0 -- true
expect_error "CUDA graphs need a CUDA device" "$normcore" train "${common[@]}" --cuda-graph on
expect_error "cannot open" "$normcore" predict --checkpoint a.safetensors /nonexistent.pgm
expect_error "not a normcore checkpoint" "$normcore" eval --checkpoint "$images/../conformance/linear.safetensors" --data "$data"
expect_error "unknown command" "$normcore" fly
echo "cli_test: all checks passed"
