// The normalization plans (plan.h): which kernels run for a shape, on the measurements
// recorded in docs/PERFORMANCE.md.
#include "kernels/cuda/norms/plan.h"

#include <initializer_list>

namespace normcore {
namespace cuda {

int row_team(int64_t row_len, int element_bytes, bool aligned) {
  const int64_t vector = 16 / element_bytes;
  if (!aligned || row_len == 0 || row_len % vector != 0 || row_len > kRowsMaxLen) return 0;
  const int64_t per_thread = kRowVecs * vector;
  for (int team : {32, 256, 512, 1024}) {
    if (row_len <= team * per_thread) return team;
  }
  return 0;
}

bool takes_pipeline(const GroupLayout& l) {
  return l.row_len() >= kPipelineMinRow && (l.spatial == 1 || l.spatial >= kPipelineMinPlane);
}

int column_vector(int64_t row_len, int element_bytes, bool aligned) {
  const int vector = 16 / element_bytes;
  return aligned && row_len % vector == 0 ? vector : 1;
}

namespace {

// A group in one block's shared memory (less what reductions and the driver keep): one
// block of 1024 threads per group reads it once, so x crosses device memory once.
bool fits_shared_groups(const GroupLayout& l, int element_bytes, bool data_aligned, const DeviceLimits& device) {
  const int64_t vector = 16 / element_bytes;
  if (l.rows() == 0 || l.spatial == 1 || l.spatial % vector != 0 || l.row_len() < kPipelineMinRow || !data_aligned) {
    return false;
  }
  return l.row_len() * element_bytes <= device.shared_memory_per_block - 1024;
}

}  // namespace

AffinePlan plan_affine_forward(const GroupLayout& l, int element_bytes, bool data_aligned, bool params_aligned,
                               const DeviceLimits& device) {
  if (l.is_rows()) {
    const bool aligned = data_aligned && params_aligned;
    if (const int team = row_team(l.row_len(), element_bytes, aligned)) return {AffinePath::Rows, team, 0};
    return {AffinePath::Columns, 0, column_vector(l.row_len(), element_bytes, aligned)};
  }
  if (fits_shared_groups(l, element_bytes, data_aligned, device)) return {AffinePath::SharedGroups};
  if (takes_pipeline(l)) return {AffinePath::Pipeline};
  return {AffinePath::Elementwise};
}

AffinePlan plan_affine_backward(const GroupLayout& l, int element_bytes, bool data_aligned, bool params_aligned) {
  if (l.is_rows()) {
    const bool aligned = data_aligned && params_aligned;
    if (const int team = row_team(l.row_len(), element_bytes, aligned)) return {AffinePath::Rows, team, 0};
    return {AffinePath::Columns, 0, column_vector(l.row_len(), element_bytes, aligned)};
  }
  if (takes_pipeline(l)) return {AffinePath::Pipeline};
  return {AffinePath::Elementwise};
}

NormPath plan_l1_forward(int64_t size, int64_t inner, int element_bytes) {
  if (inner > 1) return NormPath::Columns;
  if (size >= kPipelineMinRow && size * element_bytes <= kL1RowBytes) return NormPath::RowsTwice;
  if (size >= kPipelineMinRow) return NormPath::Pipeline;
  return NormPath::Elementwise;
}

NormPath plan_l1_backward(int64_t size, int64_t inner) {
  if (inner > 1) return NormPath::Columns;
  if (size >= kPipelineMinRow) return NormPath::Pipeline;
  return NormPath::Elementwise;
}

NormPath plan_frobenius(int64_t numel) { return numel >= kPipelineMinRow ? NormPath::Pipeline : NormPath::Elementwise; }

}  // namespace cuda
}  // namespace normcore
