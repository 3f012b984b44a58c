// The attention backward on Hopper (contract: kernels/attention.h; entry points:
// hopper/attention.h), in two forms after delta = rowsum(grad_out * out) (delta_rows).
// The fast form (the default) is one key kernel that writes grad_k and grad_v and adds each
// step's grad_q into an f32 accumulator (5 tile products a step; see "the fast form's
// grad_q"), then a pass scaling the accumulator into grad_q. The deterministic form
// (cuda::set_deterministic(true)) is the layout of the mma.sync kernels: two kernels that each
// write their gradients once, with no atomics (7 products):
//   keys:    a block per 128 keys of a q head; for each tile of 64 queries
//            S^T = K Q^T and dP^T = V dO^T (wgmma, shared memory), P^T = exp(scale S^T - lse),
//            dS^T = P^T (dP^T - delta), then grad_v += P^T dO and grad_k += dS^T Q (wgmma,
//            P^T and dS^T from registers, dO and Q N-major);
//   queries: a block per 128 queries; for each tile of 64 keys S = Q K^T and dP = dO V^T,
//            P and dS likewise, grad_q += dS K.
// Each block is a producer warpgroup (one thread copies the block's own K and V, or Q and
// dO, once and then the other side's tiles through two stages, as the forward does) and two
// consumer warpgroups of 64 rows. grad_k and grad_q are scaled once at the end. Rows past L
// or S read as zeros; queries past L get lse = +inf (P = 0), keys past S are masked in the
// query kernel and not written by the key kernel; causal blocks visit only the tiles their
// diagonal reaches.
//
// Built for sm_90a alone, as attention_forward.cu.
#include "kernels/cuda/hopper/attention.h"

#include <type_traits>

#include "kernels/cuda/hopper/sm90.cuh"
#include "kernels/cuda/hopper/tensor_map.cuh"
#include "kernels/cuda/hopper/wgmma.cuh"

namespace normcore {
namespace cuda {
namespace hopper {
namespace {

using flash::AttentionParams;

// OWN rows of the block's own side (keys or queries), stepping through tiles of STEP rows
// of the other side.
// GRAD_Q: the key kernel that also sums grad_q (the fast form, below).
template <int HD, int OWN, int STEP, int STAGES, bool GRAD_Q = false>
struct BackwardTiles {
  static constexpr int kHeadDim = HD, kOwn = OWN, kStep = STEP;
  static constexpr int kConsumers = OWN / 64, kStages = STAGES;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kParts = HD / 64;
  static constexpr uint32_t kOwnPartBytes = OWN * 128, kOwnBytes = kParts * kOwnPartBytes;
  static constexpr uint32_t kStepPartBytes = STEP * 128, kStepBytes = kParts * kStepPartBytes;
  // The fast form's grad_q: a step's dS^T (OWN keys by STEP queries, rows of 128 bytes) in two
  // buffers, and each consumer's columns of the step's grad_q (kGradQWidth f32 columns, in
  // boxes of 32 columns by STEP rows) in two buffers.
  static constexpr bool kGradQ = GRAD_Q;
  static constexpr int kGradQWidth = HD / kConsumers;
  static constexpr uint32_t kDsBytes = GRAD_Q ? OWN * STEP * 2 : 0;
  static constexpr uint32_t kGradQBoxBytes = STEP * 128;
  static constexpr uint32_t kGradQBytes = GRAD_Q ? kGradQWidth / 32 * kGradQBoxBytes : 0;
  // The fast form's step statistics (lse and delta of STEP queries) in a ring of three.
  static constexpr uint32_t kStatsBytes = GRAD_Q ? 2 * STEP * 4 : 0;
  static_assert(!GRAD_Q || (STEP == 64 && kGradQWidth % 32 == 0), "dS^T rows are one 128-byte swizzle row");
  // Two own tiles (K and V, or Q and dO), two step tiles a stage, the grad_q buffers,
  // barriers (own full; step full and empty a stage; dS^T full and empty a buffer) and room
  // to align to 1024 bytes.
  static constexpr size_t kSharedBytes = 1024 + 2 * kOwnBytes + 2 * kStages * kStepBytes + 2 * kDsBytes +
                                         2 * kConsumers * kGradQBytes + 3 * kStatsBytes + 8 * (1 + 2 * kStages + 4);
};
template <int HD>
using KeyTiles = BackwardTiles<HD, 128, 64, HD == 64 ? 3 : 2>;
template <int HD>
using FastKeyTiles = BackwardTiles<HD, 128, 64, HD == 64 ? 3 : 2, true>;
template <int HD>
using QueryTiles = BackwardTiles<HD, 128, 64, HD == 64 ? 3 : 2>;

// The shared-memory layout and barriers of a backward block; `own` holds two tiles (own0,
// own1), each stage two step tiles (step0, step1), then the fast form's grad_q buffers.
template <class Tiles>
struct BackwardSmem {
  uint32_t own0, own1, steps, ds_buffers, grad_q_buffers, stats_ring, own_full;
  __device__ explicit BackwardSmem(const void* smem) {
    own0 = (flash::smem_address(smem) + 1023u) & ~1023u;
    own1 = own0 + Tiles::kOwnBytes;
    steps = own1 + Tiles::kOwnBytes;
    ds_buffers = steps + 2 * Tiles::kStages * Tiles::kStepBytes;
    grad_q_buffers = ds_buffers + 2 * Tiles::kDsBytes;
    stats_ring = grad_q_buffers + 2 * Tiles::kConsumers * Tiles::kGradQBytes;
    own_full = stats_ring + 3 * Tiles::kStatsBytes;
  }
  __device__ uint32_t step0(int st) const { return steps + st * 2 * Tiles::kStepBytes; }
  __device__ uint32_t step1(int st) const { return step0(st) + Tiles::kStepBytes; }
  // Step n's buffers: ds(n % 2), grad_q(consumer, n % 2).
  __device__ uint32_t ds(int parity) const { return ds_buffers + parity * Tiles::kDsBytes; }
  __device__ uint32_t grad_q(int consumer, int parity) const {
    return grad_q_buffers + (2 * consumer + parity) * Tiles::kGradQBytes;
  }
  // Step n's statistics: lse of its queries, then delta.
  __device__ uint32_t stats(int n) const { return stats_ring + n % 3 * Tiles::kStatsBytes; }
  __device__ uint32_t step_full(int st) const { return own_full + 8 * (1 + st); }
  __device__ uint32_t step_empty(int st) const { return own_full + 8 * (1 + Tiles::kStages + st); }
  __device__ uint32_t ds_full(int parity) const { return own_full + 8 * (1 + 2 * Tiles::kStages + parity); }
  __device__ uint32_t ds_empty(int parity) const { return own_full + 8 * (3 + 2 * Tiles::kStages + parity); }

  __device__ void init() const {
    sm90::barrier_init(own_full, 1);
    for (int st = 0; st < Tiles::kStages; ++st) {
      sm90::barrier_init(step_full(st), 1);
      sm90::barrier_init(step_empty(st), Tiles::kConsumers * 128);
    }
    if constexpr (Tiles::kGradQ) {
      for (int parity = 0; parity < 2; ++parity) {
        sm90::barrier_init(ds_full(parity), Tiles::kConsumers * 128);
        sm90::barrier_init(ds_empty(parity), Tiles::kConsumers * 128);
      }
    }
    sm90::barrier_init_fence();
  }
};

// The producer's copies: the two own tiles at own_row, then for steps [first, last) the two
// step tiles at row STEP * step. Heads: own_head for the own maps, step_head for the step maps.
template <class Tiles>
__device__ void produce(const BackwardSmem<Tiles>& sm, const CUtensorMap* own0, const MapOrder& own0_order,
                        const CUtensorMap* own1, const MapOrder& own1_order, const CUtensorMap* step0,
                        const MapOrder& step0_order, const CUtensorMap* step1, const MapOrder& step1_order, int own_row,
                        int own_head, int step_head, int batch, int first, int last) {
  if (first >= last) return;
  sm90::barrier_expect_bytes(sm.own_full, 2 * Tiles::kOwnBytes);
#pragma unroll
  for (int part = 0; part < Tiles::kParts; ++part) {
    load_box(sm.own0 + part * Tiles::kOwnPartBytes, own0, own0_order, sm.own_full, part * 64, own_row, own_head, batch);
    load_box(sm.own1 + part * Tiles::kOwnPartBytes, own1, own1_order, sm.own_full, part * 64, own_row, own_head, batch);
  }
  for (int step = first, n = 0; step < last; ++step, ++n) {
    const int st = n % Tiles::kStages;
    if (n >= Tiles::kStages) sm90::barrier_wait(sm.step_empty(st), (n / Tiles::kStages - 1) & 1);
    sm90::barrier_expect_bytes(sm.step_full(st), 2 * Tiles::kStepBytes);
#pragma unroll
    for (int part = 0; part < Tiles::kParts; ++part) {
      load_box(sm.step0(st) + part * Tiles::kStepPartBytes, step0, step0_order, sm.step_full(st), part * 64,
               step * Tiles::kStep, step_head, batch);
      load_box(sm.step1(st) + part * Tiles::kStepPartBytes, step1, step1_order, sm.step_full(st), part * 64,
               step * Tiles::kStep, step_head, batch);
    }
  }
}

// S = A B^T over the head dim for the 64 rows of A at a_rows (own tile) and the STEP rows of
// the step tile b, both K-major (parts of 64 columns), issued.
template <class T, class Tiles>
__device__ __forceinline__ void issue_product(float (&d)[Tiles::kStep / 2], uint32_t a_rows, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < Tiles::kHeadDim / 16; ++kk) {
    const uint32_t a_offset = kk / 4 * Tiles::kOwnPartBytes + kk % 4 * 32;
    const uint32_t b_offset = kk / 4 * Tiles::kStepPartBytes + kk % 4 * 32;
    sm90::Wgmma<T, Tiles::kStep>::ss(d, sm90::swizzled_descriptor(a_rows + a_offset, 0),
                                     sm90::swizzled_descriptor(b + b_offset, 0), kk > 0);
  }
}

// Waits for stage st's step tiles, then issues d0 = A0 step0^T and d1 = A1 step1^T (A0 and
// A1 the 64 own rows of this consumer at a0_rows, a1_rows) as one group.
template <class T, class Tiles>
__device__ __forceinline__ void issue_step_products(const BackwardSmem<Tiles>& sm, int st, uint32_t parity,
                                                    float (&d0)[Tiles::kStep / 2], uint32_t a0_rows,
                                                    float (&d1)[Tiles::kStep / 2], uint32_t a1_rows) {
  sm90::barrier_wait(sm.step_full(st), parity);
  sm90::wgmma_fence();
  issue_product<T, Tiles>(d0, a0_rows, sm.step0(st));
  issue_product<T, Tiles>(d1, a1_rows, sm.step1(st));
  sm90::wgmma_commit();
}

// acc += P B for P (64 x STEP, registers) and the step tile b read N-major (STEP x HD), issued.
template <class T, class Tiles>
__device__ __forceinline__ void issue_accumulate(float (&acc)[Tiles::kHeadDim / 2],
                                                 const uint32_t (&pa)[Tiles::kStep / 16][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < Tiles::kStep / 16; ++kk)
    sm90::Wgmma<T, Tiles::kHeadDim>::rs(acc, pa[kk],
                                        sm90::swizzled_descriptor(b + kk * 16 * 128, Tiles::kStepPartBytes), true);
}

template <class T, int N>
__device__ __forceinline__ void pack_operand(uint32_t (&pa)[N / 16][4], const float (&x)[N / 2]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[kk][r] = flash::pack2<T>(x[8 * kk + 2 * r], x[8 * kk + 2 * r + 1]);
}

// Rows [row_lo, row_lo + 8] of a consumer's 64 x HD accumulators times factor to dst (rows
// `stride` apart), those below rows.
template <class T, int HD>
__device__ __forceinline__ void store_rows(T* dst, int64_t stride, int row_lo, int rows, int t,
                                           const float (&acc)[HD / 2], float factor) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_lo + half * 8;
    if (row >= rows) continue;
    T* out = dst + row * stride + 2 * t;
#pragma unroll
    for (int c = 0; c < HD / 8; ++c)
      *reinterpret_cast<uint32_t*>(out + 8 * c) =
          flash::pack2<T>(acc[4 * c + 2 * half] * factor, acc[4 * c + 2 * half + 1] * factor);
  }
}

// ---------------------------------------------------------------- grad_k, grad_v
// A key-kernel step's lse and delta for this thread's query columns q0 + 8 c + 2 t + e
// (those of row L - 1 past L, where key_probabilities zeroes P), in one of two places.
//
// RegisterStats (the deterministic form): loaded into 2 x BM / 4 registers when the step's
// products are issued, used after them, so the loads do not hold the issue up.
template <int BM>
struct RegisterStats {
  float lse_[BM / 4], delta_[BM / 4];
  template <class T>
  __device__ __forceinline__ void load(const AttentionParams<T, float>& p, int64_t bh, int q0, int t) {
#pragma unroll
    for (int c = 0; c < BM / 8; ++c)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t row = bh * p.L + min(q0 + 8 * c + 2 * t + e, p.L - 1);
        lse_[2 * c + e] = p.lse[row];
        delta_[2 * c + e] = p.delta[row];
      }
  }
  // Column pair c (e = 0, 1): lse and delta.
  __device__ __forceinline__ float2 lse(int c) const { return make_float2(lse_[2 * c], lse_[2 * c + 1]); }
  __device__ __forceinline__ float2 delta(int c) const { return make_float2(delta_[2 * c], delta_[2 * c + 1]); }
};

// SharedStats (the fast form, where the registers are short): each step's BM lse and BM
// delta in shared memory (BackwardSmem::stats, a ring of three), written two steps ahead
// (consumer 0's threads load lse, consumer 1's delta, one value a thread, when step n's
// products are issued, and store it when dS^T(n) is published: the ds_full barrier every
// consumer waits for before its step n + 1 orders the store before the reads of step n + 2,
// and the ring's third slot keeps it after the other consumer's reads of step n - 1).
template <int BM>
struct SharedStats {
  uint32_t slot = 0;
  float next = 0.0f;
  __device__ __forceinline__ float2 lse(int c) const { return pair(slot, c); }
  __device__ __forceinline__ float2 delta(int c) const { return pair(slot + BM * 4, c); }
  int t = 0;

 private:
  __device__ __forceinline__ float2 pair(uint32_t base, int c) const {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(base + (8 * c + 2 * t) * 4));
    return v;
  }
};

// P^T and dS^T in place of a key-kernel step's S^T and dP^T: rows are keys from key_lo (and
// key_lo + 8), columns the queries from q0. P is zeroed for queries past L and, causal, for
// keys past a column's query; `masked`: the step has such columns.
template <int BM, class Stats>
__device__ __forceinline__ void key_probabilities(float (&s)[BM / 2], float (&dp)[BM / 2], const Stats& stats,
                                                  float scale_log2, bool masked, bool causal, int L, int key_lo, int q0,
                                                  int t) {
#pragma unroll
  for (int c = 0; c < BM / 8; ++c) {
    const float2 lse = stats.lse(c), delta = stats.delta(c);
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // rows key_lo + 8 (r / 2), column 8 c + 2 t + r % 2
      const int i = 4 * c + r;
      float x = flash::exp2_approx(fmaf(s[i], scale_log2, -(r % 2 ? lse.y : lse.x) * flash::kLog2e));
      if (masked) {
        const int q = q0 + 8 * c + 2 * t + r % 2;
        if (q >= L || (causal && key_lo + r / 2 * 8 > q)) x = 0.0f;
      }
      s[i] = x;
      dp[i] = x * (dp[i] - (r % 2 ? delta.y : delta.x));
    }
  }
}

// ---------------------------------------------------------------- the fast form's grad_q
// The fast key kernel also adds each step's grad_q = dS K (the scale applied at the end) into
// an f32 accumulator [batch * heads, L, HD] in global memory, through the tensor memory
// accelerator's reductions: the consumers publish dS^T in shared memory, each multiplies the
// dS of all the block's keys by its half of K's columns (wgmma, dS M-major, K N-major),
// stores its 64 x HD/2 part, and a warp of the producer warpgroup adds that to the
// accumulator. Additions
// from different key blocks reach a grad_q element in an order that varies between runs.

// Publishes this consumer's dS^T of step n (block rows key_row and key_row + 8, the step's
// query columns) into buffer ds(n % 2) in the 128-byte swizzle's layout, once every
// consumer's grad_q of step n - 2 has read that buffer (ds_empty), and says so on ds_full.
// The consumers run apart: none waits for another's dS^T until it issues its grad_q.
template <class Tiles>
__device__ __forceinline__ void publish_ds(const BackwardSmem<Tiles>& sm, int n,
                                           const uint32_t (&ds)[Tiles::kStep / 16][4], int key_row, int g, int t) {
  if (n >= 2) sm90::barrier_wait(sm.ds_empty(n % 2), (n / 2 - 1) & 1);
  const uint32_t buf = sm.ds(n % 2);
#pragma unroll
  for (int kk = 0; kk < Tiles::kStep / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)  // rows key_row + 8 (r % 2), columns 16 kk + 8 (r / 2) + 2 t and + 1
      sm90::store_shared(buf + (key_row + 8 * (r % 2)) * 128 + (((2 * kk + r / 2) ^ g) << 4) + 4 * t, ds[kk][r]);
  sm90::fence_proxy_async();
  sm90::barrier_arrive(sm.ds_full(n % 2));
}

// dq = dS K over the block's keys for this consumer's kGradQWidth columns of K, issued.
template <class T, class Tiles>
__device__ __forceinline__ void issue_grad_q(float (&dq)[Tiles::kGradQWidth / 2], uint32_t ds, uint32_t k_tile,
                                             int consumer) {
  constexpr int W = Tiles::kGradQWidth;
  const uint32_t b = k_tile + consumer * W / 64 * Tiles::kOwnPartBytes + consumer * W % 64 * 2;
#pragma unroll
  for (int kk = 0; kk < Tiles::kOwn / 16; ++kk)
    sm90::Wgmma<T, W>::ss_mn(dq, sm90::swizzled_descriptor(ds + kk * 16 * 128, Tiles::kDsBytes),
                             sm90::swizzled_descriptor(b + kk * 16 * 128, Tiles::kOwnPartBytes), kk > 0);
}

// The additions are issued by a warp of the producer warpgroup (the writer), so that no
// consumer waits for them: named barriers between a consumer's 128 threads and the writer say
// that the consumer's part of step n is in buffer n % 2 (full: the consumer arrives, the
// writer syncs) and that the buffer's addition two steps before has read it (empty: the
// writer arrives, the consumer syncs). A consumer thread issuing the addition itself, its
// 128 threads waiting on a named barrier each step, was up to 7% slower (PERFORMANCE.md).
constexpr int kWriterThreads = 128 + 32;
__device__ __forceinline__ int grad_q_full_barrier(int consumer, int parity) { return 4 + 2 * consumer + parity; }
__device__ __forceinline__ int grad_q_empty_barrier(int consumer, int parity) { return 8 + 2 * consumer + parity; }

// The writer's loop: for each step, each consumer's part added once it is in, and the
// buffers freed once read (but for the last two steps', which no consumer waits for).
template <class Tiles>
__device__ void write_grad_q(const BackwardSmem<Tiles>& sm, const CUtensorMap* map, int first, int steps, int64_t bh,
                             int lane) {
  for (int n = 0; n < steps; ++n) {
    const int q0 = (first + n) * Tiles::kStep;
    for (int c = 0; c < Tiles::kConsumers; ++c) {
      sm90::named_sync(grad_q_full_barrier(c, n % 2), kWriterThreads);
      if (lane == 0) {
#pragma unroll
        for (int box = 0; box < Tiles::kGradQWidth / 32; ++box)
          sm90::tma_reduce_add_3d(map, sm.grad_q(c, n % 2) + box * Tiles::kGradQBoxBytes,
                                  c * Tiles::kGradQWidth + 32 * box, q0, static_cast<int>(bh));
        sm90::bulk_commit();
      }
    }
    if (n + 2 < steps) {
      if (lane == 0) sm90::bulk_wait_read<0>();
      __syncwarp();
      for (int c = 0; c < Tiles::kConsumers; ++c) sm90::named_arrive(grad_q_empty_barrier(c, n % 2), kWriterThreads);
    }
  }
  if (lane == 0) sm90::bulk_wait<0>();
}

// Stores this consumer's part of step n's grad_q into buffer n % 2 (boxes of 32 columns,
// 128-byte swizzle), once the writer has freed it, and tells the writer it is in.
template <class Tiles>
__device__ __forceinline__ void add_grad_q(const float (&dq)[Tiles::kGradQWidth / 2], uint32_t buf, int consumer,
                                           int tid, int n) {
  if (n >= 2) sm90::named_sync(grad_q_empty_barrier(consumer, n % 2), kWriterThreads);
  const int warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
#pragma unroll
  for (int c = 0; c < Tiles::kGradQWidth / 8; ++c)
#pragma unroll
    for (int half = 0; half < 2; ++half)  // row 16 warp + g + 8 half, columns 8 c + 2 t and + 1
      sm90::store_shared(buf + c / 4 * Tiles::kGradQBoxBytes + (warp * 16 + g + 8 * half) * 128 +
                             (((2 * (c % 4) + t / 2) ^ g) << 4) + t % 2 * 8,
                         dq[4 * c + 2 * half], dq[4 * c + 2 * half + 1]);
  sm90::fence_proxy_async();
  sm90::named_arrive(grad_q_full_barrier(consumer, n % 2), kWriterThreads);
}

// Step n's grad_v += P^T dO and grad_k += dS^T Q from stage st (and in the fast form, once
// every consumer has published its dS^T, dq = dS K), issued as one group (commit).
template <class T, class Tiles>
__device__ __forceinline__ void issue_key_accumulation(float (&dv)[Tiles::kHeadDim / 2],
                                                       float (&dk)[Tiles::kHeadDim / 2],
                                                       float (&dq)[Tiles::kGradQWidth / 2],
                                                       const uint32_t (&pa)[Tiles::kStep / 16][4],
                                                       const uint32_t (&ds)[Tiles::kStep / 16][4],
                                                       const BackwardSmem<Tiles>& sm, int st, int n, int consumer) {
  issue_accumulate<T, Tiles>(dv, pa, sm.step1(st));  // P^T dO
  issue_accumulate<T, Tiles>(dk, ds, sm.step0(st));  // dS^T Q
  if constexpr (Tiles::kGradQ) {
    sm90::barrier_wait(sm.ds_full(n % 2), (n / 2) & 1);
    issue_grad_q<T, Tiles>(dq, sm.ds(n % 2), sm.own0, consumer);
  }
  sm90::wgmma_commit();
}

// After step n's accumulation in the fast form: frees its dS^T buffer for step n + 2 and adds
// its grad_q (queries from q0) to the accumulator.
template <class Tiles>
__device__ __forceinline__ void grad_q_done(float (&dq)[Tiles::kGradQWidth / 2], const BackwardSmem<Tiles>& sm, int n,
                                            int consumer, int tid) {
  sm90::fence_registers(dq);
  sm90::barrier_arrive(sm.ds_empty(n % 2));
  add_grad_q<Tiles>(dq, sm.grad_q(consumer, n % 2), consumer, tid, n);
}
// Waits for the accumulations into a (and b), then frees stage st for the producer.
template <class Tiles, int N>
__device__ __forceinline__ void accumulated(float (&a)[N], const BackwardSmem<Tiles>& sm, int st) {
  sm90::wgmma_wait<0>();
  sm90::fence_registers(a);
  sm90::barrier_arrive(sm.step_empty(st));
}
template <class Tiles, int N>
__device__ __forceinline__ void accumulated(float (&a)[N], float (&b)[N], const BackwardSmem<Tiles>& sm, int st) {
  sm90::wgmma_wait<0>();
  sm90::fence_registers(a);
  sm90::fence_registers(b);
  sm90::barrier_arrive(sm.step_empty(st));
}

// PIPELINED: a step's accumulation issued with the next step's products (registers for both
// sets of operands: head dim 64 only).
// Tiles::kGradQ: the fast form, adding grad_q into the accumulator of grad_q_map.
template <class T, class Tiles, bool PIPELINED>
__global__ void __launch_bounds__(Tiles::kThreads, 1)
    key_kernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
               const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap do_map,
               const __grid_constant__ CUtensorMap grad_q_map, const MapOrders orders, const MapOrder do_order,
               const AttentionParams<T, float> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int HD = Tiles::kHeadDim, BN = Tiles::kOwn, BM = Tiles::kStep, STAGES = Tiles::kStages;
  extern __shared__ __align__(1024) unsigned char smem[];
  const BackwardSmem<Tiles> sm(smem);
  const int k_tiles = (p.S + BN - 1) / BN;
  const int64_t bh = blockIdx.x / k_tiles;
  const int k0 = static_cast<int>(blockIdx.x - bh * k_tiles) * BN;  // causal: the longest blocks come first
  const int batch = static_cast<int>(bh / p.heads), head = static_cast<int>(bh % p.heads);
  const int first = p.causal ? k0 / BM : 0, last = (p.L + BM - 1) / BM;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) sm.init();
  __syncthreads();

  if (warpgroup == 0) {
    sm90::registers_down<24>();
    if (threadIdx.x == 0)
      produce(sm, &k_map, orders.k, &v_map, orders.v, &q_map, orders.q, &do_map, do_order, k0, head / p.group, head,
              batch, first, last);
    if constexpr (Tiles::kGradQ) {
      if (threadIdx.x / 32 == 1) write_grad_q<Tiles>(sm, &grad_q_map, first, last - first, bh, threadIdx.x % 32);
    }
    return;
  }

  sm90::registers_up<240>();
  const int consumer = warpgroup - 1, tid = threadIdx.x - 128 * warpgroup;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int key_lo = k0 + consumer * 64 + warp * 16 + g;  // accumulators 4 c + 0, 1: key_lo; + 2, 3: key_lo + 8
  const float scale_log2 = static_cast<float>(p.scale) * flash::kLog2e;
  const uint32_t k_rows = sm.own0 + consumer * 64 * 128, v_rows = sm.own1 + consumer * 64 * 128;
  const int ds_row = consumer * 64 + warp * 16 + g;
  // Whether the step at query q0 has columns key_probabilities zeroes.
  const auto masked_step = [&](int q0) { return q0 + BM > p.L || (p.causal && k0 + BN - 1 > q0); };
  float dk[HD / 2], dv[HD / 2], dq[Tiles::kGradQWidth / 2];  // dq: the fast form's
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) dk[i] = dv[i] = 0.0f;
  const int steps = last - first;
  // The steps' statistics (RegisterStats, SharedStats): loaded when step n's products are
  // issued, read by key_probabilities, and in the fast form stored with dS^T(n).
  std::conditional_t<Tiles::kGradQ, SharedStats<BM>, RegisterStats<BM>> stats;
  [[maybe_unused]] const auto stats_value = [&](int n) {  // the fast form: this thread's of step n
    static_assert(!Tiles::kGradQ || Tiles::kConsumers == 2, "consumer 0 loads lse, consumer 1 delta");
    return (consumer == 0 ? p.lse : p.delta)[bh * p.L + min((first + n) * BM + tid, p.L - 1)];
  };
  [[maybe_unused]] const auto stats_slot = [&](int n) { return sm.stats(n) + (consumer * BM + tid) * 4; };
  const auto load_stats = [&](int n) {
    if constexpr (Tiles::kGradQ) {
      if (tid < BM && n + 2 < steps) stats.next = stats_value(n + 2);
    } else {
      stats.load(p, bh, (first + n) * BM, t);
    }
  };
  const auto use_stats = [&](int n) {
    if constexpr (Tiles::kGradQ) stats.slot = sm.stats(n);
  };
  const auto store_stats = [&](int n) {
    if constexpr (Tiles::kGradQ) {
      if (tid < BM && n + 2 < steps) sm90::store_shared(stats_slot(n + 2), __float_as_uint(stats.next));
    }
  };
  if constexpr (Tiles::kGradQ) {
    // Steps 0 and 1 before the loop, every consumer's seen by all.
    stats.t = t;
    if (steps > 0) {
      for (int n = 0; n < 2 && n < steps; ++n)
        if (tid < BM) sm90::store_shared(stats_slot(n), __float_as_uint(stats_value(n)));
      sm90::named_sync(1, Tiles::kConsumers * 128);
    }
  }
  if constexpr (!PIPELINED) {
    // One step at a time: the accumulators and both sets of operands would not fit together.
    if (first < last) sm90::barrier_wait(sm.own_full, 0);
    for (int step = first, n = 0; step < last; ++step, ++n) {
      const int st = n % STAGES, q0 = step * BM;
      load_stats(n);
      float s[BM / 2], dp[BM / 2];
      issue_step_products<T, Tiles>(sm, st, (n / STAGES) & 1, s, k_rows, dp, v_rows);  // S^T = K Q^T, dP^T = V dO^T
      sm90::wgmma_wait<0>();
      sm90::fence_registers(s);
      sm90::fence_registers(dp);
      use_stats(n);
      key_probabilities<BM>(s, dp, stats, scale_log2, masked_step(q0), p.causal, p.L, key_lo, q0, t);
      uint32_t pa[BM / 16][4], ds[BM / 16][4];
      pack_operand<T, BM>(pa, s);
      pack_operand<T, BM>(ds, dp);
      if constexpr (Tiles::kGradQ) {
        store_stats(n);
        publish_ds<Tiles>(sm, n, ds, ds_row, g, t);
      }
      sm90::wgmma_fence();
      issue_key_accumulation<T, Tiles>(dv, dk, dq, pa, ds, sm, st, n, consumer);
      accumulated(dv, dk, sm, st);
      if constexpr (Tiles::kGradQ) grad_q_done<Tiles>(dq, sm, n, consumer, tid);
    }
  } else {
    float s[BM / 2], dp[BM / 2];
    uint32_t pa[BM / 16][4], ds[BM / 16][4];
    // Step n's products S^T = K Q^T and dP^T = V dO^T, issued, after its statistics' loads.
    const auto products = [&](int n) {
      load_stats(n);
      issue_step_products<T, Tiles>(sm, n % STAGES, (n / STAGES) & 1, s, k_rows, dp, v_rows);
    };
    // P^T and dS^T of step n in s and dp.
    const auto elementwise = [&](int n) {
      sm90::fence_registers(s);
      sm90::fence_registers(dp);
      const int q0 = (first + n) * BM;
      use_stats(n);
      key_probabilities<BM>(s, dp, stats, scale_log2, masked_step(q0), p.causal, p.L, key_lo, q0, t);
    };
    // P^T and dS^T of step n as operands (dS^T published in the fast form).
    const auto pack = [&](int n) {
      pack_operand<T, BM>(pa, s);
      pack_operand<T, BM>(ds, dp);
      if constexpr (Tiles::kGradQ) {
        store_stats(n);
        publish_ds<Tiles>(sm, n, ds, ds_row, g, t);
      }
    };
    const auto accumulation = [&](int n) {
      issue_key_accumulation<T, Tiles>(dv, dk, dq, pa, ds, sm, n % STAGES, n, consumer);
    };
    // Waits for step n's accumulation, then adds its grad_q in the fast form.
    const auto accumulation_done = [&](int n) {
      accumulated(dv, dk, sm, n % STAGES);
      if constexpr (Tiles::kGradQ) grad_q_done<Tiles>(dq, sm, n, consumer, tid);
    };
    if (steps > 0) {
      sm90::barrier_wait(sm.own_full, 0);
      products(0);
      sm90::wgmma_wait<0>();
      elementwise(0);
      pack(0);
      for (int n = 1; n < steps; ++n) {
        // Step n - 1's accumulation runs under step n's elementwise work.
        products(n);
        accumulation(n - 1);
        sm90::wgmma_wait<1>();
        elementwise(n);
        accumulation_done(n - 1);
        pack(n);
      }
      sm90::wgmma_fence();
      accumulation(steps - 1);
      accumulation_done(steps - 1);
    }
  }
  store_rows<T, HD>(flash::head_rows(p.grad_k, p.grad_k_stride, bh, p.heads), p.grad_k_stride.row, key_lo, p.S, t, dk,
                    static_cast<float>(p.scale));
  store_rows<T, HD>(flash::head_rows(p.grad_v, p.grad_v_stride, bh, p.heads), p.grad_v_stride.row, key_lo, p.S, t, dv,
                    1.0f);
#endif
}

// ---------------------------------------------------------------- grad_q
// PIPELINED: as the key kernel's (head dim 64 only; at 128 it was measured slower).
template <class T, class Tiles, bool PIPELINED>
__global__ void __launch_bounds__(Tiles::kThreads, 1)
    query_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap do_map,
                 const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                 const MapOrders orders, const MapOrder do_order, const AttentionParams<T, float> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int HD = Tiles::kHeadDim, BM = Tiles::kOwn, BN = Tiles::kStep, STAGES = Tiles::kStages;
  extern __shared__ __align__(1024) unsigned char smem[];
  const BackwardSmem<Tiles> sm(smem);
  const int m_tiles = (p.L + BM - 1) / BM;
  const int64_t bh = blockIdx.x / m_tiles;
  const int m0 = (m_tiles - 1 - static_cast<int>(blockIdx.x - bh * m_tiles)) * BM;  // longest causal blocks first
  const int batch = static_cast<int>(bh / p.heads), head = static_cast<int>(bh % p.heads);
  int last = (p.S + BN - 1) / BN;
  if (p.causal) last = min(last, (min(m0 + BM, p.L) - 1) / BN + 1);
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) sm.init();
  __syncthreads();

  if (warpgroup == 0) {
    sm90::registers_down<24>();
    if (threadIdx.x == 0)
      produce(sm, &q_map, orders.q, &do_map, do_order, &k_map, orders.k, &v_map, orders.v, m0, head, head / p.group,
              batch, 0, last);
    return;
  }

  sm90::registers_up<240>();
  const int consumer = warpgroup - 1, tid = threadIdx.x - 128 * warpgroup;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row_lo = m0 + consumer * 64 + warp * 16 + g;  // accumulators 4 c + 0, 1: row_lo; + 2, 3: row_lo + 8
  const float scale_log2 = static_cast<float>(p.scale) * flash::kLog2e;
  const uint32_t q_rows = sm.own0 + consumer * 64 * 128, do_rows = sm.own1 + consumer * 64 * 128;
  float lse2[2], delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_lo + 8 * half;
    lse2[half] = row < p.L ? p.lse[bh * p.L + row] * flash::kLog2e : INFINITY;
    delta[half] = row < p.L ? p.delta[bh * p.L + row] : 0.0f;
  }
  float dq[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) dq[i] = 0.0f;
  float s[BN / 2], dp[BN / 2];
  uint32_t ds[BN / 16][4];
  const auto products = [&](int n) {
    issue_step_products<T, Tiles>(sm, n % STAGES, (n / STAGES) & 1, s, q_rows, dp, do_rows);  // S, dP
  };
  // dS of step n in dp.
  const auto elementwise = [&](int n) {
    sm90::fence_registers(s);
    sm90::fence_registers(dp);
    const int n0 = n * BN;
    const bool masked = n0 + BN > p.S || (p.causal && n0 + BN - 1 > m0 + consumer * 64);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      const int half = i % 4 / 2;
      float x = flash::exp2_approx(fmaf(s[i], scale_log2, -lse2[half]));
      if (masked) {
        const int j = n0 + i / 4 * 8 + 2 * t + i % 2;
        if (j >= p.S || (p.causal && j > row_lo + 8 * half)) x = 0.0f;
      }
      dp[i] = x * (dp[i] - delta[half]);
    }
  };
  const auto accumulate = [&](int st) {
    sm90::wgmma_fence();
    issue_accumulate<T, Tiles>(dq, ds, sm.step0(st));
    sm90::wgmma_commit();
  };
  if (last > 0) sm90::barrier_wait(sm.own_full, 0);
  if (!PIPELINED) {
    for (int n = 0; n + 1 < last; ++n) {
      products(n);
      sm90::wgmma_wait<0>();
      elementwise(n);
      pack_operand<T, BN>(ds, dp);
      accumulate(n % STAGES);
      accumulated(dq, sm, n % STAGES);
    }
  }
  if (last > 0) {
    const int first = PIPELINED ? 0 : last - 1;
    products(first);
    sm90::wgmma_wait<0>();
    elementwise(first);
    pack_operand<T, BN>(ds, dp);
    if constexpr (PIPELINED) {
      for (int n = 1; n < last; ++n) {
        // Step n - 1's grad_q += dS K runs under step n's elementwise work.
        products(n);
        issue_accumulate<T, Tiles>(dq, ds, sm.step0((n - 1) % STAGES));
        sm90::wgmma_commit();
        sm90::wgmma_wait<1>();
        elementwise(n);
        accumulated(dq, sm, (n - 1) % STAGES);
        pack_operand<T, BN>(ds, dp);
      }
    }
    accumulate((last - 1) % STAGES);
    accumulated(dq, sm, (last - 1) % STAGES);
  }
  store_rows<T, HD>(flash::head_rows(p.grad_q, p.grad_q_stride, bh, p.heads), p.grad_q_stride.row, row_lo, p.L, t, dq,
                    static_cast<float>(p.scale));
#endif
}

#include "kernels/cuda/hopper/backward_rows.cuh"

// ---------------------------------------------------------------- host
// A row pass over p's B * H * L rows of HD columns, a thread per 8 columns.
template <int HD, class T, class... Params, class... Args>
void launch_rows(const Launcher& launch, void (*kernel)(Params...), const AttentionParams<T, float>& p,
                 Args&&... args) {
  const int64_t threads = int64_t{p.batch} * p.heads * p.L * (HD / 8);
  if (threads > 0)
    launch(kernel, static_cast<unsigned>(ceil_div(threads, int64_t{kThreads})), kThreads, 0,
           std::forward<Args>(args)...);
}

// 16-byte rows: an aligned base and strides in whole 8 elements.
bool rows_aligned(const void* base, const flash::RowStrides& s) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && s.batch % 8 == 0 && s.head % 8 == 0 && s.row % 8 == 0;
}

template <class T, int HD>
bool run_backward(const Launcher& launch, const AttentionParams<T, float>& p, bool deterministic) {
  using Keys = KeyTiles<HD>;
  using FastKeys = FastKeyTiles<HD>;
  using Queries = QueryTiles<HD>;
  const int kv_heads = p.heads / p.group;
  // The key kernel's own tiles are K and V (128 rows), its steps Q and dO (64); the query
  // kernel's the other way round.
  CUtensorMap k_own, v_own, q_step, do_step, q_own, do_own, k_step, v_step;
  MapOrders key_orders, query_orders;
  MapOrder key_do_order, query_do_order;
  if (!make_map(&k_own, &key_orders.k, p.k, p.k_stride, p.batch, kv_heads, p.S, HD, Keys::kOwn) ||
      !make_map(&v_own, &key_orders.v, p.v, p.v_stride, p.batch, kv_heads, p.S, HD, Keys::kOwn) ||
      !make_map(&q_step, &key_orders.q, p.q, p.q_stride, p.batch, p.heads, p.L, HD, Keys::kStep) ||
      !make_map(&do_step, &key_do_order, p.grad_out, p.grad_out_stride, p.batch, p.heads, p.L, HD, Keys::kStep) ||
      !make_map(&q_own, &query_orders.q, p.q, p.q_stride, p.batch, p.heads, p.L, HD, Queries::kOwn) ||
      !make_map(&do_own, &query_do_order, p.grad_out, p.grad_out_stride, p.batch, p.heads, p.L, HD, Queries::kOwn) ||
      !make_map(&k_step, &query_orders.k, p.k, p.k_stride, p.batch, kv_heads, p.S, HD, Queries::kStep) ||
      !make_map(&v_step, &query_orders.v, p.v, p.v_stride, p.batch, kv_heads, p.S, HD, Queries::kStep))
    return false;
  const int64_t batch_heads = int64_t{p.batch} * p.heads;
  const int64_t key_grid = flash::tile_blocks(batch_heads, p.S, Keys::kOwn);
  const int64_t query_grid = flash::tile_blocks(batch_heads, p.L, Queries::kOwn);
  if (!deterministic) {
    // The fast form: grad_q summed in f32 by the key kernel, then scaled into grad_q.
    const size_t elements = static_cast<size_t>(batch_heads) * p.L * HD;
    const DeviceBuffer accumulator = launch.buffer(sizeof(float) * elements);
    CUtensorMap grad_q_map;
    if (!make_accumulator_map(&grad_q_map, accumulator.as<float>(), batch_heads, p.L, HD)) return false;
    launch_rows<HD>(launch, delta_rows<T, HD>, p, p, accumulator.as<float>());
    if (key_grid > 0) {
      const auto kernel = key_kernel<T, FastKeys, HD == 64>;
      launch.allow_shared_memory(kernel, FastKeys::kSharedBytes);
      launch(kernel, static_cast<unsigned>(key_grid), FastKeys::kThreads, FastKeys::kSharedBytes, k_own, v_own, q_step,
             do_step, grad_q_map, key_orders, key_do_order, p);
    }
    if (rows_aligned(p.grad_q, p.grad_q_stride))
      launch_rows<HD>(launch, grad_q_rows<T, HD, true>, p, accumulator.as<const float>(), p);
    else launch_rows<HD>(launch, grad_q_rows<T, HD, false>, p, accumulator.as<const float>(), p);
    return true;
  }
  launch_rows<HD>(launch, delta_rows<T, HD>, p, p, nullptr);
  if (key_grid > 0) {
    const CUtensorMap unused{};
    const auto kernel = key_kernel<T, Keys, HD == 64>;
    launch.allow_shared_memory(kernel, Keys::kSharedBytes);
    launch(kernel, static_cast<unsigned>(key_grid), Keys::kThreads, Keys::kSharedBytes, k_own, v_own, q_step, do_step,
           unused, key_orders, key_do_order, p);
  }
  if (query_grid > 0) {
    const auto kernel = query_kernel<T, Queries, HD == 64>;
    launch.allow_shared_memory(kernel, Queries::kSharedBytes);
    launch(kernel, static_cast<unsigned>(query_grid), Queries::kThreads, Queries::kSharedBytes, q_own, do_own, k_step,
           v_step, query_orders, query_do_order, p);
  }
  return true;
}

bool aligned_pairs(const void* base, const flash::RowStrides& s) {
  return reinterpret_cast<uintptr_t>(base) % 4 == 0 && s.batch % 2 == 0 && s.head % 2 == 0 && s.row % 2 == 0;
}

template <class T>
bool backward(const Launcher& launch, const AttentionParams<T, float>& p, bool deterministic) {
  if (forward_refusal(compute_capability(launch.device()), p) != nullptr) return false;
  // Head dim 256 would need dK and dV accumulators of 256 registers a thread in these tiles.
  if (p.D > 128) return false;
  if (!map_stride(p.grad_out_stride.row) || !map_stride(p.grad_out_stride.head) || !map_stride(p.grad_out_stride.batch))
    return false;
  if (!aligned_pairs(p.grad_q, p.grad_q_stride) || !aligned_pairs(p.grad_k, p.grad_k_stride) ||
      !aligned_pairs(p.grad_v, p.grad_v_stride))
    return false;
  return p.D == 64 ? run_backward<T, 64>(launch, p, deterministic) : run_backward<T, 128>(launch, p, deterministic);
}

}  // namespace

bool attention_backward(const Launcher& launch, const AttentionParams<__half, float>& p, bool deterministic) {
  return backward(launch, p, deterministic);
}
bool attention_backward(const Launcher& launch, const AttentionParams<__nv_bfloat16, float>& p, bool deterministic) {
  return backward(launch, p, deterministic);
}

}  // namespace hopper
}  // namespace cuda
}  // namespace normcore
