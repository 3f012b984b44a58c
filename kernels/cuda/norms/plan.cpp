// The normalization plans (plan.h): which kernels run for a shape, on the measurements
// recorded in docs/PERFORMANCE.md.
#include "kernels/cuda/norms/plan.h"

#include <algorithm>
#include <initializer_list>
#include <limits>

namespace normcore {
namespace cuda {

int row_team(int64_t row_len, int element_bytes, bool aligned) {
  const int64_t vector = 16 / element_bytes;
  if (!aligned || row_len == 0 || row_len % vector != 0 || row_len > kRowsMaxLen) return 0;
  const int64_t per_thread = kRowVecs * vector;
  for (int team : {32, 64, 128, 256, 512, 1024}) {
    if (row_len <= team * per_thread) return team;
  }
  return 0;
}

int row_vectors(int64_t row_len, int element_bytes, int team) {
  const int64_t vecs = row_len / (16 / element_bytes);
  return vecs <= 3 * static_cast<int64_t>(team) ? 3 : kRowVecs;
}

bool takes_pipeline(const GroupLayout& l) {
  return l.row_len() >= kPipelineMinRow && (l.spatial == 1 || l.spatial >= kPipelineMinPlane);
}

int column_vector(int64_t row_len, int element_bytes, bool aligned) {
  const int vector = 16 / element_bytes;
  return aligned && row_len % vector == 0 ? vector : 1;
}

namespace {

// The load's elements for a group in shared memory: 4 to 16 bytes, dividing the planes so
// that a vector lies in one channel; 0 when the layout has no planes or is not aligned.
int group_vector(const GroupLayout& l, int element_bytes, bool data_aligned) {
  if (l.rows() == 0 || l.spatial == 1 || l.row_len() < kSharedGroupMinRow || !data_aligned) return 0;
  int vector = 16 / element_bytes;
  while (vector * element_bytes > 4 && l.spatial % vector != 0) vector /= 2;
  return l.spatial % vector == 0 ? vector : 0;
}

// A group in one block's shared memory (less what reductions and the driver keep), x's
// (backward: x's and dy's): group_vector, or 0 when it does not fit.
int shared_group_vector(const GroupLayout& l, int element_bytes, bool data_aligned, int inputs,
                        const DeviceLimits& device) {
  const int vector = group_vector(l, element_bytes, data_aligned);
  if (vector == 0 || l.row_len() * element_bytes * inputs > device.shared_memory_per_block - 1024) return 0;
  return vector;
}

AffinePlan shared_groups(const GroupLayout& l, int vector) {
  return {AffinePath::SharedGroups, l.row_len() >= kPipelineMinRow ? 1024 : 256, vector};
}

// ClusterGroups for a group of more than kClusterMinBytes of input, or Elementwise (not taken).
AffinePlan cluster_groups(const GroupLayout& l, int element_bytes, bool data_aligned, int inputs,
                          const DeviceLimits& device) {
  const int vector = group_vector(l, element_bytes, data_aligned);
  const int64_t bytes = l.row_len() * element_bytes * inputs;
  if (vector == 0 || device.cluster_blocks < 2 || bytes <= kClusterMinBytes) return {AffinePath::Elementwise};
  int blocks = 2;
  while (blocks < device.cluster_blocks && bytes > blocks * kClusterSliceBytes) blocks *= 2;
  if (l.rows() > std::numeric_limits<int32_t>::max() / blocks) return {AffinePath::Elementwise};  // the grid
  // A slice rounded up to whole vectors, with the backward's per-plane partials.
  const int64_t slice = (l.row_len() / vector + blocks - 1) / blocks * vector * element_bytes * inputs;
  const int64_t partials = inputs > 1 ? (slice / inputs / element_bytes / l.spatial + 2) * 16 : 0;
  if (slice + partials > device.shared_memory_per_block - 1024) return {AffinePath::Elementwise};
  return {AffinePath::ClusterGroups, kClusterThreads, vector, blocks};
}

}  // namespace

AffinePlan plan_affine_forward(const GroupLayout& l, int element_bytes, bool data_aligned, bool params_aligned,
                               const DeviceLimits& device) {
  if (l.is_rows()) {
    const bool aligned = data_aligned && params_aligned;
    if (const int team = row_team(l.row_len(), element_bytes, aligned)) {
      return {AffinePath::Rows, team, row_vectors(l.row_len(), element_bytes, team)};
    }
    return {AffinePath::Columns, 0, column_vector(l.row_len(), element_bytes, aligned)};
  }
  if (const AffinePlan c = cluster_groups(l, element_bytes, data_aligned, 1, device);
      c.path == AffinePath::ClusterGroups) {
    return c;
  }
  if (const int vector = shared_group_vector(l, element_bytes, data_aligned, 1, device)) {
    return shared_groups(l, vector);
  }
  if (takes_pipeline(l)) return {AffinePath::Pipeline};
  return {AffinePath::Elementwise};
}

AffinePlan plan_affine_backward(const GroupLayout& l, int element_bytes, bool data_aligned, bool params_aligned,
                                const DeviceLimits& device) {
  if (l.is_rows()) {
    const bool aligned = data_aligned && params_aligned;
    if (const int team = row_team(l.row_len(), element_bytes, aligned)) {
      return {AffinePath::Rows, team, row_vectors(l.row_len(), element_bytes, team)};
    }
    return {AffinePath::Columns, 0, column_vector(l.row_len(), element_bytes, aligned)};
  }
  if (const AffinePlan c = cluster_groups(l, element_bytes, data_aligned, 2, device);
      c.path == AffinePath::ClusterGroups) {
    return c;
  }
  if (const int vector = shared_group_vector(l, element_bytes, data_aligned, 2, device)) {
    return shared_groups(l, vector);
  }
  if (takes_pipeline(l)) return {AffinePath::Pipeline};
  return {AffinePath::Elementwise};
}

namespace {

// The widest power of two up to max_vector that divides len.
int widest_dividing(int64_t len, int max_vector) {
  int v = max_vector;
  while (v > 1 && len % v != 0) v /= 2;
  return v;
}

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

BatchNormPlan plan_batch_norm(const BatchLayout& l, int max_vector, const DeviceLimits& device) {
  BatchNormPlan plan;
  if (l.count() == 0 || l.channels == 0) return plan;
  if (l.spatial >= kBatchNormMinPlane) {
    plan.path = BatchNormPath::Planes;
    plan.vector = widest_dividing(l.spatial, max_vector);
    return plan;
  }
  // Columns: enough blocks of 256 threads for one full wave of the device, but no slice with
  // fewer than kColumnMinSliceRows samples (or kBatchNormUnroll rows per thread).
  constexpr int64_t threads = 256;
  const int64_t target_blocks = 8 * static_cast<int64_t>(device.multiprocessors);
  plan.path = BatchNormPath::Columns;
  const int64_t columns = l.channels * l.spatial;
  plan.vector = widest_dividing(columns, max_vector);
  const int64_t column_vecs = columns / plan.vector;
  while (plan.column_threads < threads && plan.column_threads < column_vecs) plan.column_threads *= 2;
  const int64_t row_threads = threads / plan.column_threads;
  plan.column_tiles = ceil_div64(column_vecs, plan.column_threads);
  const int64_t min_slice_rows = std::max<int64_t>(kColumnMinSliceRows, row_threads * kBatchNormUnroll);
  const int64_t max_slices = std::min<int64_t>(65535, std::max<int64_t>(1, l.batch / min_slice_rows));
  const int64_t slices = std::clamp<int64_t>(ceil_div64(target_blocks, plan.column_tiles), 1, max_slices);
  plan.rows_per_slice = ceil_div64(l.batch, slices);
  plan.slices = ceil_div64(l.batch, plan.rows_per_slice);
  return plan;
}

int64_t l1_slice_bytes(int64_t size, int element_bytes, int inputs, int cluster) {
  const int64_t vecs = size * element_bytes / 16;  // whole vectors after the row's head, at most
  return ceil_div64(vecs, cluster) * 16 * inputs;
}

namespace {

// ClusterRows for an L1 row of size elements, or Elementwise (not taken).
L1Plan l1_cluster(int64_t outer, int64_t size, int element_bytes, int inputs, bool aligned,
                  const DeviceLimits& device) {
  const int64_t bytes = size * element_bytes * inputs;
  if (!aligned || device.cluster_blocks < 2 || bytes <= kClusterMinBytes) return {NormPath::Elementwise};
  int blocks = 2;
  while (blocks < device.cluster_blocks && bytes > blocks * kL1SliceBytes) blocks *= 2;
  if (outer > std::numeric_limits<int32_t>::max() / blocks) return {NormPath::Elementwise};  // the grid
  if (l1_slice_bytes(size, element_bytes, inputs, blocks) > kL1SliceBytes) return {NormPath::Elementwise};
  return {NormPath::ClusterRows, blocks};
}

}  // namespace

L1Plan plan_l1_forward(int64_t outer, int64_t size, int64_t inner, int element_bytes, bool aligned,
                       const DeviceLimits& device) {
  if (inner > 1) return {NormPath::Columns};
  if (size < kPipelineMinRow) return {NormPath::Elementwise};
  // Rows that start 16-byte aligned are read faster twice (measured: 93% of copy forward,
  // against the cluster's 86%); rows that do not, once (89%, against 84%).
  const int64_t row_bytes = size * element_bytes;
  if (row_bytes % 16 != 0 || row_bytes > kL1RowBytes) {
    if (const L1Plan c = l1_cluster(outer, size, element_bytes, 1, aligned, device); c.path == NormPath::ClusterRows) {
      return c;
    }
  }
  if (row_bytes <= kL1RowBytes) return {NormPath::RowsTwice};
  return {NormPath::Pipeline};
}

L1Plan plan_l1_backward(int64_t outer, int64_t size, int64_t inner, int element_bytes, bool aligned,
                        const DeviceLimits& device) {
  if (inner > 1) return {NormPath::Columns};
  if (size < kPipelineMinRow) return {NormPath::Elementwise};
  if (const L1Plan c = l1_cluster(outer, size, element_bytes, 2, aligned, device); c.path == NormPath::ClusterRows) {
    return c;
  }
  return {NormPath::Pipeline};
}

NormPath plan_frobenius(int64_t numel) { return numel >= kPipelineMinRow ? NormPath::Pipeline : NormPath::Elementwise; }

}  // namespace cuda
}  // namespace normcore
