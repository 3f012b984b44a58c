// The API tour from README.md, kept compiling and running so that the README stays true.
#include <normcore/normcore.h>
#include <normcore/safetensors.h>
#include <iostream>

namespace nc = normcore;

int main() {
  nc::Device dev = nc::best_device();              // cuda:0 if there is a GPU, else cpu
  nc::Generator gen(0);                            // seeded Philox generator
  nc::Tensor x = nc::randn({64, 784}, dev, &gen);  // f32 by default
  nc::Tensor w = nc::randn({784, 10}, {nc::DType::F32, dev}, &gen) * 0.01;

  nc::Tensor logits = nc::matmul(x, w);  // [64, 10]
  nc::Tensor probs = nc::exp(logits - nc::max(logits, 1, /*keepdim=*/true).first);
  probs = probs / nc::sum(probs, {1}, /*keepdim=*/true);
  nc::Tensor pred = nc::argmax(probs, 1);  // i64 [64]

  std::cout << probs.slice(0, 0, 2) << "\n";  // prints values, shape, dtype, device
  nc::safetensors::save("probs.safetensors", {{"probs", probs}, {"pred", pred}});

  try {
    nc::matmul(x, x);  // [64, 784] @ [64, 784]
  } catch (const nc::ShapeError& e) {
    std::cout << e.what() << "\n";  // matmul: inner sizes differ: ...
  }
}
