// Optimizers, learning-rate schedules and gradient-norm clipping. An optimizer holds
// handles to the parameters (sharing their TensorImpls with the modules, so step() updates
// the modules' weights in place) and owns its per-parameter state. state_dict() copies
// hyperparameters and state out as named tensors that a safetensors checkpoint can hold;
// load_state_dict() restores them so that training resumes bit for bit.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace optim {

// Named tensors, in a fixed order (the layout safetensors::save takes).
using StateDict = std::vector<std::pair<std::string, Tensor>>;

// The dtype of the state buffers kept for a parameter of param_dtype: f32 for f16 and bf16
// (so the running averages keep full precision), the parameter's own dtype otherwise.
DType state_dtype(DType param_dtype);

// One parameter group: every parameter shares the hyperparameters. Parameters must be
// defined, distinct, contiguous and floating; each grad() must have its parameter's shape,
// dtype and device. State tensors live on their parameter's device.
//
// state_dict() entries (all copies, never aliases of the live state):
//   "param_groups.<hyperparameter>"  0-dim f64 (bools as 0 or 1), in the order the
//                                    optimizer lists them;
//   "state.<i>.<name>"               the state of params()[i], only for parameters that were
//                                    updated at least once; "step" is a 0-dim i64 count, the
//                                    buffers have the parameter's shape and state_dtype()
//                                    (in the live state all of them are on the parameter's
//                                    device, so a captured step reads the current count).
// load_state_dict() requires every hyperparameter, known names only, and for each parameter
// either all of its state names or none; it copies the tensors to the parameters' devices.
// It checks everything before changing anything, and throws ValueError (names, values),
// ShapeError or DTypeError naming the entry.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter whose grad() is defined, with autograd recording off; the
  // others keep their values and state. Capturable in a CUDA graph once every parameter it
  // updates has state (after one uncaptured step; SGD without momentum has none).
  virtual void step() = 0;
  // step(), except that the update kernels do nothing when found_inf (a 0-dim floating
  // tensor, read on the device) is nonzero: GradScaler's skip without a host read. An
  // undefined found_inf is step().
  void step_unless(const Tensor& found_inf);
  // Makes every parameter's grad() undefined.
  void zero_grad();

  double lr() const { return lr_->value; }
  // lr >= 0 (ValueError otherwise); the next step() uses it, also when step() was captured
  // in a CUDA graph. Not inside a capture (CaptureError): call it between replays.
  void set_lr(double lr);
  const std::vector<Tensor>& params() const { return params_; }

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

  // A new optimizer of this kind and these hyperparameters (lr included) over params, with
  // no state: what distributed::ShardedOptimizer updates a rank's pieces of the parameters
  // with. Only an optimizer whose update is element by element may be cut so (SGD, Adam,
  // AdamW); the default throws ValueError naming the optimizer. The new optimizer shares this
  // one's learning rate: set_lr on either sets both, so a schedule driving this one drives
  // the pieces too, also in a replayed CUDA graph.
  virtual std::unique_ptr<Optimizer> make_like(std::vector<Tensor> params) const;

 protected:
  Optimizer(const char* name, std::vector<Tensor> params, double lr);

  // (name, value) of every hyperparameter but lr, in state_dict order.
  virtual std::vector<std::pair<std::string, double>> hyperparameters() const = 0;
  // Validates values (keyed like hyperparameters(), lr included) without changing anything.
  virtual void check_hyperparameters(const std::map<std::string, double>& values) const = 0;
  // Adopts values that check_hyperparameters accepted.
  virtual void set_hyperparameters(const std::map<std::string, double>& values) = 0;
  // Names of the state a parameter has once updated, in state_dict order.
  virtual std::vector<std::string> state_names() const = 0;

  // The parameter's gradient, checked against it and made contiguous.
  Tensor checked_grad(size_t index) const;
  // lr_ as a 0-dim f64 tensor on device, which the update kernels read (so that a CUDA
  // graph replays them with the current value); made on first use, refilled by set_lr.
  const Tensor& lr_on(Device device);
  // skip_ on device (undefined outside step_unless).
  Tensor skip_on(Device device) const;
  // made, sharing this optimizer's learning rate (what make_like returns).
  std::unique_ptr<Optimizer> sharing_lr(std::unique_ptr<Optimizer> made) const;
  // Throws CaptureError when parameter index on device has no state yet inside a CUDA graph
  // capture (the state would be made and zeroed on every replay).
  void check_state_capturable(size_t index) const;

  const char* name_;
  std::vector<Tensor> params_;
  // The learning rate and its copies on devices (lr_on), shared with the optimizers made
  // like this one.
  struct LearningRate {
    double value;
    std::vector<std::pair<Device, Tensor>> tensors;
  };
  std::shared_ptr<LearningRate> lr_;
  // state_[i]: params_[i]'s state by name; empty until its first update.
  std::vector<std::map<std::string, Tensor>> state_;
  // During step_unless: the flag, as f64 (kernels read it on the parameters' device).
  Tensor skip_;
};

struct SGDOptions {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// PyTorch's SGD: with g = grad + weight_decay * param and momentum > 0, the buffer starts
// as g and then follows buf = momentum * buf + (1 - dampening) * g; the update uses
// g + momentum * buf (nesterov) or buf. param -= lr * update.
// Options: lr >= 0, momentum >= 0, 0 <= dampening <= 1, weight_decay >= 0; nesterov needs
// momentum > 0 and dampening == 0. State: "momentum_buffer" (when momentum > 0).
// Hyperparameters: lr, momentum, dampening, weight_decay, nesterov.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step() override;
  std::unique_ptr<Optimizer> make_like(std::vector<Tensor> params) const override;
  // The options in effect (lr as set_lr or a schedule left it).
  SGDOptions options() const;

 protected:
  std::vector<std::pair<std::string, double>> hyperparameters() const override;
  void check_hyperparameters(const std::map<std::string, double>& values) const override;
  void set_hyperparameters(const std::map<std::string, double>& values) override;
  std::vector<std::string> state_names() const override;

 private:
  SGDOptions options_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// AdamW's defaults differ from Adam's only in weight_decay.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// PyTorch's Adam (weight decay added to the gradient). Per parameter, at step t (1-based):
// m = lerp(m, g, 1 - beta1), v = beta2 * v + (1 - beta2) * g^2,
// param -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
// Options: lr >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0.
// State: "step", "exp_avg", "exp_avg_sq". Hyperparameters: lr, beta1, beta2, eps,
// weight_decay, decoupled (which must match the optimizer on load).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  void step() override;
  std::unique_ptr<Optimizer> make_like(std::vector<Tensor> params) const override;
  AdamOptions options() const;
  // True for AdamW.
  bool decoupled() const { return decoupled_; }

 protected:
  Adam(const char* name, std::vector<Tensor> params, AdamOptions options, bool decoupled);
  std::vector<std::pair<std::string, double>> hyperparameters() const override;
  void check_hyperparameters(const std::map<std::string, double>& values) const override;
  void set_hyperparameters(const std::map<std::string, double>& values) override;
  std::vector<std::string> state_names() const override;

 private:
  AdamOptions options_;
  bool decoupled_;
};

// PyTorch's AdamW: as Adam, but weight decay shrinks the parameter, param *= 1 - lr * wd,
// before the update instead of entering the gradient.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
};

// A learning rate as a function of the step count, written into an optimizer (which must
// outlive the schedule). Construction sets the optimizer's lr to lr_at(0) and records the
// optimizer's lr before that as base_lr; each step() advances the count by one and sets
// lr_at(count). state_dict(): "schedule.step" (0-dim i64) and "schedule.base_lr" (0-dim f64);
// load_state_dict() restores both and sets the optimizer's lr to match.
class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  LRSchedule(const LRSchedule&) = delete;
  LRSchedule& operator=(const LRSchedule&) = delete;

  void step();
  // Steps taken since construction (or since the loaded state's start).
  int64_t last_step() const { return step_; }
  double base_lr() const { return base_lr_; }
  // The learning rate at step count s >= 0.
  virtual double lr_at(int64_t s) const = 0;

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 protected:
  LRSchedule(const char* name, Optimizer& optimizer);
  // Sets the optimizer's lr to lr_at(0); derived constructors call it once they are valid.
  void start();

  const char* name_;
  Optimizer& optimizer_;
  double base_lr_;
  int64_t step_ = 0;
};

// base_lr * gamma^floor(s / step_size). step_size >= 1, gamma >= 0 (ValueError otherwise).
class StepLR : public LRSchedule {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t s) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// Linear warm-up base_lr * s / warmup_steps for s < warmup_steps (so step 0 runs at lr 0),
// then a half cosine from base_lr at warmup_steps down to min_lr at total_steps, and min_lr
// after that. 0 <= warmup_steps < total_steps, min_lr >= 0 (ValueError otherwise).
class CosineLR : public LRSchedule {
 public:
  CosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);
  double lr_at(int64_t s) const override;

 private:
  int64_t warmup_steps_;
  int64_t total_steps_;
  double min_lr_;
};

// Scales the gradients of params (those with a defined grad()) in place so that their
// total norm is at most max_norm. The total is PyTorch's: the norm_type-norm of the
// per-tensor norm_type-norms (norm_type > 0 or infinity), computed in float64 from
// per-tensor norms rounded to the gradients' dtypes. When total > max_norm every gradient
// is multiplied by max_norm / (total + 1e-6). Returns the total (0 when no parameter has a
// gradient). max_norm >= 0; a NaN total leaves the gradients unchanged. The 2-norm of
// contiguous gradients on one device (up to 256 of them) is one fused pass per gradient
// list (kernels/optim.h: sums of squares in double, then the scaling); other cases take a
// norm per gradient.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

// clip_grad_norm without waiting for the device (as PyTorch's clip_grad_norm_): the total
// stays a 0-dim f64 tensor on the first gradient's device and the factor is applied on the
// device, to the same bits as clip_grad_norm gives. Returns the total (0 on the CPU when
// no parameter has a gradient). For training loops that should not stall the GPU once per
// step (and for CUDA graphs); read the total only when it is needed.
Tensor clip_grad_norm_async(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // clean steps before the scale grows; >= 1
};

// Dynamic loss scaling for f16 training, as PyTorch's GradScaler: the loss is multiplied by
// the scale before backward so that small gradients survive f16's range, and the gradients
// are divided by it before they are used. A step whose gradients hold an inf or a NaN is
// skipped and the scale lowered; after growth_interval clean steps in a row it grows.
//
//   scaler.scale(loss).backward();
//   scaler.unscale_async(params);          // the true gradients; inf/NaN noted on the device
//   clip_grad_norm_async(params, 1.0);
//   scaler.step(optimizer);                // skipped, on the device, after an inf or a NaN
//   scaler.update();
//
// The scale, the clean-step count and the skip decision live on the gradients' device, so
// this loop never waits for the device and can be captured in a CUDA graph.
// unscale(params), which returns whether the gradients are finite, waits for the device
// once. state_dict(): "scale" (0-dim f64) and "growth_tracker" (0-dim i64, clean steps since
// the last change); load_state_dict() restores both, so a resumed run scales as an
// uninterrupted one. Options out of range, unscale twice without update, step or update
// without unscale throw ValueError.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale, recorded (backward from it gives the scaled gradients).
  Tensor scale(const Tensor& loss);
  // Divides the defined floating gradients of params by the scale (replacing each grad())
  // and sets found_inf() to whether any of them holds an inf or a NaN.
  void unscale_async(const std::vector<Tensor>& params);
  // unscale_async, then returns whether all the gradients are finite (one host read);
  // false means: skip this optimizer step.
  bool unscale(const std::vector<Tensor>& params);
  // After unscale: 0-dim f64 on the state's device, 1 when this step's gradients hold an
  // inf or a NaN, else 0.
  const Tensor& found_inf() const;
  // optimizer.step_unless(found_inf()).
  void step(Optimizer& optimizer);
  // Ends the step: on inf/NaN the scale is multiplied by backoff_factor, otherwise the
  // clean-step count grows and, at growth_interval, the scale is multiplied by
  // growth_factor. Runs on the device.
  void update();

  // These read the device.
  double get_scale() const;
  int64_t growth_tracker() const;
  // Steps skipped since construction (not saved in the state).
  int64_t skipped_steps() const;

  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  // Puts the state on device (made from the host values on first use).
  void place_state(Device device);

  GradScalerOptions options_;
  // The state as 0-dim f64 tensors on the gradients' device once used; the host values
  // before that.
  double init_scale_;
  int64_t init_tracker_ = 0;
  Tensor scale_, tracker_, skipped_, found_;
  bool unscaled_ = false;  // unscale since the last update
};

}  // namespace optim
}  // namespace normcore

#pragma GCC visibility pop
