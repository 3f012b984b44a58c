// Bad calls to the normalizations, attention, fused ops, losses, layers, modules and
// pooling, one row each, as in test_errors.cpp (errors_support.h: the row and its runner).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "tests/ops/errors_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using namespace errors_test;

TEST(Errors, NormErrors) {
  const Tensor undefined;
  const Tensor x23 = nc::zeros({2, 3});
  const Tensor x243 = nc::zeros({2, 4, 3});
  const Tensor ints = nc::zeros({2, 3}, DType::I64);
  run_table({
      bad<nc::ValueError>("layer_norm(undefined)", [&] { nc::layer_norm(undefined, {3}, undefined, undefined); },
                          {"layer_norm", "'x'"}),
      bad<nc::DTypeError>("layer_norm of int", [&] { nc::layer_norm(ints, {3}, undefined, undefined); },
                          {"layer_norm", "x", "floating", "i64"}),
      bad<nc::ValueError>("layer_norm eps 0", [&] { nc::layer_norm(x23, {3}, undefined, undefined, 0); },
                          {"layer_norm", "eps", "0"}),
      bad<nc::ValueError>("layer_norm NaN eps", [&] { nc::layer_norm(x23, {3}, undefined, undefined, NAN); },
                          {"layer_norm", "eps", "nan"}),
      bad<nc::ShapeError>("layer_norm empty normalized_shape", [&] { nc::layer_norm(x23, {}, undefined, undefined); },
                          {"layer_norm", "normalized_shape", "[]", "[2, 3]"}),
      bad<nc::ShapeError>("layer_norm normalized_shape off the trailing dims",
                          [&] { nc::layer_norm(x23, {4}, undefined, undefined); },
                          {"layer_norm", "normalized_shape [4]", "[2, 3]"}),
      bad<nc::ShapeError>("layer_norm normalized_shape longer than x",
                          [&] {
                            nc::layer_norm(x23, {1, 2, 3}, undefined, undefined);
                          },
                          {"layer_norm", "normalized_shape [1, 2, 3]", "[2, 3]"}),
      bad<nc::ShapeError>("layer_norm weight shape", [&] { nc::layer_norm(x23, {3}, nc::ones({2}), undefined); },
                          {"layer_norm", "weight", "[3]", "f32 [2]"}),
      bad<nc::DTypeError>("layer_norm bias dtype",
                          [&] { nc::layer_norm(x23, {3}, undefined, nc::ones({3}, DType::F64)); },
                          {"layer_norm", "bias", "f64 [3]", "f32 [2, 3]"}),
      bad<nc::ValueError>("rms_norm(undefined)", [&] { nc::rms_norm(undefined, {3}, undefined); }, {"rms_norm", "'x'"}),
      bad<nc::DTypeError>("rms_norm of int", [&] { nc::rms_norm(ints, {3}, undefined); },
                          {"rms_norm", "x", "floating", "i64"}),
      bad<nc::ValueError>("rms_norm eps 0", [&] { nc::rms_norm(x23, {3}, undefined, 0); }, {"rms_norm", "eps", "0"}),
      bad<nc::ShapeError>("rms_norm normalized_shape off the trailing dims", [&] { nc::rms_norm(x23, {2}, undefined); },
                          {"rms_norm", "normalized_shape [2]", "[2, 3]"}),
      bad<nc::ShapeError>("rms_norm weight shape",
                          [&] {
                            nc::rms_norm(x23, {3}, nc::ones({3, 1}));
                          },
                          {"rms_norm", "weight", "[3]", "f32 [3, 1]"}),
      bad<nc::DTypeError>("rms_norm weight dtype", [&] { nc::rms_norm(x23, {3}, nc::ones({3}, DType::F16)); },
                          {"rms_norm", "weight", "f16 [3]", "f32 [2, 3]"}),
      bad<nc::ValueError>("group_norm(undefined)", [&] { nc::group_norm(undefined, 1, undefined, undefined); },
                          {"group_norm", "'x'"}),
      bad<nc::DTypeError>("group_norm of int",
                          [&] {
                            nc::group_norm(nc::zeros({2, 4}, DType::I32), 2, undefined, undefined);
                          },
                          {"group_norm", "x", "floating", "i32"}),
      bad<nc::ShapeError>("group_norm of 1-D", [&] { nc::group_norm(nc::zeros({4}), 1, undefined, undefined); },
                          {"group_norm", "x", "[N, C, *]", "[4]"}),
      bad<nc::ValueError>("group_norm 0 groups", [&] { nc::group_norm(x243, 0, undefined, undefined); },
                          {"group_norm", "num_groups", "0"}),
      bad<nc::ShapeError>("group_norm C not divisible", [&] { nc::group_norm(x243, 3, undefined, undefined); },
                          {"group_norm", "C = 4", "num_groups = 3", "[2, 4, 3]"}),
      bad<nc::ValueError>("group_norm of one value per group",
                          [&] {
                            nc::group_norm(nc::ones({1, 4}), 4, undefined, undefined);
                          },
                          {"group_norm", "more than 1 value per group", "[1, 4]", "4 groups"}),
      bad<nc::ShapeError>("group_norm weight shape", [&] { nc::group_norm(x243, 2, nc::ones({3}), undefined); },
                          {"group_norm", "weight", "[4]", "f32 [3]"}),
      bad<nc::DTypeError>("group_norm bias dtype",
                          [&] { nc::group_norm(x243, 2, undefined, nc::ones({4}, DType::F16)); },
                          {"group_norm", "bias", "f16 [4]", "f32 [2, 4, 3]"}),
      bad<nc::ValueError>("group_norm negative eps", [&] { nc::group_norm(x243, 2, undefined, undefined, -1); },
                          {"group_norm", "eps", "-1"}),
      bad<nc::ValueError>("l1_norm(undefined)", [&] { nc::l1_norm(undefined); }, {"l1_norm", "'x'"}),
      bad<nc::DTypeError>("l1_norm of int", [&] { nc::l1_norm(ints); }, {"l1_norm", "x", "floating", "i64"}),
      bad<nc::IndexError>("l1_norm dim", [&] { nc::l1_norm(x23, 2); }, {"l1_norm", "dim 2", "2 dims"}),
      bad<nc::ValueError>("l1_norm eps 0", [&] { nc::l1_norm(x23, 1, 0); }, {"l1_norm", "eps", "0"}),
      bad<nc::ValueError>("frobenius_norm(undefined)", [&] { nc::frobenius_norm(undefined); },
                          {"frobenius_norm", "'x'"}),
      bad<nc::DTypeError>("frobenius_norm of int", [&] { nc::frobenius_norm(ints); },
                          {"frobenius_norm", "x", "floating", "i64"}),
      bad<nc::ValueError>("frobenius_norm NaN eps", [&] { nc::frobenius_norm(x23, NAN); },
                          {"frobenius_norm", "eps", "nan"}),
      bad<nc::ValueError>("batch_norm(undefined)",
                          [&] { nc::batch_norm(undefined, undefined, undefined, undefined, undefined, true); },
                          {"batch_norm", "'x'"}),
      bad<nc::DTypeError>("batch_norm of int",
                          [&] { nc::batch_norm(ints, undefined, undefined, undefined, undefined, true); },
                          {"batch_norm", "x", "floating", "i64"}),
      bad<nc::ShapeError>("batch_norm of 1-D",
                          [&] { nc::batch_norm(nc::zeros({4}), undefined, undefined, undefined, undefined, true); },
                          {"batch_norm", "x", "[N, C, *]", "[4]"}),
      bad<nc::ValueError>("batch_norm eps 0",
                          [&] { nc::batch_norm(x243, undefined, undefined, undefined, undefined, true, 0.1, 0); },
                          {"batch_norm", "eps", "0"}),
      bad<nc::ShapeError>("batch_norm weight shape",
                          [&] { nc::batch_norm(x243, undefined, undefined, nc::ones({3}), undefined, true); },
                          {"batch_norm", "weight", "[4]", "f32 [3]", "f32 [2, 4, 3]"}),
      bad<nc::ShapeError>("batch_norm running_mean shape",
                          [&] { nc::batch_norm(x243, nc::zeros({2}), nc::ones({4}), undefined, undefined, false); },
                          {"batch_norm", "running_mean", "[4]", "f32 [2]"}),
      bad<nc::DTypeError>("batch_norm running_var dtype",
                          [&] {
                            nc::batch_norm(x243, nc::zeros({4}), nc::ones({4}, DType::F64), undefined, undefined, true);
                          },
                          {"batch_norm", "running_var", "f64 [4]", "f32 [2, 4, 3]"}),
      bad<nc::ValueError>("batch_norm evaluation without running_mean",
                          [&] { nc::batch_norm(x243, undefined, nc::ones({4}), undefined, undefined, false); },
                          {"batch_norm", "running_mean", "training = false"}),
      bad<nc::ValueError>("batch_norm evaluation without running_var",
                          [&] { nc::batch_norm(x243, nc::zeros({4}), undefined, undefined, undefined, false); },
                          {"batch_norm", "running_var", "training = false"}),
      bad<nc::ValueError>("batch_norm one value per channel in training",
                          [&] {
                            nc::batch_norm(nc::zeros({1, 4, 1}), undefined, undefined, undefined, undefined, true);
                          },
                          {"batch_norm", "more than 1 value per channel", "[1, 4, 1]"}),
  });
}

TEST(Errors, AttentionErrors) {
  const Tensor undefined;
  const Tensor q = nc::zeros({1, 2, 3, 4}), k = nc::zeros({1, 2, 5, 4}), v = nc::zeros({1, 2, 5, 6});
  auto sdpa = [](const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.5) {
    nc::scaled_dot_product_attention(q, k, v, false, scale);
  };
  run_table({
      bad<nc::ValueError>("sdpa(undefined k)", [&] { sdpa(q, undefined, v); }, {"scaled_dot_product_attention", "'k'"}),
      bad<nc::ShapeError>("sdpa 3-D q",
                          [&] {
                            sdpa(nc::zeros({2, 3, 4}), k, v);
                          },
                          {"scaled_dot_product_attention", "q", "4-D", "[2, 3, 4]"}),
      bad<nc::ShapeError>("sdpa heads of v",
                          [&] {
                            sdpa(q, k, nc::zeros({1, 3, 5, 6}));
                          },
                          {"scaled_dot_product_attention", "k and v must have the same head count", "[1, 3, 5, 6]"}),
      bad<nc::ShapeError>("sdpa heads of k and v without enable_gqa",
                          [&] {
                            sdpa(q, nc::zeros({1, 1, 5, 4}), nc::zeros({1, 1, 5, 6}));
                          },
                          {"scaled_dot_product_attention", "q's head count 2", "[1, 1, 5, 4]", "enable_gqa"}),
      bad<nc::ShapeError>("sdpa head dim of k",
                          [&] {
                            sdpa(q, nc::zeros({1, 2, 5, 3}), v);
                          },
                          {"scaled_dot_product_attention", "head dim D", "[1, 2, 3, 4]", "[1, 2, 5, 3]"}),
      bad<nc::ShapeError>("sdpa key count of v",
                          [&] {
                            sdpa(q, k, nc::zeros({1, 2, 4, 6}));
                          },
                          {"scaled_dot_product_attention", "key count S", "[1, 2, 5, 4]", "[1, 2, 4, 6]"}),
      bad<nc::ShapeError>("sdpa D = 0",
                          [&] {
                            sdpa(nc::zeros({1, 2, 3, 0}), nc::zeros({1, 2, 5, 0}), v);
                          },
                          {"scaled_dot_product_attention", "at least 1"}),
      bad<nc::DTypeError>("sdpa of int", [&] { sdpa(q.to(DType::I32), k, v); },
                          {"scaled_dot_product_attention", "q", "floating", "i32"}),
      bad<nc::DTypeError>("sdpa v dtype", [&] { sdpa(q, k, v.to(DType::BF16)); },
                          {"scaled_dot_product_attention", "v", "bf16", "f32 [1, 2, 3, 4]"}),
      bad<nc::ValueError>("sdpa NaN scale", [&] { sdpa(q, k, v, NAN); }, {"scaled_dot_product_attention", "scale"}),
  });
  if (!nc::cuda_is_available()) return;
  const nc::Device gpu = nc::Device::cuda();
  run_table({
      bad<nc::DeviceError>("sdpa k on another device", [&] { sdpa(q, k.to(gpu), v); },
                           {"scaled_dot_product_attention", "cuda:0", "cpu"}),
      bad<nc::ShapeError>(
          "sdpa head dim over the CUDA limit",
          [&] {
            sdpa(nc::zeros({1, 1, 2, 264}, gpu), nc::zeros({1, 1, 2, 264}, gpu), nc::zeros({1, 1, 2, 264}, gpu));
          },
          {"scaled_dot_product_attention", "head dims up to 256", "D = 264"}),
  });
}

TEST(Errors, FusedOpErrors) {
  // x [2, 3], weight [4, 3] -> OUT = 4; bias [1, 4, 1, 1]; two groups.
  const Tensor undefined;
  const Tensor x = nc::zeros({2, 3});
  const Tensor weight = nc::zeros({4, 3});
  const Tensor bias = nc::zeros({1, 4, 1, 1});
  const auto fused = [&](const Tensor& x_, const Tensor& weight_, const Tensor& linear_bias, const Tensor& gn_weight,
                         const Tensor& gn_bias, const Tensor& bias_, int64_t groups, double eps = 1e-5) {
    nc::gemm_group_norm_min_bias(x_, weight_, linear_bias, gn_weight, gn_bias, bias_, groups, eps);
  };
  const std::string op = "gemm_group_norm_min_bias:";
  run_table({
      bad<nc::ValueError>("x undefined", [&] { fused(undefined, weight, undefined, undefined, undefined, bias, 2); },
                          {op, "'x'"}),
      bad<nc::DTypeError>("x int", [&] { fused(x.to(DType::I64), weight, undefined, undefined, undefined, bias, 2); },
                          {op, "x", "floating", "i64"}),
      bad<nc::ShapeError>("x 3-D",
                          [&] {
                            fused(nc::zeros({2, 4, 3}), weight, undefined, undefined, undefined, bias, 2);
                          },
                          {op, "x", "[B, IN]", "[2, 4, 3]"}),
      bad<nc::ValueError>("weight undefined", [&] { fused(x, undefined, undefined, undefined, undefined, bias, 2); },
                          {op, "'weight'"}),
      bad<nc::ShapeError>("weight IN",
                          [&] {
                            fused(x, nc::zeros({4, 5}), undefined, undefined, undefined, bias, 2);
                          },
                          {op, "weight", "[OUT, 3]", "[4, 5]"}),
      bad<nc::ShapeError>("weight 1-D", [&] { fused(x, nc::zeros({3}), undefined, undefined, undefined, bias, 2); },
                          {op, "weight", "[OUT, 3]", "f32 [3]"}),
      bad<nc::DTypeError>("weight dtype",
                          [&] { fused(x, weight.to(DType::F64), undefined, undefined, undefined, bias, 2); },
                          {op, "weight", "f64 [4, 3]", "f32 [2, 3]"}),
      bad<nc::ShapeError>("OUT 0",
                          [&] {
                            fused(x, nc::zeros({0, 3}), undefined, undefined, undefined, nc::zeros({1, 0, 1, 1}), 2);
                          },
                          {op, "OUT", "[0, 3]"}),
      bad<nc::ValueError>("0 groups", [&] { fused(x, weight, undefined, undefined, undefined, bias, 0); },
                          {op, "num_groups", "0"}),
      bad<nc::ShapeError>("OUT not divisible", [&] { fused(x, weight, undefined, undefined, undefined, bias, 3); },
                          {op, "OUT = 4", "num_groups = 3"}),
      bad<nc::ValueError>("eps 0", [&] { fused(x, weight, undefined, undefined, undefined, bias, 2, 0.0); },
                          {op, "eps", "0"}),
      bad<nc::ValueError>("one value per group",
                          [&] {
                            fused(nc::ones({1, 3}), nc::ones({4, 3}), undefined, undefined, undefined, bias, 4);
                          },
                          {op, "more than 1 value per group", "B = 1", "OUT = 4", "4 groups"}),
      bad<nc::ValueError>("NaN eps", [&] { fused(x, weight, undefined, undefined, undefined, bias, 2, NAN); },
                          {op, "eps", "nan"}),
      bad<nc::ShapeError>("linear_bias shape", [&] { fused(x, weight, nc::zeros({3}), undefined, undefined, bias, 2); },
                          {op, "linear_bias", "[4]", "f32 [3]"}),
      bad<nc::DTypeError>("gn_weight dtype",
                          [&] { fused(x, weight, undefined, nc::zeros({4}, DType::F64), undefined, bias, 2); },
                          {op, "gn_weight", "f64 [4]", "f32 [2, 3]"}),
      bad<nc::ShapeError>("gn_bias shape",
                          [&] {
                            fused(x, weight, undefined, undefined, nc::zeros({1, 4}), bias, 2);
                          },
                          {op, "gn_bias", "[4]", "[1, 4]"}),
      bad<nc::ValueError>("bias undefined", [&] { fused(x, weight, undefined, undefined, undefined, undefined, 2); },
                          {op, "'bias'"}),
      bad<nc::ShapeError>("bias shape", [&] { fused(x, weight, undefined, undefined, undefined, nc::zeros({4}), 2); },
                          {op, "bias", "[1, 4, 1, 1]", "f32 [4]"}),
  });
}

TEST(Errors, LossErrors) {
  namespace nn = nc::nn;
  const Tensor undefined;
  const Tensor logits = nc::zeros({2, 3});
  const Tensor target = i64({0, 1}, {2});
  const Tensor ints = nc::zeros({2, 3}, DType::I64);
  run_table({
      bad<nc::ValueError>("cross_entropy undefined logits", [&] { nc::cross_entropy(undefined, target); },
                          {"cross_entropy", "'logits'"}),
      bad<nc::ValueError>("cross_entropy undefined target", [&] { nc::cross_entropy(logits, undefined); },
                          {"cross_entropy", "'target'"}),
      bad<nc::DTypeError>("cross_entropy int logits", [&] { nc::cross_entropy(ints, target); },
                          {"cross_entropy", "logits", "floating", "i64 [2, 3]"}),
      bad<nc::DTypeError>("cross_entropy float target", [&] { nc::cross_entropy(logits, nc::zeros({2})); },
                          {"cross_entropy", "target", "i64", "f32 [2]"}),
      bad<nc::DTypeError>("cross_entropy i32 target", [&] { nc::cross_entropy(logits, nc::zeros({2}, DType::I32)); },
                          {"cross_entropy", "target", "i32 [2]"}),
      bad<nc::ShapeError>("cross_entropy 0-dim logits", [&] { nc::cross_entropy(nc::full({}, 1.0), i64_scalar(0)); },
                          {"cross_entropy", "logits", "f32 []"}),
      bad<nc::ShapeError>("cross_entropy target shape",
                          [&] {
                            nc::cross_entropy(logits, i64({0, 1, 2}, {3}));
                          },
                          {"cross_entropy", "target", "[3]", "[2, 3]", "[2]"}),
      bad<nc::IndexError>("cross_entropy class too large",
                          [&] {
                            nc::cross_entropy(logits, i64({0, 3}, {2}));
                          },
                          {"cross_entropy", "target value 3", "3 classes"}),
      bad<nc::IndexError>("cross_entropy negative class",
                          [&] {
                            nc::cross_entropy(logits, i64({-1, 0}, {2}));
                          },
                          {"cross_entropy", "target value -1", "3 classes"}),
      bad<nc::ValueError>("cross_entropy label_smoothing 1.5",
                          [&] { nc::cross_entropy(logits, target, nc::Reduction::Mean, 1.5); },
                          {"cross_entropy", "label_smoothing", "1.5"}),
      bad<nc::ValueError>("cross_entropy NaN label_smoothing",
                          [&] { nc::cross_entropy(logits, target, nc::Reduction::Mean, NAN); },
                          {"cross_entropy", "label_smoothing", "nan"}),
      bad<nc::ValueError>("nll_loss undefined log_probs", [&] { nc::nll_loss(undefined, target); },
                          {"nll_loss", "'log_probs'"}),
      bad<nc::DTypeError>("nll_loss int log_probs", [&] { nc::nll_loss(ints, target); },
                          {"nll_loss", "log_probs", "floating", "i64"}),
      bad<nc::DTypeError>("nll_loss float target", [&] { nc::nll_loss(logits, nc::zeros({2})); },
                          {"nll_loss", "target", "f32 [2]"}),
      bad<nc::ShapeError>("nll_loss per-position target shape",
                          [&] {
                            nc::nll_loss(nc::zeros({2, 3, 4, 5}), nc::zeros({2, 4, 6}, DType::I64));
                          },
                          {"nll_loss", "target", "[2, 4, 6]", "[2, 4, 5]"}),
      bad<nc::IndexError>("nll_loss class too large",
                          [&] {
                            nc::nll_loss(logits, i64({3, 0}, {2}));
                          },
                          {"nll_loss", "target value 3", "3 classes"}),
      bad<nc::ValueError>("mse_loss undefined target", [&] { nc::mse_loss(logits, undefined); },
                          {"mse_loss", "'target'"}),
      bad<nc::ShapeError>("mse_loss shapes", [&] { nc::mse_loss(logits, nc::zeros({3})); },
                          {"mse_loss", "input", "[2, 3]", "target", "[3]"}),
      bad<nc::DTypeError>("mse_loss int input", [&] { nc::mse_loss(ints, logits); }, {"mse_loss", "input", "i64"}),
      bad<nc::DTypeError>("mse_loss int target", [&] { nc::mse_loss(logits, ints); }, {"mse_loss", "target", "i64"}),
      bad<nc::ValueError>("l1_loss undefined input", [&] { nc::l1_loss(undefined, logits); }, {"l1_loss", "'input'"}),
      bad<nc::ShapeError>("l1_loss shapes",
                          [&] {
                            nc::l1_loss(logits, nc::zeros({2, 1}));
                          },
                          {"l1_loss", "input", "[2, 3]", "target", "[2, 1]"}),
      bad<nc::DTypeError>("l1_loss int target", [&] { nc::l1_loss(logits, ints); }, {"l1_loss", "target", "i64"}),
      bad<nc::ValueError>("binary_cross_entropy_with_logits undefined logits",
                          [&] { nc::binary_cross_entropy_with_logits(undefined, logits); },
                          {"binary_cross_entropy_with_logits", "'logits'"}),
      bad<nc::ShapeError>("binary_cross_entropy_with_logits shapes",
                          [&] {
                            nc::binary_cross_entropy_with_logits(logits, nc::zeros({3, 2}));
                          },
                          {"binary_cross_entropy_with_logits", "logits", "[2, 3]", "target", "[3, 2]"}),
      bad<nc::DTypeError>("binary_cross_entropy_with_logits int logits",
                          [&] { nc::binary_cross_entropy_with_logits(ints, logits); },
                          {"binary_cross_entropy_with_logits", "logits", "i64"}),
      bad<nc::DTypeError>("binary_cross_entropy_with_logits bool target",
                          [&] {
                            nc::binary_cross_entropy_with_logits(logits, nc::zeros({2, 3}, DType::Bool));
                          },
                          {"binary_cross_entropy_with_logits", "target", "bool"}),
  });
}

TEST(Errors, LayerErrors) {
  namespace nn = nc::nn;
  const Tensor undefined;
  const Tensor x23 = nc::zeros({2, 3});
  run_table({
      bad<nc::ValueError>("Linear negative in_features", [] { nn::Linear(-1, 2); }, {"Linear", "in_features", "-1"}),
      bad<nc::ValueError>("Linear negative out_features", [] { nn::Linear(2, -3); }, {"Linear", "out_features", "-3"}),
      bad<nc::ValueError>("Linear(undefined)", [&] { nn::Linear(3, 2)(undefined); }, {"Linear", "input", "undefined"}),
      bad<nc::ShapeError>("Linear input size", [&] { nn::Linear(4, 2)(x23); },
                          {"Linear", "in_features = 4", "f32 [2, 3]", "f32 [2, 4]"}),
      bad<nc::ShapeError>("Linear 0-dim input", [&] { nn::Linear(4, 2)(nc::full({}, 1.0)); },
                          {"Linear", "in_features = 4", "f32 []"}),
      bad<nc::DTypeError>("Linear input dtype", [&] { nn::Linear(3, 2)(x23.to(DType::F64)); },
                          {"Linear", "input", "f64 [2, 3]", "weight", "f32 [2, 3]"}),
      bad<nc::DTypeError>("ReLU of bool", [&] { nn::ReLU()(nc::zeros({2}, DType::Bool)); }, {"relu", "bool"}),
      bad<nc::ValueError>("GELU(undefined)", [&] { nn::GELU()(undefined); }, {"gelu", "'x'"}),
      bad<nc::ValueError>("Tanh(undefined)", [&] { nn::Tanh()(undefined); }, {"tanh", "'x'"}),
      bad<nc::ValueError>("Sigmoid(undefined)", [&] { nn::Sigmoid()(undefined); }, {"sigmoid", "'x'"}),
      bad<nc::ValueError>("Dropout p above 1", [] { nn::Dropout(1.5); }, {"Dropout", "p", "1.5"}),
      bad<nc::ValueError>("Dropout NaN p", [] { nn::Dropout(NAN); }, {"Dropout", "p", "nan"}),
      bad<nc::ValueError>("dropout negative p", [&] { nc::dropout(x23, -0.1, true); }, {"dropout", "p", "-0.1"}),
      bad<nc::ValueError>("dropout(undefined)", [&] { nc::dropout(undefined, 0.5, true); },
                          {"dropout", "x", "undefined"}),
      bad<nc::DTypeError>("dropout of int, even in evaluation",
                          [&] { nc::dropout(nc::zeros({2}, DType::I32), 0.5, false); }, {"dropout", "x", "i32"}),
      bad<nc::DTypeError>("Dropout of int", [&] { nn::Dropout(0.5)(nc::zeros({2}, DType::I32)); },
                          {"dropout", "x", "i32"}),
      bad<nc::ValueError>("Flatten(undefined)", [&] { nn::Flatten()(undefined); }, {"Flatten", "input", "undefined"}),
      bad<nc::IndexError>("Flatten of 1-D from dim 1", [&] { nn::Flatten()(nc::zeros({3})); }, {"flatten", "dim 1"}),
      bad<nc::IndexError>("Flatten start after end",
                          [&] {
                            nn::Flatten(2, 1)(nc::zeros({2, 3, 4}));
                          },
                          {"flatten", "start_dim 2", "end_dim 1"}),
      bad<nc::ValueError>("Sequential of a null module",
                          [] {
                            nn::Sequential({std::make_shared<nn::ReLU>(), nullptr});
                          },
                          {"Sequential::push_back", "module 1", "null"}),
      bad<nc::ValueError>("Sequential::push_back(nullptr)", [] { nn::Sequential().push_back(nullptr); },
                          {"Sequential::push_back", "module 0", "null"}),
      bad<nc::IndexError>("Sequential index", [] { nn::Sequential({std::make_shared<nn::ReLU>()})[1]; },
                          {"Sequential", "index 1", "1 modules"}),
      bad<nc::ValueError>("Embedding negative num_embeddings", [] { nn::Embedding(-1, 2); },
                          {"Embedding", "num_embeddings", "-1"}),
      bad<nc::ValueError>("Embedding negative embedding_dim", [] { nn::Embedding(2, -2); },
                          {"Embedding", "embedding_dim", "-2"}),
      bad<nc::ValueError>("Embedding(undefined)", [&] { nn::Embedding(3, 2)(undefined); },
                          {"embedding", "index", "undefined"}),
      bad<nc::DTypeError>("Embedding float index", [&] { nn::Embedding(3, 2)(nc::zeros({2})); },
                          {"embedding", "index", "f32 [2]"}),
      bad<nc::DTypeError>("Embedding u8 index", [&] { nn::Embedding(3, 2)(nc::zeros({1}, DType::U8)); },
                          {"embedding", "index", "u8 [1]"}),
      bad<nc::IndexError>("Embedding index too large",
                          [&] {
                            nn::Embedding(3, 2)(i64({0, 3}, {2}));
                          },
                          {"embedding", "index 3", "3 embeddings"}),
      bad<nc::IndexError>("Embedding negative index",
                          [&] {
                            nn::Embedding(3, 2)(i64({-1, 0}, {2}));
                          },
                          {"embedding", "index -1", "3 embeddings"}),
      bad<nc::IndexError>("Embedding i32 index too large",
                          [&] { nn::Embedding(3, 2)(nc::from_vector<int32_t>({5}, {1})); },
                          {"embedding", "index 5", "3 embeddings"}),
      bad<nc::ValueError>("LayerNorm negative size",
                          [] {
                            nn::LayerNorm({2, -1});
                          },
                          {"LayerNorm", "normalized_shape", "[2, -1]"}),
      // LayerNorm, GroupNorm (past its channel check), L1Norm and FrobeniusNorm forward to the
      // functional op, which names itself.
      bad<nc::ShapeError>("LayerNorm input shape", [&] { nn::LayerNorm({4})(x23); },
                          {"layer_norm", "normalized_shape [4]", "[2, 3]"}),
      bad<nc::DTypeError>("LayerNorm input dtype", [&] { nn::LayerNorm({3})(x23.to(DType::F64)); },
                          {"layer_norm", "weight", "f32 [3]", "f64 [2, 3]"}),
      bad<nc::ValueError>("LayerNorm eps 0", [] { nn::LayerNorm({3}, 0.0); }, {"LayerNorm", "eps", "0"}),
      bad<nc::ValueError>("GroupNorm NaN eps", [] { nn::GroupNorm(1, 2, NAN); }, {"GroupNorm", "eps", "nan"}),
      bad<nc::ValueError>("GroupNorm 0 groups", [] { nn::GroupNorm(0, 4); }, {"GroupNorm", "num_groups", "0"}),
      bad<nc::ValueError>("GroupNorm channels not divisible", [] { nn::GroupNorm(3, 4); },
                          {"GroupNorm", "num_channels = 4", "num_groups = 3"}),
      bad<nc::ValueError>("GroupNorm negative channels", [] { nn::GroupNorm(2, -2); },
                          {"GroupNorm", "num_channels = -2"}),
      bad<nc::ShapeError>("GroupNorm input channels", [&] { nn::GroupNorm(2, 4)(x23); },
                          {"GroupNorm", "num_channels = 4", "f32 [2, 3]"}),
      bad<nc::ShapeError>("GroupNorm 1-D input", [&] { nn::GroupNorm(2, 4)(nc::zeros({4})); },
                          {"GroupNorm", "num_channels = 4", "f32 [4]"}),
      bad<nc::DTypeError>("GroupNorm input dtype",
                          [&] {
                            nn::GroupNorm(2, 4)(nc::zeros({2, 4}, DType::F64));
                          },
                          {"group_norm", "weight", "f32 [4]", "f64 [2, 4]"}),
      bad<nc::IndexError>("L1Norm dim", [&] { nn::L1Norm(5)(x23); }, {"l1_norm", "dim 5", "2 dims"}),
      bad<nc::ValueError>("L1Norm negative eps", [] { nn::L1Norm(1, -1); }, {"L1Norm", "eps", "-1"}),
      bad<nc::ValueError>("FrobeniusNorm infinite eps", [] { nn::FrobeniusNorm{INFINITY}; },
                          {"FrobeniusNorm", "eps", "inf"}),
      bad<nc::DTypeError>("FrobeniusNorm of int", [&] { nn::FrobeniusNorm()(nc::zeros({2}, DType::I32)); },
                          {"frobenius_norm", "x", "i32"}),
  });
}

TEST(Errors, ModuleErrors) {
  namespace nn = nc::nn;
  const Tensor undefined;
  run_table({
      bad<nc::Error>("Module without a forward", [] { nn::Module()(nc::zeros({2})); }, {"Module::forward"}),
      bad<nc::ValueError>("register_parameter empty name", [] { nn::Module().register_parameter("", nc::zeros({2})); },
                          {"register_parameter", "name", "empty"}),
      bad<nc::ValueError>("register_parameter dotted name",
                          [] { nn::Module().register_parameter("a.b", nc::zeros({2})); },
                          {"register_parameter", "\"a.b\"", "'.'"}),
      bad<nc::ValueError>("register_parameter(undefined)", [&] { nn::Module().register_parameter("w", undefined); },
                          {"register_parameter", "\"w\"", "undefined"}),
      bad<nc::DTypeError>("register_parameter of int",
                          [] { nn::Module().register_parameter("w", nc::zeros({2}, DType::I32)); },
                          {"register_parameter", "\"w\"", "floating", "i32"}),
      bad<nc::ValueError>("register_parameter of a non-leaf",
                          [] { nn::Module().register_parameter("w", nc::mul(leaf({2}), 2.0)); },
                          {"register_parameter", "\"w\"", "'mul'", "leaves"}),
      bad<nc::ValueError>("register_buffer taken name",
                          [] {
                            nn::Module m;
                            m.register_parameter("w", nc::zeros({2}));
                            m.register_buffer("w", nc::zeros({2}));
                          },
                          {"register_buffer", "\"w\"", "already used"}),
      bad<nc::ValueError>("register_buffer empty name", [] { nn::Module().register_buffer("", nc::zeros({2})); },
                          {"register_buffer", "name", "empty"}),
      bad<nc::ValueError>("register_buffer(undefined)", [&] { nn::Module().register_buffer("b", undefined); },
                          {"register_buffer", "\"b\"", "undefined"}),
      bad<nc::ValueError>("register_module null",
                          [] { nn::Module().register_module("c", std::shared_ptr<nn::Module>()); },
                          {"register_module", "\"c\"", "null"}),
      bad<nc::ValueError>("register_module of itself",
                          [] {
                            auto m = std::make_shared<nn::Module>();
                            m->register_module("me", m);
                          },
                          {"register_module", "own child", "\"me\""}),
      bad<nc::ValueError>("register_module taken name",
                          [] {
                            nn::Module m;
                            m.register_module("c", std::make_shared<nn::ReLU>());
                            m.register_module("c", std::make_shared<nn::ReLU>());
                          },
                          {"register_module", "\"c\"", "already used"}),
      bad<nc::DTypeError>("Module::to int", [] { nn::Linear(2, 2).to(DType::I32); }, {"Module::to", "dtype", "i32"}),
      bad<nc::ShapeError>("load_state_dict shape",
                          [] {
                            nn::Linear(3, 2).load_state_dict({{"weight", nc::zeros({2, 4})}, {"bias", nc::zeros({2})}});
                          },
                          {"load_state_dict", "weight", "[2, 4]", "[2, 3]"}),
      bad<nc::ShapeError>("load_state_dict shape, not strict",
                          [] {
                            nn::Linear(3, 2).load_state_dict({{"bias", nc::zeros({3})}}, false);
                          },
                          {"load_state_dict", "bias", "[3]", "[2]"}),
      bad<nc::ValueError>("load_state_dict missing key",
                          [] {
                            nn::Linear(3, 2).load_state_dict({{"weight", nc::zeros({2, 3})}});
                          },
                          {"load_state_dict", "missing keys", "\"bias\""}),
      bad<nc::ValueError>("load_state_dict unexpected key",
                          [] {
                            nn::Linear(3, 2).load_state_dict(
                                {{"weight", nc::zeros({2, 3})}, {"bias", nc::zeros({2})}, {"extra", nc::zeros({1})}});
                          },
                          {"load_state_dict", "unexpected keys", "\"extra\""}),
      bad<nc::ValueError>("load_state_dict undefined entry",
                          [&] {
                            nn::Linear(3, 2).load_state_dict({{"weight", undefined}});
                          },
                          {"load_state_dict", "\"weight\"", "undefined"}),
      bad<nc::ValueError>("load_state_dict repeated key",
                          [] {
                            nn::Linear(3, 2).load_state_dict({{"bias", nc::zeros({2})}, {"bias", nc::zeros({2})}});
                          },
                          {"load_state_dict", "\"bias\"", "more than once"}),
  });
}

TEST(Errors, PoolErrors) {
  const Tensor undefined;
  const Tensor x = nc::zeros({1, 1, 4, 4});
  run_table({
      bad<nc::ValueError>("max_pool2d(undefined)", [&] { nc::max_pool2d(undefined, 2); }, {"max_pool2d", "'x'"}),
      bad<nc::DTypeError>("max_pool2d of int",
                          [&] {
                            nc::max_pool2d(nc::zeros({1, 1, 4, 4}, DType::I64), 2);
                          },
                          {"max_pool2d", "x", "floating", "i64"}),
      bad<nc::ShapeError>("max_pool2d of 2-D",
                          [&] {
                            nc::max_pool2d(nc::zeros({4, 4}), 2);
                          },
                          {"max_pool2d", "x", "[N, C, H, W] or [C, H, W]", "[4, 4]"}),
      bad<nc::ShapeError>("max_pool2d of 5-D",
                          [&] {
                            nc::max_pool2d(nc::zeros({1, 1, 1, 4, 4}), 2);
                          },
                          {"max_pool2d", "x", "[N, C, H, W] or [C, H, W]", "[1, 1, 1, 4, 4]"}),
      bad<nc::ShapeError>("max_pool2d W of 0",
                          [&] {
                            nc::max_pool2d(nc::zeros({1, 1, 4, 0}), 2);
                          },
                          {"max_pool2d", "H and W", "[1, 1, 4, 0]"}),
      bad<nc::ShapeError>("max_pool2d C of 0",
                          [&] {
                            nc::max_pool2d(nc::zeros({1, 0, 4, 4}), 2);
                          },
                          {"max_pool2d", "channel count C", "[1, 0, 4, 4]"}),
      bad<nc::ShapeError>("avg_pool2d C of 0",
                          [&] {
                            nc::avg_pool2d(nc::zeros({0, 4, 4}), 2);
                          },
                          {"avg_pool2d", "channel count C", "[0, 4, 4]"}),
      bad<nc::ValueError>("max_pool2d kernel_size 0",
                          [&] {
                            nc::max_pool2d(x, {0, 2});
                          },
                          {"max_pool2d", "kernel_size", ">= 1", "(0, 2)"}),
      bad<nc::ValueError>("max_pool2d stride 0",
                          [&] {
                            nc::max_pool2d(x, 2, {0, 1});
                          },
                          {"max_pool2d", "stride", ">= 1", "(0, 1)"}),
      bad<nc::ValueError>("max_pool2d negative stride", [&] { nc::max_pool2d(x, 2, -1); },
                          {"max_pool2d", "stride", "(-1, -1)"}),
      bad<nc::ValueError>("max_pool2d negative padding",
                          [&] {
                            nc::max_pool2d(x, 2, 1, {-1, 0});
                          },
                          {"max_pool2d", "padding", ">= 0", "(-1, 0)"}),
      bad<nc::ValueError>("max_pool2d dilation 0",
                          [&] {
                            nc::max_pool2d(x, 2, 1, 0, {1, 0});
                          },
                          {"max_pool2d", "dilation", ">= 1", "(1, 0)"}),
      bad<nc::ValueError>("max_pool2d padding over half the kernel",
                          [&] {
                            nc::max_pool2d(x, 3, 1, {1, 2});
                          },
                          {"max_pool2d", "padding (1, 2)", "half of kernel_size (3, 3)"}),
      bad<nc::ValueError>("max_pool2d padding over half the kernel, dilated", [&] { nc::max_pool2d(x, 2, 1, 2, 3); },
                          {"max_pool2d", "padding (2, 2)", "(2, 2)"}),
      bad<nc::ValueError>("max_pool2d dilated kernel past 2^59", [&] { nc::max_pool2d(x, 2, 1, 0, int64_t{1} << 60); },
                          {"max_pool2d", "kernel_size (2, 2)", "dilation", "2^59"}),
      bad<nc::ShapeError>("max_pool2d output below 1", [&] { nc::max_pool2d(x, 5); },
                          {"max_pool2d", "output", "0 x 0", "f32 [1, 1, 4, 4]", "kernel_size (5, 5)"}),
      bad<nc::ShapeError>("max_pool2d output below 1, dilated",
                          [&] {
                            nc::max_pool2d(x, 2, 1, 0, {1, 4});
                          },
                          {"max_pool2d", "output", "3 x 0", "dilation (1, 4)"}),
      bad<nc::ValueError>("avg_pool2d(undefined)", [&] { nc::avg_pool2d(undefined, 2); }, {"avg_pool2d", "'x'"}),
      bad<nc::DTypeError>("avg_pool2d of bool",
                          [&] {
                            nc::avg_pool2d(nc::zeros({1, 4, 4}, DType::Bool), 2);
                          },
                          {"avg_pool2d", "x", "floating", "bool"}),
      bad<nc::ShapeError>("avg_pool2d of 1-D", [&] { nc::avg_pool2d(nc::zeros({4}), 2); },
                          {"avg_pool2d", "x", "[N, C, H, W] or [C, H, W]", "[4]"}),
      bad<nc::ShapeError>("avg_pool2d H of 0",
                          [&] {
                            nc::avg_pool2d(nc::zeros({3, 0, 4}), 2);
                          },
                          {"avg_pool2d", "H and W", "[3, 0, 4]"}),
      bad<nc::ValueError>("avg_pool2d kernel_size negative",
                          [&] {
                            nc::avg_pool2d(x, {2, -2});
                          },
                          {"avg_pool2d", "kernel_size", "(2, -2)"}),
      bad<nc::ValueError>("avg_pool2d stride 0",
                          [&] {
                            nc::avg_pool2d(x, 2, {1, 0});
                          },
                          {"avg_pool2d", "stride", "(1, 0)"}),
      bad<nc::ValueError>("avg_pool2d negative padding", [&] { nc::avg_pool2d(x, 2, 1, -1); },
                          {"avg_pool2d", "padding", "(-1, -1)"}),
      bad<nc::ValueError>("avg_pool2d padding over half the kernel",
                          [&] {
                            nc::avg_pool2d(x, 2, 1, {0, 2});
                          },
                          {"avg_pool2d", "padding (0, 2)", "half of kernel_size (2, 2)"}),
      bad<nc::ShapeError>("avg_pool2d output below 1",
                          [&] {
                            nc::avg_pool2d(x, {5, 1});
                          },
                          {"avg_pool2d", "output", "0 x 4", "f32 [1, 1, 4, 4]"}),
      bad<nc::ValueError>("adaptive_avg_pool2d(undefined)", [&] { nc::adaptive_avg_pool2d(undefined, 2); },
                          {"adaptive_avg_pool2d", "'x'"}),
      bad<nc::DTypeError>("adaptive_avg_pool2d of int",
                          [&] {
                            nc::adaptive_avg_pool2d(nc::zeros({1, 4, 4}, DType::I32), 2);
                          },
                          {"adaptive_avg_pool2d", "x", "floating", "i32"}),
      bad<nc::ShapeError>("adaptive_avg_pool2d of 2-D",
                          [&] {
                            nc::adaptive_avg_pool2d(nc::zeros({4, 4}), 2);
                          },
                          {"adaptive_avg_pool2d", "[N, C, H, W] or [C, H, W]", "[4, 4]"}),
      bad<nc::ShapeError>("adaptive_avg_pool2d H of 0",
                          [&] {
                            nc::adaptive_avg_pool2d(nc::zeros({1, 1, 0, 4}), 2);
                          },
                          {"adaptive_avg_pool2d", "H and W", "[1, 1, 0, 4]"}),
      bad<nc::ValueError>("adaptive_avg_pool2d output_size 0",
                          [&] {
                            nc::adaptive_avg_pool2d(x, {0, 3});
                          },
                          {"adaptive_avg_pool2d", "output_size", ">= 1", "(0, 3)"}),
      bad<nc::ValueError>("MaxPool2d kernel_size 0", [] { nc::nn::MaxPool2d layer(0); },
                          {"MaxPool2d", "kernel_size", "(0, 0)"}),
      bad<nc::ValueError>("MaxPool2d stride 0",
                          [] {
                            nc::nn::MaxPool2d layer(2, {2, 0});
                          },
                          {"MaxPool2d", "stride", "(2, 0)"}),
      bad<nc::ValueError>("MaxPool2d padding over half the kernel", [] { nc::nn::MaxPool2d layer(3, 1, 2); },
                          {"MaxPool2d", "padding (2, 2)", "half of kernel_size (3, 3)"}),
      bad<nc::ValueError>("MaxPool2d dilation 0", [] { nc::nn::MaxPool2d layer(2, 1, 0, 0); },
                          {"MaxPool2d", "dilation", "(0, 0)"}),
      bad<nc::ValueError>("MaxPool2d forward(undefined)", [&] { nc::nn::MaxPool2d(2).forward(undefined); },
                          {"MaxPool2d", "undefined"}),
      bad<nc::ShapeError>("MaxPool2d forward of 2-D",
                          [&] {
                            nc::nn::MaxPool2d(2).forward(nc::zeros({4, 4}));
                          },
                          {"max_pool2d", "[4, 4]"}),
      bad<nc::ValueError>("AvgPool2d negative padding", [] { nc::nn::AvgPool2d layer(2, nc::Size2(), -1); },
                          {"AvgPool2d", "padding", "(-1, -1)"}),
      bad<nc::ValueError>("AvgPool2d stride negative", [] { nc::nn::AvgPool2d layer(2, -2); },
                          {"AvgPool2d", "stride", "(-2, -2)"}),
      bad<nc::ValueError>("AvgPool2d forward(undefined)", [&] { nc::nn::AvgPool2d(2).forward(undefined); },
                          {"AvgPool2d", "undefined"}),
      bad<nc::ValueError>("AdaptiveAvgPool2d output_size 0",
                          [] {
                            nc::nn::AdaptiveAvgPool2d layer({2, 0});
                          },
                          {"AdaptiveAvgPool2d", "output_size", "(2, 0)"}),
      bad<nc::ValueError>("AdaptiveAvgPool2d forward(undefined)",
                          [&] { nc::nn::AdaptiveAvgPool2d(2).forward(undefined); }, {"AdaptiveAvgPool2d", "undefined"}),
  });
}
