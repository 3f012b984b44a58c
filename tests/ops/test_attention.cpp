// scaled_dot_product_attention (normcore/attention.h): the CPU kernels against the same math
// composed of matmul, masked_fill and softmax (the value and every gradient, through
// autograd), float64 gradchecks and argument errors; then the CUDA kernels against the CPU
// in f64, f32, f16 and bf16 at shapes that reach every path: head dims 32, 64, 128, 256 and
// odd ones (past 128: the row kernels for f32, matrix products for the f16/bf16 backward), lengths that are not multiples of a tile, L != S, causal, q, k and v as strided
// views of one packed qkv buffer, one query, no keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

Tensor random(const nc::Shape& shape, uint64_t seed, DType dtype = DType::F64) {
  nc::Generator gen(seed);
  return nc::randn(shape, DType::F64, &gen).to(dtype);
}

std::vector<double> values(const Tensor& t) {
  return t.to(nc::Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
}

// softmax(q k^T * scale, masked j > i when causal) v with generic ops.
Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  Tensor scores = nc::matmul(q, k.transpose(2, 3)) * scale;
  if (causal) {
    const int64_t L = q.size(2), S = k.size(2);
    Tensor rows = nc::arange(L, DType::I64).view({L, 1});
    Tensor columns = nc::arange(S, DType::I64).view({1, S});
    scores = nc::masked_fill(scores, nc::gt(columns, rows), -std::numeric_limits<double>::infinity());
  }
  return nc::matmul(nc::softmax(scores, -1), v);
}

void expect_close(const Tensor& got, const Tensor& expected, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), expected.shape()) << what;
  const std::vector<double> g = values(got), e = values(expected);
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(std::isfinite(g[i])) << what << " at " << i;
    ASSERT_NEAR(g[i], e[i], tol * (1 + std::fabs(e[i]))) << what << " at " << i << " of " << g.size();
  }
}

struct Case {
  std::string name;
  int64_t batch, heads, L, S, D, Dv;
  bool causal;
  bool packed = false;     // q, k, v as views of one [B, L, 3, H, D] buffer (needs L == S, D == Dv)
  int64_t kv_heads = 0;    // k's and v's heads with enable_gqa (a divisor of heads); 0: heads, no gqa
  bool packed_op = false;  // packed: through packed_self_attention rather than on the views

  bool gqa() const { return kv_heads != 0; }
};

// k or v of kv_heads heads with each head repeated for the group of q heads it serves: the
// plain attention that grouped-query attention equals (gradients summed back by autograd).
Tensor repeat_heads(const Tensor& t, int64_t heads) {
  const int64_t kv_heads = t.size(1), group = heads / kv_heads;
  return t.unsqueeze(2)
      .expand({t.size(0), kv_heads, group, t.size(2), t.size(3)})
      .reshape({t.size(0), heads, t.size(2), t.size(3)});
}

Tensor fused_attention(const Case& c, const std::vector<Tensor>& in) {
  if (c.packed_op) return nc::packed_self_attention(in[3], c.causal).transpose(1, 2);
  return nc::scaled_dot_product_attention(in[0], in[1], in[2], c.causal, std::nullopt, c.gqa());
}

// q, k, v for a case in dtype on device, each a leaf that requires grad (the packed buffer's
// views share one leaf, returned as the fourth tensor).
std::vector<Tensor> inputs(const Case& c, DType dtype, nc::Device device, uint64_t seed) {
  if (c.packed) {
    Tensor qkv = random({c.batch, c.L, 3, c.heads, c.D}, seed, dtype).to(device).requires_grad_();
    auto part = [&](int64_t i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };
    return {part(0), part(1), part(2), qkv};
  }
  const int64_t kv_heads = c.gqa() ? c.kv_heads : c.heads;
  return {random({c.batch, c.heads, c.L, c.D}, seed, dtype).to(device).requires_grad_(),
          random({c.batch, kv_heads, c.S, c.D}, seed + 1, dtype).to(device).requires_grad_(),
          random({c.batch, kv_heads, c.S, c.Dv}, seed + 2, dtype).to(device).requires_grad_()};
}

// The leaves whose gradients a case checks.
std::vector<Tensor> leaves(const Case& c, const std::vector<Tensor>& in) {
  return c.packed ? std::vector<Tensor>{in[3]} : std::vector<Tensor>{in[0], in[1], in[2]};
}

TEST(Attention, CpuMatchesComposedOps) {
  const std::vector<Case> cases = {
      {"basic", 2, 3, 5, 5, 4, 4, false},
      {"causal", 2, 2, 6, 6, 3, 3, true},
      {"L < S", 1, 2, 3, 7, 5, 2, false},
      {"L < S causal", 1, 2, 3, 7, 5, 2, true},
      {"L > S causal", 1, 1, 7, 3, 4, 6, true},
      {"one query", 3, 1, 1, 9, 8, 8, true},
      {"packed qkv", 2, 2, 5, 5, 4, 4, true, true},
      {"packed op", 2, 3, 5, 5, 4, 4, false, true, 0, true},
      {"packed op causal", 1, 2, 7, 7, 3, 3, true, true, 0, true},
      {"grouped-query, 2 q heads a k head", 2, 4, 5, 6, 4, 3, false, false, 2},
      {"grouped-query causal, 3 q heads a k head", 1, 6, 7, 7, 5, 5, true, false, 2},
      {"multi-query", 2, 3, 4, 5, 4, 4, true, false, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const double scale = 1 / std::sqrt(static_cast<double>(c.D));
    std::vector<Tensor> a = inputs(c, DType::F64, nc::Device::cpu(), 1);
    std::vector<Tensor> b = inputs(c, DType::F64, nc::Device::cpu(), 1);
    Tensor fused = fused_attention(c, a);
    Tensor composed =
        c.gqa() ? composed_attention(b[0], repeat_heads(b[1], c.heads), repeat_heads(b[2], c.heads), c.causal, scale)
                : composed_attention(b[0], b[1], b[2], c.causal, scale);
    if (!c.packed_op) EXPECT_EQ(fused.grad_fn_name(), "scaled_dot_product_attention");
    expect_close(fused, composed, 1e-12, "out");
    Tensor grad = random(fused.shape(), 9);
    fused.backward(grad);
    composed.backward(grad);
    const std::vector<Tensor> la = leaves(c, a), lb = leaves(c, b);
    for (size_t i = 0; i < la.size(); ++i) expect_close(la[i].grad(), lb[i].grad(), 1e-12, "grad " + std::to_string(i));
  }
}

// The f32, f16 and bf16 CPU kernels (blocks of 64 query rows as f32 products) against the
// f64 reference on the same values: several blocks, causal with L > S and L < S, GQA, odd
// dims, the packed op.
TEST(Attention, CpuBlockedKernelsMatchTheF64Reference) {
  const std::vector<Case> cases = {
      {"three blocks causal", 2, 3, 150, 150, 16, 16, true},
      {"L < S causal, odd dims", 1, 2, 70, 131, 12, 7, true},
      {"L > S causal", 1, 2, 200, 40, 8, 8, true},
      {"grouped-query", 2, 4, 65, 90, 8, 8, false, false, 2},
      {"packed op causal", 1, 2, 100, 100, 8, 8, true, true, 0, true},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype));
      std::vector<Tensor> low = inputs(c, dtype, nc::Device::cpu(), 40);
      std::vector<Tensor> reference;  // the same values in f64
      for (const Tensor& t : low) reference.push_back(t.detach().to(DType::F64).requires_grad_());
      if (c.packed) {
        const Tensor& qkv = reference[3];
        for (int64_t i = 0; i < 3; ++i) reference[i] = qkv.select(2, i).permute({0, 2, 1, 3});
      }
      const Tensor out = fused_attention(c, low), expected = fused_attention(c, reference);
      const double tol = dtype == DType::F32 ? 1e-5 : 2e-2;
      expect_close(out, expected, tol, "out");
      const Tensor grad = random(out.shape(), 41, dtype);
      out.backward(grad);
      expected.backward(grad.to(DType::F64));
      const std::vector<Tensor> la = leaves(c, low), lb = leaves(c, reference);
      for (size_t i = 0; i < la.size(); ++i)
        expect_close(la[i].grad(), lb[i].grad(), 4 * tol, "grad " + std::to_string(i));
    }
  }
}

TEST(Attention, ScaleAndDtypes) {
  Tensor q = random({1, 2, 4, 8}, 3), k = random({1, 2, 6, 8}, 4), v = random({1, 2, 6, 3}, 5);
  expect_close(nc::scaled_dot_product_attention(q, k, v, false, 0.7), composed_attention(q, k, v, false, 0.7), 1e-12,
               "scale 0.7");
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    Tensor out = nc::scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), true);
    EXPECT_EQ(out.dtype(), dtype);
    expect_close(out,
                 composed_attention(q.to(dtype).to(DType::F64), k.to(dtype).to(DType::F64), v.to(dtype).to(DType::F64),
                                    true, 1 / std::sqrt(8.0)),
                 dtype == DType::F32 ? 1e-6 : 1e-2, nc::dtype_name(dtype));
  }
}

TEST(Attention, NoKeysGivesZeros) {
  Tensor q = random({2, 1, 3, 4}, 6).requires_grad_();
  Tensor k = random({2, 1, 0, 4}, 7).requires_grad_(), v = random({2, 1, 0, 5}, 8).requires_grad_();
  Tensor out = nc::scaled_dot_product_attention(q, k, v);
  EXPECT_EQ(out.shape(), (nc::Shape{2, 1, 3, 5}));
  EXPECT_EQ(values(out), std::vector<double>(30, 0.0));
  out.backward(nc::ones_like(out));
  EXPECT_EQ(values(q.grad()), std::vector<double>(24, 0.0));
}

TEST(Attention, Gradcheck) {
  for (bool causal : {false, true}) {
    auto fn = [causal](const std::vector<Tensor>& in) {
      return nc::scaled_dot_product_attention(in[0], in[1], in[2], causal);
    };
    std::string report;
    EXPECT_TRUE(nc::gradcheck(fn,
                              {random({2, 2, 4, 3}, 10).requires_grad_(), random({2, 2, 5, 3}, 11).requires_grad_(),
                               random({2, 2, 5, 2}, 12).requires_grad_()},
                              {}, &report))
        << "causal " << causal << ": " << report;
    // Grouped-query: 4 q heads over 2 k, v heads.
    auto gqa = [causal](const std::vector<Tensor>& in) {
      return nc::scaled_dot_product_attention(in[0], in[1], in[2], causal, std::nullopt, true);
    };
    EXPECT_TRUE(nc::gradcheck(gqa,
                              {random({1, 4, 4, 3}, 13).requires_grad_(), random({1, 2, 5, 3}, 14).requires_grad_(),
                               random({1, 2, 5, 2}, 15).requires_grad_()},
                              {}, &report))
        << "grouped-query, causal " << causal << ": " << report;
  }
}

TEST(Attention, PackedGradcheckAndOneNode) {
  for (bool causal : {false, true}) {
    auto fn = [causal](const std::vector<Tensor>& in) { return nc::packed_self_attention(in[0], causal); };
    std::string report;
    EXPECT_TRUE(nc::gradcheck(fn, {random({2, 4, 3, 2, 3}, 16).requires_grad_()}, {}, &report))
        << "causal " << causal << ": " << report;
  }
  // One node, the output in [B, L, H, D], the gradient as one tensor of qkv's shape.
  Tensor qkv = random({2, 5, 3, 4, 6}, 17).requires_grad_();
  Tensor out = nc::packed_self_attention(qkv, true);
  EXPECT_EQ(out.grad_fn_name(), "packed_self_attention");
  EXPECT_EQ(out.shape(), (nc::Shape{2, 5, 4, 6}));
  EXPECT_TRUE(out.is_contiguous());
  out.backward(nc::ones_like(out));
  EXPECT_EQ(qkv.grad().shape(), qkv.shape());
  // qkv as a view of a wider buffer (rows 12 apart) gives what a contiguous copy gives.
  Tensor wide = random({2, 5, 3, 4, 12}, 18);
  Tensor strided = wide.narrow(4, 0, 6);
  expect_close(nc::packed_self_attention(strided, false), nc::packed_self_attention(strided.contiguous(), false), 1e-12,
               "strided qkv");
  using normcore_test::throws;
  throws<nc::ShapeError>(
      [&] {
        nc::packed_self_attention(nc::zeros({2, 5, 2, 4, 6}));
      },
      {"packed_self_attention", "qkv", "[B, L, 3, H, D]", "[2, 5, 2, 4, 6]"})();
  throws<nc::DTypeError>(
      [&] {
        nc::packed_self_attention(nc::zeros({1, 2, 3, 1, 4}, nc::TensorOptions(DType::I64)));
      },
      {"packed_self_attention", "floating"})();
}

TEST(Attention, ErrorsNameTheArgument) {
  Tensor q = nc::zeros({1, 2, 3, 4}), k = nc::zeros({1, 2, 5, 4}), v = nc::zeros({1, 2, 5, 6});
  auto expect_message = [](const std::function<void()>& call, const std::vector<std::string>& fragments) {
    try {
      call();
      ADD_FAILURE() << "no error for " << fragments[0];
    } catch (const nc::Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("scaled_dot_product_attention"), std::string::npos) << message;
      for (const std::string& f : fragments) EXPECT_NE(message.find(f), std::string::npos) << f << " in " << message;
    }
  };
  expect_message([&] { nc::scaled_dot_product_attention(nc::zeros({2, 3, 4}), k, v); }, {"q", "4-D", "[2, 3, 4]"});
  expect_message(
      [&] {
        nc::scaled_dot_product_attention(q, nc::zeros({1, 2, 5, 3}), v);
      },
      {"head dim", "[1, 2, 5, 3]"});
  expect_message(
      [&] {
        nc::scaled_dot_product_attention(q, k, nc::zeros({1, 2, 4, 6}));
      },
      {"key count", "[1, 2, 4, 6]"});
  expect_message(
      [&] {
        nc::scaled_dot_product_attention(q, nc::zeros({1, 3, 5, 4}), nc::zeros({1, 3, 5, 6}));
      },
      {"q's head count 2", "[1, 3, 5, 4]", "enable_gqa"});
  expect_message(
      [&] {
        nc::scaled_dot_product_attention(q, nc::zeros({1, 1, 5, 4}), nc::zeros({1, 1, 5, 6}));
      },
      {"q's head count 2", "[1, 1, 5, 4]", "enable_gqa"});
  expect_message(
      [&] {
        nc::scaled_dot_product_attention(q, k, nc::zeros({1, 1, 5, 6}), false, std::nullopt, true);
      },
      {"k and v must have the same head count", "[1, 1, 5, 6]"});
  expect_message(
      [&] {
        nc::scaled_dot_product_attention(nc::zeros({1, 3, 3, 4}), k, nc::zeros({1, 2, 5, 6}), false, std::nullopt,
                                         true);
      },
      {"multiple of k's and v's", "[1, 3, 3, 4]"});
  expect_message(
      [&] {
        nc::scaled_dot_product_attention(q, nc::zeros({2, 2, 5, 4}), v);
      },
      {"batch dim 1", "[2, 2, 5, 4]"});
  expect_message([&] { nc::scaled_dot_product_attention(q, k.to(DType::F64), v); }, {"k", "f64", "share a dtype"});
  expect_message([&] { nc::scaled_dot_product_attention(q.to(DType::I64), k, v); }, {"q", "floating", "i64"});
  expect_message([&] { nc::scaled_dot_product_attention(q, k, v, false, std::nan("")); }, {"scale"});
  EXPECT_THROW(nc::scaled_dot_product_attention(Tensor(), k, v), nc::Error);
}

// ---- CUDA against the CPU ----

double cuda_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-10;
    case DType::F32: return 1e-4;
    case DType::F16: return 1e-2;
    default: return 4e-2;
  }
}

void run_cuda_case(const Case& c, DType dtype) {
  SCOPED_TRACE(c.name + " " + nc::dtype_name(dtype));
  std::vector<Tensor> cpu = inputs(c, dtype, nc::Device::cpu(), 20);
  std::vector<Tensor> gpu = inputs(c, dtype, nc::Device::cuda(), 20);
  Tensor cpu_out = fused_attention(c, cpu);
  Tensor gpu_out = fused_attention(c, gpu);
  ASSERT_TRUE(gpu_out.device().is_cuda());
  const double tol = cuda_tolerance(dtype);
  expect_close(gpu_out, cpu_out, tol, "out");
  Tensor grad = random(cpu_out.shape(), 21, dtype);
  cpu_out.backward(grad);
  gpu_out.backward(grad.to(nc::Device::cuda()));
  const std::vector<Tensor> lc = leaves(c, cpu), lg = leaves(c, gpu);
  // Gradients sum over a whole row or column of keys: a few times the value tolerance.
  for (size_t i = 0; i < lc.size(); ++i) expect_close(lg[i].grad(), lc[i].grad(), 4 * tol, "grad " + std::to_string(i));
}

TEST(AttentionCuda, MatchesCpuOnEveryPath) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Case> cases = {
      {"D 64, one tile", 2, 2, 64, 64, 64, 64, false},
      {"D 64 causal, tails", 1, 3, 130, 130, 64, 64, true},
      {"D 32, L < S", 2, 1, 17, 257, 32, 32, false},
      {"D 128 causal, L < S", 1, 2, 64, 130, 128, 128, true},
      {"D 128 causal, L > S", 1, 2, 257, 64, 128, 128, true},
      {"odd dims", 2, 2, 33, 47, 40, 24, false},
      {"odd dims causal", 1, 2, 47, 47, 40, 24, true},
      {"one query", 3, 2, 1, 100, 64, 64, false},
      {"one key", 1, 2, 9, 1, 64, 64, false},
      {"packed qkv", 2, 3, 77, 77, 64, 64, true, true},
      {"grouped-query D 64 causal", 2, 8, 130, 130, 64, 64, true, false, 2},
      {"grouped-query D 128, L < S", 1, 6, 65, 200, 128, 128, false, false, 3},
      {"multi-query odd dims", 2, 4, 33, 47, 40, 24, false, false, 1},
      {"packed qkv D 128", 1, 2, 200, 200, 128, 128, false, true},
      {"packed op D 64 causal, tails", 2, 3, 77, 77, 64, 64, true, true, 0, true},
      {"packed op D 128", 1, 2, 200, 200, 128, 128, false, true, 0, true},
      {"packed op odd dim, one token", 3, 2, 1, 1, 40, 40, true, true, 0, true},
      {"packed op D 32", 2, 4, 130, 130, 32, 32, false, true, 0, true},
      {"D 256 causal, tails", 1, 2, 130, 130, 256, 256, true},
      {"D 256, L < S", 1, 2, 65, 200, 256, 256, false},
      {"odd dims past 128", 1, 2, 33, 47, 200, 136, false},
      {"grouped-query D 256 causal", 1, 4, 70, 70, 256, 256, true, false, 2},
      {"packed op D 256", 1, 2, 77, 77, 256, 256, true, true, 0, true},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::F64, DType::F32, DType::F16, DType::BF16}) run_cuda_case(c, dtype);
  }
}

TEST(AttentionCuda, NoKeysAndEmpty) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda();
  Tensor out = nc::scaled_dot_product_attention(nc::ones({1, 2, 3, 64}, gpu), nc::ones({1, 2, 0, 64}, gpu),
                                                nc::ones({1, 2, 0, 64}, gpu));
  EXPECT_EQ(values(out), std::vector<double>(384, 0.0));
  EXPECT_EQ(nc::scaled_dot_product_attention(nc::ones({0, 2, 3, 64}, gpu), nc::ones({0, 2, 5, 64}, gpu),
                                             nc::ones({0, 2, 5, 64}, gpu))
                .shape(),
            (nc::Shape{0, 2, 3, 64}));
  EXPECT_THROW(nc::scaled_dot_product_attention(nc::ones({1, 1, 2, 264}, gpu), nc::ones({1, 1, 2, 264}, gpu),
                                                nc::ones({1, 1, 2, 264}, gpu)),
               nc::ShapeError);
  // With no keys the backward at head dim 256 (matrix products elsewhere) gives zero gradients.
  Tensor q = nc::ones({1, 2, 3, 256}, gpu).to(DType::BF16).requires_grad_();
  Tensor kv = nc::ones({1, 2, 0, 256}, gpu).to(DType::BF16).requires_grad_();
  nc::sum(nc::scaled_dot_product_attention(q, kv, kv)).backward();
  EXPECT_EQ(values(q.grad()), std::vector<double>(1536, 0.0));
}

// No atomics in the backward: two runs give the same bits.
// Under cuda::set_deterministic(true) (the Hopper kernels' fast backward sums grad_q with
// atomics otherwise).
TEST(AttentionCuda, BackwardIsDeterministic) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const bool was = nc::cuda::deterministic();
  nc::cuda::set_deterministic(true);
  struct Restore {
    bool was;
    ~Restore() { nc::cuda::set_deterministic(was); }
  } restore{was};
  const Case c{"deterministic", 2, 4, 300, 300, 64, 64, true};
  std::vector<Tensor> a = inputs(c, DType::BF16, nc::Device::cuda(), 30),
                      b = inputs(c, DType::BF16, nc::Device::cuda(), 30);
  Tensor grad = random({2, 4, 300, 64}, 31, DType::BF16).to(nc::Device::cuda());
  nc::scaled_dot_product_attention(a[0], a[1], a[2], true).backward(grad);
  nc::scaled_dot_product_attention(b[0], b[1], b[2], true).backward(grad);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(values(a[i].grad()), values(b[i].grad())) << "grad " << i;
}

// The gradients of attention over contiguous [BH, L, D] q, [BH, S, D] k, [BH, S, Dv] v for
// upstream grad_out, in long double (three more digits than double): the exact reference of
// the test below. Softmax from the row max, delta = sum_j p_j dp_j.
std::vector<std::vector<long double>> long_double_grads(const std::vector<double>& q, const std::vector<double>& k,
                                                        const std::vector<double>& v,
                                                        const std::vector<double>& grad_out, int64_t heads, int64_t L,
                                                        int64_t S, int64_t D, int64_t Dv, bool causal,
                                                        long double scale) {
  std::vector<long double> gq(q.size()), gk(k.size()), gv(v.size()), p(S), dp(S);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < L; ++i) {
      const int64_t keys = causal ? std::min(i + 1, S) : S;
      const double* qi = &q[(h * L + i) * D];
      const double* doi = &grad_out[(h * L + i) * Dv];
      long double max = -INFINITY, sum = 0, delta = 0;
      for (int64_t j = 0; j < keys; ++j) {
        long double score = 0;
        for (int64_t d = 0; d < D; ++d) score += static_cast<long double>(qi[d]) * k[(h * S + j) * D + d];
        p[j] = score * scale;
        max = std::max(max, p[j]);
      }
      for (int64_t j = 0; j < keys; ++j) sum += (p[j] = std::exp(p[j] - max));
      for (int64_t j = 0; j < keys; ++j) {
        p[j] /= sum;
        dp[j] = 0;
        for (int64_t d = 0; d < Dv; ++d) dp[j] += static_cast<long double>(doi[d]) * v[(h * S + j) * Dv + d];
        delta += p[j] * dp[j];
      }
      for (int64_t j = 0; j < keys; ++j) {
        const long double ds = p[j] * (dp[j] - delta) * scale;
        for (int64_t d = 0; d < D; ++d) {
          gq[(h * L + i) * D + d] += ds * k[(h * S + j) * D + d];
          gk[(h * S + j) * D + d] += ds * qi[d];
        }
        for (int64_t d = 0; d < Dv; ++d) gv[(h * S + j) * Dv + d] += p[j] * doi[d];
      }
    }
  }
  return {gq, gk, gv};
}

// max |got - exact| / max |exact| over a gradient.
double normwise_error(const Tensor& got, const std::vector<long double>& exact) {
  const std::vector<double> g = values(got);
  long double err = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    err = std::max(err, std::fabs(g[i] - exact[i]));
    scale = std::max(scale, std::fabs(exact[i]));
  }
  return static_cast<double>(err / scale);
}

// A saturated softmax in f64 (scores up to about 100): every gradient on every device is as
// close to the exact one as the math PyTorch runs in f64 (softmax from the row max and its
// backward, here composed of normcore's matmul and softmax on the CPU), within 4 times its
// error or 32 units in the last place of the largest element (rounding that differs, an FMA
// here, a tree sum there, moves a gradient without cancellation by a few units).
// Probabilities taken through the saved log-sum-exp, and delta as rowsum(grad_out * out),
// put grad_q and grad_k 7 to 11 times further off than the math (2e-14 to 5e-14).
TEST(Attention, SaturatedSoftmaxGradientsInF64AreAsExactAsPyTorchs) {
  const int64_t heads = 4, L = 6, S = 9, D = 8, Dv = 8;
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    const Tensor q = random({1, heads, L, D}, 50) * 30.0, k = random({1, heads, S, D}, 51),
                 v = random({1, heads, S, Dv}, 52);
    const Tensor grad_out = random({1, heads, L, Dv}, 53);
    const double scale = 1 / std::sqrt(static_cast<double>(D));
    const auto exact = long_double_grads(values(q), values(k), values(v), values(grad_out), heads, L, S, D, Dv, causal,
                                         1 / std::sqrt(static_cast<long double>(D)));
    std::vector<Tensor> leaves = {q.detach().requires_grad_(), k.detach().requires_grad_(),
                                  v.detach().requires_grad_()};
    composed_attention(leaves[0], leaves[1], leaves[2], causal, scale).backward(grad_out);
    std::vector<double> math_error;
    for (int i = 0; i < 3; ++i) math_error.push_back(normwise_error(leaves[i].grad(), exact[i]));
    std::vector<nc::Device> devices = {nc::Device::cpu()};
    if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
    for (nc::Device device : devices) {
      std::vector<Tensor> in = {q.to(device).detach().requires_grad_(), k.to(device).detach().requires_grad_(),
                                v.to(device).detach().requires_grad_()};
      nc::scaled_dot_product_attention(in[0], in[1], in[2], causal).backward(grad_out.to(device));
      for (int i = 0; i < 3; ++i) {
        const double error = normwise_error(in[i].grad(), exact[i]);
        std::printf("%s grad %d: error %.2e, the composed math %.2e\n", device.str().c_str(), i, error, math_error[i]);
        EXPECT_LE(error, std::max(4 * math_error[i], 32 * std::numeric_limits<double>::epsilon()))
            << device.str() << " grad " << i;
      }
    }
  }
}

}  // namespace
