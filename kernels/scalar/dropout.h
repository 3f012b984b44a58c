// The element math of dropout (kernels/generate.h), shared by the CPU and CUDA backends so
// that both draw the same mask and give the same bits. The mask is the one
// `ge(rand(shape, f32), p)` draws: element i is kept when the f32 uniform of
// philox(seed, offset + i) is at least p (as an f32). A kept element is x * scale and a
// dropped one x * 0, computed in compute_t<T> with scale rounded to T first: the bits of
// x * (keep.to(T) * scale).
#pragma once

#include <cstdint>

#include "base/philox.h"
#include "kernels/scalar/dtype.h"

namespace normcore {

NC_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t counter, float threshold) {
  return philox::uniform_float(philox::generate(seed, counter).w[0]) >= threshold;
}

// C is compute_t<T>; scale is convert<C>(convert<T>(1 / (1 - p))).
template <class T, class C>
NC_HOST_DEVICE T dropout_apply(T x, bool keep, C scale) {
  return convert<T>(convert<C>(x) * (keep ? scale : C(0)));
}

}  // namespace normcore
