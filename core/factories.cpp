// Tensor factories (empty, zeros, full, arange, linspace, eye), the seeded random ones and
// sample_logits, which draws from the generator as they do.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/internal.h"
#include "kernels/elementwise.h"
#include "kernels/generate.h"
#include "normcore/random.h"
#include "runtime/cuda/capture.h"

namespace normcore {

using namespace detail;

Tensor empty(const Shape& shape, TensorOptions options) {
  const OpScope op("empty");
  checked_numel(shape, op);
  DType dtype = options.dtype_or(DType::F32);
  if (!options.pinned) return new_tensor(shape, dtype, options.device);
  NC_CHECK(options.device.is_cpu(), DeviceError, op, ": pinned memory is host memory, but device ", options.device,
           " was asked for");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = allocate_storage(static_cast<size_t>(checked_numel(shape, op)) * dtype_size(dtype), Device::cpu(),
                                   /*pinned=*/true);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor full(const Shape& shape, Scalar value, TensorOptions options) {
  DType fallback = value.is_bool() ? DType::Bool : value.is_integral() ? DType::I64 : DType::F32;
  if (!options.dtype) options.dtype = fallback;
  check_representable("full", "value", value, *options.dtype);
  Tensor t = empty(shape, options);
  if (t.numel() > 0) kernels::elementwise(t.device()).fill(t, value);  // a new tensor: version 0
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions options) {
  if (!options.dtype) options.dtype = DType::F32;
  return full(shape, 0, options);
}

Tensor ones(const Shape& shape, TensorOptions options) {
  if (!options.dtype) options.dtype = DType::F32;
  return full(shape, 1, options);
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), TensorOptions(t.dtype(), t.device())); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), TensorOptions(t.dtype(), t.device())); }

Tensor arange(Scalar end, TensorOptions options) { return arange(0, end, 1, options); }

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions options) {
  const OpScope op("arange");
  double s = start.to_double(), e = end.to_double(), st = step.to_double();
  NC_CHECK(std::isfinite(s) && std::isfinite(e) && std::isfinite(st), ValueError, op,
           ": start, end and step must be finite (got ", start, ", ", end, ", ", step, ")");
  NC_CHECK(st != 0, ValueError, op, ": step must be non-zero");
  NC_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), ValueError, op, ": step ", step, " does not lead from ", start,
           " to ", end);
  bool all_int = start.is_integral() && end.is_integral() && step.is_integral();
  int64_t n;
  // The count, computed where it cannot overflow, then bounded like any shape.
  if (all_int) {
    const __int128 a = start.to_int(), b = end.to_int(), c = step.to_int();
    const __int128 count = c > 0 ? (b - a + c - 1) / c : (a - b - c - 1) / -c;
    NC_CHECK(count < (__int128{1} << 59), ShapeError, op, ": ", start, " to ", end, " in steps of ", step,
             " gives too many elements (the limit is 2^59)");
    n = static_cast<int64_t>(count);
  } else {
    const double count = std::ceil((e - s) / st);
    NC_CHECK(count < 0x1p59, ShapeError, op, ": ", start, " to ", end, " in steps of ", step,
             " gives too many elements (the limit is 2^59)");
    n = static_cast<int64_t>(count);
  }
  if (!options.dtype) options.dtype = all_int ? DType::I64 : DType::F32;
  if (n > 0) {
    // As values, not scalars to write: u8's wrapping of -255 to -1 does not apply.
    check_representable(op, "start", Scalar(s), *options.dtype);
    check_representable(op, "last value", Scalar(s + static_cast<double>(n - 1) * st), *options.dtype);
  }
  Tensor out = empty({n}, options);
  if (n > 0) kernels::generate(out.device()).arange(out, s, st);
  return out;
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions options) {
  const OpScope op("linspace");
  NC_CHECK(steps >= 0, ValueError, op, ": steps must be non-negative, got ", steps);
  NC_CHECK(std::isfinite(start) && std::isfinite(end), ValueError, op, ": start and end must be finite (got ", start,
           ", ", end, ")");
  Tensor out = empty({steps}, options);
  if (steps == 1) kernels::generate(out.device()).arange(out, start, 0);
  if (steps >= 2) kernels::generate(out.device()).linspace(out, start, end);
  return out;
}

Tensor eye(int64_t n, int64_t m, TensorOptions options) {
  if (m < 0) m = n;
  NC_CHECK(n >= 0, ValueError, "eye: n must be non-negative, got ", n);
  Tensor out = zeros({n, m}, options);
  int64_t diag = std::min(n, m);
  if (diag > 0) kernels::elementwise(out.device()).fill(make_view(out, {diag}, {m + 1}, 0), 1);
  return out;
}

// ---------------------------------------------------------------- random
void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}

uint64_t Generator::advance(uint64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t first = offset_;
  offset_ += n;
  return first;
}

uint64_t Generator::offset() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return offset_;
}

void Generator::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  offset_ = offset;
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {

Tensor empty_floating(const char* op, const Shape& shape, TensorOptions options) {
  if (!options.dtype) options.dtype = DType::F32;
  NC_CHECK(is_floating(*options.dtype), DTypeError, op, ": dtype must be floating, got ", dtype_name(*options.dtype));
  return empty(shape, options);
}

// The first of out.numel() counters of g. A replayed graph would draw these same numbers
// again each time, so not inside a capture.
uint64_t reserve_counters(const OpScope& op, Generator& g, const Tensor& out) {
  NC_CHECK(!cuda::capturing(out.device()), CaptureError, op, ": cannot run inside a CUDA graph capture on ",
           out.device(), ": each replay would draw the same numbers (normcore::dropout can be captured)");
  return g.advance(static_cast<uint64_t>(out.numel()));
}

}  // namespace

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) {
  const OpScope op("rand");
  Tensor out = empty_floating(op, shape, options);
  Generator& g = gen ? *gen : default_generator();
  uint64_t offset = reserve_counters(op, g, out);
  if (out.numel()) kernels::generate(out.device()).random_uniform(out, g.seed(), offset);
  return out;
}

Tensor sample_logits(const Tensor& logits, double temperature, int64_t top_k, double top_p, Generator* gen) {
  const OpScope op("sample_logits");
  check_defined(op, "logits", logits);
  NC_CHECK(logits.dim() == 2 && logits.size(1) >= 1, ShapeError, op,
           ": logits must be [rows, classes] with at least one class, got ", describe(logits));
  NC_CHECK(is_floating(logits.dtype()), DTypeError, op, ": logits must be floating, got ", describe(logits));
  NC_CHECK(std::isfinite(temperature) && temperature > 0, ValueError, op,
           ": temperature must be finite and > 0 (0, greedy, is argmax), got ", temperature);
  NC_CHECK(top_k >= 0, ValueError, op, ": top_k must be >= 0, got ", top_k);
  NC_CHECK(top_p > 0 && top_p <= 1, ValueError, op, ": top_p must be in (0, 1], got ", top_p);
  const Tensor x = logits.contiguous();
  Tensor out = new_tensor({x.size(0)}, DType::I64, x.device());
  if (x.size(0) == 0) return out;
  Generator& g = gen ? *gen : default_generator();
  const uint64_t n = static_cast<uint64_t>(x.size(0));
  const cuda::RandomOffset offset =
      x.device().is_cuda() ? cuda::random_offset(g, n, x.device().index) : cuda::RandomOffset{g.advance(n), nullptr};
  kernels::generate(x.device())
      .sample_logits(x, g.seed(), offset.offset, offset.base, temperature, std::min(top_k, x.size(1)), top_p, out);
  return out;
}

Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) {
  const OpScope op("randn");
  Tensor out = empty_floating(op, shape, options);
  Generator& g = gen ? *gen : default_generator();
  uint64_t offset = reserve_counters(op, g, out);
  if (out.numel()) kernels::generate(out.device()).random_normal(out, g.seed(), offset);
  return out;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  const OpScope op("randint");
  NC_CHECK(low < high, ValueError, op, ": low (", low, ") must be less than high (", high, ")");
  if (!options.dtype) options.dtype = DType::I64;
  NC_CHECK(*options.dtype != DType::Bool, DTypeError, op, ": dtype bool is not supported");
  // Integer results must be representable: [low, high) inside the dtype's range.
  const DType dtype = *options.dtype;
  if (dtype == DType::I32 || dtype == DType::U8) {
    const int64_t lo = dtype == DType::U8 ? 0 : std::numeric_limits<int32_t>::min();
    const int64_t hi = dtype == DType::U8 ? 255 : std::numeric_limits<int32_t>::max();
    NC_CHECK(low >= lo && high - 1 <= hi, ValueError, op, ": [", low, ", ", high, ") does not fit dtype ",
             dtype_name(dtype), " (", lo, " to ", hi, ")");
  }
  Tensor out = empty(shape, options);
  Generator& g = gen ? *gen : default_generator();
  uint64_t offset = reserve_counters(op, g, out);
  uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  if (out.numel()) kernels::generate(out.device()).random_int(out, g.seed(), offset, low, range);
  return out;
}

}  // namespace normcore
