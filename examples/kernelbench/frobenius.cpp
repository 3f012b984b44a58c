// KernelBench FrobeniusNorm: out = x / ||x||_F on x [112, 64, 512, 512]. The norm is global,
// so the check sums x^2 and grad_out * x over the whole input in float64 on the CPU, a
// chunk at a time, and compares the first elements of out and grad_x with
//   out = x / n,  grad_x = grad_out / n - x * sum(grad_out * x) / n^3.
#include "common.h"

namespace kb = kernelbench;
using kb::Tensor;

namespace {

// Elements per float64 chunk: 16 MB, which the allocator reuses from chunk to chunk.
constexpr int64_t kChunk = int64_t{1} << 21;

// elements [start, start + length) of t (contiguous) as float64 on the CPU.
Tensor flat_f64(const Tensor& t, int64_t start, int64_t length) {
  return t.detach().reshape({-1}).narrow(0, start, length).to(kb::nc::Device::cpu(), kb::DType::F64);
}

void check(const kb::Run& run, kb::Checker& checker) {
  const int64_t n = run.x.numel();
  double sum_sq = 0, dot = 0;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t length = std::min(kChunk, n - start);
    const Tensor x = flat_f64(run.x, start, length), g = flat_f64(run.grad_out, start, length);
    sum_sq += kb::nc::sum(x * x).item<double>();
    dot += kb::nc::sum(g * x).item<double>();
  }
  const double norm = std::sqrt(sum_sq);
  const int64_t compared = std::min(kChunk, n);
  const Tensor x = flat_f64(run.x, 0, compared), g = flat_f64(run.grad_out, 0, compared);
  checker.compare(run.label + " out", flat_f64(run.out, 0, compared), x / norm);
  checker.compare(run.label + " grad_x", flat_f64(run.grad_x, 0, compared),
                  g / norm - x * (dot / (norm * norm * norm)));
}

}  // namespace

int main(int argc, char** argv) {
  return kb::run(argc, argv,
                 {"kernelbench_frobenius",
                  "FrobeniusNorm of x [112, 64, 512, 512]",
                  {112, 64, 512, 512},
                  kb::no_params,
                  [](const Tensor& x, const std::vector<Tensor>&) { return kb::nc::frobenius_norm(x); },
                  check});
}
