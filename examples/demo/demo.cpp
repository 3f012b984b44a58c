// A first normcore program: make tensors on the best available device, compute with
// them, and print the results.
#include <iostream>

#include "normcore/normcore.h"

int main() {
  namespace nc = normcore;
  nc::Device device = nc::best_device();
  std::cout << "normcore demo on " << device << (device.is_cpu() ? " (no CUDA device found)" : "") << "\n";

  nc::Generator gen(42);
  nc::Tensor a = nc::randn({3, 4}, device, &gen);
  nc::Tensor b = nc::arange(0, 8, 1, nc::TensorOptions(nc::DType::F32, device)).view({4, 2});
  nc::Tensor c = nc::relu(nc::matmul(a, b) + 1.0);
  std::cout << "a =\n" << a << "\n\nb =\n" << b << "\n\nrelu(a @ b + 1) =\n" << c << "\n\n";

  auto [values, indices] = nc::max(c, 1);
  std::cout << "row max  = " << values << "\nargmax   = " << indices << "\n";
  std::cout << "mean     = " << nc::mean(c).item<double>() << "\n";
  return 0;
}
