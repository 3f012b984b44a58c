// Which kernels a normalization op runs, as pure functions of the layout (GroupLayout,
// kernels/norms.h), the element size, the alignment and the device's size (plain C++,
// tested without a GPU). Each launcher in
// this folder is a switch over its plan.
#pragma once

#include <cstdint>

#include "kernels/cuda/limits.h"
#include "kernels/norms.h"

namespace normcore {
namespace cuda {

using kernels::group_layout;
using kernels::GroupLayout;  // kernels/norms.h
using kernels::layer_layout;

// Rows (or L1 rows, Frobenius tensors) of at least this many elements, and group rows whose
// planes have at least kPipelineMinPlane, take the pipelined pass; shorter ones a reduction
// kernel and an element-wise one.
constexpr int64_t kPipelineMinRow = 16384;
constexpr int64_t kPipelineMinPlane = 1024;

// Rows kept in registers: at most kRowVecs 16-byte vectors per thread, rows up to kRowsMaxLen.
constexpr int kRowVecs = 4;
constexpr int64_t kRowsMaxLen = 16384;

// The smallest team (32, 64, 128, 256, 512 or 1024 threads) that holds a row in registers,
// or 0 when the row does not fit, is empty or does not start 16-byte aligned (row_len a
// multiple of the vector, every pointer aligned).
int row_team(int64_t row_len, int element_bytes, bool aligned);

// The vectors each thread of that team holds, as the kernels are built: 3 where that is
// enough, else kRowVecs. A smaller count is fewer registers (more blocks per SM); a team
// larger than a warp always needs 3 or 4, as the next smaller team did not hold the row.
int row_vectors(int64_t row_len, int element_bytes, int team);

// Whether the pipelined pass takes a layout: long rows, or groups of long planes.
bool takes_pipeline(const GroupLayout& l);

// Elements per vector of the column passes: 16 bytes' worth when row_len and every pointer
// allow it, else 1.
int column_vector(int64_t row_len, int element_bytes, bool aligned);

// ---------------------------------------------------------------- layer and group norm
enum class AffinePath {
  Rows,           // layer layout: a team holds each row in registers (team)
  Columns,        // layer layout: chunked statistics, then a pass along columns (vector)
  SharedGroups,   // groups (backward: and their gradients) that fit in shared memory: a block per group
  ClusterGroups,  // larger groups: a thread-block cluster per group, a slice in each block's shared memory
  Pipeline,       // long rows or groups of long planes: the pipelined pass
  Elementwise,    // the rest: chunked statistics (or plane sums), then an element-wise pass
};

struct AffinePlan {
  AffinePath path;
  int team = 0;     // Rows: threads per row; SharedGroups: per block
  int vector = 0;   // Columns, SharedGroups, ClusterGroups: elements per load; Rows: vectors per thread
  int cluster = 0;  // ClusterGroups: blocks per group (2 to the device's cluster_blocks)
};

// Groups of at least this many elements may take SharedGroups; shorter ones are cheaper as
// chunked statistics and an element-wise pass.
constexpr int64_t kSharedGroupMinRow = 1024;

// Groups of more than kClusterMinBytes of input (x; backward x and dy) take ClusterGroups
// where the device launches clusters: a power-of-two number of blocks, the fewest that leave
// each at most kClusterSliceBytes, up to the device's cluster_blocks; larger groups take
// ClusterGroups with bigger slices while a slice fits in a block's shared memory.
constexpr int64_t kClusterMinBytes = 64 << 10;
constexpr int64_t kClusterSliceBytes = 48 << 10;
constexpr int kClusterThreads = 256;

// data_aligned: x and y (backward: x, dy and dx) start 16-byte aligned; params_aligned:
// weight and bias do (or are absent).
AffinePlan plan_affine_forward(const GroupLayout& l, int element_bytes, bool data_aligned, bool params_aligned,
                               const DeviceLimits& device);
AffinePlan plan_affine_backward(const GroupLayout& l, int element_bytes, bool data_aligned, bool params_aligned,
                                const DeviceLimits& device);

// ---------------------------------------------------------------- batch norm
using kernels::BatchLayout;  // kernels/norms.h

constexpr int64_t kBatchNormMinPlane = 32;   // shorter planes take the column layout
constexpr int64_t kColumnMinSliceRows = 16;  // so that a slice's partials are a fraction of its data
constexpr int kBatchNormUnroll = 4;          // vectors (Planes) or rows (Columns) in flight per thread
enum class BatchNormPath {
  Empty,
  Planes,   // planes of kBatchNormMinPlane or more: per-channel block reductions, then a sweep
  Columns,  // shorter planes (BatchNorm1d's [N, C]): threads across a sample's columns
};

struct BatchNormPlan {
  BatchNormPath path = BatchNormPath::Empty;
  int vector = 1;  // elements per load: a power of two, at most 16 bytes
  // Columns: blocks of column_threads vectors (a power of two) by kThreads / column_threads
  // rows, column_tiles of them across a sample and `slices` of rows_per_slice samples.
  int column_threads = 1;
  int64_t column_tiles = 0, slices = 1, rows_per_slice = 0;
};

// max_vector: the widest load every pointer allows.
BatchNormPlan plan_batch_norm(const BatchLayout& l, int max_vector, const DeviceLimits& device);

// ---------------------------------------------------------------- L1 and Frobenius
enum class NormPath {
  Columns,      // L1 along a dim that is not the last: a thread per column
  ClusterRows,  // L1 rows whose input fits in a cluster's shared memory: read once
  RowsTwice,    // L1 forward, rows up to kL1RowBytes: a block per row, read again from L2
  Pipeline,     // long rows, or a whole tensor: the pipelined pass
  Elementwise,  // the rest: chunked sums, then an element-wise pass
};

struct L1Plan {
  NormPath path;
  int cluster = 0;  // ClusterRows: blocks per row
};

constexpr int64_t kL1RowBytes = 256 << 10;

// L1 rows (inner 1, at least kPipelineMinRow elements) of more than kClusterMinBytes of input
// (x; backward x and dy) take ClusterRows where the device launches clusters, every pointer
// is 16-byte aligned and the row fits in the cluster at kL1SliceBytes a block: the fewest
// blocks (a power of two, up to the device's cluster_blocks) that leave each at most
// kL1SliceBytes, so that three blocks share an SM and one's copies overlap another's
// arithmetic and writes (slices of 128 KB, a block an SM, measured 12% slower). The forward
// leaves rows of a whole number of 16-byte vectors up to kL1RowBytes to RowsTwice, faster
// there.
constexpr int64_t kL1SliceBytes = 64 << 10;
constexpr int kL1ClusterThreads = 256;

// L1 over [outer, size, inner] along size; Frobenius is one row of every element.
L1Plan plan_l1_forward(int64_t outer, int64_t size, int64_t inner, int element_bytes, bool aligned,
                       const DeviceLimits& device);
L1Plan plan_l1_backward(int64_t outer, int64_t size, int64_t inner, int element_bytes, bool aligned,
                        const DeviceLimits& device);
// The shared memory of a ClusterRows block: its slice of each input.
int64_t l1_slice_bytes(int64_t size, int element_bytes, int inputs, int cluster);
NormPath plan_frobenius(int64_t numel);

}  // namespace cuda
}  // namespace normcore
