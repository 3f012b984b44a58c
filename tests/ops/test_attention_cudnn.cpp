// The CUDA attention engines (cuda::set_attention_engine): the rules that pick cuDNN's fused
// attention or the native kernels (on the CPU, from their pure function), then on the GPU
// cuDNN against the native kernels and the CPU reference in f16 and bf16 (out, the
// log-sum-exp the two engines share, grad_q, grad_k, grad_v), each engine's forward paired
// with the other's backward, q, k and v as views of one packed qkv projection, a determinism
// check of cuDNN's backward, a capture and replay in a CUDA graph, and what
// last_attention_engine reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "normcore/normcore.h"

#ifdef NORMCORE_TEST_HAS_CUDNN
#include <cuda_runtime.h>
#include <cudnn.h>
#endif

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using nc::cuda::AttentionEngine;
using nc::cuda::AttentionPass;
using nc::kernels::AttentionEngineQuery;

namespace {

// Restores the process's engine setting when a test ends.
class EngineSetting {
 public:
  EngineSetting() : saved_(nc::cuda::attention_engine()) {}
  ~EngineSetting() { nc::cuda::set_attention_engine(saved_); }

 private:
  AttentionEngine saved_;
};

// A query cuDNN takes: bf16, 2 x 4 heads, L = S = 1024, D = 64, contiguous, on an H100 with
// cuDNN 9.14.
AttentionEngineQuery eligible(AttentionPass pass) {
  AttentionEngineQuery q;
  q.requested = AttentionEngine::Cudnn;
  q.pass = pass;
  q.dtype = DType::BF16;
  q.shape = {2, 4, 1024, 1024, 64, 64};
  for (auto& strides : q.strides) {
    strides[0] = 4 * 1024 * 64;
    strides[1] = 1024 * 64;
    strides[2] = 64;
  }
  q.aligned = true;
  q.cudnn_version = 91400;
  q.compute_capability = 90;
  return q;
}

TEST(AttentionEngine, SettingAndNames) {
  EngineSetting restore;
  EXPECT_EQ(nc::cuda::attention_engine(), AttentionEngine::Auto);  // the default
  for (AttentionEngine e : {AttentionEngine::Native, AttentionEngine::Cudnn, AttentionEngine::Auto}) {
    nc::cuda::set_attention_engine(e);
    EXPECT_EQ(nc::cuda::attention_engine(), e);
  }
  EXPECT_STREQ(nc::cuda::attention_engine_name(AttentionEngine::Auto), "auto");
  EXPECT_STREQ(nc::cuda::attention_engine_name(AttentionEngine::Native), "native");
  EXPECT_STREQ(nc::cuda::attention_engine_name(AttentionEngine::Cudnn), "cudnn");
  // A CPU pass records nothing; a thread that ran no CUDA pass reports Native.
  nc::scaled_dot_product_attention(nc::ones({1, 1, 2, 8}), nc::ones({1, 1, 2, 8}), nc::ones({1, 1, 2, 8}));
  if (!nc::cuda_is_available()) {
    EXPECT_EQ(nc::cuda::last_attention_engine(), AttentionEngine::Native);
    EXPECT_EQ(nc::cuda::last_attention_engine(AttentionPass::Backward), AttentionEngine::Native);
  }
}

TEST(AttentionEngine, WhenCudnnRuns) {
  struct Row {
    std::string name;
    std::function<void(AttentionEngineQuery&)> change;
    const char* refusal;  // a fragment of the reason, or nullptr: cuDNN runs the pass
  };
  const std::vector<Row> rows = {
      {"eligible", [](AttentionEngineQuery&) {}, nullptr},
      {"native selected", [](AttentionEngineQuery& q) { q.requested = AttentionEngine::Native; }, "native"},
      {"no cuDNN in the build", [](AttentionEngineQuery& q) { q.cudnn_version = 0; }, "without cuDNN"},
      {"cuDNN 9.10.1", [](AttentionEngineQuery& q) { q.cudnn_version = 91001; }, "9.10.0 and 9.10.1"},
      {"Turing", [](AttentionEngineQuery& q) { q.compute_capability = 75; }, "Ampere"},
      {"f32", [](AttentionEngineQuery& q) { q.dtype = DType::F32; }, "f16 and bf16"},
      {"f64", [](AttentionEngineQuery& q) { q.dtype = DType::F64; }, "f16 and bf16"},
      {"f16", [](AttentionEngineQuery& q) { q.dtype = DType::F16; }, nullptr},
      {"grouped-query", [](AttentionEngineQuery& q) { q.shape.kv_heads = 2; }, "grouped-query"},
      {"D 264", [](AttentionEngineQuery& q) { q.shape.D = q.shape.Dv = 264; }, "multiples of 8 up to 256"},
      {"D 256", [](AttentionEngineQuery& q) { q.shape.D = q.shape.Dv = 256; }, nullptr},
      {"D 40", [](AttentionEngineQuery& q) { q.shape.D = q.shape.Dv = 40; }, nullptr},
      {"Dv 36", [](AttentionEngineQuery& q) { q.shape.Dv = 36; }, "multiples of 8"},
      {"D 128, Dv 64", [](AttentionEngineQuery& q) { q.shape.D = 128; }, nullptr},
      {"no keys", [](AttentionEngineQuery& q) { q.shape.S = 0; }, "nothing"},
      {"unaligned pointer", [](AttentionEngineQuery& q) { q.aligned = false; }, "16-byte aligned"},
      {"row stride 72", [](AttentionEngineQuery& q) { q.strides[1][2] = 72; }, nullptr},
      {"row stride 66", [](AttentionEngineQuery& q) { q.strides[1][2] = 66; }, "multiple of 16 bytes"},
      {"broadcast batch", [](AttentionEngineQuery& q) { q.strides[2][0] = 0; }, "positive multiple"},
      {"packed qkv",
       [](AttentionEngineQuery& q) {
         for (auto& s : q.strides) s[0] = 1024 * 3 * 256, s[1] = 64, s[2] = 3 * 256;
       },
       nullptr},
      {"L = S = 1", [](AttentionEngineQuery& q) { q.shape.L = q.shape.S = 1; }, nullptr},
  };
  for (const Row& row : rows) {
    for (AttentionPass pass : {AttentionPass::Forward, AttentionPass::Backward}) {
      AttentionEngineQuery q = eligible(pass);
      row.change(q);
      const char* got = nc::kernels::cudnn_attention_refusal(q);
      SCOPED_TRACE(row.name + (pass == AttentionPass::Forward ? " forward" : " backward"));
      if (row.refusal == nullptr && !(row.name == "L = S = 1" && pass == AttentionPass::Backward)) {
        EXPECT_EQ(got, nullptr) << got;
      } else if (row.refusal != nullptr) {
        ASSERT_NE(got, nullptr);
        EXPECT_NE(std::string(got).find(row.refusal), std::string::npos) << got;
      }
    }
  }
  // The backward alone: Hopper only, not L = S = 1, S a multiple of 128 before cuDNN 9.16.
  AttentionEngineQuery q = eligible(AttentionPass::Backward);
  q.compute_capability = 80;
  EXPECT_NE(nc::kernels::cudnn_attention_refusal(q), nullptr);
  q.pass = AttentionPass::Forward;
  EXPECT_EQ(nc::kernels::cudnn_attention_refusal(q), nullptr);
  q = eligible(AttentionPass::Backward);
  q.shape.L = q.shape.S = 1;
  EXPECT_NE(nc::kernels::cudnn_attention_refusal(q), nullptr);
  q = eligible(AttentionPass::Backward);
  q.shape.S = 300;
  EXPECT_NE(std::string(nc::kernels::cudnn_attention_refusal(q)).find("9.16"), std::string::npos);
  q.cudnn_version = 91600;
  EXPECT_EQ(nc::kernels::cudnn_attention_refusal(q), nullptr);
  // Auto's backward at head dim 64 takes the Hopper kernels where they run, unless
  // deterministic; at other head dims, or without them, cuDNN.
  q = eligible(AttentionPass::Backward);
  q.requested = AttentionEngine::Auto;
  q.hopper_backward = true;
  EXPECT_NE(std::string(nc::kernels::cudnn_attention_refusal(q)).find("Hopper"), std::string::npos);
  q.deterministic = true;
  EXPECT_EQ(nc::kernels::cudnn_attention_refusal(q), nullptr);
  q.deterministic = false;
  q.shape.D = q.shape.Dv = 128;
  EXPECT_EQ(nc::kernels::cudnn_attention_refusal(q), nullptr);
  q.shape.D = q.shape.Dv = 64;
  q.hopper_backward = false;
  EXPECT_EQ(nc::kernels::cudnn_attention_refusal(q), nullptr);
  q.hopper_backward = true;
  q.requested = AttentionEngine::Cudnn;
  EXPECT_EQ(nc::kernels::cudnn_attention_refusal(q), nullptr);
  q = eligible(AttentionPass::Forward);
  q.requested = AttentionEngine::Auto;
  q.hopper_backward = true;
  EXPECT_EQ(nc::kernels::cudnn_attention_refusal(q), nullptr);  // the forward stays on cuDNN
  // Auto takes cuDNN from 2^21 scores (B * H * L * S) on, at any head dim it runs.
  for (int64_t head_dim : {128, 32}) {
    q = eligible(AttentionPass::Forward);
    q.requested = AttentionEngine::Auto;
    q.shape.D = q.shape.Dv = head_dim;
    q.shape.batch = 1, q.shape.L = 1024, q.shape.S = 512;  // 4 heads: 2^21 scores
    EXPECT_EQ(nc::kernels::cudnn_attention_refusal(q), nullptr) << head_dim;
    q.shape.S = 511;
    EXPECT_NE(std::string(nc::kernels::cudnn_attention_refusal(q)).find("Auto"), std::string::npos) << head_dim;
    q.requested = AttentionEngine::Cudnn;
    EXPECT_EQ(nc::kernels::cudnn_attention_refusal(q), nullptr) << head_dim;
  }
}

// ---- on the GPU ----

#ifdef NORMCORE_TEST_HAS_CUDNN

struct Case {
  std::string name;
  int64_t batch, heads, L, S, D, Dv;
  bool causal;
  bool packed = false;  // q, k, v as the GPT's views of one [B, T, 3 * H * D] projection
};

struct Pass {
  Tensor out, lse, grad_q, grad_k, grad_v;
};

Tensor random(const nc::Shape& shape, uint64_t seed, DType dtype) {
  nc::Generator gen(seed);
  return nc::randn(shape, DType::F64, &gen).to(dtype);
}

// q, k, v of a case in dtype on device (the packed views share one buffer).
std::vector<Tensor> operands(const Case& c, DType dtype, nc::Device device) {
  if (c.packed) {
    // [B, T, 3, H, D]: each view has the strides (T * 3C, D, 3C, 1) of the GPT's.
    Tensor qkv = random({c.batch, c.L, 3, c.heads, c.D}, 40, dtype).to(device);
    auto part = [&](int64_t i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };
    return {part(0), part(1), part(2)};
  }
  return {random({c.batch, c.heads, c.L, c.D}, 41, dtype).to(device),
          random({c.batch, c.heads, c.S, c.D}, 42, dtype).to(device),
          random({c.batch, c.heads, c.S, c.Dv}, 43, dtype).to(device)};
}

nc::kernels::AttentionShape shape_of(const Case& c) { return {c.batch, c.heads, c.L, c.S, c.D, c.Dv}; }

// The forward on `forward`'s engine, then the backward on `backward`'s from that forward's
// out and lse, through the kernels of q's device (the CPU's in f64 for the reference).
Pass run(const Case& c, const std::vector<Tensor>& in, const Tensor& grad_out, AttentionEngine forward,
         AttentionEngine backward) {
  const nc::Device device = in[0].device();
  const DType dtype = in[0].dtype();
  const nc::kernels::AttentionShape s = shape_of(c);
  const double scale = 1 / std::sqrt(static_cast<double>(c.D));
  const nc::TensorOptions options(dtype, device);
  Pass p;
  p.out = nc::empty({c.batch, c.heads, c.L, c.Dv}, options);
  p.lse = nc::empty({c.batch, c.heads, c.L}, nc::TensorOptions(nc::kernels::stats_dtype(device, dtype), device));
  p.grad_q = nc::empty({c.batch, c.heads, c.L, c.D}, options);
  p.grad_k = nc::empty({c.batch, c.heads, c.S, c.D}, options);
  p.grad_v = nc::empty({c.batch, c.heads, c.S, c.Dv}, options);
  const nc::kernels::AttentionKernels& kernels = nc::kernels::attention(device);
  nc::cuda::set_attention_engine(forward);
  kernels.attention_forward(in[0], in[1], in[2], s, c.causal, scale, p.out, p.lse);
  nc::cuda::set_attention_engine(backward);
  kernels.attention_backward(grad_out, in[0], in[1], in[2], p.out, p.lse, s, c.causal, scale, p.grad_q, p.grad_k,
                             p.grad_v);
  return p;
}

std::vector<double> values(const Tensor& t) {
  return t.to(nc::Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
}

// ||got - expected|| / ||expected||, the norm taken at least that of entries of 1e-3 (where
// the exact gradient vanishes, as grad_q and grad_k do with one visible key).
double relative_error(const Tensor& got, const Tensor& expected) {
  const std::vector<double> g = values(got), e = values(expected);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    diff += (g[i] - e[i]) * (g[i] - e[i]);
    norm += e[i] * e[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-6 * static_cast<double>(g.size())));
}

int compute_capability() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major * 10 + minor;
}

// Whether the rules send this case's pass to cuDNN on this machine.
bool cudnn_takes(const Case& c, const std::vector<Tensor>& in, AttentionPass pass) {
  AttentionEngineQuery q;
  q.requested = AttentionEngine::Cudnn;
  q.pass = pass;
  q.dtype = in[0].dtype();
  q.shape = shape_of(c);
  for (int i = 0; i < 3; ++i) {
    for (int d = 0; d < 3; ++d) q.strides[i][d] = in[i].stride(d);
  }
  q.aligned = true;
  q.cudnn_version = static_cast<int>(cudnnGetVersion());
  q.compute_capability = compute_capability();
  return nc::kernels::cudnn_attention_refusal(q) == nullptr;
}

const char* name(AttentionEngine e) { return nc::cuda::attention_engine_name(e); }

TEST(AttentionCudnn, MatchesNativeAndCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  EngineSetting restore;
  const nc::Device gpu = nc::Device::cuda();
  const std::vector<Case> cases = {
      {"D 64, 128 keys", 2, 3, 128, 128, 64, 64, false},
      {"D 64, 128 keys, causal", 2, 3, 128, 128, 64, 64, true},
      {"D 128, L 300 > S 256, causal", 1, 2, 300, 256, 128, 128, true},
      {"D 128, L 77 < S 256", 1, 2, 77, 256, 128, 128, false},
      {"D 64, L = S = 77, causal", 2, 2, 77, 77, 64, 64, true},
      {"D 128, L = S = 300", 1, 2, 300, 300, 128, 128, false},
      {"one query, one key", 3, 2, 1, 1, 64, 64, false},
      {"one query, 300 keys, causal", 2, 2, 1, 300, 128, 128, true},
      {"D 128, Dv 64", 1, 2, 128, 256, 128, 64, true},
      {"packed qkv D 64, T 256, causal", 2, 4, 256, 256, 64, 64, true, true},
      {"packed qkv D 128, T 77, causal", 1, 3, 77, 77, 128, 128, true, true},
      {"D 256, causal", 1, 2, 256, 256, 256, 256, true},
      {"D 256, L 77 < S 256", 1, 2, 77, 256, 256, 256, false},
  };
  const AttentionEngine engines[2] = {AttentionEngine::Native, AttentionEngine::Cudnn};
  for (const Case& c : cases) {
    for (DType dtype : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype));
      const std::vector<Tensor> in = operands(c, dtype, gpu);
      const Tensor grad_out = random({c.batch, c.heads, c.L, c.Dv}, 44, dtype).to(gpu);
      // The reference: the CPU kernels in f64 on the same (rounded) values.
      std::vector<Tensor> in64;
      for (const Tensor& t : in) in64.push_back(t.to(nc::Device::cpu()).to(DType::F64));
      const Pass ref =
          run(c, in64, grad_out.to(nc::Device::cpu()).to(DType::F64), AttentionEngine::Native, AttentionEngine::Native);
      // Relative L2 error: bf16 keeps 8 bits, f16 11; both engines round p to the dtype.
      const double tol = dtype == DType::BF16 ? 1e-2 : 5e-3;
      for (AttentionEngine forward : engines) {
        for (AttentionEngine backward : engines) {
          const Pass p = run(c, in, grad_out, forward, backward);
          const bool fwd_cudnn = forward == AttentionEngine::Cudnn && cudnn_takes(c, in, AttentionPass::Forward);
          const bool bwd_cudnn = backward == AttentionEngine::Cudnn && cudnn_takes(c, in, AttentionPass::Backward);
          EXPECT_EQ(nc::cuda::last_attention_engine(), fwd_cudnn ? AttentionEngine::Cudnn : AttentionEngine::Native);
          EXPECT_EQ(nc::cuda::last_attention_engine(AttentionPass::Backward),
                    bwd_cudnn ? AttentionEngine::Cudnn : AttentionEngine::Native);
          const double errors[5] = {relative_error(p.out, ref.out), relative_error(p.grad_q, ref.grad_q),
                                    relative_error(p.grad_k, ref.grad_k), relative_error(p.grad_v, ref.grad_v),
                                    relative_error(p.lse, ref.lse)};
          std::printf("[ cudnn    ] %-34s %-4s fwd %-6s bwd %-6s  out %.1e  dq %.1e  dk %.1e  dv %.1e  lse %.1e\n",
                      c.name.c_str(), nc::dtype_name(dtype), name(nc::cuda::last_attention_engine()),
                      name(nc::cuda::last_attention_engine(AttentionPass::Backward)), errors[0], errors[1], errors[2],
                      errors[3], errors[4]);
          const char* what[5] = {"out", "grad_q", "grad_k", "grad_v", "lse"};
          for (int i = 0; i < 4; ++i) {
            EXPECT_LT(errors[i], tol) << what[i] << " fwd " << name(forward) << " bwd " << name(backward);
          }
          // Both engines compute the log-sum-exp in f32 from the same inputs.
          EXPECT_LT(errors[4], 1e-5) << "lse fwd " << name(forward);
        }
      }
    }
  }
}

// Other dtypes and grouped-query attention run on the native kernels even when cuDNN is asked for.
TEST(AttentionCudnn, FallsBackToNative) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  EngineSetting restore;
  nc::cuda::set_attention_engine(AttentionEngine::Cudnn);
  const nc::Device gpu = nc::Device::cuda();
  const nc::TensorOptions bf16(DType::BF16, gpu);
  nc::scaled_dot_product_attention(nc::ones({1, 2, 128, 64}, bf16), nc::ones({1, 2, 128, 64}, bf16),
                                   nc::ones({1, 2, 128, 64}, bf16));
  EXPECT_EQ(nc::cuda::last_attention_engine(), AttentionEngine::Cudnn);
  const nc::TensorOptions f32(DType::F32, gpu);
  nc::scaled_dot_product_attention(nc::ones({1, 2, 128, 64}, f32), nc::ones({1, 2, 128, 64}, f32),
                                   nc::ones({1, 2, 128, 64}, f32));
  EXPECT_EQ(nc::cuda::last_attention_engine(), AttentionEngine::Native);
  Tensor out = nc::scaled_dot_product_attention(nc::ones({1, 4, 128, 64}, bf16), nc::ones({1, 2, 128, 64}, bf16),
                                                nc::ones({1, 2, 128, 64}, bf16), false, std::nullopt, true);
  EXPECT_EQ(nc::cuda::last_attention_engine(), AttentionEngine::Native);
  EXPECT_EQ(values(out), std::vector<double>(4 * 128 * 64, 1.0));
  nc::scaled_dot_product_attention(nc::ones({1, 1, 16, 72}, bf16), nc::ones({1, 1, 16, 72}, bf16),
                                   nc::ones({1, 1, 16, 36}, bf16));
  EXPECT_EQ(nc::cuda::last_attention_engine(), AttentionEngine::Native);  // Dv 36
  // Auto: cuDNN where it runs on 2^21 scores or more, the native kernels for the rest.
  nc::cuda::set_attention_engine(AttentionEngine::Auto);
  nc::scaled_dot_product_attention(nc::ones({1, 2, 1024, 64}, bf16), nc::ones({1, 2, 1024, 64}, bf16),
                                   nc::ones({1, 2, 1024, 64}, bf16), true);
  EXPECT_EQ(nc::cuda::last_attention_engine(), AttentionEngine::Cudnn);
  nc::scaled_dot_product_attention(nc::ones({1, 2, 64, 64}, bf16), nc::ones({1, 2, 64, 64}, bf16),
                                   nc::ones({1, 2, 64, 64}, bf16), true);
  EXPECT_EQ(nc::cuda::last_attention_engine(), AttentionEngine::Native);
  // Auto's backward: at head dim 64 the native kernels (Hopper's, or before Hopper, where
  // cuDNN's backward does not run); at 128 cuDNN's on Hopper.
  for (int64_t head_dim : {64, 128}) {
    Tensor q = nc::ones({1, 2, 1024, head_dim}, bf16).requires_grad_();
    nc::sum(nc::scaled_dot_product_attention(q, nc::ones({1, 2, 1024, head_dim}, bf16),
                                             nc::ones({1, 2, 1024, head_dim}, bf16), true))
        .backward();
    const bool hopper = compute_capability() == 90;
    EXPECT_EQ(nc::cuda::last_attention_engine(AttentionPass::Backward),
              head_dim == 128 && hopper ? AttentionEngine::Cudnn : AttentionEngine::Native)
        << head_dim;
  }
  nc::scaled_dot_product_attention(nc::ones({1, 2, 1024, 64}, f32), nc::ones({1, 2, 1024, 64}, f32),
                                   nc::ones({1, 2, 1024, 64}, f32), true);
  EXPECT_EQ(nc::cuda::last_attention_engine(), AttentionEngine::Native);
  // Native when asked for, even where cuDNN would run.
  nc::cuda::set_attention_engine(AttentionEngine::Native);
  nc::scaled_dot_product_attention(nc::ones({1, 2, 1024, 64}, bf16), nc::ones({1, 2, 1024, 64}, bf16),
                                   nc::ones({1, 2, 1024, 64}, bf16), true);
  EXPECT_EQ(nc::cuda::last_attention_engine(), AttentionEngine::Native);
}

// cuDNN's backward in its dP-workspace form gives the same bits twice, at a size where the
// form with an atomic dQ accumulator does not.
TEST(AttentionCudnn, BackwardIsDeterministic) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  EngineSetting restore;
  const Case c{"gpt-2 small", 8, 12, 1024, 1024, 64, 64, true, true};
  const std::vector<Tensor> in = operands(c, DType::BF16, nc::Device::cuda());
  if (!cudnn_takes(c, in, AttentionPass::Backward)) GTEST_SKIP() << "cuDNN's backward does not run here";
  const Tensor grad_out = random({c.batch, c.heads, c.L, c.Dv}, 45, DType::BF16).to(nc::Device::cuda());
  const Pass a = run(c, in, grad_out, AttentionEngine::Cudnn, AttentionEngine::Cudnn);
  EXPECT_EQ(nc::cuda::last_attention_engine(AttentionPass::Backward), AttentionEngine::Cudnn);
  const Pass b = run(c, in, grad_out, AttentionEngine::Cudnn, AttentionEngine::Cudnn);
  EXPECT_EQ(values(a.out), values(b.out));
  EXPECT_EQ(values(a.grad_q), values(b.grad_q));
  EXPECT_EQ(values(a.grad_k), values(b.grad_k));
  EXPECT_EQ(values(a.grad_v), values(b.grad_v));
}

// A forward and backward on cuDNN captured in a CUDA graph and replayed on new values; a shape
// first seen inside the capture runs on the native kernels there.
TEST(AttentionCudnn, CapturedInACudaGraph) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  EngineSetting restore;
  const nc::Device gpu = nc::Device::cuda();
  for (int64_t L : {256, 384}) {
    const Case c{"captured", 2, 4, L, L, 64, 64, true, true};
    std::vector<Tensor> in = operands(c, DType::BF16, gpu);
    const Tensor grad_out = random({c.batch, c.heads, c.L, c.Dv}, 46, DType::BF16).to(gpu);
    const bool warm = L == 256;  // 384: no plan before the capture
    if (warm) run(c, in, grad_out, AttentionEngine::Cudnn, AttentionEngine::Cudnn);
    Pass captured;
    nc::cuda::Graph graph;
    graph.capture(0, [&] { captured = run(c, in, grad_out, AttentionEngine::Cudnn, AttentionEngine::Cudnn); });
    const AttentionEngine expected =
        warm && cudnn_takes(c, in, AttentionPass::Forward) ? AttentionEngine::Cudnn : AttentionEngine::Native;
    EXPECT_EQ(nc::cuda::last_attention_engine(), expected) << "L " << L;
    // New values in place (q, k, v are views of one buffer), then a replay.
    for (int i = 0; i < 3; ++i) in[i].copy_(random(in[i].shape(), 50 + i, DType::BF16).to(gpu));
    graph.replay();
    graph.synchronize();
    // The same engines uncaptured give the same bits.
    const AttentionEngine backward =
        warm && cudnn_takes(c, in, AttentionPass::Backward) ? AttentionEngine::Cudnn : AttentionEngine::Native;
    const Pass direct = run(c, in, grad_out, expected, backward);
    EXPECT_EQ(nc::cuda::last_attention_engine(AttentionPass::Backward), backward);
    EXPECT_EQ(values(captured.out), values(direct.out)) << "L " << L;
    EXPECT_EQ(values(captured.lse), values(direct.lse)) << "L " << L;
    EXPECT_EQ(values(captured.grad_q), values(direct.grad_q)) << "L " << L;
    EXPECT_EQ(values(captured.grad_k), values(direct.grad_k)) << "L " << L;
    EXPECT_EQ(values(captured.grad_v), values(direct.grad_v)) << "L " << L;
  }
}

#endif  // NORMCORE_TEST_HAS_CUDNN

}  // namespace
