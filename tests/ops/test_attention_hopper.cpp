// The Hopper attention kernels (kernels/cuda/hopper/: warpgroup MMA fed by the tensor memory
// accelerator) on an sm_90 device: out and the gradients (the backward on the Hopper kernels
// too, reading the log-sum-exp the forward saved) against a float64 CPU reference of the
// same rounded inputs and against the mma.sync kernels (kernels::set_hopper_attention(Off)),
// both forms of the forward (pipelined and serial), in f16 and bf16, for head dims 64,
// 128 and 256 (whose backward runs as matrix products on cuBLAS), causal or not, lengths on and off the tiles (1, 127, 129, 300), L != S both ways,
// grouped-query and multi-query heads, q, k and v as views of one packed projection, and
// logits large enough to saturate the softmax; the backward in its fast form (grad_q summed
// with atomics) and its deterministic form (cuda::set_deterministic). Every case checks that the Hopper kernels
// ran both passes (kernels::last_native_attention_kernels), so a silent fallback fails. On
// other devices, or builds without the Hopper kernels, the tests skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "normcore/normcore.h"
#include "tests/test_support.h"

#if NORMCORE_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using nc::cuda::AttentionPass;
using nc::kernels::HopperAttention;

namespace {

bool hopper_device() {
#if NORMCORE_HAS_CUDA && NORMCORE_TEST_HOPPER_KERNELS
  if (!nc::cuda_is_available()) return false;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) return false;
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

// Restores the engine, the Hopper kernels' switch and the deterministic switch when a test
// ends.
class Settings {
 public:
  Settings()
      : engine_(nc::cuda::attention_engine()), hopper_(nc::kernels::hopper_attention()),
        deterministic_(nc::cuda::deterministic()) {
    nc::cuda::set_attention_engine(nc::cuda::AttentionEngine::Native);
  }
  ~Settings() {
    nc::cuda::set_attention_engine(engine_);
    nc::kernels::set_hopper_attention(hopper_);
    nc::cuda::set_deterministic(deterministic_);
  }

 private:
  nc::cuda::AttentionEngine engine_;
  nc::kernels::HopperAttention hopper_;
  bool deterministic_;
};

struct Case {
  std::string name;
  int64_t batch, heads, kv_heads, L, S, D;
  bool causal;
  bool packed = false;  // q, k, v as views of one [B, L, 3, H, D] buffer (L == S, kv_heads == heads)
  double logits = 1.0;  // q scaled by this: large values saturate the softmax
};

struct Inputs {
  Tensor q, k, v, packed;  // packed: the buffer q, k, v view, when the case packs them
};

Inputs make_inputs(const Case& c, DType dtype, nc::Device device) {
  nc::Generator gen(40 + c.L + c.D);
  if (c.packed) {
    Tensor qkv = nc::randn({c.batch, c.L, 3, c.heads, c.D}, DType::F64, &gen);
    qkv = nc::cat({qkv.narrow(2, 0, 1) * c.logits, qkv.narrow(2, 1, 2)}, 2).to(dtype).to(device).requires_grad_();
    auto part = [&](int64_t i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };
    return {part(0), part(1), part(2), qkv};
  }
  Tensor q = (nc::randn({c.batch, c.heads, c.L, c.D}, DType::F64, &gen) * c.logits).to(dtype);
  Tensor k = nc::randn({c.batch, c.kv_heads, c.S, c.D}, DType::F64, &gen).to(dtype);
  Tensor v = nc::randn({c.batch, c.kv_heads, c.S, c.D}, DType::F64, &gen).to(dtype);
  return {q.to(device).requires_grad_(), k.to(device).requires_grad_(), v.to(device).requires_grad_(), Tensor()};
}

Tensor attend(const Case& c, const Inputs& in) {
  return nc::scaled_dot_product_attention(in.q, in.k, in.v, c.causal, std::nullopt, c.kv_heads != c.heads);
}

// Largest |got - expected| over the largest |expected|, or over 1 where every |expected| is
// smaller (the gradients of q and k are zero with one key).
double error(const Tensor& got, const Tensor& expected) {
  const std::vector<double> g = normcore_test::values(got), e = normcore_test::values(expected);
  double worst = 0, scale = 1;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    worst = std::max(worst, std::fabs(g[i] - e[i]));
    scale = std::max(scale, std::fabs(e[i]));
  }
  return worst / scale;
}

struct Run {
  Tensor out;
  std::vector<Tensor> grads;
  std::string forward_kernels, backward_kernels;
};

// out and the gradients for grad_out on the device, with the Hopper kernels in `mode` and
// the backward's deterministic form or not.
Run run(const Case& c, DType dtype, nc::Device device, HopperAttention mode, const Tensor& grad_out,
        bool deterministic = true) {
  nc::kernels::set_hopper_attention(mode);
  nc::cuda::set_deterministic(deterministic);
  Inputs in = make_inputs(c, dtype, device);
  Run r;
  r.out = attend(c, in);
  const char* ran = nc::kernels::last_native_attention_kernels(AttentionPass::Forward);
  r.forward_kernels = device.is_cuda() && ran != nullptr ? ran : "cpu";
  r.out.backward(grad_out.to(dtype).to(device));
  const char* ran_backward = nc::kernels::last_native_attention_kernels(AttentionPass::Backward);
  r.backward_kernels = device.is_cuda() && ran_backward != nullptr ? ran_backward : "cpu";
  if (c.packed) r.grads = {in.packed.grad()};
  else r.grads = {in.q.grad(), in.k.grad(), in.v.grad()};
  return r;
}

void check_case(const Case& c, DType dtype) {
  SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype));
  nc::Generator gen(7);
  const Tensor grad_out = nc::randn({c.batch, c.heads, c.L, c.D}, DType::F64, &gen);
  // The reference: the same rounded inputs in f64 on the CPU.
  Run reference;
  {
    const Inputs in = make_inputs(c, dtype, nc::Device::cpu());
    Inputs wide;
    if (c.packed) {
      wide.packed = in.packed.detach().to(DType::F64).requires_grad_();
      auto part = [&](int64_t i) { return wide.packed.select(2, i).permute({0, 2, 1, 3}); };
      wide.q = part(0), wide.k = part(1), wide.v = part(2);
    } else {
      wide.q = in.q.detach().to(DType::F64).requires_grad_();
      wide.k = in.k.detach().to(DType::F64).requires_grad_();
      wide.v = in.v.detach().to(DType::F64).requires_grad_();
    }
    reference.out = attend(c, wide);
    reference.out.backward(grad_out);
    if (c.packed) reference.grads = {wide.packed.grad()};
    else reference.grads = {wide.q.grad(), wide.k.grad(), wide.v.grad()};
  }
  // Past head dim 128 the backward runs as matrix products, whatever the forward ran.
  const char* backward_kernels = c.D > 128 ? "cublas" : "wgmma";
  const Run mma = run(c, dtype, nc::Device::cuda(), HopperAttention::Off, grad_out);
  ASSERT_EQ(mma.forward_kernels, "mma.sync");
  ASSERT_EQ(mma.backward_kernels, c.D > 128 ? "cublas" : "mma.sync");
  // P is rounded to the storage type before P V on both kernels: errors of a few units of
  // that type's precision, and the Hopper kernels' no larger than the mma.sync kernels' by
  // more than rounding noise.
  const double unit = dtype == DType::BF16 ? 1.0 / 128 : 1.0 / 1024;
  const double out_mma = error(mma.out, reference.out);
  // Both forward forms; the backward's fast form (grad_q summed with atomics) after each, and
  // its deterministic form once.
  const std::pair<HopperAttention, bool> forms[] = {
      {HopperAttention::Pipelined, false}, {HopperAttention::Serial, false}, {HopperAttention::Pipelined, true}};
  for (const auto& [mode, deterministic] : forms) {
    SCOPED_TRACE(std::string(mode == HopperAttention::Pipelined ? "pipelined" : "serial") +
                 (deterministic ? ", deterministic backward" : ", fast backward"));
    const Run hopper = run(c, dtype, nc::Device::cuda(), mode, grad_out, deterministic);
    ASSERT_EQ(hopper.forward_kernels, "wgmma");
    ASSERT_EQ(hopper.backward_kernels, backward_kernels);
    const double out_hopper = error(hopper.out, reference.out);
    EXPECT_LT(out_hopper, 2 * unit) << "out: mma.sync's error " << out_mma;
    EXPECT_LT(out_hopper, 1.5 * out_mma + unit / 4) << "out";
    for (size_t i = 0; i < reference.grads.size(); ++i) {
      const double g_hopper = error(hopper.grads[i], reference.grads[i]);
      const double g_mma = error(mma.grads[i], reference.grads[i]);
      EXPECT_LT(g_hopper, 6 * unit) << "grad " << i << ": mma.sync's error " << g_mma;
      EXPECT_LT(g_hopper, 1.5 * g_mma + unit) << "grad " << i;
    }
  }
}

TEST(AttentionHopper, MatchesReferenceAndMmaSync) {
  if (!hopper_device()) GTEST_SKIP() << "no sm_90 device, or a build without the Hopper kernels";
  Settings restore;
  const std::vector<Case> cases = {
      {"D 64, one tile", 2, 2, 2, 128, 128, 64, false},
      {"D 64 causal, tails", 1, 3, 3, 300, 300, 64, true},
      {"D 128, L < S", 2, 2, 2, 129, 300, 128, false},
      {"D 128 causal, L > S", 1, 2, 2, 300, 127, 128, true},
      {"D 64 causal, L < S", 1, 2, 2, 127, 257, 64, true},
      {"one query", 3, 2, 2, 1, 200, 64, false},
      {"one key", 1, 2, 2, 129, 1, 128, false},
      {"one token causal", 2, 2, 2, 1, 1, 64, true},
      {"grouped-query causal", 2, 8, 2, 200, 200, 64, true},
      {"multi-query D 128", 1, 4, 1, 129, 129, 128, false},
      {"packed qkv causal", 2, 3, 3, 257, 257, 64, true, true},
      {"packed qkv D 128", 1, 2, 2, 200, 200, 128, false, true},
      {"saturated softmax", 1, 2, 2, 256, 256, 64, false, false, 40.0},
      {"saturated softmax causal D 128", 1, 2, 2, 200, 200, 128, true, false, 40.0},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F16, DType::BF16}) check_case(c, dtype);
  }
}

// Head dim 256: the Hopper forward (key tiles of 64) and the backward as matrix products.
TEST(AttentionHopper, HeadDim256MatchesReferenceAndMmaSync) {
  if (!hopper_device()) GTEST_SKIP() << "no sm_90 device, or a build without the Hopper kernels";
  Settings restore;
  const std::vector<Case> cases = {
      {"D 256, L < S", 1, 2, 2, 129, 300, 256, false},
      {"D 256 causal, tails", 1, 2, 2, 300, 300, 256, true},
      {"D 256 causal, L > S", 1, 2, 2, 200, 65, 256, true},
      {"grouped-query D 256 causal", 1, 4, 2, 130, 130, 256, true},
      {"packed qkv D 256", 1, 2, 2, 200, 200, 256, false, true},
      {"saturated softmax D 256", 1, 2, 2, 129, 129, 256, false, false, 40.0},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F16, DType::BF16}) check_case(c, dtype);
  }
}

// A causal head of 2^22 scores or more runs its backward in blocks of query rows, each
// multiplying only the keys up to its last row, grad_k and grad_v summed in f32 over them.
TEST(AttentionHopper, HeadDim256BackwardInRowBlocks) {
  if (!hopper_device()) GTEST_SKIP() << "no sm_90 device, or a build without the Hopper kernels";
  Settings restore;
  check_case({"D 256 causal, backward in row blocks", 1, 3, 3, 2048, 2048, 256, true}, DType::BF16);
}

// The deterministic backward gives the same bits on every run; the fast one sums grad_q with
// atomics, so its bits may differ, but grad_k and grad_v are written once and stay the same.
TEST(AttentionHopper, DeterministicBackwardRepeatsItsBits) {
  if (!hopper_device()) GTEST_SKIP() << "no sm_90 device, or a build without the Hopper kernels";
  Settings restore;
  const Case c{"repeat", 2, 4, 4, 700, 700, 64, true};
  nc::Generator gen(11);
  const Tensor grad_out = nc::randn({c.batch, c.heads, c.L, c.D}, DType::F64, &gen);
  for (bool deterministic : {true, false}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "fast");
    const auto a = run(c, DType::BF16, nc::Device::cuda(), HopperAttention::Pipelined, grad_out, deterministic);
    const auto b = run(c, DType::BF16, nc::Device::cuda(), HopperAttention::Pipelined, grad_out, deterministic);
    ASSERT_EQ(a.backward_kernels, "wgmma");
    if (deterministic) EXPECT_EQ(normcore_test::values(a.grads[0]), normcore_test::values(b.grads[0])) << "grad_q";
    EXPECT_EQ(normcore_test::values(a.grads[1]), normcore_test::values(b.grads[1])) << "grad_k";
    EXPECT_EQ(normcore_test::values(a.grads[2]), normcore_test::values(b.grads[2])) << "grad_v";
    EXPECT_LT(error(a.grads[0], b.grads[0]), 1.0 / 128) << "grad_q";
  }
}

// Shapes the Hopper kernels do not take run on the mma.sync kernels, with the same results.
TEST(AttentionHopper, OtherShapesFallBack) {
  if (!hopper_device()) GTEST_SKIP() << "no sm_90 device, or a build without the Hopper kernels";
  Settings restore;
  nc::kernels::set_hopper_attention(HopperAttention::Pipelined);
  const nc::Device gpu = nc::Device::cuda();
  nc::Generator gen(3);
  // Head dim 32, and D != Dv.
  for (const auto& dims : std::vector<std::pair<int64_t, int64_t>>{{32, 32}, {64, 32}}) {
    Tensor q = nc::randn({1, 2, 70, dims.first}, DType::BF16, &gen).to(gpu);
    Tensor k = nc::randn({1, 2, 70, dims.first}, DType::BF16, &gen).to(gpu);
    Tensor v = nc::randn({1, 2, 70, dims.second}, DType::BF16, &gen).to(gpu);
    nc::scaled_dot_product_attention(q, k, v);
    EXPECT_STREQ(nc::kernels::last_native_attention_kernels(AttentionPass::Forward), "mma.sync")
        << dims.first << " x " << dims.second;
  }
  // f32 runs on the SIMT kernels.
  Tensor x = nc::randn({1, 1, 8, 64}, DType::F32, &gen).to(gpu);
  nc::scaled_dot_product_attention(x, x, x);
  EXPECT_STREQ(nc::kernels::last_native_attention_kernels(AttentionPass::Forward), "simt");
}

}  // namespace
