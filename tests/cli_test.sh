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

# The CNNs train on the CPU as well (a short run); a cnn-bn checkpoint carries BatchNorm's
# running statistics, so resuming, eval, predict and the embedding example agree with it.
cnn=(--data "$data" --device cpu --limit 1000 --batch-size 50 --warmup 5 --lr 0.002)
"$normcore" train "${cnn[@]}" --model cnn-bn --epochs 2 --seed 3 --out cnn.safetensors > cnn.log
cat cnn.log
grep -q "model cnn-bn" cnn.log || fail "train did not build cnn-bn"
cnn_accuracy=$(summary 2 cnn.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
awk -v a="$cnn_accuracy" 'BEGIN { exit !(a > 60) }' || fail "cnn-bn test accuracy $cnn_accuracy% after 2 short epochs"
"$normcore" train "${cnn[@]}" --model cnn-bn --epochs 2 --stop-after 1 --seed 3 --out cnn-r.safetensors > cnn1.log
"$normcore" train "${cnn[@]}" --epochs 2 --resume cnn-r.safetensors --out cnn-r.safetensors > cnn2.log
[ "$(summary 2 cnn.log)" = "$(summary 2 cnn2.log)" ] || fail "resuming cnn-bn changed the run: $(summary 2 cnn.log) vs $(summary 2 cnn2.log)"
"$normcore" eval --checkpoint cnn.safetensors --data "$data" --device cpu > cnn-eval.log
grep -q "test accuracy $cnn_accuracy%" cnn-eval.log || fail "eval of cnn-bn disagrees with train: $(head -1 cnn-eval.log)"
"$normcore" predict --checkpoint cnn.safetensors --device cpu "$images"/*.pgm > cnn-predict.log
[ "$(wc -l < cnn-predict.log)" -eq "$(ls "$images"/*.pgm | wc -l)" ] || fail "predict with cnn-bn did not label every image"
"$embed" cnn.safetensors "$images"/t10k-2-trouser.pgm | grep -q "Trouser" || fail "the embedding example failed with cnn-bn"
"$normcore" train "${cnn[@]}" --model cnn-gn --epochs 1 --seed 3 --out cnn-gn.safetensors > cnn-gn.log
cat cnn-gn.log
gn_accuracy=$(summary 1 cnn-gn.log | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
awk -v a="$gn_accuracy" 'BEGIN { exit !(a > 50) }' || fail "cnn-gn test accuracy $gn_accuracy% after 1 short epoch"

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
