// CPU reference reductions over the rows of a contiguous [outer, inner] matrix (contracts in
// kernels/reduce.h). Floating sums accumulate in double; variance is two-pass (mean, then
// squared deviations). Rows run in ranges on the thread pool, each row on one thread.
#include <cmath>
#include <limits>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reduce.h"

namespace normcore {
namespace cpu {

namespace {

template <class T>
void reduce_typed(ReduceOp op, const Tensor& out, const Tensor& x, double arg) {
  const T* data = static_cast<const T*>(x.data_ptr());
  int64_t outer = x.size(0), inner = x.size(1);
  constexpr bool kFloat = std::is_floating_point<compute_t<T>>::value;
  parallel_for(outer, grain_for(inner), [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      const T* row = data + r * inner;
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Prod: {
          bool is_sum = op == ReduceOp::Sum;
          if constexpr (kFloat) {
            double acc = is_sum ? 0.0 : 1.0;
            for (int64_t i = 0; i < inner; ++i) {
              double v = convert<double>(row[i]);
              acc = is_sum ? acc + v : acc * v;
            }
            static_cast<T*>(out.data_ptr())[r] = convert<T>(acc);
          } else {
            uint64_t acc = is_sum ? 0 : 1;  // wraps like int64 arithmetic
            for (int64_t i = 0; i < inner; ++i) {
              uint64_t v = static_cast<uint64_t>(convert<int64_t>(row[i]));
              acc = is_sum ? acc + v : acc * v;
            }
            static_cast<int64_t*>(out.data_ptr())[r] = static_cast<int64_t>(acc);
          }
          break;
        }
        case ReduceOp::Mean:
        case ReduceOp::Var:
        case ReduceOp::Norm: {
          if constexpr (kFloat) {
            double result;
            if (op == ReduceOp::Norm) {
              double p = arg, acc = 0;
              for (int64_t i = 0; i < inner; ++i) {
                double v = std::fabs(convert<double>(row[i]));
                if (std::isinf(p)) acc = (std::isnan(v) || v > acc) ? v : acc;
                else if (p == 1) acc += v;
                else if (p == 2) acc += v * v;
                else acc += std::pow(v, p);
              }
              result = std::isinf(p) || p == 1 ? acc : p == 2 ? std::sqrt(acc) : std::pow(acc, 1.0 / p);
            } else {
              double sum = 0;
              for (int64_t i = 0; i < inner; ++i) sum += convert<double>(row[i]);
              double mean = sum / static_cast<double>(inner);
              if (op == ReduceOp::Mean) {
                result = inner > 0 ? mean : std::numeric_limits<double>::quiet_NaN();
              } else {
                double sq = 0;
                for (int64_t i = 0; i < inner; ++i) {
                  double d = convert<double>(row[i]) - mean;
                  sq += d * d;
                }
                double denom = static_cast<double>(inner) - arg;
                result = denom > 0 ? sq / denom : std::numeric_limits<double>::quiet_NaN();
              }
            }
            static_cast<T*>(out.data_ptr())[r] = convert<T>(result);
          } else {
            throw DTypeError("reduce: mean, var and norm need a floating dtype");
          }
          break;
        }
        case ReduceOp::Max:
        case ReduceOp::Min: {
          using A = compute_t<T>;
          A best = convert<A>(row[0]);
          bool is_max = op == ReduceOp::Max;
          for (int64_t i = 1; i < inner; ++i) {
            A v = convert<A>(row[i]);
            if constexpr (kFloat) {
              if (std::isnan(best)) break;
              if (std::isnan(v)) {
                best = v;
                break;
              }
            }
            if (is_max ? v > best : v < best) best = v;
          }
          static_cast<T*>(out.data_ptr())[r] = convert<T>(best);
          break;
        }
        case ReduceOp::All:
        case ReduceOp::Any: {
          bool is_all = op == ReduceOp::All;
          bool acc = is_all;
          for (int64_t i = 0; i < inner; ++i) {
            bool v = convert<bool>(row[i]);
            if (is_all ? !v : v) {
              acc = !is_all;
              break;
            }
          }
          static_cast<bool*>(out.data_ptr())[r] = acc;
          break;
        }
      }
    }
  });
}

template <class T>
void arg_reduce_typed(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x) {
  using A = compute_t<T>;
  const T* data = data_as<const T>(x);
  T* vals = data_as<T>(values);
  int64_t* idx = data_as<int64_t>(indices);
  const int64_t outer = x.size(0), inner = x.size(1);
  parallel_for(outer, grain_for(inner), [&](int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      const T* row = data + r * inner;
      A best = convert<A>(row[0]);
      int64_t best_i = 0;
      for (int64_t i = 1; i < inner; ++i) {
        A v = convert<A>(row[i]);
        if constexpr (std::is_floating_point<A>::value) {
          if (std::isnan(best)) break;
          if (std::isnan(v)) {
            best = v;
            best_i = i;
            break;
          }
        }
        if (is_max ? v > best : v < best) {
          best = v;
          best_i = i;
        }
      }
      vals[r] = convert<T>(best);
      idx[r] = best_i;
    }
  });
}

class CpuReduce final : public kernels::ReduceKernels {
 public:
  void reduce(ReduceOp op, const Tensor& out, const Tensor& x, double arg) const override {
    visit(x.dtype(), "reduce", [&](auto tag) { reduce_typed<typename decltype(tag)::type>(op, out, x, arg); });
  }

  void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x) const override {
    visit(x.dtype(), "arg_reduce",
          [&](auto tag) { arg_reduce_typed<typename decltype(tag)::type>(is_max, values, indices, x); });
  }
};

}  // namespace

const kernels::ReduceKernels& reduce_kernels() {
  static const CpuReduce kernels;
  return kernels;
}

}  // namespace cpu
}  // namespace normcore
