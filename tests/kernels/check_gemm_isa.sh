#!/usr/bin/env bash
# A vector build of the CPU matrix product (kernels/cpu/gemm_avx2.cpp, gemm_avx512.cpp) must
# define no weak or unique symbol outside its renamed Eigen namespace: the linker keeps one
# copy of each such symbol for the whole library, and an AVX2 or AVX-512 copy of a function
# the baseline code also uses would run on processors without those instructions. Fails when
# the object cannot be read.
#   check_gemm_isa.sh OBJECT EIGEN_NAMESPACE    (NormcoreEigenAvx2, NormcoreEigenAvx512)
set -euo pipefail
object=$1
namespace=$2
if [[ ! -f "$object" ]]; then
  echo "FAIL: $object not found (is the build's object layout different?)" >&2
  exit 1
fi
symbols=$(nm -C --defined-only "$object")
if [[ -z "$symbols" ]]; then
  echo "FAIL: $object defines no symbols: the product was not compiled" >&2
  exit 1
fi
# Weak (W, V) and unique (u) symbols, less the renamed Eigen and the personality routine's
# reference, which is the same data in every object.
leaked=$(echo "$symbols" | awk '$2 ~ /^[WVu]$/' | grep -v "$namespace::" | grep -v 'DW.ref.__gxx_personality_v0' || true)
if [[ -n "$leaked" ]]; then
  echo "FAIL: $object defines shared symbols outside $namespace:" >&2
  echo "$leaked" >&2
  exit 1
fi
echo "PASS: $(echo "$symbols" | grep -c "$namespace::" || true) $namespace symbols, none shared with the baseline code"
