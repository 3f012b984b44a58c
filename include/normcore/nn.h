// Neural-network modules: a Module owns named parameters (leaves that require grad),
// buffers (state that is saved but not trained) and child modules, and names them with
// PyTorch's dotted state_dict keys ("fc1.weight", "body.0.bias"), so weights move between
// PyTorch and normcore through safetensors. Layers compose functional ops from ops.h.
// Modules are shared (std::shared_ptr) and not copyable: parameter handles alias the
// module's tensors, and to()/load_state_dict() change those tensors in place.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "normcore/autograd.h"
#include "normcore/conv.h"
#include "normcore/losses.h"
#include "normcore/pool.h"
#include "normcore/random.h"
#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

// ---- the functional ops of the layers below (namespace normcore, as every functional op) ----

// y = x @ weight^T + bias (PyTorch's F.linear): x [..., in], weight [out, in], bias [out] or
// undefined; one floating dtype (autocast lowers all three). The bias is added inside the
// product (on CUDA, cuBLASLt's bias epilogue), not as a pass of its own over y.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// A transformer's MLP as one op: linear(gelu(linear(x, fc_weight, fc_bias), approximate =
// true), proj_weight, proj_bias), x [..., in] -> [..., out]. On CUDA the GELU is the first
// product's epilogue forward (its input kept for the gradient) and the second product's
// epilogue backward (cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD), not passes of their own. Without
// both biases it is the composition. With recompute_gelu only the GELU's input is kept for
// the backward, which makes its output again (one elementwise pass): hidden values a row
// less held between forward and backward. nn::MLP uses it when its recompute_gelu is set.
Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
                const Tensor& proj_bias, bool recompute_gelu = false);

// Training: each element is zeroed with probability p and the survivors scaled by
// 1 / (1 - p) (all zeros for p = 1); evaluation: the identity. x floating; p in [0, 1].
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

// PyTorch's F.embedding: rows of weight [num, dim] picked by index (i32/i64, any shape,
// values in [0, num)) -> [*index.shape, dim]; repeated rows sum their gradients. The
// padding_idx row (negative counts from the end) is looked up like any other but gets no
// gradient.
Tensor embedding(const Tensor& weight, const Tensor& index, std::optional<int64_t> padding_idx = std::nullopt);

namespace nn {

// (name, tensor) pairs in a fixed order; the same type as safetensors::TensorList.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation on one input. The base class has none and throws Error; modules with
  // other inputs add their own forward overloads.
  virtual Tensor forward(const Tensor& x);
  // forward(x), then the forward hooks. Containers call their children this way.
  Tensor operator()(const Tensor& x);

  // ---- forward hooks (PyTorch's register_forward_hook): hook(module, input, output) after
  // every call through operator(), in the order registered, to inspect activations (a
  // hook that changes output in place changes what the caller gets). A hook on a layer
  // deep inside a model runs, since containers call their children through operator();
  // forward() called directly, and forward overloads with other inputs, run none. The
  // hook must not keep the module alive. HookHandle::remove() unregisters it. ----
  using ForwardHook = std::function<void(Module& module, const Tensor& input, const Tensor& output)>;
  HookHandle register_forward_hook(ForwardHook hook);
  // Whether a forward hook is registered (a model that fuses this module's work into
  // another's kernel must then call it through operator() instead).
  bool has_forward_hooks() const;

  // ---- registration (normally from a subclass's constructor) ----
  // Names are non-empty, contain no '.', and are unique among a module's parameters,
  // buffers and children (ValueError otherwise). The module keeps the given handle.
  // A floating leaf; marked requires_grad. Returns the handle the module keeps.
  Tensor register_parameter(const std::string& name, Tensor tensor);
  // Any dtype; saved in state_dict(), moved by to(), never trained.
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- traversal: this module's own entries in registration order, then each child's,
  // recursively, with "child." prefixed; a tensor or module reachable twice is listed once ----
  std::vector<Tensor> parameters() const;
  NamedTensors named_parameters() const;
  NamedTensors named_buffers() const;
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;

  // ---- mode: training (the default) or evaluation, set recursively ----
  void train(bool training = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Every parameter's grad() becomes undefined.
  void zero_grad();

  // Converts every parameter and buffer in place: each TensorImpl gets new storage, shape,
  // strides and dtype, so every handle to it (an optimizer's list, a member) sees the
  // change; requires_grad is kept and an accumulated grad is converted with it.
  void to(Device device);
  // Floating tensors only; integer and bool buffers keep their dtype.
  void to(DType dtype);

  // ---- state: parameters then buffers of each module, this module's before its
  // children's (PyTorch's order); detached handles that share the module's data ----
  NamedTensors state_dict() const;
  // Copies each entry into the tensor of the same name (converting dtype and device), with
  // recording off. Everything is checked before anything is copied: an entry whose shape
  // differs throws ShapeError; with strict, keys the module lacks (unexpected) or that the
  // dict lacks (missing) throw ValueError. Both messages list every offending name.
  void load_state_dict(const NamedTensors& dict, bool strict = true);
  // state_dict() to / load_state_dict() from a safetensors file.
  void save(const std::string& path) const;
  void load(const std::string& path, bool strict = true);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const char* what, const std::string& name) const;
  // Appends this module's and its descendants' parameters and buffers, keys prefixed.
  void collect_state(const std::string& prefix, bool detached, NamedTensors& out) const;

  struct ForwardHooks;
  std::shared_ptr<ForwardHooks> forward_hooks_;  // created by the first registration
  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// ---- layers ----

// y = x @ weight^T + bias: [*, in_features] -> [*, out_features]. weight [out, in] and
// bias [out] start uniform on [-1/sqrt(in), 1/sqrt(in)] (PyTorch's default), drawn from
// gen (the default generator when null).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;

  const int64_t in_features;
  const int64_t out_features;
  Tensor weight;  // [out_features, in_features]
  Tensor bias;    // [out_features]; undefined when built without bias
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// Exact GELU, or its tanh approximation.
class GELU : public Module {
 public:
  explicit GELU(bool approximate = false) : approximate(approximate) {}
  Tensor forward(const Tensor& x) override;
  const bool approximate;
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// dropout() with the module's training flag; masks drawn from gen (default generator when null).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  const double p;

 private:
  Generator* gen_;
};

// Dims start_dim..end_dim merged into one: [2, 3, 4, 5] with (1, -1) -> [2, 60].
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override;
  const int64_t start_dim;
  const int64_t end_dim;
};

// Children named "0", "1", ...; forward feeds each one's output to the next (the input
// itself when empty).
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return layers_.size(); }
  // The i-th module; IndexError when i >= size().
  std::shared_ptr<Module> operator[](size_t i) const;
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

// A lookup table: index (i32/i64, any shape, values in [0, num_embeddings)) ->
// [*index.shape, embedding_dim]. weight [num_embeddings, embedding_dim] starts N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator* gen = nullptr);
  Tensor forward(const Tensor& index) override;

  const int64_t num_embeddings;
  const int64_t embedding_dim;
  Tensor weight;  // [num_embeddings, embedding_dim]
};

// layer_norm over the trailing normalized_shape dims: [*, normalized_shape] -> same.
// weight (ones) and bias (zeros) have shape normalized_shape; bias needs elementwise_affine.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true);
  Tensor forward(const Tensor& x) override;

  const std::vector<int64_t> normalized_shape;
  const double eps;
  Tensor weight;  // normalized_shape; undefined without elementwise_affine
  Tensor bias;    // normalized_shape; undefined without elementwise_affine or bias
};

// rms_norm over the trailing normalized_shape dims: [*, normalized_shape] -> same. weight
// (ones) has shape normalized_shape. PyTorch's nn.RMSNorm leaves eps unset (the dtype's
// epsilon); here it is a number, 1e-6 by default, as most transformer code sets it.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(std::vector<int64_t> normalized_shape, double eps = 1e-6, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;

  const std::vector<int64_t> normalized_shape;
  const double eps;
  Tensor weight;  // normalized_shape; undefined without elementwise_affine
};

// group_norm: [N, num_channels, *] -> same; weight (ones) and bias (zeros) [num_channels].
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;

  const int64_t num_groups;
  const int64_t num_channels;
  const double eps;
  Tensor weight;  // [num_channels]; undefined without affine
  Tensor bias;    // [num_channels]; undefined without affine
};

// l1_norm along dim; no parameters.
class L1Norm : public Module {
 public:
  explicit L1Norm(int64_t dim = 1, double eps = 1e-12);
  Tensor forward(const Tensor& x) override;
  const int64_t dim;
  const double eps;
};

// frobenius_norm of the whole input; no parameters.
class FrobeniusNorm : public Module {
 public:
  explicit FrobeniusNorm(double eps = 1e-12);
  Tensor forward(const Tensor& x) override;
  const double eps;
};

// ---- convolutional networks ----

// conv2d: [N, in_channels, H, W] -> [N, out_channels, Ho, Wo]. weight
// [out_channels, in_channels / groups, kh, kw] and bias [out_channels] start uniform on
// [-1/sqrt(fan_in), 1/sqrt(fan_in)], fan_in = in_channels / groups * kh * kw (PyTorch's
// default), drawn from gen (the default generator when null).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1, Size2 padding = 0,
         Size2 dilation = 1, int64_t groups = 1, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;

  const int64_t in_channels;
  const int64_t out_channels;
  const Size2 kernel_size;
  const Size2 stride;
  const Size2 padding;
  const Size2 dilation;
  const int64_t groups;
  Tensor weight;  // [out_channels, in_channels / groups, kh, kw]
  Tensor bias;    // [out_channels]; undefined when built without bias
};

// The weight and bias of one convolution.
struct ConvWeights {
  Tensor weight;
  Tensor bias;
};
class BatchNorm;
// conv followed by bn in evaluation mode (its running statistics) as one convolution: the
// weight of output channel o scaled by s = gamma[o] / sqrt(running_var[o] + eps), the bias
// (conv's, or 0) becoming (bias - running_mean) * s + beta, computed in f64 and returned in
// conv's dtype and device; with layout NHWC the weight comes as [O, kh, kw, C / groups]. For
// conv2d_fused at inference. A BatchNorm without running statistics (it normalizes with
// each batch's own) or of another width is an Error naming both layers' shapes.
ConvWeights fold_batch_norm(const Conv2d& conv, const BatchNorm& bn, ConvLayout layout = ConvLayout::NCHW);

// max_pool2d with fixed hyper-parameters; no parameters.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, Size2 stride = Size2(), Size2 padding = 0, Size2 dilation = 1,
                     bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;

  const Size2 kernel_size;
  const Size2 stride;  // kernel_size when not given
  const Size2 padding;
  const Size2 dilation;
  const bool ceil_mode;
};

// avg_pool2d with fixed hyper-parameters; no parameters.
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, Size2 stride = Size2(), Size2 padding = 0, bool ceil_mode = false,
                     bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;

  const Size2 kernel_size;
  const Size2 stride;  // kernel_size when not given
  const Size2 padding;
  const bool ceil_mode;
  const bool count_include_pad;
};

// adaptive_avg_pool2d to output_size; no parameters.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& x) override;
  const Size2 output_size;
};

// batch_norm over the channels of [N, C, *]. weight (ones) and bias (zeros) [C] with affine;
// with track_running_stats the buffers running_mean (zeros), running_var (ones) [C] and
// num_batches_tracked (i64, shape []) of PyTorch's state_dict. Training updates them with
// momentum, or, when momentum is not given, with the cumulative average
// (1 / num_batches_tracked); evaluation normalizes with them. Without
// track_running_stats, batch statistics are used in both modes.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;

  const int64_t num_features;
  const double eps;
  const std::optional<double> momentum;
  const bool track_running_stats;
  Tensor weight;               // [num_features]; undefined without affine
  Tensor bias;                 // [num_features]; undefined without affine
  Tensor running_mean;         // [num_features]; undefined without track_running_stats
  Tensor running_var;          // [num_features]; undefined without track_running_stats
  Tensor num_batches_tracked;  // i64 []; undefined without track_running_stats

 protected:
  // layer names the subclass in messages; ranks lists the input ranks it takes.
  BatchNorm(const char* layer, std::vector<int64_t> ranks, int64_t num_features, double eps,
            std::optional<double> momentum, bool affine, bool track_running_stats);

 private:
  const char* layer_;
  std::vector<int64_t> ranks_;
};

// BatchNorm over [N, C] or [N, C, L].
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
};

// BatchNorm over [N, C, H, W].
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
};

// ---- transformers ----

// The keys and values one attention layer has seen, for incremental decoding: k and v
// [B, H, max_len, D], of which positions [0, length) are filled. Made by
// CausalSelfAttention::make_cache; forward(x, cache) fills it.
struct KVCache {
  Tensor k;
  Tensor v;
  int64_t length = 0;
  int64_t max_len() const { return k.defined() ? k.size(2) : 0; }
};

// Multi-head causal self-attention with one fused projection: x [B, T, C] -> "qkv"
// Linear(C, 3C) -> q, k, v [B, H, T, D] (views of it, D = C / H) -> causal
// scaled_dot_product_attention -> [B, T, C] -> "proj" Linear(C, C) -> dropout. Attention
// weights are not dropped (scaled_dot_product_attention has no dropout); dropout applies
// to the output, a residual branch, in training. Masks come from gen.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t embed_dim, int64_t heads, bool bias = true, double dropout = 0.0,
                      Generator* gen = nullptr);
  // x [B, T, C] -> [B, T, C]; position t attends to positions 0..t.
  Tensor forward(const Tensor& x) override;
  // Incremental decoding, in eval mode (Error in training): x [B, T, C] holds positions
  // cache.length .. cache.length + T - 1; their keys and values are written into the cache
  // and each attends to every cached position up to its own. T tokens on an empty cache
  // (a prefill), then one at a time; a multi-token step on a non-empty cache, or more
  // positions than max_len, is an Error. Gives what forward() gives for those positions.
  Tensor forward(const Tensor& x, KVCache& cache);
  // One decoding step whose positions live on the device (cached_attention), so that a CUDA
  // graph replays it at every position: x [B, 1, C] holds position positions[b] (i64 [B] on
  // x's device) of row b, whose key and value go into the cache there, attending to the
  // cache's positions up to it. cache.length is the caller's to keep. Eval mode only.
  Tensor forward(const Tensor& x, KVCache& cache, const Tensor& positions);
  // An empty cache for batch sequences of up to max_len positions, zeros of the weights'
  // dtype on their device.
  KVCache make_cache(int64_t batch, int64_t max_len) const;

  const int64_t embed_dim;
  const int64_t heads;
  const int64_t head_dim;
  const double dropout;
  std::shared_ptr<Linear> qkv;   // [3C, C]: q, k, v stacked along the output features
  std::shared_ptr<Linear> proj;  // [C, C]

 private:
  // q, k, v [B, H, T, D] as views of the qkv projection of x [B, T, C].
  std::vector<Tensor> project(const Tensor& x);
  // y [B, H, T, D] -> proj(y as [B, T, C]) -> dropout.
  Tensor output(const Tensor& y);
  Generator* gen_;
};

// The transformer's feed-forward block: "fc" Linear(C, 4C) -> GELU (tanh approximation, as
// GPT-2) -> "proj" Linear(4C, C) -> dropout (training only). [*, C] -> [*, C].
class MLP : public Module {
 public:
  MLP(int64_t embed_dim, bool bias = true, double dropout = 0.0, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;

  // Trade a pass for memory: keep only the GELU's input for the backward and make its output
  // again there (gelu_mlp's recompute_gelu), 4 * embed_dim values a token less held from the
  // forward to the backward. Needs the biases and no forward hooks on fc or proj (otherwise
  // the layers run one by one, keeping both).
  bool recompute_gelu = false;
  const double dropout;
  std::shared_ptr<Linear> fc;
  std::shared_ptr<Linear> proj;

 private:
  Generator* gen_;
};

// A pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)). norm is
// "layernorm" (LayerNorm, with a bias when bias is set) or "rmsnorm" (RMSNorm, eps 1e-6);
// children "norm1", "attn", "norm2", "mlp". [B, T, C] -> [B, T, C].
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t embed_dim, int64_t heads, const std::string& norm = "layernorm", bool bias = true,
                   double dropout = 0.0, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // With the attention's KV cache (CausalSelfAttention::forward(x, cache)'s rules).
  Tensor forward(const Tensor& x, KVCache& cache);
  // A decoding step at device positions (CausalSelfAttention::forward(x, cache, positions)).
  Tensor forward(const Tensor& x, KVCache& cache, const Tensor& positions);
  // For a stack of blocks: given x and normed = norm1(x), returns {block(x), next(block(x))}
  // with both residual adds and the LayerNorms after them (norm2, then next) as add_layer_norm
  // passes. Needs can_fuse_norms() and a LayerNorm `next` over the last dim with a weight.
  std::pair<Tensor, Tensor> forward_normed(const Tensor& x, const Tensor& normed, const LayerNorm& next);
  // Whether norm1 and norm2 are LayerNorms over the last dim with weights and no forward
  // hook is registered on them or the block: then forward folds norm2 into the residual add
  // before it (add_layer_norm) and forward_normed applies.
  bool can_fuse_norms() const;

  std::shared_ptr<Module> norm1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<Module> norm2;
  std::shared_ptr<MLP> mlp;
};

// The functional ops' former names in nn, from before functional ops all lived in namespace
// normcore. They forward to normcore::linear, gelu_mlp, dropout and embedding and go in a
// later release.
[[deprecated("use normcore::linear")]] inline Tensor linear(const Tensor& x, const Tensor& weight,
                                                            const Tensor& bias = Tensor()) {
  return normcore::linear(x, weight, bias);
}
[[deprecated("use normcore::gelu_mlp")]] inline Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight,
                                                                const Tensor& fc_bias, const Tensor& proj_weight,
                                                                const Tensor& proj_bias, bool recompute_gelu = false) {
  return normcore::gelu_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, recompute_gelu);
}
[[deprecated("use normcore::dropout")]] inline Tensor dropout(const Tensor& x, double p, bool training,
                                                              Generator* gen = nullptr) {
  return normcore::dropout(x, p, training, gen);
}
[[deprecated("use normcore::embedding")]] inline Tensor embedding(const Tensor& weight, const Tensor& index,
                                                                  std::optional<int64_t> padding_idx = std::nullopt) {
  return normcore::embedding(weight, index, padding_idx);
}

}  // namespace nn
}  // namespace normcore

#pragma GCC visibility pop
