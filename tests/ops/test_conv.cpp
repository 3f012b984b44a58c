// conv2d and nn::Conv2d: the CPU kernels (im2col + GEMM) against a direct six-loop
// convolution in double over stride, padding, dilation, groups and batch-less input;
// hand-computed values; float64 gradchecks of x, weight and bias; 16-bit dtypes against
// f32; the layer's parameters, initialization and state_dict names; and the CUDA path
// (cuDNN) against the CPU in every dtype, with TF32 on and off and the timed algorithm search.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/conv.h"
#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Size2;
using nc::Tensor;

namespace {

Tensor random(const nc::Shape& shape, uint64_t seed, DType dtype = DType::F64) {
  nc::Generator gen(seed);
  return nc::randn(shape, DType::F64, &gen).to(dtype);
}

struct Geometry {
  std::string name;
  nc::Shape x, weight;
  bool bias;
  Size2 stride, padding, dilation;
  int64_t groups;
};

const std::vector<Geometry>& geometries() {
  static const std::vector<Geometry> g = {
      {"3x3 pad 1", {2, 3, 7, 6}, {4, 3, 3, 3}, true, 1, 1, 1, 1},
      {"1x1", {3, 5, 4, 4}, {7, 5, 1, 1}, true, 1, 0, 1, 1},
      {"stride 2 no bias", {1, 4, 9, 9}, {6, 4, 3, 3}, false, 2, 0, 1, 1},
      {"rectangular kernel, stride and padding", {2, 2, 8, 7}, {3, 2, 3, 2}, true, {2, 1}, {1, 0}, 1, 1},
      {"dilation 2", {2, 3, 9, 8}, {2, 3, 3, 3}, true, 1, 2, 2, 1},
      {"groups 2", {2, 4, 6, 6}, {6, 2, 3, 3}, true, 1, 1, 1, 2},
      {"depthwise", {2, 6, 5, 5}, {6, 1, 3, 3}, true, 1, 1, 1, 6},
      {"batch-less", {3, 6, 5}, {2, 3, 3, 3}, true, 1, 1, 1, 1},
      {"kernel as large as the padded input", {1, 2, 3, 3}, {2, 2, 5, 5}, true, 1, 1, 1, 1},
      {"empty batch", {0, 3, 5, 5}, {2, 3, 3, 3}, true, 1, 1, 1, 1},
  };
  return g;
}

// The definition, in double: y[n, o, i, j] = bias[o] + sum over c in o's group, ki, kj of
// x[n, c, i s - p + ki d, j s - p + kj d] w[o, c, ki, kj].
Tensor direct_conv(const Tensor& x_in, const Tensor& w, const Tensor& b, Size2 s, Size2 p, Size2 d, int64_t groups) {
  const bool batched = x_in.dim() == 4;
  const Tensor x = batched ? x_in : x_in.unsqueeze(0);
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = w.size(0), kh = w.size(2), kw = w.size(3), cg = C / groups, og = O / groups;
  const int64_t Ho = (H + 2 * p.h - d.h * (kh - 1) - 1) / s.h + 1, Wo = (W + 2 * p.w - d.w * (kw - 1) - 1) / s.w + 1;
  const std::vector<double> xv = x.to(DType::F64).to_vector<double>(), wv = w.to(DType::F64).to_vector<double>();
  const std::vector<double> bv = b.defined() ? b.to(DType::F64).to_vector<double>() : std::vector<double>(O, 0.0);
  std::vector<double> y(static_cast<size_t>(N * O * Ho * Wo));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < Ho; ++i)
        for (int64_t j = 0; j < Wo; ++j) {
          double acc = bv[o];
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t ki = 0; ki < kh; ++ki)
              for (int64_t kj = 0; kj < kw; ++kj) {
                const int64_t r = i * s.h - p.h + ki * d.h, q = j * s.w - p.w + kj * d.w;
                if (r < 0 || r >= H || q < 0 || q >= W) continue;
                acc += xv[((n * C + (o / og) * cg + c) * H + r) * W + q] * wv[((o * cg + c) * kh + ki) * kw + kj];
              }
          y[((n * O + o) * Ho + i) * Wo + j] = acc;
        }
  Tensor out = nc::from_vector(y, {N, O, Ho, Wo});
  return batched ? out : out.squeeze(0);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  const std::vector<double> av = a.to(nc::Device::cpu(), DType::F64).to_vector<double>();
  const std::vector<double> bv = b.to(nc::Device::cpu(), DType::F64).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < av.size(); ++i)
    worst = std::max(worst, std::isnan(av[i]) != std::isnan(bv[i]) ? INFINITY : std::fabs(av[i] - bv[i]));
  return worst;
}

Tensor conv(const Geometry& g, const Tensor& x, const Tensor& w, const Tensor& b) {
  return nc::conv2d(x, w, b, g.stride, g.padding, g.dilation, g.groups);
}

}  // namespace

TEST(Conv2d, HandComputedValues) {
  // x = 1..9 in a 3x3 plane, w = [[1, 0], [0, -1]], bias 0.5: y[i, j] = x[i, j] - x[i+1, j+1] + 0.5.
  Tensor x = nc::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  Tensor w = nc::from_vector<float>({1, 0, 0, -1}, {1, 1, 2, 2});
  Tensor b = nc::from_vector<float>({0.5f}, {1});
  EXPECT_EQ(nc::conv2d(x, w, b).to_vector<float>(), (std::vector<float>{-3.5f, -3.5f, -3.5f, -3.5f}));
  // Padding 1: the corners see one input each: y[0, 0] = -x[0, 0] + 0.5, y[3, 3] = x[2, 2] + 0.5.
  Tensor padded = nc::conv2d(x, w, b, 1, 1);
  ASSERT_EQ(padded.shape(), (nc::Shape{1, 1, 4, 4}));
  const std::vector<float> v = padded.to_vector<float>();
  EXPECT_EQ(v[0], -0.5f);
  EXPECT_EQ(v[15], 9.5f);
  EXPECT_EQ(v[5], 1 - 5 + 0.5f);
  // Stride 2 with padding 1: rows and columns 0 and 2 of the padded result.
  EXPECT_EQ(nc::conv2d(x, w, b, 2, 1).to_vector<float>(), (std::vector<float>{-0.5f, -2.5f, -6.5f, -3.5f}));
}

TEST(Conv2d, CpuMatchesDirectConvolution) {
  uint64_t seed = 1;
  for (const Geometry& g : geometries()) {
    for (DType dtype : {DType::F64, DType::F32}) {
      Tensor x = random(g.x, seed++, dtype), w = random(g.weight, seed++, dtype);
      Tensor b = g.bias ? random({g.weight[0]}, seed++, dtype) : Tensor();
      Tensor got = conv(g, x, w, b);
      Tensor want = direct_conv(x, w, b, g.stride, g.padding, g.dilation, g.groups);
      EXPECT_EQ(got.dtype(), dtype) << g.name;
      EXPECT_LT(max_abs_diff(got, want), dtype == DType::F64 ? 1e-12 : 1e-5) << g.name << " " << nc::dtype_name(dtype);
    }
  }
}

// Where the AVX-512 product reads the columns from the image (stride 1, an output as large
// as the input): panels that wrap across image rows, a last vector joined to the panel
// before it, k cut into blocks in the middle of a channel, the work cut into column pieces
// and into row blocks, kernels of 25 taps and of one row; each with bias, residual and ReLU.
TEST(Conv2d, CpuProductFromTheImageMatchesDirectConvolution) {
  const std::vector<Geometry> cases = {
      {"3x3, column pieces, k blocks", {1, 40, 13, 11}, {64, 40, 3, 3}, true, 1, 1, 1, 1},
      {"5x5 pad 2, a joined last vector", {2, 3, 10, 10}, {4, 3, 5, 5}, true, 1, 2, 1, 1},
      {"1x3 pad (0, 1)", {2, 6, 9, 20}, {5, 6, 1, 3}, true, 1, {0, 1}, 1, 1},
      {"3x3 at 7x7, row blocks", {1, 16, 7, 7}, {160, 16, 3, 3}, true, 1, 1, 1, 1},
  };
  uint64_t seed = 500;
  for (const Geometry& g : cases) {
    SCOPED_TRACE(g.name);
    nc::autograd::NoGradGuard no_grad;
    const Tensor x = random(g.x, seed++, DType::F32), w = random(g.weight, seed++, DType::F32);
    const Tensor b = random({g.weight[0]}, seed++, DType::F32);
    Tensor want = direct_conv(x, w, b, g.stride, g.padding, g.dilation, g.groups);
    ASSERT_EQ(want.size(2), g.x[2]);
    ASSERT_EQ(want.size(3), g.x[3]);
    EXPECT_LT(max_abs_diff(conv(g, x, w, b), want), 1e-4);
    const Tensor r = random(want.shape(), seed++, DType::F32);
    want = nc::relu(nc::add(want, r.to(DType::F64)));
    const Tensor got = nc::conv2d_fused(x, w, b, r, true, g.stride, g.padding, g.dilation, g.groups);
    EXPECT_LT(max_abs_diff(got, want), 1e-4);
  }
}

TEST(Conv2d, GradcheckFloat64) {
  uint64_t seed = 100;
  for (const Geometry& g : geometries()) {
    if (g.x[0] == 0) continue;
    Tensor x = random(g.x, seed++).requires_grad_(), w = random(g.weight, seed++).requires_grad_();
    std::vector<Tensor> inputs = {x, w};
    if (g.bias) inputs.push_back(random({g.weight[0]}, seed++).requires_grad_());
    auto fn = [g](const std::vector<Tensor>& in) { return conv(g, in[0], in[1], in.size() > 2 ? in[2] : Tensor()); };
    std::string report;
    EXPECT_TRUE(nc::gradcheck(fn, inputs, {}, &report)) << g.name << ": " << report;
  }
}

// Gradients reach only the inputs that ask for them; an empty batch gives a zero weight
// gradient and an empty x gradient.
TEST(Conv2d, GradientsOfSomeInputsAndEmptyBatch) {
  Tensor x = random({2, 3, 5, 5}, 1), w = random({4, 3, 3, 3}, 2).requires_grad_();
  nc::sum(nc::conv2d(x, w, Tensor(), 1, 1)).backward();
  EXPECT_FALSE(x.grad().defined());
  ASSERT_TRUE(w.grad().defined());
  // d/dw of sum(y) is the sum of the inputs under each tap: the centre tap sees all of x.
  EXPECT_NEAR(nc::sum(w.grad().select(0, 0).select(1, 1).select(1, 1)).item<double>(), nc::sum(x).item<double>(), 1e-9);

  Tensor empty_x = nc::zeros({0, 3, 5, 5}, DType::F64).requires_grad_();
  Tensor w2 = random({4, 3, 3, 3}, 3).requires_grad_();
  Tensor b2 = random({4}, 4).requires_grad_();
  Tensor y = nc::conv2d(empty_x, w2, b2, 1, 1);
  EXPECT_EQ(y.shape(), (nc::Shape{0, 4, 5, 5}));
  nc::sum(y).backward();
  EXPECT_EQ(empty_x.grad().shape(), (nc::Shape{0, 3, 5, 5}));
  EXPECT_EQ(nc::sum(nc::abs(w2.grad())).item<double>(), 0.0);
  EXPECT_EQ(nc::sum(nc::abs(b2.grad())).item<double>(), 0.0);
}

// f16 and bf16 accumulate in f32 and round once: close to the f32 result at their precision.
TEST(Conv2d, SixteenBitDtypesAgreeWithFloat32) {
  const Geometry g = geometries()[0];
  for (DType dtype : {DType::F16, DType::BF16}) {
    Tensor x = random(g.x, 7, dtype), w = random(g.weight, 8, dtype), b = random({4}, 9, dtype);
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_();
    Tensor y = conv(g, x, w, b);
    EXPECT_EQ(y.dtype(), dtype);
    Tensor grad = random(y.shape(), 10, dtype);
    y.backward(grad);
    Tensor x32 = x.detach().to(DType::F32).requires_grad_(), w32 = w.detach().to(DType::F32).requires_grad_();
    Tensor b32 = b.detach().to(DType::F32).requires_grad_();
    Tensor y32 = conv(g, x32, w32, b32);
    y32.backward(grad.to(DType::F32));
    const double tol = dtype == DType::F16 ? 2e-2 : 1.5e-1;  // |y| up to about 15: a few ulps
    EXPECT_LT(max_abs_diff(y, y32), tol) << nc::dtype_name(dtype);
    EXPECT_LT(max_abs_diff(x.grad(), x32.grad()), tol) << nc::dtype_name(dtype);
    EXPECT_LT(max_abs_diff(w.grad(), w32.grad()), 4 * tol) << nc::dtype_name(dtype);
    EXPECT_LT(max_abs_diff(b.grad(), b32.grad()), 4 * tol) << nc::dtype_name(dtype);
  }
}

TEST(Conv2d, NonContiguousInputs) {
  Tensor x = random({2, 5, 6, 3}, 11).permute({0, 3, 1, 2});  // [2, 3, 5, 6], channels last in memory
  Tensor w = random({3, 4, 3, 3}, 12).transpose(0, 1);        // [4, 3, 3, 3]
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_LT(max_abs_diff(nc::conv2d(x, w, Tensor(), 1, 1), direct_conv(x, w, Tensor(), 1, 1, 1, 1)), 1e-12);
}

TEST(Conv2dLayer, ParametersInitAndStateDict) {
  nc::Generator gen(5);
  nc::nn::Conv2d conv(4, 8, 3, 1, 1, 1, 2, true, &gen);
  EXPECT_EQ(conv.weight.shape(), (nc::Shape{8, 2, 3, 3}));
  EXPECT_EQ(conv.bias.shape(), (nc::Shape{8}));
  const auto state = conv.state_dict();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "weight");
  EXPECT_EQ(state[1].first, "bias");
  // Uniform on [-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 2 * 3 * 3.
  const double bound = 1.0 / std::sqrt(18.0);
  EXPECT_LE(nc::max(nc::abs(conv.weight)).item<double>(), bound);
  EXPECT_GT(nc::max(nc::abs(conv.weight)).item<double>(), 0.8 * bound);
  EXPECT_LE(nc::max(nc::abs(conv.bias)).item<double>(), bound);
  Tensor x = random({2, 4, 5, 5}, 13, DType::F32);
  EXPECT_LT(max_abs_diff(conv(x), nc::conv2d(x, conv.weight, conv.bias, 1, 1, 1, 2)), 0.0 + 1e-30);
  EXPECT_EQ(conv(x).shape(), (nc::Shape{2, 8, 5, 5}));

  nc::nn::Conv2d no_bias(3, 6, {3, 1}, 2, 0, 1, 1, false);
  EXPECT_FALSE(no_bias.bias.defined());
  EXPECT_EQ(no_bias.state_dict().size(), 1u);
  EXPECT_EQ(no_bias.weight.shape(), (nc::Shape{6, 3, 3, 1}));
}

TEST(Conv2dLayer, TrainsAStep) {
  // One SGD step on a conv layer lowers a squared error.
  nc::Generator gen(3);
  nc::nn::Conv2d conv(2, 3, 3, 1, 1, 1, 1, true, &gen);
  nc::optim::SGDOptions options;
  options.lr = 0.05;
  nc::optim::SGD sgd(conv.parameters(), options);
  Tensor x = random({4, 2, 6, 6}, 21, DType::F32), target = random({4, 3, 6, 6}, 22, DType::F32);
  double first = 0, last = 0;
  for (int step = 0; step < 5; ++step) {
    sgd.zero_grad();
    Tensor loss = nc::mse_loss(conv(x), target);
    loss.backward();
    sgd.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, first);
}

// ---- CUDA (cuDNN) against the CPU ----

namespace {

double cuda_tolerance(DType dtype, bool tf32) {
  switch (dtype) {
    case DType::F64: return 1e-10;
    case DType::F32: return tf32 ? 2e-2 : 1e-4;
    case DType::F16: return 3e-2;
    default: return 2e-1;
  }
}

// Forward and every gradient on CUDA against the CPU, both from the same rounded inputs;
// tolerances relative to the largest magnitude of each result.
void expect_cuda_matches_cpu(const Geometry& g, DType dtype, bool tf32, uint64_t seed) {
  const std::string what = g.name + " " + nc::dtype_name(dtype) + (tf32 ? " tf32" : "");
  Tensor x = random(g.x, seed, dtype), w = random(g.weight, seed + 1, dtype);
  Tensor b = g.bias ? random({g.weight[0]}, seed + 2, dtype) : Tensor();
  std::vector<Tensor> cpu_in = {x, w}, gpu_in = {x.to(nc::Device::cuda(0)), w.to(nc::Device::cuda(0))};
  if (g.bias) cpu_in.push_back(b), gpu_in.push_back(b.to(nc::Device::cuda(0)));
  for (Tensor& t : cpu_in) t.requires_grad_();
  for (Tensor& t : gpu_in) t.requires_grad_();
  Tensor y_cpu = conv(g, cpu_in[0], cpu_in[1], g.bias ? cpu_in[2] : Tensor());
  Tensor y_gpu = conv(g, gpu_in[0], gpu_in[1], g.bias ? gpu_in[2] : Tensor());
  ASSERT_EQ(y_gpu.device(), nc::Device::cuda(0)) << what;
  Tensor grad = random(y_cpu.shape(), seed + 3, dtype);
  y_cpu.backward(grad);
  y_gpu.backward(grad.to(nc::Device::cuda(0)));
  auto scale = [](const Tensor& t) {
    return t.numel() == 0 ? 1.0 : std::max(1.0, nc::max(nc::abs(t.to(DType::F64))).item<double>());
  };
  const double tol = cuda_tolerance(dtype, tf32);
  EXPECT_LT(max_abs_diff(y_gpu, y_cpu), tol * scale(y_cpu)) << what << ": forward";
  const char* names[] = {"grad x", "grad weight", "grad bias"};
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    ASSERT_TRUE(gpu_in[i].grad().defined()) << what << ": " << names[i];
    EXPECT_LT(max_abs_diff(gpu_in[i].grad(), cpu_in[i].grad()), tol * scale(cpu_in[i].grad()))
        << what << ": " << names[i];
  }
}

// Sets the TF32 and benchmark switches for one scope.
class CudnnSettings {
 public:
  CudnnSettings(bool tf32, bool benchmark) : tf32_(nc::cuda::allow_tf32()), benchmark_(nc::cuda::cudnn_benchmark()) {
    nc::cuda::set_allow_tf32(tf32);
    nc::cuda::set_cudnn_benchmark(benchmark);
  }
  ~CudnnSettings() {
    nc::cuda::set_allow_tf32(tf32_);
    nc::cuda::set_cudnn_benchmark(benchmark_);
  }

 private:
  bool tf32_, benchmark_;
};

}  // namespace

TEST(Conv2dCuda, MatchesCpuInEveryDtype) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 1000;
  for (const Geometry& g : geometries())
    for (DType dtype : {DType::F64, DType::F32, DType::F16, DType::BF16})
      expect_cuda_matches_cpu(g, dtype, false, seed += 10);
}

TEST(Conv2dCuda, Tf32AndTimedSearch) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint64_t seed = 2000;
  {
    CudnnSettings settings(true, false);
    for (const Geometry& g : geometries()) expect_cuda_matches_cpu(g, DType::F32, true, seed += 10);
  }
  {
    CudnnSettings settings(false, true);
    for (const Geometry& g : geometries())
      for (DType dtype : {DType::F32, DType::BF16}) expect_cuda_matches_cpu(g, dtype, false, seed += 10);
  }
}

// Without TF32, f32 convolutions are exact to float rounding even when the data would show
// TF32's 10-bit mantissa: x with low bits set, a one-tap weight of 1.
TEST(Conv2dCuda, NoTf32UnlessAllowed) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  CudnnSettings settings(false, false);
  Tensor x = nc::add(nc::ones({8, 64, 16, 16}, DType::F32), 1.0 / 4096);  // 1 + 2^-12: not a TF32 value
  Tensor w = nc::zeros({64, 64, 3, 3}, DType::F32);
  for (int64_t o = 0; o < 64; ++o) w.select(0, o).select(0, o).select(0, 1).select(0, 1).fill_(1.0);
  Tensor y = nc::conv2d(x.to(nc::Device::cuda(0)), w.to(nc::Device::cuda(0)), Tensor(), 1, 1).to(nc::Device::cpu());
  EXPECT_EQ(nc::max(nc::abs(nc::sub(y, x))).item<double>(), 0.0);
}

// The same geometry twice reuses the cached plan and gives the same bits (deterministic
// algorithms only), forward and backward.
TEST(Conv2dCuda, RepeatableBits) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = random({4, 16, 12, 12}, 31, DType::F32).to(nc::Device::cuda(0));
  Tensor w = random({32, 16, 3, 3}, 32, DType::F32).to(nc::Device::cuda(0));
  Tensor grad = random({4, 32, 12, 12}, 33, DType::F32).to(nc::Device::cuda(0));
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    Tensor xr = x.detach().requires_grad_(), wr = w.detach().requires_grad_();
    nc::conv2d(xr, wr, Tensor(), 1, 1).backward(grad);
    std::vector<float> all = xr.grad().to(nc::Device::cpu()).to_vector<float>();
    const std::vector<float> gw = wr.grad().to(nc::Device::cpu()).to_vector<float>();
    all.insert(all.end(), gw.begin(), gw.end());
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

// Tensor-core convolutions (bf16, f16, f32 with TF32) and plain f32 run on engines of cuDNN's
// graph API, not the convolution API's fallback, in all three directions, and agree with the
// CPU; so do pointers aligned to only 2 bytes (a view one element into its storage).
TEST(Conv2dCuda, GraphApiEnginesInEveryDirection) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const char* api = std::getenv("NORMCORE_CUDNN_API");
  if (api != nullptr && std::string(api) == "convolution") GTEST_SKIP() << "NORMCORE_CUDNN_API=convolution";
  const Geometry g{"resnet-like 3x3", {8, 64, 14, 14}, {64, 64, 3, 3}, false, 1, 1, 1, 1};
  uint64_t seed = 3000;
  for (bool tf32 : {false, true}) {
    CudnnSettings settings(tf32, false);
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      if (tf32 && dtype != DType::F32) continue;
      expect_cuda_matches_cpu(g, dtype, tf32, seed += 10);
      for (auto d : {nc::kernels::ConvDirection::Forward, nc::kernels::ConvDirection::BackwardData,
                     nc::kernels::ConvDirection::BackwardFilter}) {
        const std::string ran = nc::kernels::last_conv_algorithm(d);
        EXPECT_EQ(ran.rfind("cuDNN graph engine", 0), 0u)
            << nc::dtype_name(dtype) << (tf32 ? " tf32 " : " ") << nc::kernels::conv_direction_name(d) << ": " << ran;
      }
    }
  }
}

TEST(Conv2dCuda, PointersAlignedToTwoBytes) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::F16, DType::F32}) {
    const nc::Shape shape = {2, 8, 9, 9};
    Tensor storage = random({2 * 8 * 9 * 9 + 1}, 51, dtype).to(nc::Device::cuda(0));
    Tensor x = storage.narrow(0, 1, 2 * 8 * 9 * 9).view(shape);
    Tensor w = random({8, 8, 3, 3}, 52, dtype);
    Tensor y = nc::conv2d(x, w.to(nc::Device::cuda(0)), Tensor(), 1, 1);
    Tensor y_cpu = nc::conv2d(x.to(nc::Device::cpu()), w, Tensor(), 1, 1);
    EXPECT_LT(max_abs_diff(y, y_cpu), cuda_tolerance(dtype, false) * 10) << nc::dtype_name(dtype);
  }
}

TEST(Conv2dCuda, LayerOnGpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::Generator gen(9);
  nc::nn::Conv2d conv(3, 5, 3, 1, 1, 1, 1, true, &gen);
  Tensor x = random({2, 3, 8, 8}, 41, DType::F32);
  Tensor y_cpu = conv(x);
  conv.to(nc::Device::cuda(0));
  Tensor y_gpu = conv(x.to(nc::Device::cuda(0)));
  EXPECT_LT(max_abs_diff(y_gpu, y_cpu), 1e-4);
}
