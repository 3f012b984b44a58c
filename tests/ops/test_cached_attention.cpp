// cached_attention (normcore/attention.h), a decoding step over a KV cache whose positions are
// read on the device: on the CPU against scaled_dot_product_attention over the cache's first
// p + 1 positions with position p replaced by the step's key and value, with the cache
// written there and nowhere else; argument errors; then CUDA against the CPU in f64, f32,
// f16 and bf16 (grouped-query heads, odd head dims, strided q, k, v, positions past one
// chunk of keys) and a position out of range reported at the next wait.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::random;
using normcore_test::throws;
using normcore_test::values;

namespace {

struct Step {
  int64_t batch, heads, kv_heads, S, D, Dv;
  std::vector<int64_t> positions;  // one per batch row
};

struct StepTensors {
  Tensor q, k, v, k_cache, v_cache, positions;
};

// q, k, v as strided views of one buffer each (as a fused projection gives them), random
// caches; all in f64 on the CPU.
StepTensors make_step(const Step& s, uint64_t seed) {
  StepTensors t;
  t.q = random({s.batch, 1, s.heads, s.D + 3}, seed).narrow(3, 1, s.D).permute({0, 2, 1, 3});
  t.k = random({s.batch, 1, s.kv_heads, s.D}, seed + 1).permute({0, 2, 1, 3});
  t.v = random({s.batch, 1, s.kv_heads, s.Dv}, seed + 2).permute({0, 2, 1, 3});
  t.k_cache = random({s.batch, s.kv_heads, s.S, s.D}, seed + 3);
  t.v_cache = random({s.batch, s.kv_heads, s.S, s.Dv}, seed + 4);
  t.positions = nc::from_vector(s.positions, {s.batch});
  return t;
}

// Row b of the step through scaled_dot_product_attention on the cache's first p + 1
// positions, position p replaced by the step's k and v: [1, H, 1, Dv].
Tensor expected_row(const Step& s, const StepTensors& t, int64_t b) {
  const int64_t p = s.positions[b];
  Tensor keys = t.k_cache.narrow(0, b, 1).narrow(2, 0, p + 1).clone();
  Tensor values = t.v_cache.narrow(0, b, 1).narrow(2, 0, p + 1).clone();
  keys.narrow(2, p, 1).copy_(t.k.narrow(0, b, 1));
  values.narrow(2, p, 1).copy_(t.v.narrow(0, b, 1));
  return nc::scaled_dot_product_attention(t.q.narrow(0, b, 1), keys, values, false, std::nullopt,
                                          /*enable_gqa=*/true);
}

}  // namespace

TEST(CachedAttention, MatchesAttentionOverTheFilledPositionsAndWritesTheCache) {
  const Step s{3, 4, 2, 10, 8, 6, {0, 4, 9}};
  const StepTensors t = make_step(s, 1);
  const Tensor k_before = t.k_cache.clone(), v_before = t.v_cache.clone();
  std::vector<Tensor> expected;
  for (int64_t b = 0; b < s.batch; ++b) expected.push_back(expected_row(s, t, b));
  const Tensor out = nc::cached_attention(t.q, t.k, t.v, t.k_cache, t.v_cache, t.positions);
  ASSERT_EQ(out.shape(), (nc::Shape{3, 4, 1, 6}));
  EXPECT_LT(normcore_test::relative_error(out, nc::cat(expected, 0)), 1e-12);
  // The step's k and v at each row's position, every other position as it was.
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t j = 0; j < s.S; ++j) {
      const bool written = j == s.positions[b];
      const Tensor k_row = t.k_cache.narrow(0, b, 1).narrow(2, j, 1);
      const Tensor v_row = t.v_cache.narrow(0, b, 1).narrow(2, j, 1);
      EXPECT_EQ(values(k_row), values(written ? t.k.narrow(0, b, 1) : k_before.narrow(0, b, 1).narrow(2, j, 1)))
          << "k row " << b << " position " << j;
      EXPECT_EQ(values(v_row), values(written ? t.v.narrow(0, b, 1) : v_before.narrow(0, b, 1).narrow(2, j, 1)))
          << "v row " << b << " position " << j;
    }
  }
}

TEST(CachedAttention, RefusesWhatItCannotDo) {
  const Step s{2, 2, 2, 5, 4, 4, {1, 2}};
  const StepTensors t = make_step(s, 7);
  const Tensor k_before = t.k_cache.clone();
  // A position out of range: nothing written.
  const Tensor past_the_end = nc::from_vector<int64_t>({1, 5}, {2});
  throws<nc::IndexError>([&] { nc::cached_attention(t.q, t.k, t.v, t.k_cache, t.v_cache, past_the_end); },
                         {"cached_attention", "position 5", "5 positions"})();
  EXPECT_EQ(values(t.k_cache), values(k_before));
  const Tensor one_row = nc::from_vector<int64_t>({1}, {1});
  throws<nc::ShapeError>([&] { nc::cached_attention(t.q, t.k, t.v, t.k_cache, t.v_cache, one_row); },
                         {"cached_attention", "positions must be i64 [2]"})();
  throws<nc::ShapeError>([&] { nc::cached_attention(t.q, t.k, t.v, t.k_cache, t.v_cache, t.positions.to(DType::I32)); },
                         {"positions must be i64"})();
  throws<nc::ShapeError>(
      [&] { nc::cached_attention(t.q, t.k, t.v, t.k_cache.narrow(2, 0, 4), t.v_cache, t.positions); },
      {"cached_attention", "the caches must be"})();
  const Tensor two_positions = random({2, 2, 2, 4}, 3);
  throws<nc::ShapeError>([&] { nc::cached_attention(two_positions, t.k, t.v, t.k_cache, t.v_cache, t.positions); },
                         {"one position each"})();
  const Tensor strided_cache = t.k_cache.transpose(2, 3).contiguous().transpose(2, 3);
  throws<nc::ValueError>([&] { nc::cached_attention(t.q, t.k, t.v, strided_cache, t.v_cache, t.positions); },
                         {"contiguous"})();
  throws<nc::DTypeError>([&] { nc::cached_attention(t.q, t.k, t.v, t.k_cache.to(DType::F32), t.v_cache, t.positions); },
                         {"k_cache"})();
  const Tensor q_with_grad = t.q.detach().requires_grad_();
  throws<nc::ValueError>([&] { nc::cached_attention(q_with_grad, t.k, t.v, t.k_cache, t.v_cache, t.positions); },
                         {"no gradient"})();
}

TEST(CachedAttentionCuda, MatchesCpu) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda();
  // Positions past the kernel's chunk of 1,024 keys, the first and last positions, GQA.
  const std::vector<Step> steps = {
      {2, 4, 4, 1500, 64, 64, {0, 1499}},
      {1, 12, 12, 1024, 64, 64, {700}},
      {2, 8, 2, 300, 128, 128, {17, 299}},
      {3, 3, 1, 40, 40, 24, {39, 0, 5}},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    for (DType dtype : {DType::F64, DType::F32, DType::F16, DType::BF16}) {
      SCOPED_TRACE("step " + std::to_string(i) + " " + nc::dtype_name(dtype));
      const StepTensors base = make_step(s, 100 + i);
      // The CPU in f64 on the dtype's values, the GPU in the dtype.
      StepTensors cpu, cuda;
      for (auto [field, name] : {std::pair{&StepTensors::q, "q"},
                                 {&StepTensors::k, "k"},
                                 {&StepTensors::v, "v"},
                                 {&StepTensors::k_cache, "k_cache"},
                                 {&StepTensors::v_cache, "v_cache"}}) {
        (void)name;
        const Tensor rounded = (base.*field).to(dtype);
        cpu.*field = rounded.to(DType::F64).contiguous();
        cuda.*field = rounded.to(gpu);
      }
      cpu.positions = base.positions;
      cuda.positions = base.positions.to(gpu);
      const Tensor expected = nc::cached_attention(cpu.q, cpu.k, cpu.v, cpu.k_cache, cpu.v_cache, cpu.positions);
      const Tensor got = nc::cached_attention(cuda.q, cuda.k, cuda.v, cuda.k_cache, cuda.v_cache, cuda.positions);
      const double tol = dtype == DType::F64 ? 1e-12 : dtype == DType::F32 ? 1e-5 : dtype == DType::F16 ? 2e-3 : 1.6e-2;
      EXPECT_LT(normcore_test::relative_error(got, expected), tol);
      EXPECT_EQ(values(cuda.k_cache), values(cpu.k_cache.to(dtype)));
      EXPECT_EQ(values(cuda.v_cache), values(cpu.v_cache.to(dtype)));
    }
  }
}

TEST(CachedAttentionCuda, APositionOutOfRangeIsAnIndexErrorAtTheNextWait) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Device gpu = nc::Device::cuda();
  const Step s{2, 2, 2, 6, 8, 8, {2, 6}};
  StepTensors t = make_step(s, 9);
  for (Tensor* x : {&t.q, &t.k, &t.v, &t.k_cache, &t.v_cache, &t.positions}) *x = x->to(gpu);
  const std::vector<double> k_before = values(t.k_cache);
  const Tensor out = nc::cached_attention(t.q, t.k, t.v, t.k_cache, t.v_cache, t.positions);
  throws<nc::IndexError>([&] { nc::cuda::synchronize(); },
                         {"cached_attention: position 6", "KV cache of 6 positions"})();
  // Row 1 wrote nothing and gave zeros; row 0 ran.
  const std::vector<double> k_after = values(t.k_cache);
  const int64_t row = 2 * 6 * 8;  // one batch row of the cache
  EXPECT_TRUE(std::equal(k_after.begin() + row, k_after.end(), k_before.begin() + row));
  EXPECT_EQ(values(out.narrow(0, 1, 1)), std::vector<double>(16, 0.0));
  EXPECT_NE(values(out.narrow(0, 0, 1)), std::vector<double>(16, 0.0));
}
