// The CUDA indexing kernels (kernels/index.h), sequences and random draws against the CPU,
// tensors beyond 2^31 elements, the public ops on CUDA tensors, then the caching allocator,
// streams and transfers. Without a GPU every test skips.
#include <gtest/gtest.h>

#ifdef NORMCORE_HAS_CUDA

#include "tests/kernels/cuda_backend_support.h"

using namespace cuda_backend_test;  // nc, Device, DType, Shape, Tensor and the helpers

namespace {

// ---------------------------------------------------------------- indexing
struct IndexCase {
  Shape x_shape;
  int64_t dim;
  Shape index_shape;  // gather/scatter_add; index_select uses index_shape[dim] indices
};

const std::vector<IndexCase> kIndexCases = {
    {{5}, 0, {3}},
    {{0, 4}, 1, {0, 2}},
    {{7, 9}, 0, {11, 9}},
    {{7, 9}, 1, {7, 20}},
    {{4, 6, 5}, 1, {3, 4, 5}},
    {{4, 6, 5}, 2, {4, 6, 3}},
    {{3, 1000, 17}, 1, {2, 513, 17}},
};

// Indices in [0, size).
Pair make_indices(const Shape& shape, int64_t size, uint32_t seed) {
  return make_input(shape, DType::I64, Layout::Contiguous, seed, Range{0.0, static_cast<double>(size)});
}

TEST(CudaBackend, IndexSelectGatherAndScatterAddMatchCpu) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 70000;
  for (const IndexCase& c : kIndexCases) {
    const int64_t size = c.x_shape[c.dim];
    for (DType dtype : kAllDTypes) {
      const std::string what = describe_case("dim " + std::to_string(c.dim), dtype, c.x_shape);
      Pair x = make_input(c.x_shape, dtype, Layout::Contiguous, ++seed);

      const int64_t count = c.index_shape[c.dim];
      Pair select_index = make_indices({count}, size, ++seed);
      Shape select_shape = c.x_shape;
      select_shape[c.dim] = count;
      Pair selected = empty_pair(select_shape, dtype);
      if (size > 0 || count == 0) {
        nc::cpu::index_kernels().index_select(selected.cpu, x.cpu, c.dim, select_index.cpu);
        nc::cuda::index_kernels().index_select(selected.cuda, x.cuda, c.dim, select_index.cuda);
        expect_equal(selected.cuda, selected.cpu, "index_select " + what);
      }

      Pair index = make_indices(c.index_shape, size, ++seed);
      Pair gathered = empty_pair(c.index_shape, dtype);
      nc::cpu::index_kernels().gather(gathered.cpu, x.cpu, c.dim, index.cpu);
      nc::cuda::index_kernels().gather(gathered.cuda, x.cuda, c.dim, index.cuda);
      expect_equal(gathered.cuda, gathered.cpu, "gather " + what);

      if (dtype == DType::Bool || dtype == DType::U8) continue;
      // Whole numbers, so that the atomics' order of additions cannot change the sums.
      Pair src = make_input(c.index_shape, dtype, Layout::Contiguous, ++seed, Range{-8, 8}, true);
      Pair out = make_input(c.x_shape, dtype, Layout::Contiguous, ++seed, Range{-8, 8}, true);
      nc::cpu::index_kernels().scatter_add(out.cpu, c.dim, index.cpu, src.cpu);
      nc::cuda::index_kernels().scatter_add(out.cuda, c.dim, index.cuda, src.cuda);
      expect_equal(out.cuda, out.cpu, "scatter_add " + what);
    }
  }
}

// index_add_rows (index_select's backward along dim 0): the same bits on every run, and the
// f64 reference's values, for rows repeated across many sort chunks, runs that end exactly
// at chunk boundaries, a single row for everything, and unrepeated rows; widths 1 and 300.
TEST(CudaBackend, IndexAddRowsIsDeterministicAndMatchesTheReference) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 gen(4);
  struct Case {
    std::string name;
    int64_t rows;
    std::vector<double> index;
  };
  std::vector<Case> cases(4);
  cases[0].name = "skewed";
  cases[0].rows = 37;
  for (int i = 0; i < 5000; ++i) cases[0].index.push_back(gen() % 10 < 6 ? 3 : static_cast<double>(gen() % 37));
  cases[1].name = "runs of 64";
  cases[1].rows = 9;
  for (int i = 0; i < 64 * 9; ++i) cases[1].index.push_back(static_cast<double>((i / 64 * 5) % 9));
  cases[2].name = "one row";
  cases[2].rows = 3;
  cases[2].index.assign(1000, 2.0);
  cases[3].name = "distinct";
  cases[3].rows = 300;
  for (int i = 0; i < 300; ++i) cases[3].index.push_back(static_cast<double>((i * 7) % 300));
  for (const Case& c : cases) {
    for (int64_t width : {int64_t{1}, int64_t{300}}) {
      for (DType dtype : {DType::F32, DType::BF16, DType::F64}) {
        const std::string what = c.name + " width " + std::to_string(width) + " " + nc::dtype_name(dtype);
        const int64_t n = static_cast<int64_t>(c.index.size());
        const Pair index = from_values(c.index, {n}, DType::I64);
        const Tensor src64 = random_cpu({n, width}, DType::F64, -1, 1, 7);
        const Tensor src = src64.to(dtype);
        Tensor reference = nc::zeros({c.rows, width}, DType::F64), magnitude = nc::zeros({c.rows, width}, DType::F64);
        nc::cpu::index_kernels().index_add_rows(reference, index.cpu, src.to(DType::F64));
        nc::cpu::index_kernels().index_add_rows(magnitude, index.cpu, nc::abs(src.to(DType::F64)));
        std::vector<std::vector<double>> runs;
        for (int run = 0; run < 2; ++run) {
          Tensor out = nc::zeros({c.rows, width}, nc::TensorOptions(dtype, nc::Device::cuda()));
          nc::cuda::index_kernels().index_add_rows(out, index.cuda, src.to(nc::Device::cuda()));
          runs.push_back(values_of(out));
        }
        EXPECT_EQ(runs[0], runs[1]) << what << ": two runs differ";
        // Sums of at most 64 terms in order, then of the chunks' partials: an error below
        // 1e-5 of the sum of magnitudes in f32 (1e-12 in f64), then one rounding to dtype.
        const std::vector<double> expected = values_of(reference), sum_abs = values_of(magnitude);
        const double accumulation = dtype == DType::F64 ? 1e-12 : 1e-5;
        const double rounding = dtype == DType::BF16 ? 4e-3 : (dtype == DType::F32 ? 1.2e-7 : 0.0);
        for (size_t i = 0; i < expected.size(); ++i) {
          const double bound = accumulation * sum_abs[i] + rounding * std::fabs(expected[i]) + 1e-30;
          if (std::fabs(runs[0][i] - expected[i]) > bound) {
            ADD_FAILURE() << what << ": element " << i << " is " << runs[0][i] << ", expected " << expected[i]
                          << " (sum of magnitudes " << sum_abs[i] << ")";
            break;
          }
        }
      }
    }
  }
  // Through autograd: an embedding's weight gradient, twice.
  nc::Generator g(2);
  const Tensor weight = nc::randn({256, 64}, DType::F32, &g).to(nc::Device::cuda());
  const Tensor tokens = nc::randint(0, 8, {4096}, nc::TensorOptions(DType::I64), &g).to(nc::Device::cuda());
  const Tensor grad = nc::randn({4096, 64}, DType::F32, &g).to(nc::Device::cuda());
  std::vector<std::vector<double>> grads;
  for (int run = 0; run < 2; ++run) {
    Tensor w = weight.detach();
    w.requires_grad_();
    nc::embedding(w, tokens).backward(grad);
    grads.push_back(values_of(w.grad()));
  }
  EXPECT_EQ(grads[0], grads[1]);
}

// ---------------------------------------------------------------- sequences and random
TEST(CudaBackend, ArangeAndLinspaceMatchCpuExactly) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : kAllDTypes) {
    // Non-negative starts where negative values would not convert (u8, bool).
    const bool non_negative = dtype == DType::U8 || dtype == DType::Bool;
    for (int64_t n : {0, 1, 2, 7, 85, 1000, 65537}) {
      if (dtype == DType::U8 && n > 85) continue;  // 3 * n would not fit: undefined conversion
      Pair out = empty_pair({n}, dtype);
      const double start = non_negative ? 0.0 : -3.5, step = nc::is_floating(dtype) ? 0.1 : 3.0;
      nc::cpu::generate_kernels().arange(out.cpu, start, step);
      nc::cuda::generate_kernels().arange(out.cuda, start, step);
      expect_equal(out.cuda, out.cpu, describe_case("arange", dtype, {n}));
      if (n < 2) continue;
      const double lo = non_negative ? 0.0 : -1.0, hi = nc::is_floating(dtype) ? 1.0 : 100.0;
      nc::cpu::generate_kernels().linspace(out.cpu, lo, hi);
      nc::cuda::generate_kernels().linspace(out.cuda, lo, hi);
      expect_equal(out.cuda, out.cpu, describe_case("linspace", dtype, {n}));
    }
  }
}

TEST(CudaBackend, RandomDrawsTheCpuNumbers) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seeds[] = {0, 42, 0xDEADBEEFCAFEull};
  const uint64_t offsets[] = {0, 12345, (uint64_t{1} << 32) - 3};  // crosses a 32-bit counter carry
  for (uint64_t seed : seeds) {
    for (uint64_t offset : offsets) {
      for (int64_t n : {0, 1, 1000, 65537}) {
        for (DType dtype : kFloatDTypes) {
          Pair out = empty_pair({n}, dtype);
          nc::cpu::generate_kernels().random_uniform(out.cpu, seed, offset);
          nc::cuda::generate_kernels().random_uniform(out.cuda, seed, offset);
          expect_equal(out.cuda, out.cpu, describe_case("random_uniform", dtype, {n}));
          for (double v : values_of(out.cuda)) ASSERT_TRUE(v >= 0.0 && v < 1.0) << v;
          nc::cpu::generate_kernels().random_normal(out.cpu, seed, offset);
          nc::cuda::generate_kernels().random_normal(out.cuda, seed, offset);
          // The log and cos of the transform may differ in the last float bits.
          const double tol = std::max(dtype_tolerance(dtype), 1e-6);
          expect_close(out.cuda, out.cpu, tol, tol, describe_case("random_normal", dtype, {n}));
        }
        for (DType dtype : kAllDTypes) {
          Pair out = empty_pair({n}, dtype);
          const bool signed_ok = dtype != DType::U8 && dtype != DType::Bool;
          const int64_t low = signed_ok ? -100 : 0;
          const uint64_t range = dtype == DType::Bool ? 2 : 200;
          nc::cpu::generate_kernels().random_int(out.cpu, seed, offset, low, range);
          nc::cuda::generate_kernels().random_int(out.cuda, seed, offset, low, range);
          expect_equal(out.cuda, out.cpu, describe_case("random_int", dtype, {n}));
        }
      }
    }
  }
}

// Rounds-to-one of 16-bit uniforms are replaced by the largest value below one: seen
// through the public API, values stay in [0, 1) over many draws.
TEST(CudaBackend, SixteenBitUniformsStayBelowOne) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::F16, DType::BF16}) {
    nc::Generator gen(3);
    Tensor r = nc::rand({1 << 20}, nc::TensorOptions(dtype, Device::cuda()), &gen);
    Tensor max_value = nc::max(r).to(Device::cpu());
    EXPECT_LT(max_value.item<double>(), 1.0) << nc::dtype_name(dtype);
    EXPECT_GT(max_value.item<double>(), 0.99) << nc::dtype_name(dtype);
  }
}

// ---------------------------------------------------------------- 64-bit indexing
// More than 2^31 elements: the strided copy takes its 64-bit path, and a single row that
// long goes through the two-stage reduction.
TEST(CudaBackend, TensorsBeyondTwoToTheThirtyOneElements) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = (int64_t{1} << 31) + 77;
  size_t free_bytes = 0, total_bytes = 0;
  nc::cuda::mem_get_info(0, &free_bytes, &total_bytes);
  if (free_bytes < static_cast<size_t>(3 * n)) GTEST_SKIP() << "needs " << 3 * n << " bytes of GPU memory";
  const nc::TensorOptions u8_cuda(DType::U8, Device::cuda());
  Tensor big = nc::empty({1, n}, u8_cuda);
  Tensor three = nc::full({1, 1}, 3, u8_cuda);
  nc::cuda::elementwise_kernels().copy(big, three.expand({1, n}));  // source stride 0: strided path
  Tensor sum = nc::empty({1}, nc::TensorOptions(DType::I64, Device::cuda()));
  nc::cuda::reduce_kernels().reduce(nc::ReduceOp::Sum, sum, big, 0.0);
  EXPECT_EQ(sum.to(Device::cpu()).item<int64_t>(), 3 * n);
  nc::cuda::elementwise_kernels().fill(big.narrow(1, n - 5, 1), 9);
  Tensor values = nc::empty({1}, u8_cuda), indices = nc::empty({1}, nc::TensorOptions(DType::I64, Device::cuda()));
  nc::cuda::reduce_kernels().arg_reduce(true, values, indices, big);
  EXPECT_EQ(indices.to(Device::cpu()).item<int64_t>(), n - 5);
  EXPECT_EQ(values.to(Device::cpu()).item<int64_t>(), 9);
}

// ---------------------------------------------------------------- public ops on the GPU
struct OpCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
};

const std::vector<OpCase> kPublicOps = {
    {"add broadcast", [](const Tensor& a, const Tensor& b) { return nc::add(a, b.narrow(0, 0, 1)); }},
    {"mul scalar", [](const Tensor& a, const Tensor&) { return nc::mul(a, 2.5); }},
    {"matmul", [](const Tensor& a, const Tensor& b) { return nc::matmul(a, b.t()); }},
    {"sum dim 1", [](const Tensor& a, const Tensor&) { return nc::sum(a, {1}); }},
    {"sum dim 0", [](const Tensor& a, const Tensor&) { return nc::sum(a, {0}); }},
    {"var dim 0", [](const Tensor& a, const Tensor&) { return nc::var(a, {0}); }},
    {"argmax dim 0", [](const Tensor& a, const Tensor&) { return nc::argmax(a, 0); }},
    {"gelu of transpose", [](const Tensor& a, const Tensor&) { return nc::gelu(a.t()); }},
    {"where", [](const Tensor& a, const Tensor& b) { return nc::where(nc::gt(a, b), a, b); }},
};

TEST(CudaBackend, PublicOpsOnCudaTensorsMatchCpu) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const OpCase& c : kPublicOps) {
    Pair a = make_input({37, 50}, DType::F32, Layout::Contiguous, 1);
    Pair b = make_input({37, 50}, DType::F32, Layout::Contiguous, 2);
    Tensor want = c.op(a.cpu, b.cpu), got = c.op(a.cuda, b.cuda);
    EXPECT_TRUE(got.device().is_cuda()) << c.name;
    expect_close(got, want, 1e-4, 1e-4, c.name);
  }
}

// ---------------------------------------------------------------- runtime and allocator
TEST(CudaRuntime, FreedBlocksAreReusedWithoutCudaMalloc) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::cuda::synchronize();
  nc::cuda::empty_cache();
  const nc::TensorOptions f32_cuda(DType::F32, Device::cuda());
  const nc::cuda::MemoryStats before = nc::cuda::memory_stats(0);
  { Tensor t = nc::empty({1000}, f32_cuda); }  // 4000 bytes -> one 4096-byte block
  const nc::cuda::MemoryStats first = nc::cuda::memory_stats(0);
  EXPECT_EQ(first.num_device_mallocs, before.num_device_mallocs + 1);
  EXPECT_EQ(first.allocated, before.allocated);
  EXPECT_EQ(first.reserved, before.reserved + 4096);
  {
    Tensor t = nc::empty({1000}, f32_cuda);
    EXPECT_EQ(nc::cuda::memory_stats(0).allocated, before.allocated + 4096);
  }
  const nc::cuda::MemoryStats second = nc::cuda::memory_stats(0);
  EXPECT_EQ(second.num_device_mallocs, first.num_device_mallocs);
  EXPECT_EQ(second.num_cache_hits, first.num_cache_hits + 1);
  EXPECT_EQ(second.num_allocs, first.num_allocs + 1);
  // A much larger request does not take the small block, and a tiny one does not take a large block.
  { Tensor t = nc::empty({100000}, f32_cuda); }
  EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, second.num_device_mallocs + 1);
  { Tensor t = nc::empty({1}, f32_cuda); }
  EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, second.num_device_mallocs + 2);
  nc::cuda::empty_cache();
  const nc::cuda::MemoryStats emptied = nc::cuda::memory_stats(0);
  EXPECT_EQ(emptied.reserved, emptied.allocated + emptied.split_cached);
}

// A request of 1 MiB or more is cut from a larger cached block, and the parts merge back
// when they are freed: no cudaMalloc for either, and the whole block serves the next large
// request.
TEST(CudaRuntime, LargeCachedBlocksAreCutAndMergeBack) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::cuda::synchronize();
  nc::cuda::empty_cache();
  const nc::TensorOptions u8_cuda(DType::U8, Device::cuda());
  constexpr int64_t kMiB = 1 << 20;
  const int64_t big = 97 * kMiB + 512;  // a size no other test asks for
  { Tensor t = nc::empty({big}, u8_cuda); }
  const nc::cuda::MemoryStats cached = nc::cuda::memory_stats(0);
  {
    Tensor a = nc::empty({31 * kMiB}, u8_cuda);
    Tensor b = nc::empty({33 * kMiB}, u8_cuda);
    const nc::cuda::MemoryStats cut = nc::cuda::memory_stats(0);
    EXPECT_EQ(cut.num_device_mallocs, cached.num_device_mallocs);
    EXPECT_EQ(cut.reserved, cached.reserved);
    EXPECT_EQ(static_cast<const char*>(b.data_ptr()) - static_cast<const char*>(a.data_ptr()), 31 * kMiB);
    EXPECT_EQ(cut.split_cached, cached.split_cached + static_cast<size_t>(big - 64 * kMiB));
    // Half a MiB is too small to cut a block for: it gets its own.
    { Tensor small = nc::empty({kMiB / 2}, u8_cuda); }
    EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, cached.num_device_mallocs + 1);
    // The parts hold what was written to them.
    a.fill_(1);
    b.fill_(2);
    EXPECT_EQ(nc::sum(a.to(DType::F64)).item<double>(), static_cast<double>(31 * kMiB));
    EXPECT_EQ(nc::sum(b.to(DType::F64)).item<double>(), static_cast<double>(2 * 33 * kMiB));
  }
  const nc::cuda::MemoryStats merged = nc::cuda::memory_stats(0);
  EXPECT_EQ(merged.split_cached, cached.split_cached);
  { Tensor whole = nc::empty({big}, u8_cuda); }
  EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, merged.num_device_mallocs);
  nc::cuda::empty_cache();
  const nc::cuda::MemoryStats emptied = nc::cuda::memory_stats(0);
  EXPECT_EQ(emptied.reserved, emptied.allocated + emptied.split_cached);
}

TEST(CudaRuntime, SteadyLoopMakesNoCudaMalloc) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Pair x = make_input({64, 128}, DType::F32, Layout::Contiguous, 5);
  Pair w = make_input({128, 32}, DType::F32, Layout::Contiguous, 6);
  auto step = [&] {
    Tensor h = nc::relu(nc::matmul(x.cuda, w.cuda));
    Tensor loss = nc::sum(nc::mul(h, h));
    return loss.to(Device::cpu()).item<double>();
  };
  // Best fit settles within a couple of iterations; from then on every request is a hit.
  const double warm = step();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(step(), warm);
  const uint64_t mallocs = nc::cuda::memory_stats(0).num_device_mallocs;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(step(), warm);
  EXPECT_EQ(nc::cuda::memory_stats(0).num_device_mallocs, mallocs);
}

TEST(CudaRuntime, PeakTracksTheHighWaterMark) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  nc::cuda::reset_peak_memory_stats(0);
  const size_t base = nc::cuda::memory_stats(0).allocated;
  EXPECT_EQ(nc::cuda::memory_stats(0).peak_allocated, base);
  { Tensor t = nc::empty({1 << 20}, nc::TensorOptions(DType::F32, Device::cuda())); }
  const nc::cuda::MemoryStats after = nc::cuda::memory_stats(0);
  EXPECT_EQ(after.allocated, base);
  EXPECT_EQ(after.peak_allocated, base + (size_t{4} << 20));
  nc::cuda::reset_peak_memory_stats(0);
  EXPECT_EQ(nc::cuda::memory_stats(0).peak_allocated, base);
}

TEST(CudaRuntime, AllocationLargerThanTheGpuThrowsOutOfMemoryAndAllocatorStillWorks) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  size_t free_bytes = 0, total_bytes = 0;
  nc::cuda::mem_get_info(0, &free_bytes, &total_bytes);
  EXPECT_GT(total_bytes, 0u);
  EXPECT_LE(free_bytes, total_bytes);
  { Tensor cached = nc::empty({1 << 20}, nc::TensorOptions(DType::F32, Device::cuda())); }
  const nc::cuda::MemoryStats before = nc::cuda::memory_stats(0);
  const int64_t too_many = static_cast<int64_t>(total_bytes) * 2;
  try {
    Tensor t = nc::empty({too_many}, nc::TensorOptions(DType::U8, Device::cuda()));
    ADD_FAILURE() << "allocating " << too_many << " bytes did not throw";
  } catch (const nc::OutOfMemoryError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(std::to_string(too_many)), std::string::npos) << message;
    EXPECT_NE(message.find("cuda:0"), std::string::npos) << message;
    EXPECT_NE(message.find("free"), std::string::npos) << message;
  }
  const nc::cuda::MemoryStats after = nc::cuda::memory_stats(0);
  EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.reserved, after.allocated + after.split_cached);  // the cache was freed before the retry
  Pair x = make_input({1000}, DType::F32, Layout::Contiguous, 9);
  expect_equal(nc::neg(x.cuda), nc::neg(x.cpu), "neg after an out-of-memory error");
}

TEST(CudaRuntime, DeviceIndicesAreValidated) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const int count = nc::cuda_device_count();
  EXPECT_THROW(nc::cuda::memory_stats(count), nc::DeviceError);
  EXPECT_THROW(nc::cuda::set_device(-1), nc::DeviceError);
  EXPECT_THROW(nc::cuda::current_stream(count + 3), nc::DeviceError);
  try {
    nc::cuda::synchronize(count);
    ADD_FAILURE() << "synchronize(" << count << ") did not throw";
  } catch (const nc::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda::synchronize"), std::string::npos) << e.what();
  }
  nc::cuda::set_device(0);
  EXPECT_EQ(nc::cuda::current_device(), 0);
}

TEST(CudaRuntime, StreamGuardRoutesWorkToAUserStream) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::cuda::StreamHandle own = nc::cuda::current_stream(0);
  ASSERT_NE(own, nullptr);
  nc::cuda::StreamHandle user = nc::cuda::create_stream();
  Pair x = make_input({4096}, DType::F32, Layout::Contiguous, 12);
  {
    nc::cuda::StreamGuard guard(0, user);
    EXPECT_EQ(nc::cuda::current_stream(0), user);
    Tensor y = nc::exp(x.cuda);
    nc::cuda::synchronize(0);
    expect_close(y, nc::exp(x.cpu), 1e-5, 1e-6, "exp on a user stream");
  }
  EXPECT_EQ(nc::cuda::current_stream(0), own);
  EXPECT_THROW(nc::cuda::destroy_stream(own), nc::ValueError);
  nc::cuda::destroy_stream(user);
  expect_close(nc::exp(x.cuda), nc::exp(x.cpu), 1e-5, 1e-6, "exp after the user stream is gone");
}

TEST(CudaRuntime, TransfersRoundTripAtEverySize) {
  if (!normcore::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t n : {0, 1, 3, 1000, (1 << 20) + 1}) {
    Tensor host = random_cpu({n}, DType::F64, -1, 1, 3);
    Tensor back = host.to(Device::cuda()).to(Device::cpu());
    EXPECT_EQ(back.to_vector<double>(), host.to_vector<double>()) << n;
    // Through pinned memory, whose upload is asynchronous; the pinned tensor is freed
    // right away, which must wait for the upload.
    Tensor on_gpu = host.pin_memory().to(Device::cuda());
    EXPECT_EQ(on_gpu.to(Device::cpu()).to_vector<double>(), host.to_vector<double>()) << n;
  }
  if (nc::cuda_device_count() > 1) {
    Tensor host = random_cpu({12345}, DType::F32, -1, 1, 4);
    Tensor peer = host.to(Device::cuda(0)).to(Device::cuda(1));
    EXPECT_EQ(peer.device(), Device::cuda(1));
    EXPECT_EQ(peer.to(Device::cpu()).to_vector<float>(), host.to_vector<float>());
  }
}

}  // namespace

#endif  // NORMCORE_HAS_CUDA
