// The attention forward on Hopper (contract: kernels/attention.h; entry points:
// hopper/attention.h). A persistent grid, a block per multiprocessor, takes work tiles of
// 64 x kConsumers query rows of one head. Each block is a producer warpgroup, whose one thread
// brings a work tile's Q and then K and V tiles of 128 keys (64 at head dim 256) into shared memory with the
// tensor memory accelerator, through kStages stages with transaction barriers (full: the
// copy's bytes have landed; empty: every consumer is done with the stage's K or V, or with
// Q), and kConsumers consumer warpgroups of 64 query rows each:
//   S = Q K^T   wgmma, both operands in shared memory (K-major), f32 accumulators
//   online softmax in registers (scale folded into the exponent base 2), the running max and sum
//   O += P V    wgmma, P from registers (the accumulators rounded to T), V N-major in shared memory
// and at the end out = O / sum and lse, written from the registers while the producer
// already loads the next work tile. The tensor maps' 128-byte swizzle is the layout wgmma
// reads (sm90.cuh); rows past L or S read as zeros and the keys past S (and above the
// diagonal when causal) are masked to -inf. Causal work tiles stop at their last row's
// diagonal, and a block takes them in pairs of equal work (Schedule).
//
// The file is built for sm_90a alone (CMakeLists.txt), and only when the build targets
// Hopper; attention.cu asks forward_refusal before calling it.
#include "kernels/cuda/hopper/attention.h"

#include <algorithm>

#include "kernels/cuda/hopper/sm90.cuh"
#include "kernels/cuda/hopper/tensor_map.cuh"
#include "kernels/cuda/hopper/wgmma.cuh"

namespace normcore {
namespace cuda {
namespace hopper {
namespace {

using flash::AttentionParams;

// CONSUMERS warpgroups of 64 query rows: three at head dim 64 without a causal mask, where
// the exponentials take as long as the products and a third warpgroup hides more of their
// latency; two otherwise (at 128 their accumulators need 240 registers a thread; causal, a
// work tile of 192 rows would carry a key tile of masked work for its first warpgroup).
// Head dim 256 takes key tiles of 64: O's 128 accumulators a thread, the scores' 32 and P's
// 16 fit the 240 registers, and Q (64 KB) with two stages of K and V (32 KB each) fits the
// 227 KB of shared memory.
template <int HD, int CONSUMERS>
struct ForwardTiles {
  static constexpr int kHeadDim = HD;
  static constexpr int kConsumers = CONSUMERS;
  static constexpr int kBlockM = 64 * kConsumers, kBlockN = HD == 256 ? 64 : 128;
  static constexpr int kStages = HD == 64 ? 4 : 2;  // K and V tiles of 16 or 32 KB each
  static constexpr int kThreads = 128 * (kConsumers + 1);
  // Registers a thread after setmaxnreg: the producer's few, the rest split among the
  // consumers (65536 a multiprocessor).
  static constexpr int kProducerRegisters = 24, kConsumerRegisters = kConsumers == 3 ? 160 : 240;
  static constexpr int kParts = HD / 64;  // 64-column parts of a tile (128-byte swizzled rows)
  static constexpr uint32_t kQPartBytes = kBlockM * 128, kKVPartBytes = kBlockN * 128;
  static constexpr uint32_t kQBytes = kParts * kQPartBytes, kKVBytes = kParts * kKVPartBytes;
  static constexpr uint32_t kBarriers = 2 + 4 * kStages;  // Q full and empty; K and V full, K and V empty per stage
  // The tiles, the barriers, and room to align the tiles to 1024 bytes.
  static constexpr size_t kSharedBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + 8 * kBarriers;
};

// Work tile t of a launch: query block m of head bh (batch * heads), heads outermost; n_tiles
// key tiles (0 only when there are no keys). Causal, a head's tiles go longest, shortest,
// second longest, second shortest, ..., so that the pairs (2 i, 2 i + 1) a block takes
// together (Schedule) hold the same number of key tiles.
struct WorkTile {
  int64_t bh;
  int m0, batch, head, n_tiles;
};
template <class T, int BM, int BN>
__device__ __forceinline__ WorkTile work_tile(int64_t t, int m_tiles, const AttentionParams<T, float>& p) {
  WorkTile w;
  w.bh = t / m_tiles;
  const int j = static_cast<int>(t - w.bh * m_tiles);
  const int rank = !p.causal ? j : j % 2 == 0 ? j / 2 : m_tiles - 1 - j / 2;  // 0: the longest
  w.m0 = (m_tiles - 1 - rank) * BM;
  w.batch = static_cast<int>(w.bh / p.heads);
  w.head = static_cast<int>(w.bh % p.heads);
  w.n_tiles = (p.S + BN - 1) / BN;
  if (p.causal) w.n_tiles = min(w.n_tiles, (min(w.m0 + BM, p.L) - 1) / BN + 1);
  return w;
}

// The work tiles of a persistent block: blockIdx.x, + gridDim.x, ...; causal, the pairs
// (2 b, 2 b + 1), (2 (b + gridDim.x), + 1), ..., of equal work (work_tile), since a stride
// over single causal tiles gave some blocks 1.4 times the key tiles of others.
struct Schedule {
  bool paired;
  __device__ int64_t first() const { return paired ? 2 * int64_t{blockIdx.x} : blockIdx.x; }
  __device__ int64_t next(int64_t t) const {
    if (!paired) return t + gridDim.x;
    return t % 2 == 0 ? t + 1 : t - 1 + 2 * int64_t{gridDim.x};
  }
};

// Persistent (Schedule); the producer loads the next tile's Q and keys while the consumers
// finish the last one and write it out.
template <class T, class Tiles, bool PIPELINED>
__global__ void __launch_bounds__(Tiles::kThreads, 1)
    forward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map, const MapOrders orders,
                   const AttentionParams<T, float> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int HD = Tiles::kHeadDim, BM = Tiles::kBlockM, BN = Tiles::kBlockN, STAGES = Tiles::kStages;
  constexpr int kConsumers = Tiles::kConsumers;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t q_s = (flash::smem_address(smem) + 1023u) & ~1023u;
  const uint32_t k_s = q_s + Tiles::kQBytes;            // stage st at k_s + st * kKVBytes
  const uint32_t v_s = k_s + STAGES * Tiles::kKVBytes;  // the same
  const uint32_t q_full = v_s + STAGES * Tiles::kKVBytes, q_empty = q_full + 8;
  const auto k_full = [&](int st) { return q_full + 8 * (2 + st); };
  const auto v_full = [&](int st) { return q_full + 8 * (2 + STAGES + st); };
  const auto k_empty = [&](int st) { return q_full + 8 * (2 + 2 * STAGES + st); };
  const auto v_empty = [&](int st) { return q_full + 8 * (2 + 3 * STAGES + st); };

  const int m_tiles = (p.L + BM - 1) / BM;
  const int64_t total = int64_t{p.batch} * p.heads * m_tiles;
  const Schedule schedule{Tiles::kConsumers == 2 && p.causal};  // three consumers: never causal
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    sm90::barrier_init(q_full, 1);
    sm90::barrier_init(q_empty, kConsumers * 128);
    for (int st = 0; st < STAGES; ++st) {
      sm90::barrier_init(k_full(st), 1);
      sm90::barrier_init(v_full(st), 1);
      sm90::barrier_init(k_empty(st), kConsumers * 128);
      sm90::barrier_init(v_empty(st), kConsumers * 128);
    }
    sm90::barrier_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {  // ---- producer
    sm90::registers_down<Tiles::kProducerRegisters>();
    // Every copy issued is waited for by the consumers, so none is in flight when the block
    // ends (no keys: no copies at all).
    if (threadIdx.x != 0) return;
    sm90::prefetch_tensor_map(&q_map);
    sm90::prefetch_tensor_map(&k_map);
    sm90::prefetch_tensor_map(&v_map);
    int64_t kv = 0;  // key tiles loaded, over all work tiles
    int q_loads = 0;
    for (int64_t t = schedule.first(); t < total; t = schedule.next(t)) {
      const WorkTile w = work_tile<T, BM, BN>(t, m_tiles, p);
      if (w.n_tiles == 0) continue;
      const int kv_head = w.head / p.group;
      if (q_loads > 0) sm90::barrier_wait(q_empty, (q_loads - 1) & 1);
      sm90::barrier_expect_bytes(q_full, Tiles::kQBytes);
#pragma unroll
      for (int part = 0; part < Tiles::kParts; ++part)
        load_box(q_s + part * Tiles::kQPartBytes, &q_map, orders.q, q_full, part * 64, w.m0, w.head, w.batch);
      ++q_loads;
      for (int n = 0; n < w.n_tiles; ++n, ++kv) {
        const int st = static_cast<int>(kv % STAGES);
        const uint32_t round = static_cast<uint32_t>(kv / STAGES);
        if (kv >= STAGES) sm90::barrier_wait(k_empty(st), (round - 1) & 1);
        sm90::barrier_expect_bytes(k_full(st), Tiles::kKVBytes);
#pragma unroll
        for (int part = 0; part < Tiles::kParts; ++part)
          load_box(k_s + st * Tiles::kKVBytes + part * Tiles::kKVPartBytes, &k_map, orders.k, k_full(st), part * 64,
                   n * BN, kv_head, w.batch);
        if (kv >= STAGES) sm90::barrier_wait(v_empty(st), (round - 1) & 1);
        sm90::barrier_expect_bytes(v_full(st), Tiles::kKVBytes);
#pragma unroll
        for (int part = 0; part < Tiles::kParts; ++part)
          load_box(v_s + st * Tiles::kKVBytes + part * Tiles::kKVPartBytes, &v_map, orders.v, v_full(st), part * 64,
                   n * BN, kv_head, w.batch);
      }
    }
    return;
  }

  // ---- consumers
  sm90::registers_up<Tiles::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int tid = threadIdx.x - 128 * warpgroup;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const float scale_log2 = static_cast<float>(p.scale) * flash::kLog2e;
  const uint32_t q_rows = q_s + consumer * 64 * 128;
  float o[HD / 2];
  float row_max[2], row_sum[2];  // max of raw scores; this thread's part of the sum
  float s[BN / 2];
  uint32_t pa[BN / 16][4];
  int64_t kv = 0;  // key tiles used, over all work tiles
  int q_loads = 0;
  int row0 = 0, row_lo = 0;  // the work tile's first row of this warpgroup; this thread's first row
  const auto k_tile = [&](int64_t i) { return k_s + static_cast<uint32_t>(i % STAGES) * Tiles::kKVBytes; };
  const auto v_tile = [&](int64_t i) { return v_s + static_cast<uint32_t>(i % STAGES) * Tiles::kKVBytes; };
  const auto stage = [&](int64_t i) { return static_cast<int>(i % STAGES); };
  const auto parity = [&](int64_t i) { return static_cast<uint32_t>(i / STAGES & 1); };

  // S = Q K^T from key-tile slot i, issued (the caller commits and waits).
  const auto issue_scores = [&](int64_t i) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const uint32_t q_offset = kk / 4 * Tiles::kQPartBytes + kk % 4 * 32;
      const uint32_t k_offset = kk / 4 * Tiles::kKVPartBytes + kk % 4 * 32;
      sm90::Wgmma<T, BN>::ss(s, sm90::swizzled_descriptor(q_rows + q_offset, 0),
                             sm90::swizzled_descriptor(k_tile(i) + k_offset, 0), kk > 0);
    }
  };
  // O += P V from key-tile slot i, issued.
  const auto issue_values = [&](int64_t i) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      sm90::Wgmma<T, HD>::rs(o, pa[kk], sm90::swizzled_descriptor(v_tile(i) + kk * 16 * 128, Tiles::kKVPartBytes),
                             true);
  };
  // The scores of key tile n (of the work tile) to probabilities under the new row maxima;
  // alpha rescales what was summed before. Maxima are of the raw scores (the scale is
  // positive), so each probability is one FFMA and one ex2: 2^(s scale_log2 - max
  // scale_log2). The max and the sum run as four independent chains, which the few warps a
  // scheduler holds cannot otherwise hide.
  const auto softmax = [&](int n, float(&alpha)[2]) {
    const int n0 = n * BN;
    if (n0 + BN > p.S || (p.causal && n0 + BN - 1 > row0)) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) {
        const int j = n0 + i / 4 * 8 + 2 * t + i % 2, row = row_lo + i % 4 / 2 * 8;
        if (j >= p.S || (p.causal && j > row)) s[i] = -INFINITY;
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float m[4] = {row_max[half], -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
      for (int c = 0; c < BN / 8; ++c) m[c % 4] = fmaxf(m[c % 4], fmaxf(s[4 * c + 2 * half], s[4 * c + 2 * half + 1]));
      float tile_max = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
      tile_max = warp_reduce<4>(tile_max, cuda::Max{});
      const float base = tile_max == -INFINITY ? 0.0f : tile_max * scale_log2;
      alpha[half] = flash::exp2_approx(fmaf(row_max[half], scale_log2, -base));
      row_max[half] = tile_max;
      float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int c = 0; c < BN / 8; ++c) {
        s[4 * c + 2 * half] = flash::exp2_approx(fmaf(s[4 * c + 2 * half], scale_log2, -base));
        s[4 * c + 2 * half + 1] = flash::exp2_approx(fmaf(s[4 * c + 2 * half + 1], scale_log2, -base));
        sum[c % 4] += s[4 * c + 2 * half] + s[4 * c + 2 * half + 1];
      }
      row_sum[half] = fmaf(row_sum[half], alpha[half], (sum[0] + sum[1]) + (sum[2] + sum[3]));
    }
  };
  // O *= alpha (to the new row maxima).
  const auto rescale = [&](const float(&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] *= alpha[i % 4 / 2];
  };
  // P (in s) to the A operand of the next P V.
  const auto pack = [&] {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pa[kk][0] = flash::pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = flash::pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = flash::pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = flash::pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };

  // Pipelined, the consumers take turns at the tensor cores, round robin (named barriers 1
  // to kConsumers): each issues its products only after the one before it has issued its
  // own, so that one's softmax runs while another's products do. Consumer 0 goes first; each
  // turn ends with an arrival on the next one's barrier, but for the last consumer's last
  // turn of the launch (it gave the first).
  bool last_turn = false;
  const auto begin_turn = [&] {
    if constexpr (PIPELINED) sm90::named_sync(1 + consumer, 256);
  };
  const auto end_turn = [&] {
    if constexpr (PIPELINED) {
      if (consumer + 1 < kConsumers || !last_turn) sm90::named_arrive(1 + (consumer + 1) % kConsumers, 256);
    }
  };
  if (PIPELINED && consumer == kConsumers - 1 && p.S > 0 && schedule.first() < total) sm90::named_arrive(1, 256);

  for (int64_t work = schedule.first(); work < total; work = schedule.next(work)) {
    const WorkTile w = work_tile<T, BM, BN>(work, m_tiles, p);
    const bool last_work = schedule.next(work) >= total;
    const int n_tiles = w.n_tiles;
    row0 = w.m0 + consumer * 64;
    row_lo = row0 + warp * 16 + g;  // accumulators 4 c + 0, 1: row_lo; 4 c + 2, 3: row_lo + 8
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
    if (n_tiles > 0) {
      // Key tile n of this work tile sits in slot kv + n. Q is released with the last K.
      const auto release_k = [&](int n) {
        sm90::barrier_arrive(k_empty(stage(kv + n)));
        if (n == n_tiles - 1) sm90::barrier_arrive(q_empty);
      };
      sm90::barrier_wait(q_full, q_loads & 1);
      float alpha[2];
      sm90::barrier_wait(k_full(stage(kv)), parity(kv));
      begin_turn();
      sm90::wgmma_fence();
      issue_scores(kv);
      sm90::wgmma_commit();
      end_turn();
      sm90::wgmma_wait<0>();
      sm90::fence_registers(s);
      release_k(0);
      softmax(0, alpha);
      pack();
      for (int n = 1; n < n_tiles; ++n) {
        const int64_t i = kv + n;
        if constexpr (PIPELINED) {
          // S(n) = Q K(n)^T and O += P(n - 1) V(n - 1) in flight together: O's rescaling
          // runs under the first, the softmax of S(n) under the second.
          sm90::barrier_wait(k_full(stage(i)), parity(i));
          sm90::barrier_wait(v_full(stage(i - 1)), parity(i - 1));
          begin_turn();
          sm90::wgmma_fence();
          issue_scores(i);
          sm90::wgmma_commit();
          rescale(alpha);
          sm90::wgmma_fence();
          issue_values(i - 1);
          sm90::wgmma_commit();
          end_turn();
          sm90::wgmma_wait<1>();
          sm90::fence_registers(s);
          release_k(n);
          softmax(n, alpha);
          sm90::wgmma_wait<0>();
          sm90::fence_registers(o);
          sm90::barrier_arrive(v_empty(stage(i - 1)));
          pack();
        } else {
          sm90::barrier_wait(v_full(stage(i - 1)), parity(i - 1));
          rescale(alpha);
          sm90::wgmma_fence();
          issue_values(i - 1);
          sm90::wgmma_commit();
          sm90::wgmma_wait<0>();
          sm90::fence_registers(o);
          sm90::barrier_arrive(v_empty(stage(i - 1)));
          sm90::barrier_wait(k_full(stage(i)), parity(i));
          sm90::wgmma_fence();
          issue_scores(i);
          sm90::wgmma_commit();
          sm90::wgmma_wait<0>();
          sm90::fence_registers(s);
          release_k(n);
          softmax(n, alpha);
          pack();
        }
      }
      const int64_t last = kv + n_tiles - 1;
      sm90::barrier_wait(v_full(stage(last)), parity(last));
      last_turn = last_work;
      begin_turn();
      rescale(alpha);
      sm90::wgmma_fence();
      issue_values(last);
      sm90::wgmma_commit();
      end_turn();
      sm90::wgmma_wait<0>();
      sm90::fence_registers(o);
      sm90::barrier_arrive(v_empty(stage(last)));
      kv += n_tiles;
      ++q_loads;
    }

    // out = O / sum, lse = log(sum) + max.
    T* out = flash::head_rows(p.out, p.out_stride, w.bh, p.heads);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = warp_reduce<4>(row_sum[half], Plus{});
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      const int row = row_lo + half * 8;
      if (row >= p.L) continue;
      if (t == 0) {
        p.lse[w.bh * p.L + row] = sum > 0 ? row_max[half] * static_cast<float>(p.scale) + logf(sum) : -INFINITY;
      }
      T* dst = out + row * p.out_stride.row + 2 * t;
#pragma unroll
      for (int c = 0; c < HD / 8; ++c) {
        const uint32_t pair = flash::pack2<T>(o[4 * c + 2 * half] * inv, o[4 * c + 2 * half + 1] * inv);
        *reinterpret_cast<uint32_t*>(dst + 8 * c) = pair;
      }
    }
  }
#endif
}

// ---------------------------------------------------------------- host
template <class T, int HD, int CONSUMERS, bool PIPELINED>
bool run_forward(const Launcher& launch, const AttentionParams<T, float>& p) {
  using Tiles = ForwardTiles<HD, CONSUMERS>;
  CUtensorMap q_map, k_map, v_map;
  MapOrders orders;
  const int kv_heads = p.heads / p.group;
  if (!make_map(&q_map, &orders.q, p.q, p.q_stride, p.batch, p.heads, p.L, HD, Tiles::kBlockM) ||
      !make_map(&k_map, &orders.k, p.k, p.k_stride, p.batch, kv_heads, p.S, HD, Tiles::kBlockN) ||
      !make_map(&v_map, &orders.v, p.v, p.v_stride, p.batch, kv_heads, p.S, HD, Tiles::kBlockN))
    return false;
  const int64_t tiles = flash::tile_blocks(int64_t{p.batch} * p.heads, p.L, Tiles::kBlockM);
  const int64_t grid = std::min<int64_t>(p.causal ? (tiles + 1) / 2 : tiles, launch.multiprocessors());
  const auto kernel = forward_kernel<T, Tiles, PIPELINED>;
  launch.allow_shared_memory(kernel, Tiles::kSharedBytes);
  launch(kernel, static_cast<unsigned>(grid), Tiles::kThreads, Tiles::kSharedBytes, q_map, k_map, v_map, orders, p);
  return true;
}

template <class T>
bool forward(const Launcher& launch, const AttentionParams<T, float>& p, bool pipelined) {
  if (forward_refusal(compute_capability(launch.device()), p) != nullptr) return false;
  if (p.D == 64 && !p.causal)
    return pipelined ? run_forward<T, 64, 3, true>(launch, p) : run_forward<T, 64, 3, false>(launch, p);
  if (p.D == 64) return pipelined ? run_forward<T, 64, 2, true>(launch, p) : run_forward<T, 64, 2, false>(launch, p);
  if (p.D == 128) return pipelined ? run_forward<T, 128, 2, true>(launch, p) : run_forward<T, 128, 2, false>(launch, p);
  return pipelined ? run_forward<T, 256, 2, true>(launch, p) : run_forward<T, 256, 2, false>(launch, p);
}

}  // namespace

template <class T>
const char* forward_refusal(int cc, const AttentionParams<T, float>& p) {
  if (cc != 90) return "the Hopper kernels run on sm_90 devices";
  if (p.D != p.Dv || (p.D != 64 && p.D != 128 && p.D != 256))
    return "the Hopper kernels take D == Dv of 64, 128 or 256";
  if (!(p.scale > 0)) return "the Hopper kernels take a positive scale";
  if (!p.vectorized) return "the Hopper kernels need 16-byte aligned rows";
  if (p.batch <= 0 || p.heads <= 0 || p.L <= 0) return "nothing to compute";
  if (p.S <= 0) return "no keys (a tensor map of no rows is refused; the mma.sync kernels write the zeros)";
  for (const flash::RowStrides* s : {&p.q_stride, &p.k_stride, &p.v_stride}) {
    if (!map_stride(s->row) || !map_stride(s->head) || !map_stride(s->batch))
      return "a stride the tensor memory accelerator does not take";
  }
  if (int64_t{p.batch} * p.heads * ((p.L + 127) / 128) >= (int64_t{1} << 31)) return "too many query tiles";
  if (tensor_map_encoder() == nullptr) return "the driver offers no cuTensorMapEncodeTiled";
  return nullptr;
}
template const char* forward_refusal(int, const AttentionParams<__half, float>&);
template const char* forward_refusal(int, const AttentionParams<__nv_bfloat16, float>&);

bool attention_forward(const Launcher& launch, const AttentionParams<__half, float>& p, bool pipelined) {
  return forward(launch, p, pipelined);
}
bool attention_forward(const Launcher& launch, const AttentionParams<__nv_bfloat16, float>& p, bool pipelined) {
  return forward(launch, p, pipelined);
}

}  // namespace hopper
}  // namespace cuda
}  // namespace normcore
