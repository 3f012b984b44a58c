// The chunked row reduction: a problem of `rows` rows of row_len elements, each element
// mapped to an accumulator R (Welford, Sums), each row reduced to one R in a fixed order and
// handed to finish(row, r). A team of threads (a warp for short rows, a block for long ones)
// reduces one chunk of one row to a partial; then one warp per row combines the row's
// partials in chunk order. The split is plan_chunks (reduction/plan.h).
#pragma once

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/reduction/combine.cuh"
#include "kernels/cuda/reduction/plan.h"

namespace normcore {
namespace cuda {

// A team of kTeam threads (32 or kThreads) reduces one (row, chunk) to
// partials[row * chunks + chunk], accumulating map(row, i) for each element i of the chunk,
// kUnroll elements per thread at a time so that their loads overlap.
template <int kTeam, class R, class Map>
__global__ void chunk_reduce_kernel(int64_t rows, int64_t row_len, int64_t chunk_len, int64_t chunks, Map map,
                                    R* partials) {
  constexpr int kTeams = kThreads / kTeam;
  const int64_t team = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam;
  const int lane = threadIdx.x % kTeam;
  R acc = R::identity();
  const bool active = team < rows * chunks;
  if (active) {
    const int64_t row = team / chunks, chunk = team % chunks;
    const int64_t begin = chunk * chunk_len, end = min(begin + chunk_len, row_len);
    // kUnroll loads in flight per thread before any is added (one Chan step for them all).
    constexpr int kUnroll = 8;
    using Value = decltype(map(row, begin));
    int64_t i = begin + lane;
    for (; i + (kUnroll - 1) * kTeam < end; i += kUnroll * kTeam) {
      Value v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = map(row, i + u * kTeam);
      acc.add_many(v);
    }
    for (; i < end; i += kTeam) acc.add(map(row, i));
  }
  acc = team_reduce<kTeam>(acc, Merge{});
  if (active && lane == 0) partials[team] = acc;
}

// One warp per row: combines partials[row * chunks ...] in a fixed order, then calls
// finish(row, combined) on lane 0.
template <class R, class Finish>
__global__ void finalize_kernel(int64_t rows, int64_t chunks, const R* partials, Finish finish) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  R acc = R::identity();
  for (int64_t k = lane; k < chunks; k += 32) acc = combine(acc, partials[row * chunks + k]);
  acc = warp_reduce<32>(acc, Merge{});
  if (lane == 0) finish(row, acc);
}

// Reduces every row to one R and hands it to finish(row, r).
template <class R, class Map, class Finish>
void reduce_rows(const Launcher& launch, int64_t rows, int64_t row_len, Map map, Finish finish) {
  if (rows == 0) return;
  const ChunkPlan plan = plan_chunks(rows, row_len, launch.limits());
  const DeviceBuffer partials = launch.buffer(static_cast<size_t>(rows * plan.chunks) * sizeof(R));
  const int64_t teams = rows * plan.chunks;
  if (plan.warp_teams) {
    launch(chunk_reduce_kernel<32, R, Map>, static_cast<unsigned>(ceil_div(teams, kThreads / 32)), kThreads, 0, rows,
           row_len, plan.chunk_len, plan.chunks, map, partials.as<R>());
  } else {
    launch(chunk_reduce_kernel<kThreads, R, Map>, static_cast<unsigned>(teams), kThreads, 0, rows, row_len,
           plan.chunk_len, plan.chunks, map, partials.as<R>());
  }
  launch(finalize_kernel<R, Finish>, static_cast<unsigned>(ceil_div(rows, kThreads / 32)), kThreads, 0, rows,
         plan.chunks, partials.as<const R>(), finish);
}

}  // namespace cuda
}  // namespace normcore
