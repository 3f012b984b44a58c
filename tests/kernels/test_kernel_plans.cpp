// How each kernel family is picked for a device, and the CUDA launch plans as pure
// functions of shape, element size, alignment and device size (kernels/cuda/norms/plan.h,
// kernels/cuda/reduction/plan.h): checked on the CPU, one row per shape, so that a change
// of plan is a visible change of a table. The plans' kernels themselves are checked against
// the CPU reference on the GPU (test_norms_cuda.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/fused.h"
#include "kernels/generate.h"
#include "kernels/index.h"
#include "kernels/matmul.h"
#include "kernels/norms.h"
#include "kernels/optim.h"
#include "kernels/reduce.h"
#include "normcore/error.h"
#ifdef NORMCORE_HAS_CUDA
#include "kernels/cuda/norms/plan.h"
#include "kernels/cuda/reduction/plan.h"
#endif

namespace nc = normcore;
namespace kernels = normcore::kernels;

namespace {

TEST(KernelFamilies, EachFamilyHasItsImplementationPerDevice) {
  const nc::Device cpu = nc::Device::cpu();
  EXPECT_EQ(&kernels::elementwise(cpu), &nc::cpu::elementwise_kernels());
  EXPECT_EQ(&kernels::generate(cpu), &nc::cpu::generate_kernels());
  EXPECT_EQ(&kernels::reduce(cpu), &nc::cpu::reduce_kernels());
  EXPECT_EQ(&kernels::index(cpu), &nc::cpu::index_kernels());
  EXPECT_EQ(&kernels::matmul(cpu), &nc::cpu::matmul_kernels());
  EXPECT_EQ(&kernels::optim(cpu), &nc::cpu::optim_kernels());
  EXPECT_EQ(&kernels::norms(cpu), &nc::cpu::norm_kernels());
  EXPECT_EQ(&kernels::fused(cpu), &nc::cpu::fused_kernels());
  const nc::Device gpu = nc::Device::cuda(0);
#ifdef NORMCORE_HAS_CUDA
  EXPECT_EQ(&kernels::elementwise(gpu), &nc::cuda::elementwise_kernels());
  EXPECT_EQ(&kernels::norms(gpu), &nc::cuda::norm_kernels());
  EXPECT_NE(static_cast<const void*>(&kernels::norms(gpu)), static_cast<const void*>(&kernels::norms(cpu)));
#else
  try {
    kernels::norms(gpu);
    ADD_FAILURE() << "kernels::norms(cuda:0) returned in a build without CUDA";
  } catch (const nc::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("norms: normcore was built without CUDA"), std::string::npos) << e.what();
  }
#endif
}

#ifdef NORMCORE_HAS_CUDA
namespace cuda = normcore::cuda;

constexpr cuda::DeviceLimits kH100{132, 232448, 8};

const char* path_name(cuda::AffinePath p) {
  switch (p) {
    case cuda::AffinePath::Rows: return "rows";
    case cuda::AffinePath::Columns: return "columns";
    case cuda::AffinePath::SharedGroups: return "shared groups";
    case cuda::AffinePath::ClusterGroups: return "cluster groups";
    case cuda::AffinePath::Pipeline: return "pipeline";
    case cuda::AffinePath::Elementwise: return "elementwise";
  }
  return "?";
}

struct AffineRow {
  const char* what;
  cuda::GroupLayout layout;
  int element_bytes;
  bool data_aligned, params_aligned;
  cuda::AffinePath forward;
  int forward_team_or_vector;  // the team of Rows, the vector of Columns, SharedGroups and ClusterGroups, else 0
  cuda::AffinePath backward;
  int backward_team_or_vector;
};

const std::vector<AffineRow> kAffineRows = {
    {"layer norm f32 x768: 64 threads, four rows a block", cuda::layer_layout(32768, 768), 4, true, true,
     cuda::AffinePath::Rows, 64, cuda::AffinePath::Rows, 64},
    {"layer norm f32 x512: one warp", cuda::layer_layout(100, 512), 4, true, true, cuda::AffinePath::Rows, 32,
     cuda::AffinePath::Rows, 32},
    {"layer norm bf16 x4096", cuda::layer_layout(32768, 4096), 2, true, true, cuda::AffinePath::Rows, 128,
     cuda::AffinePath::Rows, 128},
    {"layer norm f32 x4096", cuda::layer_layout(32768, 4096), 4, true, true, cuda::AffinePath::Rows, 256,
     cuda::AffinePath::Rows, 256},
    {"layer norm f32 x16384: the longest row in registers", cuda::layer_layout(8, 16384), 4, true, true,
     cuda::AffinePath::Rows, 1024, cuda::AffinePath::Rows, 1024},
    {"layer norm f64 x16384: too long in 8-byte elements", cuda::layer_layout(8, 16384), 8, true, true,
     cuda::AffinePath::Columns, 2, cuda::AffinePath::Columns, 2},
    {"layer norm f32 x16388", cuda::layer_layout(8, 16388), 4, true, true, cuda::AffinePath::Columns, 4,
     cuda::AffinePath::Columns, 4},
    {"layer norm f32 x766: not a whole number of vectors", cuda::layer_layout(8, 766), 4, true, true,
     cuda::AffinePath::Columns, 1, cuda::AffinePath::Columns, 1},
    {"layer norm f32, a misaligned weight", cuda::layer_layout(8, 768), 4, true, false, cuda::AffinePath::Columns, 1,
     cuda::AffinePath::Columns, 1},
    {"layer norm of empty rows", cuda::layer_layout(8, 0), 4, true, true, cuda::AffinePath::Columns, 4,
     cuda::AffinePath::Columns, 4},
    {"group norm of one group over [N, C] is layer norm", cuda::group_layout(32, 1, 768, 1), 4, true, true,
     cuda::AffinePath::Rows, 64, cuda::AffinePath::Rows, 64},
    {"group norm f32 32x320x64x64 g32: 160 KB groups", cuda::group_layout(32, 32, 320, 4096), 4, true, true,
     cuda::AffinePath::ClusterGroups, 4, cuda::AffinePath::ClusterGroups, 4},
    {"group norm bf16 32x320x64x64 g32: 80 KB groups", cuda::group_layout(32, 32, 320, 4096), 2, true, true,
     cuda::AffinePath::ClusterGroups, 8, cuda::AffinePath::ClusterGroups, 8},
    {"group norm f32 8x64x64x64 g32: 32 KB groups, 64 KB with dy", cuda::group_layout(8, 32, 64, 4096), 4, true, true,
     cuda::AffinePath::SharedGroups, 4, cuda::AffinePath::SharedGroups, 4},
    {"group norm f32 64x64x56x56 g32: 25 KB groups", cuda::group_layout(64, 32, 64, 3136), 4, true, true,
     cuda::AffinePath::SharedGroups, 4, cuda::AffinePath::SharedGroups, 4},
    {"group norm bf16 64x256x14x14 g32: planes of 196, 8-byte loads", cuda::group_layout(64, 32, 256, 196), 2, true,
     true, cuda::AffinePath::SharedGroups, 4, cuda::AffinePath::SharedGroups, 4},
    {"group norm f32, planes of odd length", cuda::group_layout(8, 4, 64, 49), 4, true, true,
     cuda::AffinePath::Elementwise, 0, cuda::AffinePath::Elementwise, 0},
    {"group norm 112x64x512x512 g8: 8 MB groups", cuda::group_layout(112, 8, 64, 262144), 4, true, true,
     cuda::AffinePath::Pipeline, 0, cuda::AffinePath::Pipeline, 0},
    {"group norm f32, groups just over shared memory: over a cluster", cuda::group_layout(2, 1, 1, 58113), 4, true,
     true, cuda::AffinePath::ClusterGroups, 1, cuda::AffinePath::ClusterGroups, 1},
    {"group norm f32, groups of 2 MB: a slice over shared memory", cuda::group_layout(2, 1, 1, 524288), 4, true, true,
     cuda::AffinePath::Pipeline, 0, cuda::AffinePath::Pipeline, 0},
    {"group norm, misaligned data", cuda::group_layout(32, 32, 320, 4096), 4, false, true, cuda::AffinePath::Pipeline,
     0, cuda::AffinePath::Pipeline, 0},
    {"group norm, small planes", cuda::group_layout(32, 32, 320, 100), 4, true, true, cuda::AffinePath::Elementwise, 0,
     cuda::AffinePath::Elementwise, 0},
    {"group norm over [N, C], long groups", cuda::group_layout(4, 2, 65536, 1), 4, true, true,
     cuda::AffinePath::Pipeline, 0, cuda::AffinePath::Pipeline, 0},
    {"group norm over [N, C], short groups", cuda::group_layout(4, 2, 64, 1), 4, true, true,
     cuda::AffinePath::Elementwise, 0, cuda::AffinePath::Elementwise, 0},
};

int team_or_vector(const cuda::AffinePlan& plan) {
  switch (plan.path) {
    case cuda::AffinePath::Rows: return plan.team;
    case cuda::AffinePath::Columns:
    case cuda::AffinePath::SharedGroups:
    case cuda::AffinePath::ClusterGroups: return plan.vector;
    default: return 0;
  }
}

TEST(NormPlans, AffinePathForEachLayout) {
  for (const AffineRow& row : kAffineRows) {
    SCOPED_TRACE(row.what);
    const cuda::AffinePlan forward =
        cuda::plan_affine_forward(row.layout, row.element_bytes, row.data_aligned, row.params_aligned, kH100);
    EXPECT_STREQ(path_name(forward.path), path_name(row.forward));
    EXPECT_EQ(team_or_vector(forward), row.forward_team_or_vector);
    const cuda::AffinePlan backward =
        cuda::plan_affine_backward(row.layout, row.element_bytes, row.data_aligned, row.params_aligned, kH100);
    EXPECT_STREQ(path_name(backward.path), path_name(row.backward));
    EXPECT_EQ(team_or_vector(backward), row.backward_team_or_vector);
  }
}

// A row's team holds it in 3 or 4 vectors a thread (the kernels are built for those two):
// 3 where they are enough, which leaves registers for more rows in flight.
TEST(NormPlans, RowTeamsHoldThreeOrFourVectorsAThread) {
  struct Case {
    int64_t row_len;
    int element_bytes, team, vectors;
  };
  for (const Case& c : std::vector<Case>{{768, 4, 64, 3},    // 192 vectors over 64 threads
                                         {768, 2, 32, 3},    // 96 over a warp
                                         {1024, 2, 32, 4},   // 128 over a warp
                                         {512, 4, 32, 4},    // 128 over a warp
                                         {128, 4, 32, 3},    // one each: the smaller build
                                         {2560, 4, 256, 3},  // 640 over 256
                                         {4096, 4, 256, 4},  // 1024 over 256
                                         {16384, 4, 1024, 4}}) {
    SCOPED_TRACE(std::to_string(c.row_len) + " elements of " + std::to_string(c.element_bytes) + " bytes");
    for (const cuda::AffinePlan& plan :
         {cuda::plan_affine_forward(cuda::layer_layout(64, c.row_len), c.element_bytes, true, true, kH100),
          cuda::plan_affine_backward(cuda::layer_layout(64, c.row_len), c.element_bytes, true, true, kH100)}) {
      EXPECT_EQ(plan.path, cuda::AffinePath::Rows);
      EXPECT_EQ(plan.team, c.team);
      EXPECT_EQ(plan.vector, c.vectors);
    }
  }
}

TEST(NormPlans, SharedGroupsFollowTheDevicesSharedMemory) {
  const cuda::GroupLayout groups = cuda::group_layout(32, 32, 384, 4096);  // 192 KB of f32 per group
  const cuda::DeviceLimits h100_without_clusters{132, 232448, 0}, a100{108, 166912, 0};
  EXPECT_EQ(cuda::plan_affine_forward(groups, 4, true, true, h100_without_clusters).path,
            cuda::AffinePath::SharedGroups);
  EXPECT_EQ(cuda::plan_affine_forward(groups, 4, true, true, a100).path, cuda::AffinePath::Pipeline);
  EXPECT_EQ(cuda::plan_affine_forward(groups, 2, true, true, a100).path, cuda::AffinePath::SharedGroups);
}

// Groups of more than 64 KB of input go over a cluster where the device has them: the fewest
// blocks (a power of two, up to the device's cluster size) that leave each at most 48 KB,
// larger slices where 8 blocks are not enough, as long as a slice fits in a block.
TEST(NormPlans, ClusterGroupsSplitAGroupOverTwoToEightBlocks) {
  struct Case {
    const char* what;
    cuda::GroupLayout layout;
    int element_bytes;
    bool backward;
    cuda::AffinePath path;
    int blocks;
  };
  const std::vector<Case> cases = {
      {"f32 32x320x64x64 g32: 160 KB in 4 slices", cuda::group_layout(32, 32, 320, 4096), 4, false,
       cuda::AffinePath::ClusterGroups, 4},
      {"its backward: 320 KB of x and dy in 8", cuda::group_layout(32, 32, 320, 4096), 4, true,
       cuda::AffinePath::ClusterGroups, 8},
      {"bf16 32x320x64x64 g32: 80 KB in 2", cuda::group_layout(32, 32, 320, 4096), 2, false,
       cuda::AffinePath::ClusterGroups, 2},
      {"its backward: 160 KB in 4", cuda::group_layout(32, 32, 320, 4096), 2, true, cuda::AffinePath::ClusterGroups, 4},
      {"64 KB exactly: one block", cuda::group_layout(8, 32, 64, 4096), 2, true, cuda::AffinePath::SharedGroups, 0},
      {"800 KB: 8 slices of 100 KB", cuda::group_layout(2, 2, 4, 100000), 4, false, cuda::AffinePath::ClusterGroups, 8},
      {"1.6 MB with dy: 8 slices of 200 KB", cuda::group_layout(2, 2, 4, 100000), 4, true,
       cuda::AffinePath::ClusterGroups, 8},
      {"2 MB of f64: slices over shared memory", cuda::group_layout(2, 1, 4, 65536), 8, false,
       cuda::AffinePath::Pipeline, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const cuda::AffinePlan plan = c.backward ? cuda::plan_affine_backward(c.layout, c.element_bytes, true, true, kH100)
                                             : cuda::plan_affine_forward(c.layout, c.element_bytes, true, true, kH100);
    EXPECT_STREQ(path_name(plan.path), path_name(c.path));
    EXPECT_EQ(plan.cluster, c.blocks);
    // Without clusters, the same groups take a block each or the pipelined pass.
    const cuda::DeviceLimits no_clusters{132, 232448, 0};
    const cuda::AffinePlan fallback =
        c.backward ? cuda::plan_affine_backward(c.layout, c.element_bytes, true, true, no_clusters)
                   : cuda::plan_affine_forward(c.layout, c.element_bytes, true, true, no_clusters);
    EXPECT_NE(fallback.path, cuda::AffinePath::ClusterGroups);
  }
}

// Batch norm: planes of 32 or more take the per-channel reductions and a sweep, with the
// widest load that divides a plane; shorter planes the columns, sliced to fill the device.
TEST(NormPlans, BatchNormPathForEachLayout) {
  using P = cuda::BatchNormPath;
  struct Row {
    const char* what;
    cuda::BatchLayout layout;
    int max_vector;
    P path;
    int vector;
    int64_t column_tiles, slices;
  };
  const std::vector<Row> rows = {
      {"f32 64x64x56x56: 16-byte loads", {64, 64, 3136}, 4, P::Planes, 4, 0, 1},
      {"bf16 64x256x14x14: planes of 196 take 8-byte loads", {64, 256, 196}, 8, P::Planes, 4, 0, 1},
      {"planes of 49: one element per load", {8, 16, 49}, 8, P::Planes, 1, 0, 1},
      {"misaligned data: one element per load", {8, 16, 64}, 1, P::Planes, 1, 0, 1},
      {"[N, C] of 4096 x 96 f32: one tile across, 128 slices of 32 rows", {4096, 96, 1}, 4, P::Columns, 4, 1, 128},
      {"[N, C] of 64 x 48: one slice", {64, 48, 1}, 4, P::Columns, 4, 1, 1},
      {"empty batch", {0, 96, 64}, 4, P::Empty, 1, 0, 1},
      {"no channels", {3, 0, 5}, 4, P::Empty, 1, 0, 1},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    const cuda::BatchNormPlan plan = cuda::plan_batch_norm(row.layout, row.max_vector, kH100);
    EXPECT_EQ(static_cast<int>(plan.path), static_cast<int>(row.path));
    EXPECT_EQ(plan.vector, row.vector);
    EXPECT_EQ(plan.column_tiles, row.column_tiles);
    EXPECT_EQ(plan.slices, row.slices);
    if (plan.path == P::Columns) {
      EXPECT_GE(plan.slices * plan.rows_per_slice, row.layout.batch);
      EXPECT_GE(plan.column_tiles * plan.column_threads * plan.vector, row.layout.channels * row.layout.spatial);
    }
  }
}

TEST(NormPlans, NormPathForEachShape) {
  using P = cuda::NormPath;
  const cuda::DeviceLimits no_clusters{132, 232448, 0};
  struct Row {
    const char* what;
    cuda::L1Plan actual;
    P expected;
    int cluster;
  };
  const std::vector<Row> rows = {
      {"L1 along an inner dim", cuda::plan_l1_forward(8, 65535, 4, 4, true, kH100), P::Columns, 0},
      {"L1 rows of 64K f32: 64 KB slices", cuda::plan_l1_forward(32768, 65535, 1, 4, true, kH100), P::ClusterRows, 4},
      {"L1 rows of whole vectors read twice", cuda::plan_l1_forward(32768, 65536, 1, 4, true, kH100), P::RowsTwice, 0},
      {"L1 rows of 128K f32: 8 slices", cuda::plan_l1_forward(32768, 1 << 17, 1, 4, true, kH100), P::ClusterRows, 8},
      {"L1 rows of 64K f32, not aligned", cuda::plan_l1_forward(32768, 65535, 1, 4, false, kH100), P::RowsTwice, 0},
      {"L1 rows of 64K f32, no clusters", cuda::plan_l1_forward(32768, 65535, 1, 4, true, no_clusters), P::RowsTwice,
       0},
      {"L1 rows of 64K f64", cuda::plan_l1_forward(32768, 65535, 1, 8, true, kH100), P::ClusterRows, 8},
      {"L1 rows of 64K bf16, odd", cuda::plan_l1_forward(32768, 65535, 1, 2, true, kH100), P::ClusterRows, 2},
      {"L1 rows of 64K f64, no clusters", cuda::plan_l1_forward(32768, 65535, 1, 8, true, no_clusters), P::Pipeline, 0},
      {"L1 rows of one slice", cuda::plan_l1_forward(32768, 16384, 1, 4, true, kH100), P::RowsTwice, 0},
      {"L1 rows of 200K f32: over 64 KB slices", cuda::plan_l1_forward(3, 200000, 1, 4, true, kH100), P::Pipeline, 0},
      {"L1 rows beyond a cluster", cuda::plan_l1_forward(3, 1 << 20, 1, 4, true, kH100), P::Pipeline, 0},
      {"L1 short rows", cuda::plan_l1_forward(32768, 16383, 1, 4, true, kH100), P::Elementwise, 0},
      {"L1 backward along an inner dim", cuda::plan_l1_backward(8, 65535, 4, 4, true, kH100), P::Columns, 0},
      {"L1 backward, rows of 16K f32", cuda::plan_l1_backward(64, 16384, 1, 4, true, kH100), P::ClusterRows, 2},
      {"L1 backward, rows of 64K f32", cuda::plan_l1_backward(64, 65535, 1, 4, true, kH100), P::ClusterRows, 8},
      {"L1 backward, rows of 64K bf16", cuda::plan_l1_backward(64, 65535, 1, 2, true, kH100), P::ClusterRows, 4},
      {"L1 backward, no clusters", cuda::plan_l1_backward(64, 65535, 1, 4, true, no_clusters), P::Pipeline, 0},
      {"L1 backward, not aligned", cuda::plan_l1_backward(64, 65535, 1, 4, false, kH100), P::Pipeline, 0},
      {"L1 backward, rows beyond a cluster", cuda::plan_l1_backward(3, 1 << 19, 1, 4, true, kH100), P::Pipeline, 0},
      {"L1 backward, short rows", cuda::plan_l1_backward(64, 16383, 1, 4, true, kH100), P::Elementwise, 0},
  };
  for (const Row& row : rows) {
    EXPECT_EQ(row.actual.path, row.expected) << row.what;
    if (row.expected == P::ClusterRows) EXPECT_EQ(row.actual.cluster, row.cluster) << row.what;
  }
  // A cluster's slice holds every whole vector after a row's head: 65535 f32 elements are
  // at most 16383 vectors, 4096 a block of four.
  EXPECT_EQ(cuda::l1_slice_bytes(65535, 4, 1, 4), 4096 * 16);
  EXPECT_EQ(cuda::l1_slice_bytes(65535, 4, 2, 8), 2048 * 16 * 2);
  EXPECT_EQ(cuda::plan_frobenius(16384), P::Pipeline);
  EXPECT_EQ(cuda::plan_frobenius(16383), P::Elementwise);
}

TEST(ReductionPlans, ChunksFillTheDeviceWithoutShortChunks) {
  // Rows up to a warp's reach stay whole.
  const cuda::ChunkPlan short_rows = cuda::plan_chunks(1000, 1024, kH100);
  EXPECT_TRUE(short_rows.warp_teams);
  EXPECT_EQ(short_rows.chunks, 1);
  // One long row is cut into enough chunks for 4 blocks per SM, none under 4096 elements.
  const cuda::ChunkPlan one_row = cuda::plan_chunks(1, 1 << 24, kH100);
  EXPECT_FALSE(one_row.warp_teams);
  EXPECT_EQ(one_row.chunks, 4 * 132);
  EXPECT_EQ(one_row.chunk_len * one_row.chunks >= (1 << 24), true);
  const cuda::ChunkPlan medium = cuda::plan_chunks(1, 10000, kH100);
  EXPECT_EQ(medium.chunks, 3);
  EXPECT_EQ(medium.chunk_len, 3334);
  // Many rows: one chunk each.
  EXPECT_EQ(cuda::plan_chunks(100000, 5000, kH100).chunks, 1);
}

TEST(ReductionPlans, PipelineChunksStayWithinSpansAndL2) {
  // 2 MB rows of f32 over two inputs: re-read from L2, 16 KB chunks, a 16 MB lag.
  const cuda::PipelineShape reused = cuda::plan_pipeline(64, 262144, 262144, 4, 2);
  EXPECT_TRUE(reused.reuse);
  EXPECT_EQ(reused.chunk_len, 4096);
  EXPECT_EQ(reused.chunks, 64);
  EXPECT_EQ(reused.lag, (16 << 20) / (4096 * 4 * 2));
  // 8 MB groups of 64 planes of 128 KB: streamed in 256 KB chunks that never straddle a plane.
  const cuda::PipelineShape streamed = cuda::plan_pipeline(896, 64 * 32768, 32768, 4, 1);
  EXPECT_FALSE(streamed.reuse);
  EXPECT_EQ(streamed.pieces, 1);
  EXPECT_EQ(streamed.chunk_len, 32768);
  EXPECT_EQ(streamed.chunks, 64);
  EXPECT_EQ(streamed.lag, streamed.items);
  // One row (a Frobenius tensor) is never reused: nothing runs beside it to keep it in L2.
  EXPECT_FALSE(cuda::plan_pipeline(1, 1 << 20, 1 << 20, 4, 1).reuse);
}
#endif

}  // namespace
