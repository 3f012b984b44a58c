// The CUDA normalization kernels against the CPU reference, values and every gradient, in
// f64, f32, f16 and bf16, at sizes chosen to reach each kernel path: rows reduced by one
// warp (<= 1024) or one block, rows split into many chunks, very long rows, one row, many
// rows (the sliced parameter-gradient reduction), group norm on [N, C] and on planes, L1
// along the last dim and along an inner dim, large means, zero rows and empty tensors.
// Layer-norm rows of up to 16384 elements that start 16-byte aligned are kept in
// registers; longer or unaligned ones take the chunked reduction and a column pass. Group
// norm groups of 1024 elements or more that fit in shared memory (backward: x and dy) are
// normalized there (the 100x100 case only forward in 16 bits; planes of odd length only
// in 4- and 8-byte types); longer ones (Frobenius tensors) with
// planes of 1024 or more take the pipelined kernel, mostly with unaligned chunks here.
// L1 rows of more than 64 KB that fit in a cluster's shared memory at 64 KB a block are
// split over it (forward: rows that are not whole 16-byte vectors, or over 256 KB), the
// rows' edges before and after their whole vectors held in registers.
// Groups over 2 MB (per input; 16-bit forward groups here stay under it) are streamed
// twice.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

using NormOp = std::function<Tensor(const Tensor& x, const Tensor& weight, const Tensor& bias)>;

struct CudaCase {
  std::string name;
  nc::Shape x_shape;
  nc::Shape param_shape;  // empty: the op takes no weight or bias
  NormOp op;
  double offset = 0;       // added to x: a large mean (f64 and f32 only)
  bool zero_rows = false;  // zero the first half of x
  bool has_bias = true;    // with param_shape: the op takes a bias beside its weight
};

Tensor random(const nc::Shape& shape, uint64_t seed, DType dtype) {
  nc::Generator gen(seed);
  return nc::randn(shape, DType::F64, &gen).to(dtype);
}

// Tolerance for values of magnitude 1, by dtype: the CPU rounds a double result once, the
// GPU accumulates in float (double for f64) and rounds once.
double value_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-10;
    case DType::F32: return 2e-5;
    case DType::F16: return 4e-3;
    default: return 3e-2;
  }
}

// Float rounding of a value near offset, relative: the mean saved in the accumulation
// type is within this of the exact mean, which shifts every normalized value by as much.
double unit_roundoff(DType dtype) { return dtype == DType::F64 ? 0x1p-53 : 0x1p-24; }

void expect_close(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  std::vector<double> got = gpu.to(nc::Device::cpu()).to(DType::F64).to_vector<double>();
  std::vector<double> expected = cpu.to(DType::F64).to_vector<double>();
  // Sums over many elements carry error relative to the largest term, not the result.
  double scale = 1;
  for (double v : expected) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(expected[i])) {  // dy / eps overflowing f16 on a zero row, as on the CPU
      ASSERT_EQ(got[i], expected[i]) << what << " at " << i;
      continue;
    }
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i << ": " << got[i];
    ASSERT_NEAR(got[i], expected[i], tol * (1 + std::fabs(expected[i]) + 1e-2 * scale))
        << what << " at " << i << " of " << got.size();
  }
}

void run_case(const CudaCase& c, DType dtype) {
  if (c.offset != 0 && dtype != DType::F64 && dtype != DType::F32) return;  // f16 cannot hold 1e4 + x
  SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype));
  Tensor x = random(c.x_shape, 11, DType::F64);
  if (c.offset != 0) x = x + c.offset;
  if (c.zero_rows && x.numel() > 0) x.narrow(0, 0, (x.size(0) + 1) / 2).fill_(0);
  x = x.to(dtype);
  Tensor weight, bias;
  if (!c.param_shape.empty()) {
    weight = random(c.param_shape, 12, dtype);
    if (c.has_bias) bias = random(c.param_shape, 13, dtype);
  }
  Tensor grad = random(c.x_shape, 14, dtype);

  std::vector<Tensor> cpu_in = {x.clone().requires_grad_()};
  if (weight.defined()) {
    cpu_in.push_back(weight.clone().requires_grad_());
    if (bias.defined()) cpu_in.push_back(bias.clone().requires_grad_());
  }
  std::vector<Tensor> gpu_in;
  for (const Tensor& t : cpu_in) gpu_in.push_back(t.detach().to(nc::Device::cuda()).requires_grad_());
  auto call = [&](const std::vector<Tensor>& in) {
    return c.op(in[0], in.size() > 1 ? in[1] : Tensor(), in.size() > 2 ? in[2] : Tensor());
  };
  Tensor cpu_y = call(cpu_in), gpu_y = call(gpu_in);
  EXPECT_EQ(gpu_y.dtype(), dtype);
  EXPECT_TRUE(gpu_y.device().is_cuda());
  // A variance that cancelled (E[x^2] - E[x]^2) would be off by about offset^2 * roundoff,
  // far outside this.
  const double tol = value_tolerance(dtype) + 8 * c.offset * unit_roundoff(dtype);
  expect_close(gpu_y, cpu_y, tol, "y");
  if (x.numel() == 0) return;
  cpu_y.backward(grad);
  gpu_y.backward(grad.to(nc::Device::cuda()));
  const char* names[] = {"grad_x", "grad_weight", "grad_bias"};  // as pushed: bias only with weight
  for (size_t i = 0; i < cpu_in.size(); ++i) expect_close(gpu_in[i].grad(), cpu_in[i].grad(), 4 * tol, names[i]);
}

NormOp layer_norm_over(std::vector<int64_t> normalized_shape) {
  return [normalized_shape](const Tensor& x, const Tensor& w, const Tensor& b) {
    return nc::layer_norm(x, normalized_shape, w, b);
  };
}

NormOp rms_norm_over(std::vector<int64_t> normalized_shape) {
  return [normalized_shape](const Tensor& x, const Tensor& w, const Tensor&) {
    return nc::rms_norm(x, normalized_shape, w);
  };
}

NormOp group_norm_with(int64_t groups) {
  return [groups](const Tensor& x, const Tensor& w, const Tensor& b) { return nc::group_norm(x, groups, w, b); };
}

NormOp l1_norm_along(int64_t dim) {
  return [dim](const Tensor& x, const Tensor&, const Tensor&) { return nc::l1_norm(x, dim); };
}

NormOp frobenius() {
  return [](const Tensor& x, const Tensor&, const Tensor&) { return nc::frobenius_norm(x); };
}

std::vector<CudaCase> cases() {
  return {
      {"layer_norm row of 1", {5, 1}, {1}, layer_norm_over({1})},
      {"layer_norm warp rows", {37, 100}, {100}, layer_norm_over({100})},
      {"layer_norm warp rows, no affine", {37, 1000}, {}, layer_norm_over({1000})},
      {"layer_norm block row, one chunk", {3, 1025}, {1025}, layer_norm_over({1025})},
      {"layer_norm many rows", {3000, 48}, {48}, layer_norm_over({48})},
      {"layer_norm rows of 768, three vectors a thread", {300, 768}, {768}, layer_norm_over({768})},
      {"layer_norm rows in chunks", {3, 12000}, {12000}, layer_norm_over({12000})},
      {"layer_norm many unaligned rows", {700, 33}, {33}, layer_norm_over({33})},
      {"layer_norm chunked rows", {2, 3, 65535}, {3, 65535}, layer_norm_over({3, 65535})},
      {"layer_norm one long row", {1, 1 << 20}, {1 << 20}, layer_norm_over({1 << 20})},
      {"layer_norm large mean", {4, 3000}, {3000}, layer_norm_over({3000}), 1e4},
      {"layer_norm zero rows", {6, 70}, {70}, layer_norm_over({70}), 0, true},
      {"layer_norm empty", {0, 16}, {16}, layer_norm_over({16})},
      {"rms_norm row of 1", {5, 1}, {1}, rms_norm_over({1}), 0, false, false},
      {"rms_norm warp rows", {37, 100}, {100}, rms_norm_over({100}), 0, false, false},
      {"rms_norm warp rows, no weight", {37, 1000}, {}, rms_norm_over({1000})},
      {"rms_norm block rows", {9, 4096}, {4096}, rms_norm_over({4096}), 0, false, false},
      {"rms_norm many rows", {3000, 48}, {48}, rms_norm_over({48}), 0, false, false},
      {"rms_norm rows of 768, three vectors a thread", {300, 768}, {768}, rms_norm_over({768}), 0, false, false},
      {"rms_norm rows in chunks", {3, 20000}, {20000}, rms_norm_over({20000}), 0, false, false},
      {"rms_norm many unaligned rows", {700, 33}, {33}, rms_norm_over({33}), 0, false, false},
      {"rms_norm chunked rows", {2, 3, 65535}, {3, 65535}, rms_norm_over({3, 65535}), 0, false, false},
      {"rms_norm one long row", {1, 1 << 20}, {1 << 20}, rms_norm_over({1 << 20}), 0, false, false},
      {"rms_norm large mean", {4, 3000}, {3000}, rms_norm_over({3000}), 1e4, false, false},
      {"rms_norm zero rows", {6, 70}, {70}, rms_norm_over({70}), 0, true, false},
      {"rms_norm empty", {0, 16}, {16}, rms_norm_over({16}), 0, false, false},
      {"group_norm [N, C]", {64, 24}, {24}, group_norm_with(6)},
      {"group_norm small planes", {3, 12, 3}, {12}, group_norm_with(4)},
      {"group_norm image", {2, 8, 33, 31}, {8}, group_norm_with(2)},
      {"group_norm rows in chunks", {1, 8, 1000}, {8}, group_norm_with(1)},
      {"group_norm groups in shared memory", {3, 8, 64, 64}, {8}, group_norm_with(2)},
      {"group_norm ResNet groups in shared memory", {4, 64, 56, 56}, {64}, group_norm_with(32)},
      {"group_norm planes of 196, more groups than resident blocks", {72, 256, 14, 14}, {256}, group_norm_with(32)},
      {"group_norm shared groups, large mean", {3, 6, 1000}, {6}, group_norm_with(3), 1e4},
      {"group_norm shared groups, no affine", {2, 6, 32, 32}, {}, group_norm_with(3)},
      {"group_norm groups in shared memory in 16 bits", {2, 6, 100, 100}, {6}, group_norm_with(1)},
      {"group_norm long groups", {2, 4, 100000}, {4}, group_norm_with(2)},
      {"group_norm long groups of short planes", {2, 16, 50, 41}, {16}, group_norm_with(2)},
      {"group_norm groups over 2 MB, streamed twice", {3, 4, 640, 512}, {4}, group_norm_with(2)},
      {"group_norm groups over a cluster", {2, 20, 64, 64}, {20}, group_norm_with(2)},
      {"group_norm cluster slices ending inside planes", {2, 12, 70, 70}, {12}, group_norm_with(2)},
      {"group_norm cluster groups, large mean", {2, 6, 100, 100}, {6}, group_norm_with(1), 1e4},
      {"group_norm cluster groups, no affine", {3, 8, 80, 80}, {}, group_norm_with(2)},
      {"group_norm large mean", {3, 6, 500}, {6}, group_norm_with(3), 1e4},
      {"group_norm no affine", {5, 9, 17}, {}, group_norm_with(3)},
      {"group_norm empty", {0, 4, 5}, {4}, group_norm_with(2)},
      {"l1_norm last dim", {300, 77}, {}, l1_norm_along(1)},
      {"l1_norm rows over a cluster of two (f32) or read twice", {5, 20001}, {}, l1_norm_along(1)},
      {"l1_norm rows of whole vectors read twice, backward over a cluster", {5, 20000}, {}, l1_norm_along(1)},
      {"l1_norm rows over a cluster, each but the first unaligned", {7, 65535}, {}, l1_norm_along(1)},
      {"l1_norm zero rows over a cluster", {4, 40000}, {}, l1_norm_along(1), 0, true},
      {"l1_norm rows over a cluster of eight", {3, 100001}, {}, l1_norm_along(1)},
      {"l1_norm long rows", {3, 200000}, {}, l1_norm_along(1)},
      {"l1_norm rows beyond a cluster", {2, 1 << 20}, {}, l1_norm_along(1)},
      {"l1_norm inner dim", {4, 50, 9, 7}, {}, l1_norm_along(1)},
      {"l1_norm zero rows", {8, 33}, {}, l1_norm_along(1), 0, true},
      {"l1_norm 0-dim", {}, {}, l1_norm_along(0)},
      {"frobenius small", {3, 5}, {}, frobenius()},
      {"frobenius large", {7, 300001}, {}, frobenius()},
      {"frobenius zero", {4, 5}, {}, frobenius(), 0, true},
      {"frobenius empty", {0}, {}, frobenius()},
  };
}

TEST(NormCuda, MatchesCpuOnEveryPath) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const CudaCase& c : cases()) {
    for (DType dtype : {DType::F64, DType::F32, DType::F16, DType::BF16}) run_case(c, dtype);
  }
}

// The frobenius "zero" case above zeroes only half; a whole zero tensor gives zeros and a
// finite gradient on the GPU as on the CPU.
TEST(NormCuda, ZeroInputsGiveZeros) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = nc::zeros({4, 300}, nc::Device::cuda()).requires_grad_();
  for (Tensor y : {nc::l1_norm(x, 1), nc::frobenius_norm(x)}) {
    EXPECT_EQ(nc::sum(nc::abs(y)).item<double>(), 0.0);
    x.zero_grad();
    y.backward(nc::ones_like(y));
    std::vector<float> g = x.grad().to(nc::Device::cpu()).to_vector<float>();
    for (float v : g) ASSERT_TRUE(std::isfinite(v));
  }
}

// L1 rows over a cluster add the blocks' sums in rank order: two runs give the same bits,
// forward and backward.
TEST(NormCuda, L1RowsOverAClusterAreDeterministic) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda();
  const Tensor x = random({64, 65535}, 27, DType::F32).to(gpu);
  const Tensor grad = random({64, 65535}, 28, DType::F32).to(gpu);
  auto run = [&]() {
    Tensor xg = x.detach().requires_grad_();
    Tensor y = nc::l1_norm(xg, 1);
    y.backward(grad);
    return std::vector<std::vector<float>>{y.to(nc::Device::cpu()).to_vector<float>(),
                                           xg.grad().to(nc::Device::cpu()).to_vector<float>()};
  };
  EXPECT_EQ(run(), run());
}

// Parameter gradients are reduced in a fixed order: two runs give the same bits.
TEST(NormCuda, ParameterGradientsAreDeterministic) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda();
  Tensor x = random({4096, 96}, 21, DType::F32).to(gpu);
  Tensor grad = random({4096, 96}, 22, DType::F32).to(gpu);
  Tensor images = random({16, 8, 40, 40}, 23, DType::F32).to(gpu);
  Tensor image_grad = random({16, 8, 40, 40}, 24, DType::F32).to(gpu);
  Tensor large = random({4, 16, 64, 64}, 25, DType::F32).to(gpu);  // 256 KB groups: over a cluster
  Tensor large_grad = random({4, 16, 64, 64}, 26, DType::F32).to(gpu);
  auto grads = [&]() {
    Tensor w = nc::ones({96}, gpu).requires_grad_();
    Tensor b = nc::zeros({96}, gpu).requires_grad_();
    nc::layer_norm(x, {96}, w, b).backward(grad);
    Tensor gw = nc::ones({8}, gpu).requires_grad_();
    Tensor gb = nc::zeros({8}, gpu).requires_grad_();
    nc::group_norm(images, 2, gw, gb).backward(image_grad);
    Tensor rw = nc::ones({96}, gpu).requires_grad_();
    nc::rms_norm(x, {96}, rw).backward(grad);
    Tensor lw = nc::ones({16}, gpu).requires_grad_();
    Tensor lb = nc::zeros({16}, gpu).requires_grad_();
    nc::group_norm(large, 1, lw, lb).backward(large_grad);
    return std::vector<Tensor>{w.grad(), b.grad(), gw.grad(), gb.grad(), rw.grad(), lw.grad(), lb.grad()};
  };
  std::vector<Tensor> first = grads(), second = grads();
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].to(nc::Device::cpu()).to_vector<float>(), second[i].to(nc::Device::cpu()).to_vector<float>())
        << "gradient " << i;
  }
}

}  // namespace
