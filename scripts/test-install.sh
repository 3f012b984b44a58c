#!/usr/bin/env bash
# Installs the build in ${BUILD_DIR:-build} into a fresh prefix and builds a separate
# project against it four times: the shared and the static library, each through
# find_package(normcore) and through pkg-config; every program must train, save, load and
# predict (tests/consumer), and the static ones must not need libnormcore.so; the C example
# (examples/c) must build as C through pkg-config and label images, and the custom-op
# example (examples/custom_op) must build and pass its gradcheck. The installed normcore
# program must pass the conformance cases. A program that references every symbol the
# installed headers declare (tests/exports) must link against each library and find them all
# there. Prints the installed size.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh clang
build=${BUILD_DIR:-build}
prefix=$PWD/$build/install-test
rm -rf "$prefix" "$build/consumer" "$build/consumer-static"
cmake --install "$build" --prefix "$prefix" > /dev/null
libdir=$(dirname "$(find "$prefix" -name 'libnormcore.*' | head -1)")
size() { if [ -e "$1" ]; then du -sh "$1" | cut -f1; else echo "none"; fi; }
echo "normcore: installed into $prefix ($(du -sh "$prefix" | cut -f1): libnormcore.so $(size "$libdir/libnormcore.so"), libnormcore.a $(size "$libdir/libnormcore.a"), headers $(du -sh "$prefix/include/normcore" | cut -f1))"

"$prefix/bin/normcore" conformance tests/data/conformance --device cpu > "$build/install-test-conformance.log"

cmake -S tests/consumer -B "$build/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$build/consumer" > /dev/null
"$build/consumer/consumer" "$build/consumer/consumer.safetensors"

pc_dir=$libdir/pkgconfig
# shellcheck disable=SC2046
g++ -std=c++17 tests/consumer/main.cpp -o "$build/consumer/consumer_pkgconfig" \
  $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs normcore) -Wl,-rpath,"$libdir"
"$build/consumer/consumer_pkgconfig" "$build/consumer/consumer_pkgconfig.safetensors"

# The C example, compiled as C through pkg-config, labels the test images with the
# consumer's checkpoint.
# shellcheck disable=SC2046
cc -std=c99 examples/c/classify.c -o "$build/consumer/classify_c" \
  $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs normcore) -Wl,-rpath,"$libdir"
"$build/consumer/classify_c" "$build/consumer/consumer.safetensors" tests/data/images/*.pgm > "$build/consumer/classify_c.log"
if [ "$(grep -c "%)$" "$build/consumer/classify_c.log")" -ne "$(ls tests/data/images/*.pgm | wc -l)" ]; then
  echo "FAIL: the C example did not label every image: $(cat "$build/consumer/classify_c.log")" >&2
  exit 1
fi

if [ -e "$libdir/libnormcore.a" ] && [ -e "$libdir/libnormcore.so" ]; then
  cmake -S tests/consumer -B "$build/consumer-static" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    -DNORMCORE_TARGET=normcore::normcore_static > /dev/null
  cmake --build "$build/consumer-static" > /dev/null
  # shellcheck disable=SC2046
  g++ -std=c++17 tests/consumer/main.cpp -o "$build/consumer-static/consumer_pkgconfig" \
    $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs normcore-static)
  for program in "$build/consumer-static/consumer" "$build/consumer-static/consumer_pkgconfig"; do
    if ldd "$program" | grep -q libnormcore; then
      echo "FAIL: $program, linked against the static library, needs libnormcore.so" >&2
      exit 1
    fi
    "$program" "$program.safetensors"
  done
fi

# Every function, template instantiation (per dtype), variable and class type information the
# installed headers declare without defining, listed from clang's AST of the headers, must
# come from the library: a missing export fails here, as it would fail a user's link.
exports=$build/consumer/exports
mkdir -p "$exports"
for header in "$prefix"/include/normcore/*.h; do echo "#include \"normcore/$(basename "$header")\""; done \
  > "$exports/api_headers.h"
# shellcheck disable=SC2046
for filter in normcore nc_; do
  clang++ -std=c++17 -x c++ -fsyntax-only $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags normcore) \
    -Xclang -ast-dump=json -Xclang -ast-dump-filter -Xclang "$filter" "$exports/api_headers.h" > "$exports/ast_$filter.json"
done
g++ -std=c++17 -O1 tests/exports/api_symbols.cpp -o "$exports/api_symbols"
"$exports/api_symbols" "$exports"/ast_*.json --symbols "$exports/symbols.cpp" --types "$exports/types.cpp" \
  --list "$exports/symbols.txt"
api_check() {  # api_check shared|static pkg-config-package [linker flags...]
  local kind=$1 package=$2
  shift 2
  # shellcheck disable=SC2046
  if ! g++ -std=c++17 -I"$exports" tests/exports/main.cpp "$exports/symbols.cpp" "$exports/types.cpp" \
      -o "$exports/api_check_$kind" $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs "$package") "$@" -ldl \
      2> "$exports/api_check_$kind.log"; then
    echo "FAIL: a program using every declaration of the installed headers does not link against the $kind library:" >&2
    if [ "$kind" = shared ]; then
      nm -D --defined-only "$libdir/libnormcore.so" | awk '{print $3}' | sort > "$exports/exported.txt"
      sort "$exports/symbols.txt" | comm -23 - "$exports/exported.txt" | c++filt | sed 's/^/  not exported: /' | head -40 >&2
    fi
    grep -m 20 "undefined reference" "$exports/api_check_$kind.log" >&2 || tail -20 "$exports/api_check_$kind.log" >&2
    exit 1
  fi
  "$exports/api_check_$kind" "$kind"
}
if [ -e "$libdir/libnormcore.so" ]; then api_check shared normcore -Wl,-rpath,"$libdir"; fi
if [ -e "$libdir/libnormcore.a" ]; then api_check static normcore-static; fi

# The custom-op example: an outside project adding a differentiable op (with its own CUDA
# kernels when the toolkit is there), checked by gradcheck on the CPU here.
rm -rf "$build/custom-op"
cmake -S examples/custom_op -B "$build/custom-op" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$build/custom-op" > /dev/null
"$build/custom-op/custom_op" cpu

# The training example: an outside project's own model trained with the Trainer; a few steps
# on the CPU, which must report a test accuracy and write a checkpoint that loads.
rm -rf "$build/train-custom"
cmake -S examples/train_custom -B "$build/train-custom" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$build/train-custom" > /dev/null
fashion=${NORMCORE_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
"$build/train-custom/train_custom" "$fashion" 8 "$build/train-custom/custom.safetensors" > "$build/train-custom/train.log"
if ! grep -qE "^step 8: train loss [0-9.]+, test accuracy [0-9.]+%" "$build/train-custom/train.log" ||
   [ ! -s "$build/train-custom/custom.safetensors" ]; then
  echo "FAIL: the training example did not train: $(cat "$build/train-custom/train.log")" >&2
  exit 1
fi
