// Philox-4x32-10 counter-based generator (Salmon et al., SC'11), shared by the CPU and
// CUDA backends so that both derive element i of a random tensor from (seed, offset + i)
// alone. Also the per-element transforms from random words to uniform/normal/int values.
#pragma once

#include <cmath>
#include <cstdint>

#include "base/host_device.h"

namespace normcore {
namespace philox {

struct Words {
  uint32_t w[4];
};

NC_HOST_DEVICE void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Four random 32-bit words for counter under key seed.
NC_HOST_DEVICE Words generate(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Words{{c0, c1, c2, c3}};
}

// [0, 1) with 24 bits (exact in float).
NC_HOST_DEVICE float uniform_float(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }
// [0, 1) with 53 bits.
NC_HOST_DEVICE double uniform_double(uint32_t hi, uint32_t lo) {
  uint64_t bits = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}
// Box-Muller on (0, 1] x [0, 1).
NC_HOST_DEVICE float normal_float(const Words& r) {
  float u1 = static_cast<float>((r.w[0] >> 8) + 1) * (1.0f / 16777216.0f);
  float u2 = uniform_float(r.w[2]);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}
NC_HOST_DEVICE double normal_double(const Words& r) {
  double u1 = 1.0 - uniform_double(r.w[0], r.w[1]);
  double u2 = uniform_double(r.w[2], r.w[3]);
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
}
NC_HOST_DEVICE int64_t uniform_int(const Words& r, int64_t low, uint64_t range) {
  uint64_t bits = (static_cast<uint64_t>(r.w[0]) << 32) | r.w[1];
  return static_cast<int64_t>(static_cast<uint64_t>(low) + bits % range);  // wraps, never overflows
}

}  // namespace philox
}  // namespace normcore
