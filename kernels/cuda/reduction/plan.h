// How the row reductions of kernels/cuda/reduction/ split their work, as pure functions of
// the problem's shape and the device's size: plain C++, so that the choices can be tested
// on a machine without a GPU.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/limits.h"

namespace normcore {
namespace cuda {

// ---------------------------------------------------------------- chunked reduction
constexpr int64_t kWarpRowMax = 1024;  // rows up to this long are reduced by one warp
constexpr int64_t kMinChunk = 4096;    // a block reduces at least this many elements

// rows x row_len elements, each row cut into `chunks` chunks of chunk_len (the last one
// shorter), each reduced by a warp (warp_teams) or by a block.
struct ChunkPlan {
  int64_t chunk_len = 0;
  int64_t chunks = 1;
  bool warp_teams = false;
};

// Short rows: one warp each. Long ones: enough blocks to fill the device a few times, none
// with fewer than kMinChunk elements.
inline ChunkPlan plan_chunks(int64_t rows, int64_t row_len, const DeviceLimits& device) {
  ChunkPlan plan;
  plan.chunk_len = std::max<int64_t>(row_len, 1);
  if (row_len <= kWarpRowMax) {
    plan.warp_teams = true;
    return plan;
  }
  const int64_t target_blocks = 4 * static_cast<int64_t>(device.multiprocessors);
  const int64_t by_size = (row_len + kMinChunk - 1) / kMinChunk;
  plan.chunks = std::max<int64_t>(1, std::min((target_blocks + rows - 1) / rows, by_size));
  plan.chunk_len = (row_len + plan.chunks - 1) / plan.chunks;
  plan.chunks = (row_len + plan.chunk_len - 1) / plan.chunk_len;
  return plan;
}

// ---------------------------------------------------------------- pipelined pass
constexpr int64_t kPipelineChunkBytes = 16 << 10;         // per input, per item, rows in L2
constexpr int64_t kPipelineL2Bytes = 16 << 20;            // the A stream's lag behind the S stream
constexpr int64_t kPipelineReuseRowBytes = 2 << 20;       // longest row (all inputs) reused from L2
constexpr int64_t kPipelineStreamChunkBytes = 256 << 10;  // per input, per item, longer rows

// A row is a sequence of spans (a whole row, or one plane of a group) and each span is
// cut into `pieces` chunks of chunk_len (the last one shorter), so no chunk straddles spans.
struct PipelineShape {
  int64_t rows, row_len, span, pieces, chunk_len;
  int64_t chunks;  // per row: (row_len / span) * pieces
  int64_t items;   // rows * chunks, of each kind
  int64_t lag;     // S items ahead of the A stream, >= chunks
  bool reuse;      // whether A items expect their chunk in L2 (cache hints on)
};

// Chunks of about kPipelineChunkBytes per input within spans of `span` elements (row_len a
// multiple of span), and the lag that keeps the A stream within L2's reach; rows too long
// to be re-read from L2 stream in large chunks.
inline PipelineShape plan_pipeline(int64_t rows, int64_t row_len, int64_t span, int64_t element_bytes, int inputs) {
  PipelineShape s{};
  s.rows = rows;
  s.row_len = row_len;
  s.span = std::max<int64_t>(span, 1);
  s.reuse = rows > 1 && row_len * element_bytes * inputs <= kPipelineReuseRowBytes;
  const int64_t target =
      std::max<int64_t>(1, (s.reuse ? kPipelineChunkBytes : kPipelineStreamChunkBytes) / element_bytes);
  s.pieces = (s.span + target - 1) / target;
  s.chunk_len = (s.span + s.pieces - 1) / s.pieces;
  s.chunks = std::max<int64_t>(1, row_len / s.span * s.pieces);
  s.items = rows * s.chunks;
  const int64_t chunk_bytes = s.chunk_len * element_bytes * inputs;
  s.lag =
      s.reuse ? std::min(s.items, std::max(s.chunks, kPipelineL2Bytes / std::max<int64_t>(chunk_bytes, 1))) : s.items;
  return s;
}

}  // namespace cuda
}  // namespace normcore
