// Layers without parameters: activations and Flatten, each a call to one functional op.
#include "normcore/nn.h"
#include "normcore/ops.h"

namespace normcore {
namespace nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }

Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

Tensor Flatten::forward(const Tensor& x) {
  NC_CHECK(x.defined(), ValueError, "Flatten: input is an undefined tensor");
  return x.flatten(start_dim, end_dim);
}

}  // namespace nn
}  // namespace normcore
