#!/usr/bin/env bash
# Installs the build in ${BUILD_DIR:-build} into a fresh prefix and builds a separate
# project against it twice, through find_package(normcore) and through pkg-config; both
# programs must train, save, load and predict (tests/consumer). Prints the installed size.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
prefix=$PWD/$build/install-test
rm -rf "$prefix" "$build/consumer"
cmake --install "$build" --prefix "$prefix" > /dev/null
echo "normcore: installed into $prefix ($(du -sh "$prefix" | cut -f1): library $(du -sh "$prefix"/lib*/libnormcore* | cut -f1 | head -1), headers $(du -sh "$prefix/include/normcore" | cut -f1))"

cmake -S tests/consumer -B "$build/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$build/consumer" > /dev/null
"$build/consumer/consumer" "$build/consumer/consumer.safetensors"

pc_dir=$(dirname "$(find "$prefix" -name normcore.pc | head -1)")
libdir=$(PKG_CONFIG_PATH=$pc_dir pkg-config --variable=libdir normcore)
# shellcheck disable=SC2046
g++ -std=c++17 tests/consumer/main.cpp -o "$build/consumer/consumer_pkgconfig" \
  $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs normcore) -Wl,-rpath,"$libdir"
"$build/consumer/consumer_pkgconfig" "$build/consumer/consumer_pkgconfig.safetensors"
