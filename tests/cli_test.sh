#!/usr/bin/env bash
# End-to-end checks of the normcore program and the embedding example on the CPU, with a
# small slice of Fashion-MNIST: training learns, the same seed gives the same run, a
# resumed run matches an uninterrupted one, anomaly mode changes nothing in a healthy run,
# eval/predict/embed read the checkpoint, the CNNs train and resume, and bad input gives an error message and a
# non-zero exit status.
#   cli_test.sh NORMCORE_BINARY EMBED_BINARY DATA_DIR IMAGE_DIR WORK_DIR
set -euo pipefail
normcore=$1 embed=$2 data=$3 images=$4 work=$5
mkdir -p "$work"
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
common=(--data "$data" --device cpu --limit 3000 --batch-size 100 --warmup 10)

# The summary line of an epoch without its timing, e.g. "epoch 2/2: train loss 0.91, test accuracy 71.3%".
summary() { grep -E "^epoch $1/[0-9]+: " "$2" | sed -E 's/ \(.*//'; }

"$normcore" train "${common[@]}" --epochs 2 --seed 7 --out a.safetensors > a.log
"$normcore" train "${common[@]}" --epochs 2 --seed 7 --out b.safetensors > b.log
cat a.log
[ "$(summary 2 a.log)" = "$(summary 2 b.log)" ] || fail "the same seed gave different runs"
accuracy=$(summary 2 a.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
awk -v a="$accuracy" 'BEGIN { exit !(a > 70) }' || fail "test accuracy $accuracy% after 2 short epochs"

"$normcore" train "${common[@]}" --epochs 2 --stop-after 1 --seed 7 --out c.safetensors > c1.log
grep -q "^epoch 2/" c1.log && fail "--stop-after 1 ran a second epoch"
"$normcore" train "${common[@]}" --epochs 2 --resume c.safetensors --out c.safetensors > c2.log
[ "$(summary 2 a.log)" = "$(summary 2 c2.log)" ] || fail "resuming changed the run: $(summary 2 a.log) vs $(summary 2 c2.log)"
grep -q "resuming after epoch 1" c2.log || fail "resume did not say where it resumed"

# Anomaly mode checks every op and gradient and changes nothing when all are finite.
"$normcore" train "${common[@]}" --epochs 2 --stop-after 1 --seed 7 --detect-anomaly on --out d.safetensors > d.log
[ "$(summary 1 c1.log)" = "$(summary 1 d.log)" ] || fail "anomaly mode changed the run: $(summary 1 d.log)"

"$normcore" eval --checkpoint a.safetensors --data "$data" --device cpu > eval.log
grep -q "test accuracy $accuracy%" eval.log || fail "eval disagrees with train: $(head -1 eval.log)"
grep -q "confusion matrix" eval.log || fail "eval printed no confusion matrix"

"$normcore" predict --checkpoint a.safetensors --device cpu "$images"/*.pgm "$images"/*.png > predict.log
cat predict.log
[ "$(wc -l < predict.log)" -eq "$(ls "$images" | wc -l)" ] || fail "predict did not label every image"
grep -q "trouser.pgm: Trouser" predict.log || fail "a trouser was not recognised"
"$embed" a.safetensors "$images"/t10k-2-trouser.pgm | grep -q "Trouser" || fail "the embedding example failed"

# The CNNs train on the CPU as well (a short run, evaluated on the first 1,000 test images:
# a CNN's pass over all 10,000 costs more than its training here); a cnn-bn checkpoint
# carries BatchNorm's running statistics, so resuming, eval, predict and the embedding
# example agree with it. NORMCORE_CLI_TEST_QUICK=1 (the sanitizer run, 10-15x slower) trains
# on 200 images, evaluates on 200 and checks agreement only, not how much was learnt.
quick=${NORMCORE_CLI_TEST_QUICK:-0}
test_images=1000 cnn_limit=1000
[ "$quick" = 1 ] && test_images=200 cnn_limit=200

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
expect_error() {
  local pattern=$1; shift
  if "$@" > err.log 2>&1; then fail "no error from: $*"; fi
  grep -q -- "$pattern" err.log || fail "error for '$*' does not mention '$pattern': $(cat err.log)"
}
expect_error "unknown option --bogus" "$normcore" train --bogus 1
expect_error "expects a number" "$normcore" train --lr fast
expect_error "unknown optimizer" "$normcore" train "${common[@]}" --optimizer nope
expect_error "detect-anomaly must be on or off" "$normcore" train "${common[@]}" --detect-anomaly yes
expect_error "cannot open" "$normcore" predict --checkpoint a.safetensors /nonexistent.pgm
expect_error "not a normcore checkpoint" "$normcore" eval --checkpoint "$images/../conformance/linear.safetensors" --data "$data"
expect_error "unknown command" "$normcore" fly
echo "cli_test: all checks passed"
