// Mixed precision by scope, as PyTorch's autocast: inside an autocast::Guard, the ops whose
// arithmetic is matrix products run in a 16-bit dtype and the ops that need range or
// accumulate many terms run in f32, whatever the dtypes of their floating inputs. Parameters
// stay what they are (f32 master weights); the casts are recorded ops, so the gradients
// reach the f32 parameters in f32 and the optimizers update them in f32.
//
//   {
//     normcore::autocast::Guard guard(normcore::DType::BF16);
//     loss = cross_entropy(model(x), y);   // Linear/conv in bf16, the loss in f32
//   }
//   loss.backward();                       // backward runs as the forward recorded it
//
// The lists (an input is cast when it is floating, not f64 and not already the target):
//   16-bit: matmul, linear (nn::Linear), conv2d (nn::Conv2d), scaled_dot_product_attention.
//   f32:    softmax, log_softmax, cross_entropy, nll_loss, mse_loss, l1_loss,
//           binary_cross_entropy_with_logits, layer_norm, rms_norm, group_norm, batch_norm,
//           l1_norm, frobenius_norm, sum, norm.
// Every other op runs in the dtype of its inputs, promoted as usual (an f32 residual plus a
// bf16 branch is f32). The state is per thread; it applies to tensors on every device, and
// backward() runs with it off. f16 needs a loss scaler (optim::GradScaler), bf16 does not.
#pragma once

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace autocast {

// Whether autocast is on in this thread, and its 16-bit dtype (BF16 when it has never been
// set).
bool is_enabled();
DType dtype();

// Sets autocast in this thread for its lifetime and restores the previous state after.
// dtype must be BF16 or F16 (DTypeError otherwise); enabled = false turns autocast off
// inside an enclosing guard.
class Guard {
 public:
  explicit Guard(DType dtype, bool enabled = true);
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  bool previous_enabled_;
  DType previous_dtype_;
};

// For ops written outside normcore: t in the autocast dtype (to_lower) or in f32 (to_float)
// when autocast is on and t is eligible, else t itself.
Tensor to_lower(const Tensor& t);
Tensor to_float(const Tensor& t);

}  // namespace autocast
}  // namespace normcore

#pragma GCC visibility pop
