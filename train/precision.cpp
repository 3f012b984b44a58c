// A training step's arithmetic (normcore/train.h: Precision, use_cuda_graph): autocast and
// the fp16 loss scaler around backward, clipping and the optimizer's update.
#include <cstdio>

#include "normcore/cuda.h"
#include "normcore/error.h"
#include "normcore/train.h"

namespace normcore {
namespace train {

Precision::Precision(const std::string& name, Device device) : name_(name) {
  NC_CHECK(name == "fp32" || name == "tf32" || name == "bf16" || name == "fp16", ValueError,
           "option --precision must be fp32, tf32, bf16 or fp16, got '", name, "'");
  if (device.is_cuda()) cuda::set_allow_tf32(name == "tf32");
  autocast_ = name == "bf16" || name == "fp16";
  if (name == "fp16") {
    dtype_ = DType::F16;
    scaler_ = std::make_unique<optim::GradScaler>();
  }
}

Tensor Precision::backward_and_step(const Tensor& loss, const std::vector<Tensor>& params, double clip,
                                    const std::function<void(const Tensor&)>& step) {
  Tensor norm;
  if (!scaler_) {
    loss.backward();
    if (clip > 0) norm = optim::clip_grad_norm_async(params, clip);
    step(Tensor());
    return norm;
  }
  scaler_->scale(loss).backward();
  scaler_->unscale_async(params);
  if (clip > 0) norm = optim::clip_grad_norm_async(params, clip);
  step(scaler_->found_inf());
  scaler_->update();
  return norm;
}

std::string Precision::scaler_report() const {
  if (!scaler_) return "";
  char text[96];
  std::snprintf(text, sizeof text, ", loss scale %g (%lld steps skipped)", scaler_->get_scale(),
                static_cast<long long>(scaler_->skipped_steps()));
  return text;
}

nn::NamedTensors Precision::state_dict() const { return scaler_ ? scaler_->state_dict() : nn::NamedTensors(); }

void Precision::load_state_dict(const nn::NamedTensors& state) {
  if (scaler_ && !state.empty()) scaler_->load_state_dict(state);
}

bool use_cuda_graph(const std::string& mode, const Device& device, bool anomaly) {
  NC_CHECK(mode == "auto" || mode == "on" || mode == "off", ValueError,
           "option --cuda-graph must be auto, on or off, got '", mode, "'");
  if (mode == "off") return false;
  const char* why = !device.is_cuda() ? "CUDA graphs need a CUDA device"
                    : anomaly         ? "--detect-anomaly reads every result on the host"
                                      : nullptr;
  NC_CHECK(mode == "auto" || why == nullptr, ValueError, "option --cuda-graph on: ", why,
           " (use --cuda-graph off or auto)");
  return why == nullptr;
}

}  // namespace train
}  // namespace normcore
