// Bad calls to optimizers, schedules and clipping, data, models, checkpoint files,
// evaluation and CUDA devices, one row each, as in test_errors.cpp (errors_support.h: the
// row and its runner).
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

TEST(Errors, OptimizerErrors) {
  namespace optim = nc::optim;
  const Tensor undefined;
  // Hyperparameters: {lr, momentum, dampening, weight_decay, nesterov} and {lr, beta1, beta2, eps, weight_decay}.
  const auto sgd = [](optim::SGDOptions options) { optim::SGD(std::vector<Tensor>{leaf({2})}, options); };
  const auto adam = [](optim::AdamOptions options) { optim::Adam(std::vector<Tensor>{leaf({2})}, options); };
  const auto load_sgd = [](const optim::StateDict& state) {
    optim::SGD(std::vector<Tensor>{leaf({2})}, {0.1, 0.9}).load_state_dict(state);
  };
  const auto load_adam = [](const optim::StateDict& state) { optim::Adam({leaf({2})}).load_state_dict(state); };
  run_table({
      bad<nc::DTypeError>("state_dtype of int", [] { optim::state_dtype(DType::I32); }, {"state_dtype", "i32"}),
      bad<nc::ValueError>("SGD without parameters", [] { optim::SGD({}, {0.1}); }, {"SGD", "empty parameter list"}),
      bad<nc::ValueError>("AdamW without parameters", [] { optim::AdamW({}); }, {"AdamW", "empty parameter list"}),
      bad<nc::ValueError>("SGD undefined parameter", [&] { optim::SGD({undefined}, {0.1}); },
                          {"SGD", "parameter 0", "undefined"}),
      bad<nc::DTypeError>("SGD int parameter", [] { optim::SGD({nc::zeros({2}, DType::I32)}, {0.1}); },
                          {"SGD", "parameter 0", "floating", "i32"}),
      bad<nc::DTypeError>("Adam int parameter", [] { optim::Adam({nc::zeros({2}, DType::I64)}); },
                          {"Adam", "parameter 0", "floating", "i64"}),
      bad<nc::ValueError>("SGD non-contiguous parameter",
                          [] {
                            optim::SGD({nc::zeros({2, 3}).t()}, {0.1});
                          },
                          {"SGD", "parameter 0", "[3, 2]", "contiguous"}),
      bad<nc::ValueError>("SGD repeated parameter",
                          [] {
                            Tensor p = leaf({2});
                            optim::SGD({p, p}, {0.1});
                          },
                          {"SGD", "parameter 1", "parameter 0"}),
      bad<nc::ValueError>("SGD negative lr", [&] { sgd({-1}); }, {"SGD", "lr", "-1"}),
      bad<nc::ValueError>("SGD NaN lr", [&] { sgd({NAN}); }, {"SGD", "lr", "nan"}),
      bad<nc::ValueError>("SGD negative momentum",
                          [&] {
                            sgd({0.1, -0.5});
                          },
                          {"SGD", "momentum", "-0.5"}),
      bad<nc::ValueError>("SGD infinite momentum",
                          [&] {
                            sgd({0.1, INFINITY});
                          },
                          {"SGD", "momentum", "inf"}),
      bad<nc::ValueError>("SGD dampening above 1",
                          [&] {
                            sgd({0.1, 0.9, 2});
                          },
                          {"SGD", "dampening", "2"}),
      bad<nc::ValueError>("SGD NaN dampening",
                          [&] {
                            sgd({0.1, 0.9, NAN});
                          },
                          {"SGD", "dampening", "nan"}),
      bad<nc::ValueError>("SGD negative weight_decay",
                          [&] {
                            sgd({0.1, 0, 0, -1});
                          },
                          {"SGD", "weight_decay", "-1"}),
      bad<nc::ValueError>("SGD NaN weight_decay",
                          [&] {
                            sgd({0.1, 0, 0, NAN});
                          },
                          {"SGD", "weight_decay", "nan"}),
      bad<nc::ValueError>("SGD nesterov without momentum",
                          [&] {
                            sgd({0.1, 0, 0, 0, true});
                          },
                          {"SGD", "momentum", "nesterov", "0"}),
      bad<nc::ValueError>("SGD nesterov with dampening",
                          [&] {
                            sgd({0.1, 0.9, 0.5, 0, true});
                          },
                          {"SGD", "dampening", "nesterov", "0.5"}),
      bad<nc::ValueError>("set_lr negative", [] { optim::SGD({leaf({2})}, {0.1}).set_lr(-1); }, {"SGD", "lr", "-1"}),
      bad<nc::ValueError>("set_lr NaN", [] { optim::Adam({leaf({2})}).set_lr(NAN); }, {"Adam", "lr", "nan"}),
      bad<nc::ValueError>("SGD infinite lr", [] { optim::SGD({leaf({2})}, {INFINITY}); }, {"SGD", "lr", "inf"}),
      bad<nc::ValueError>("Adam negative lr", [&] { adam({-1}); }, {"Adam", "lr", "-1"}),
      bad<nc::ValueError>("Adam beta1 1",
                          [&] {
                            adam({1e-3, 1.0});
                          },
                          {"Adam", "beta1", "1"}),
      bad<nc::ValueError>("Adam negative beta2",
                          [&] {
                            adam({1e-3, 0.9, -0.1});
                          },
                          {"Adam", "beta2", "-0.1"}),
      bad<nc::ValueError>("Adam NaN beta2",
                          [&] {
                            adam({1e-3, 0.9, NAN});
                          },
                          {"Adam", "beta2", "nan"}),
      bad<nc::ValueError>("Adam eps 0",
                          [&] {
                            adam({1e-3, 0.9, 0.999, 0});
                          },
                          {"Adam", "eps", "0"}),
      bad<nc::ValueError>("Adam infinite eps",
                          [&] {
                            adam({1e-3, 0.9, 0.999, INFINITY});
                          },
                          {"Adam", "eps", "inf"}),
      bad<nc::ValueError>("Adam NaN weight_decay",
                          [&] {
                            adam({1e-3, 0.9, 0.999, 1e-8, NAN});
                          },
                          {"Adam", "weight_decay", "nan"}),
      bad<nc::ValueError>("AdamW beta1 1",
                          [] {
                            optim::AdamW({leaf({2})}, {1e-3, 1.0});
                          },
                          {"AdamW", "beta1", "1"}),
      // load_state_dict: names, then values, checked before anything changes.
      bad<nc::ValueError>("SGD state entry twice",
                          [&] {
                            optim::StateDict state = sgd_state();
                            state.push_back(state[0]);
                            load_sgd(state);
                          },
                          {"SGD.load_state_dict", "'param_groups.lr'", "twice"}),
      bad<nc::ValueError>("SGD state undefined entry",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.momentum", undefined)); },
                          {"SGD.load_state_dict", "'param_groups.momentum'", "undefined"}),
      bad<nc::ValueError>("SGD state unknown hyperparameter",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.beta1", f64_scalar(0.9))); },
                          {"SGD.load_state_dict", "unknown hyperparameter", "'param_groups.beta1'"}),
      bad<nc::ValueError>("SGD state unknown entry", [&] { load_sgd(with_entry(sgd_state(), "foo", f64_scalar(1))); },
                          {"SGD.load_state_dict", "unknown entry", "'foo'"}),
      bad<nc::ValueError>("SGD state malformed entry",
                          [&] { load_sgd(with_entry(sgd_state(), "state.x.momentum_buffer", nc::zeros({2}))); },
                          {"SGD.load_state_dict", "malformed entry", "'state.x.momentum_buffer'"}),
      bad<nc::ValueError>("SGD state parameter index",
                          [&] { load_sgd(with_entry(sgd_state(), "state.3.momentum_buffer", nc::zeros({2}))); },
                          {"SGD.load_state_dict", "'state.3.momentum_buffer'", "parameter 3"}),
      bad<nc::ValueError>("SGD state unknown state",
                          [&] { load_sgd(with_entry(sgd_state(), "state.0.exp_avg", nc::zeros({2}))); },
                          {"SGD.load_state_dict", "unknown state", "'state.0.exp_avg'"}),
      bad<nc::ValueError>("SGD state missing hyperparameter",
                          [&] { load_sgd(without_entry(sgd_state(), "param_groups.dampening")); },
                          {"SGD.load_state_dict", "missing entry", "'param_groups.dampening'"}),
      bad<nc::ShapeError>("SGD state buffer shape",
                          [&] { load_sgd(with_entry(sgd_state(), "state.0.momentum_buffer", nc::zeros({3}))); },
                          {"SGD.load_state_dict", "'state.0.momentum_buffer'", "[3]", "[2]"}),
      bad<nc::DTypeError>("SGD state buffer dtype",
                          [&] {
                            load_sgd(with_entry(sgd_state(), "state.0.momentum_buffer", nc::zeros({2}, DType::F64)));
                          },
                          {"SGD.load_state_dict", "'state.0.momentum_buffer'", "f64", "f32"}),
      bad<nc::ShapeError>("SGD state hyperparameter of two values",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.lr", nc::zeros({2}, DType::F64))); },
                          {"SGD.load_state_dict", "'param_groups.lr'", "one value", "[2]"}),
      bad<nc::DTypeError>("SGD state int hyperparameter",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.lr", i64_scalar(1))); },
                          {"SGD.load_state_dict", "'param_groups.lr'", "floating", "i64"}),
      bad<nc::ValueError>("SGD state negative lr",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.lr", f64_scalar(-1))); },
                          {"SGD", "lr", "-1"}),
      bad<nc::ValueError>("SGD state nesterov 0.5",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.nesterov", f64_scalar(0.5))); },
                          {"SGD", "nesterov", "0 or 1", "0.5"}),
      bad<nc::ValueError>("Adam state with part of a parameter's state",
                          [&] { load_adam(without_entry(adam_state(), "state.0.exp_avg")); },
                          {"Adam.load_state_dict", "parameter 0", "'state.0.exp_avg'"}),
      bad<nc::ValueError>("Adam state negative step",
                          [&] { load_adam(with_entry(adam_state(), "state.0.step", i64_scalar(-1))); },
                          {"Adam.load_state_dict", "'state.0.step'", "-1"}),
      bad<nc::DTypeError>("Adam state float step",
                          [&] { load_adam(with_entry(adam_state(), "state.0.step", f64_scalar(1))); },
                          {"Adam.load_state_dict", "'state.0.step'", "integer", "f64"}),
      bad<nc::ShapeError>("Adam state step of two values",
                          [&] { load_adam(with_entry(adam_state(), "state.0.step", nc::zeros({2}, DType::I64))); },
                          {"Adam.load_state_dict", "'state.0.step'", "one value", "[2]"}),
      bad<nc::ValueError>("Adam state decoupled 2",
                          [&] { load_adam(with_entry(adam_state(), "param_groups.decoupled", f64_scalar(2))); },
                          {"Adam", "decoupled", "0 or 1", "2"}),
      bad<nc::ValueError>("Adam state NaN beta1",
                          [&] { load_adam(with_entry(adam_state(), "param_groups.beta1", f64_scalar(NAN))); },
                          {"Adam", "beta1", "nan"}),
      bad<nc::ValueError>("Adam state into AdamW", [&] { optim::AdamW({leaf({2})}).load_state_dict(adam_state()); },
                          {"AdamW", "decoupled = 0", "Adam"}),
      bad<nc::ValueError>("SGD state into Adam", [&] { load_adam(sgd_state()); },
                          {"Adam.load_state_dict", "unknown hyperparameter", "'param_groups.momentum'"}),
  });
}

TEST(Errors, ScheduleAndClippingErrors) {
  namespace optim = nc::optim;
  const Tensor undefined;
  // Each call builds its own optimizer, which the schedule writes into.
  const auto step_lr = [](int64_t step_size, double gamma) {
    optim::SGD sgd({leaf({2})}, {0.1});
    optim::StepLR schedule(sgd, step_size, gamma);
  };
  const auto cosine_lr = [](int64_t warmup_steps, int64_t total_steps, double min_lr) {
    optim::SGD sgd({leaf({2})}, {0.1});
    optim::CosineLR schedule(sgd, warmup_steps, total_steps, min_lr);
  };
  const auto load_step_lr = [](const optim::StateDict& state) {
    optim::SGD sgd({leaf({2})}, {0.1});
    optim::StepLR(sgd, 2).load_state_dict(state);
  };
  const optim::StateDict good = {{"schedule.step", i64_scalar(2)}, {"schedule.base_lr", f64_scalar(0.1)}};
  run_table({
      bad<nc::ValueError>("StepLR step_size 0", [&] { step_lr(0, 0.1); }, {"StepLR", "step_size", "0"}),
      bad<nc::ValueError>("StepLR negative gamma", [&] { step_lr(1, -1); }, {"StepLR", "gamma", "-1"}),
      bad<nc::ValueError>("StepLR infinite gamma", [&] { step_lr(1, INFINITY); }, {"StepLR", "gamma", "inf"}),
      bad<nc::ValueError>("StepLR NaN gamma", [&] { step_lr(1, NAN); }, {"StepLR", "gamma", "nan"}),
      bad<nc::ValueError>("CosineLR negative warmup_steps", [&] { cosine_lr(-1, 10, 0); },
                          {"CosineLR", "warmup_steps", "-1"}),
      bad<nc::ValueError>("CosineLR total_steps not after warmup_steps", [&] { cosine_lr(5, 5, 0); },
                          {"CosineLR", "total_steps", "warmup_steps", "5"}),
      bad<nc::ValueError>("CosineLR negative min_lr", [&] { cosine_lr(0, 10, -1); }, {"CosineLR", "min_lr", "-1"}),
      bad<nc::ValueError>("CosineLR NaN min_lr", [&] { cosine_lr(0, 10, NAN); }, {"CosineLR", "min_lr", "nan"}),
      bad<nc::ValueError>("schedule state unknown entry",
                          [&] { load_step_lr(with_entry(good, "schedule.gamma", f64_scalar(1))); },
                          {"StepLR.load_state_dict", "unknown entry", "'schedule.gamma'"}),
      bad<nc::ValueError>("schedule state missing entry",
                          [&] { load_step_lr(without_entry(good, "schedule.base_lr")); },
                          {"StepLR.load_state_dict", "missing entry", "'schedule.base_lr'"}),
      bad<nc::ValueError>("schedule state undefined entry",
                          [&] { load_step_lr(with_entry(good, "schedule.step", undefined)); },
                          {"StepLR.load_state_dict", "'schedule.step'", "undefined"}),
      bad<nc::ValueError>("schedule state entry twice",
                          [&] {
                            optim::StateDict state = good;
                            state.push_back(state[0]);
                            load_step_lr(state);
                          },
                          {"StepLR.load_state_dict", "'schedule.step'", "twice"}),
      bad<nc::ValueError>("schedule state negative step",
                          [&] { load_step_lr(with_entry(good, "schedule.step", i64_scalar(-2))); },
                          {"StepLR.load_state_dict", "'schedule.step'", "-2"}),
      bad<nc::ShapeError>("schedule state step of two values",
                          [&] { load_step_lr(with_entry(good, "schedule.step", nc::zeros({2}, DType::I64))); },
                          {"StepLR.load_state_dict", "'schedule.step'", "one value", "[2]"}),
      bad<nc::DTypeError>("schedule state int base_lr",
                          [&] { load_step_lr(with_entry(good, "schedule.base_lr", i64_scalar(1))); },
                          {"StepLR.load_state_dict", "'schedule.base_lr'", "floating", "i64"}),
      bad<nc::ValueError>("schedule state negative base_lr",
                          [&] { load_step_lr(with_entry(good, "schedule.base_lr", f64_scalar(-0.1))); },
                          {"StepLR", "base_lr", "-0.1"}),
      bad<nc::ValueError>("schedule state NaN base_lr",
                          [&] { load_step_lr(with_entry(good, "schedule.base_lr", f64_scalar(NAN))); },
                          {"StepLR", "base_lr", "nan"}),
      bad<nc::ValueError>("clip_grad_norm norm_type 0", [] { optim::clip_grad_norm({leaf({2})}, 1.0, 0); },
                          {"clip_grad_norm", "norm_type", "0"}),
      bad<nc::ValueError>("clip_grad_norm NaN norm_type", [] { optim::clip_grad_norm({leaf({2})}, 1.0, NAN); },
                          {"clip_grad_norm", "norm_type", "nan"}),
      bad<nc::ValueError>("clip_grad_norm negative max_norm", [] { optim::clip_grad_norm({leaf({2})}, -1.0); },
                          {"clip_grad_norm", "max_norm", "-1"}),
      bad<nc::ValueError>("clip_grad_norm NaN max_norm", [] { optim::clip_grad_norm({leaf({2})}, NAN); },
                          {"clip_grad_norm", "max_norm", "nan"}),
      bad<nc::ValueError>("clip_grad_norm undefined parameter",
                          [&] {
                            optim::clip_grad_norm({leaf({2}), undefined}, 1.0);
                          },
                          {"clip_grad_norm", "parameter 1", "undefined"}),
      bad<nc::DTypeError>("clip_grad_norm int gradient",
                          [] {
                            Tensor p = nc::zeros({2}, DType::I32);
                            p.set_grad(nc::ones({2}, DType::I32));
                            optim::clip_grad_norm({p}, 1.0);
                          },
                          {"clip_grad_norm", "grad of parameter 0", "i32"}),
  });
}

TEST(Errors, DataErrors) {
  namespace data = nc::data;
  const Tensor undefined;
  const auto loader = [](data::TensorDataset dataset, data::DataLoaderOptions options) {
    data::DataLoader(std::move(dataset), std::move(options));
  };
  const auto with = [](const std::function<void(data::DataLoaderOptions&)>& change) {
    data::DataLoaderOptions options = loader_options();
    change(options);
    return options;
  };
  ScratchDir dir;
  const std::string text = dir.write("text.txt", "not an IDX file");
  run_table({
      bad<nc::ValueError>("TensorDataset undefined inputs",
                          [&] { data::TensorDataset(undefined, nc::zeros({4}, DType::I64)); },
                          {"TensorDataset", "inputs", "undefined"}),
      bad<nc::ValueError>("TensorDataset undefined targets",
                          [&] {
                            data::TensorDataset(nc::zeros({4, 2, 2}, DType::U8), undefined);
                          },
                          {"TensorDataset", "targets", "undefined"}),
      bad<nc::ValueError>("TensorDataset 0-dim inputs",
                          [&] { data::TensorDataset(nc::zeros({}), nc::zeros({1}, DType::I64)); },
                          {"TensorDataset", "inputs", "sample dimension", "f32 []"}),
      bad<nc::ShapeError>("TensorDataset counts differ", [&] { images(4, DType::U8, 3); },
                          {"TensorDataset", "4 inputs but 3 targets", "u8 [4, 2, 2]", "i64 [3]"}),
      bad<nc::IndexError>("TensorDataset::get past the end", [&] { images(4).get(4); },
                          {"TensorDataset::get", "index 4", "[0, 4)"}),
      bad<nc::ValueError>("TextWindows context 0", [&] { data::TextWindows("abc", 0); },
                          {"TextWindows", "context", "0"}),
      bad<nc::ValueError>("TextWindows stream too short", [&] { data::TextWindows("abc", 3); },
                          {"TextWindows", "3 bytes", "no window of 4"}),
      bad<nc::IndexError>("TextWindows::get past the end", [&] { data::TextWindows("abcd", 2).get(2); },
                          {"TextWindows::get", "index 2", "[0, 2)"}),
      bad<nc::ValueError>("DataLoader empty dataset", [&] { loader(images(0), loader_options()); },
                          {"DataLoader", "empty", "size() is 0"}),
      bad<nc::ValueError>("DataLoader null dataset",
                          [&] { data::DataLoader(std::shared_ptr<const data::Dataset>(), loader_options()); },
                          {"DataLoader", "null"}),
      bad<nc::ValueError>("DataLoader batch_size 0", [&] { loader(images(4), loader_options(0)); },
                          {"DataLoader", "batch_size", "0"}),
      bad<nc::ValueError>("DataLoader negative workers",
                          [&] { loader(images(4), with([](auto& o) { o.workers = -1; })); },
                          {"DataLoader", "workers", "-1"}),
      bad<nc::ValueError>("DataLoader empty transform",
                          [&] { loader(images(4), with([](auto& o) { o.transforms = {data::Transform()}; })); },
                          {"DataLoader", "transform 0", "empty"}),
      bad<nc::ValueError>("normalize NaN mean", [&] { data::transforms::normalize({NAN}, {1}); },
                          {"normalize", "mean", "nan"}),
      bad<nc::ValueError>("normalize stddev 0", [&] { data::transforms::normalize({0}, {0}); },
                          {"normalize", "stddev", "0"}),
      bad<nc::ValueError>("normalize infinite stddev", [&] { data::transforms::normalize({0}, {INFINITY}); },
                          {"normalize", "stddev", "inf"}),
      bad<nc::ValueError>("normalize counts differ",
                          [&] {
                            data::transforms::normalize({0, 0}, {1});
                          },
                          {"normalize", "2 and 1"}),
      bad<nc::ValueError>("random_crop 0 wide", [&] { data::transforms::random_crop(2, 0); }, {"random_crop", "2 x 0"}),
      bad<nc::ValueError>("random_crop negative padding", [&] { data::transforms::random_crop(2, 2, -1); },
                          {"random_crop", "padding", "-1"}),
      bad<nc::ValueError>("random_horizontal_flip p 1.5", [&] { data::transforms::random_horizontal_flip(1.5); },
                          {"random_horizontal_flip", "p", "1.5"}),
      bad<nc::ValueError>("SampleRandom empty range", [&] { data::SampleRandom(0, 0, 0).integer(3, 3); },
                          {"SampleRandom::integer", "[3, 3)"}),
      bad<nc::ShapeError>("collate of unlike shapes",
                          [&] {
                            data::collate({{nc::zeros({2}), nc::zeros({})}, {nc::zeros({3}), nc::zeros({})}});
                          },
                          {"collate", "sample 1's input", "f32 [3]", "f32 [2]"}),
      bad<nc::DTypeError>(
          "collate of unlike dtypes",
          [&] {
            data::collate({{nc::zeros({2}), nc::zeros({})}, {nc::zeros({2}), nc::zeros({}, DType::I64)}});
          },
          {"collate", "sample 1's target", "i64 []", "f32 []"}),
      bad<nc::ValueError>("collate of no samples", [&] { data::collate({}); }, {"collate", "no samples"}),
      bad<nc::ValueError>("DataLoader drop_last leaves nothing",
                          [&] {
                            loader(images(4), with([](auto& o) {
                                     o.batch_size = 8;
                                     o.drop_last = true;
                                   }));
                          },
                          {"DataLoader", "drop_last", "4 samples", "batch_size 8"}),
      bad<nc::ValueError>("DataLoader::begin_epoch first_batch past the end",
                          [] { data::DataLoader(images(4), loader_options()).begin_epoch(0, 3); },
                          {"DataLoader::begin_epoch", "first_batch 3", "[0, 2]"}),
      bad<nc::ValueError>("DataLoader::begin_epoch 2^32",
                          [] { data::DataLoader(images(4), loader_options()).begin_epoch(uint64_t(1) << 32); },
                          {"DataLoader::begin_epoch", "epoch 4294967296"}),
      bad<nc::ValueError>("DataLoader::next before begin_epoch",
                          [] {
                            data::Batch batch;
                            data::DataLoader(images(4), loader_options()).next(batch);
                          },
                          {"DataLoader::next", "begin_epoch"}),
      bad<nc::IOError>("read_idx missing file", [&] { data::read_idx(dir.path("missing.idx")); },
                       {"read_idx", dir.path("missing.idx"), "cannot open"}),
      bad<nc::IOError>("read_idx of a directory", [&] { data::read_idx(dir.path()); },
                       {"read_idx", "not a regular file"}),
      bad<nc::IOError>("read_idx of text", [&] { data::read_idx(text); }, {"read_idx", text, "neither gzip nor IDX"}),
  });
}

TEST(Errors, ModelErrors) {
  namespace models = nc::models;
  ScratchDir dir;
  const std::string text = dir.write("text.txt", "not an image");
  const std::string small = dir.write("small.pgm", std::string("P5\n2 2\n255\n") + std::string(4, '\0'));
  const std::string plain = dir.path("plain.safetensors");
  nc::safetensors::save(plain, {{"a", nc::zeros({2})}});
  const std::string checkpoint = dir.path("mlp.safetensors");
  models::save_checkpoint(checkpoint, "mlp", *models::make_classifier("mlp"), 1, {}, {}, {});
  const std::string zero_std = dir.path("zero_std.safetensors");
  models::save_checkpoint(zero_std, "mlp", *models::make_classifier("mlp"), 1, {}, {}, {{"std", "0"}});
  run_table({
      bad<nc::ValueError>("make_classifier unknown name", [] { models::make_classifier("resnet"); },
                          {"make_classifier", "'resnet'", "mlp"}),
      bad<nc::IOError>("load_checkpoint of a plain safetensors file", [&] { models::load_checkpoint(plain); },
                       {"load_checkpoint", plain, "'format'"}),
      bad<nc::IOError>("read_image missing file", [&] { models::read_image(dir.path("missing.pgm")); },
                       {"read_image", "cannot open", dir.path("missing.pgm")}),
      bad<nc::IOError>("read_image of text", [&] { models::read_image(text); }, {"read_image", text, "PGM"}),
      bad<nc::IOError>("read_image of a 2x2 image", [&] { models::read_image(small); },
                       {"read_image", small, "2x2", "28x28"}),
      bad<nc::ValueError>("Classifier::predict undefined image",
                          [&] { models::Classifier(checkpoint).predict(Tensor()); },
                          {"Classifier::predict", "'image'", "undefined"}),
      bad<nc::ShapeError>("Classifier::predict image size",
                          [&] {
                            models::Classifier(checkpoint).predict(nc::zeros({27, 28}));
                          },
                          {"Classifier::predict", "28x28", "f32 [27, 28]"}),
      bad<nc::IOError>("Classifier with option.std 0",
                       [&] {
                         models::Classifier(zero_std).predict(nc::zeros({28, 28}));
                       },
                       {"Classifier", "option.std", "0"}),
  });
}

TEST(Errors, SafetensorsErrors) {
  namespace st = nc::safetensors;
  const Tensor undefined;
  ScratchDir dir;
  const std::string target = dir.path("out.safetensors");
  const std::string short_file = dir.write("short.bin", "abc");
  const std::string plain = dir.path("plain.safetensors");
  st::save(plain, {{"a", nc::zeros({2})}});
  const std::vector<uint8_t> long_header = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
  const std::vector<uint8_t> not_json = {8, 0, 0, 0, 0, 0, 0, 0, 'n', 'o', 't', ' ', 'j', 's', 'o', 'n'};
  run_table({
      bad<nc::ValueError>("save undefined tensor",
                          [&] {
                            st::save(target, {{"a", undefined}});
                          },
                          {"safetensors::save", "tensor 0", "\"a\"", "undefined"}),
      bad<nc::ValueError>("save reserved name",
                          [&] {
                            st::save(target, {{"__metadata__", nc::zeros({1})}});
                          },
                          {"safetensors::save", "reserved name", "__metadata__"}),
      bad<nc::ValueError>("save repeated name",
                          [&] {
                            st::save(target, {{"a", nc::zeros({1})}, {"a", nc::zeros({1})}});
                          },
                          {"safetensors::save", "duplicate", "\"a\""}),
      bad<nc::ValueError>("save a name that is not UTF-8",
                          [&] {
                            st::save(target, {{"\xff\xfe", nc::zeros({1})}});
                          },
                          {"safetensors::save", "UTF-8"}),
      bad<nc::ValueError>("save metadata that is not UTF-8",
                          [&] {
                            st::save(target, {{"a", nc::zeros({1})}}, {{"k", "\xff"}});
                          },
                          {"safetensors::save", "UTF-8"}),
      bad<nc::IOError>("save into a missing directory",
                       [&] {
                         st::save(dir.path("missing/out.safetensors"), {{"a", nc::zeros({1})}});
                       },
                       {"safetensors", dir.path("missing/out.safetensors"), "cannot create"}),
      bad<nc::IOError>("load missing file", [&] { st::load(dir.path("missing.safetensors")); },
                       {"safetensors", dir.path("missing.safetensors"), "cannot open"}),
      bad<nc::IOError>("load a directory", [&] { st::load(dir.path()); }, {"safetensors", "not a regular file"}),
      bad<nc::IOError>("load a 3-byte file", [&] { st::load(short_file); },
                       {"safetensors", short_file, "shorter than 8 bytes"}),
      bad<nc::ValueError>("load_bytes null data", [] { st::load_bytes(nullptr, 5); },
                          {"safetensors::load_bytes", "null", "5"}),
      bad<nc::IOError>("load_bytes 3 bytes",
                       [] {
                         const uint8_t bytes[3] = {};
                         st::load_bytes(bytes, 3);
                       },
                       {"safetensors", "<memory>", "shorter than 8 bytes"}),
      bad<nc::IOError>("load_bytes header past the end",
                       [&] { st::load_bytes(long_header.data(), long_header.size()); },
                       {"safetensors", "<memory>", "header length 100"}),
      bad<nc::IOError>("load_bytes header not JSON", [&] { st::load_bytes(not_json.data(), not_json.size()); },
                       {"safetensors", "<memory>", "JSON"}),
      bad<nc::IOError>("File::at missing name", [&] { st::load(plain).at("b"); }, {"safetensors", plain, "\"b\""}),
      bad<nc::IOError>("conformance::run_dir of a missing directory",
                       [&] { nc::conformance::run_dir(dir.path("missing"), nc::Device::cpu()); },
                       {"conformance", dir.path("missing")}),
  });
}

// evaluate() indexes its confusion matrix by label and prediction: labels outside the
// classes and models with another number of scores are errors, not out-of-bounds writes.
TEST(Errors, EvaluateChecksLabelsAndScores) {
  namespace models = nc::models;
  auto model = models::make_classifier("mlp");
  const Tensor images = nc::zeros({3, 28, 28}, DType::U8);
  run_table({
      bad<nc::IndexError>(
          "label past the classes",
          [&] {
            models::evaluate(*model, nc::data::TensorDataset(images, i64({0, 12, 1}, {3})), nc::Device::cpu());
          },
          {"evaluate", "label 12", "sample 1", "0 to 9"}),
      bad<nc::IndexError>(
          "negative label",
          [&] {
            models::evaluate(*model, nc::data::TensorDataset(images, i64({-1, 0, 1}, {3})), nc::Device::cpu());
          },
          {"evaluate", "label -1", "sample 0"}),
      bad<nc::ShapeError>(
          "a model with 3 scores",
          [&] {
            nc::nn::Sequential three({std::make_shared<nc::nn::Flatten>(), std::make_shared<nc::nn::Linear>(784, 3)});
            models::evaluate(three, nc::data::TensorDataset(images, i64({0, 1, 2}, {3})), nc::Device::cpu());
          },
          {"evaluate", "[3, 3]", "expected 10 scores"}),
  });
  const models::Evaluation e =
      models::evaluate(*model, nc::data::TensorDataset(images, i64({0, 9, 4}, {3})), nc::Device::cpu());
  int64_t counted = 0;
  for (const auto& row : e.confusion)
    for (int64_t c : row) counted += c;
  EXPECT_EQ(counted, 3);
}

// Tensors on two devices, and the CUDA runtime API with bad device indices; needs a GPU.
TEST(Errors, CudaDeviceErrors) {
  namespace nn = nc::nn;
  if (!nc::cuda_is_available()) GTEST_SKIP() << "needs a CUDA device";
  const nc::Device gpu = nc::Device::cuda(0);
  const Tensor cpu2 = nc::zeros({2});
  const Tensor gpu2 = nc::zeros({2}, gpu);
  const Tensor cpu23 = nc::zeros({2, 3});
  const Tensor gpu23 = nc::zeros({2, 3}, gpu);
  const Tensor undefined;
  run_table({
      bad<nc::DeviceError>("add", [&] { nc::add(cpu2, gpu2); }, {"add", "'a'", "cpu", "'b'", "cuda:0"}),
      bad<nc::DeviceError>("mul", [&] { gpu2* cpu2; }, {"mul", "'a'", "cuda:0", "'b'", "cpu"}),
      bad<nc::DeviceError>("where",
                           [&] {
                             nc::where(flags({true, false}, {2}), gpu2, gpu2);
                           },
                           {"where", "'cond'", "cpu", "'a'", "cuda:0"}),
      bad<nc::DeviceError>("matmul",
                           [&] {
                             nc::matmul(cpu23, nc::zeros({3, 2}, gpu));
                           },
                           {"matmul", "'a'", "cpu", "'b'", "cuda:0"}),
      bad<nc::DeviceError>("cat",
                           [&] {
                             nc::cat({cpu2, gpu2});
                           },
                           {"cat", "cpu", "cuda:0"}),
      bad<nc::DeviceError>("index_select", [&] { nc::index_select(gpu23, 0, i64({0}, {1})); },
                           {"index_select", "'x'", "cuda:0", "'index'", "cpu"}),
      bad<nc::DeviceError>("gather", [&] { nc::gather(gpu2, 0, i64({0}, {1})); }, {"gather", "'x'", "'index'"}),
      bad<nc::DeviceError>("scatter_add src", [&] { nc::scatter_add(cpu2, 0, i64({0}, {1}), nc::ones({1}, gpu)); },
                           {"scatter_add", "'x'", "'src'", "cuda:0"}),
      bad<nc::DeviceError>("masked_fill mask",
                           [&] {
                             nc::masked_fill(gpu2, flags({true, false}, {2}), 1);
                           },
                           {"masked_fill", "'x'", "'mask'"}),
      bad<nc::DeviceError>("layer_norm weight", [&] { nc::layer_norm(gpu23, {3}, nc::ones({3}), undefined); },
                           {"layer_norm", "'x'", "cuda:0", "'weight'", "cpu"}),
      bad<nc::DeviceError>("group_norm bias",
                           [&] {
                             nc::group_norm(gpu23.view({2, 3, 1}), 3, undefined, nc::zeros({3}));
                           },
                           {"group_norm", "'x'", "'bias'"}),
      bad<nc::DeviceError>(
          "gemm_group_norm_min_bias bias",
          [&] {
            const Tensor weight = nc::zeros({4, 3}, gpu);
            nc::gemm_group_norm_min_bias(gpu23, weight, undefined, undefined, undefined, nc::zeros({1, 4, 1, 1}), 2);
          },
          {"gemm_group_norm_min_bias", "'x'", "'bias'", "cpu"}),
      bad<nc::DeviceError>("cross_entropy target",
                           [&] {
                             nc::cross_entropy(gpu23, i64({0, 1}, {2}));
                           },
                           {"cross_entropy", "'logits'", "cuda:0", "'target'", "cpu"}),
      bad<nc::DeviceError>("mse_loss target", [&] { nc::mse_loss(cpu2, gpu2); }, {"mse_loss", "'input'", "'target'"}),
      bad<nc::DeviceError>("Linear input", [&] { nn::Linear(3, 2)(gpu23); },
                           {"Linear", "input", "cuda:0", "weight", "cpu"}),
      bad<nc::DeviceError>("Embedding index",
                           [&] { nn::Embedding(3, 2)(nc::zeros({2}, nc::TensorOptions(DType::I64, gpu))); },
                           {"embedding", "index", "cuda:0", "weight", "cpu"}),
      bad<nc::DeviceError>("backward grad", [&] { nc::mul(leaf({2}), 2.0).backward(gpu2); },
                           {"backward", "'tensor'", "cpu", "'grad'", "cuda:0"}),
      bad<nc::DeviceError>("pin_memory of a GPU tensor", [&] { gpu2.pin_memory(); }, {"pin_memory", "cuda:0", "cpu"}),
      bad<nc::DeviceError>("zeros on a GPU past the last",
                           [&] { nc::zeros({2}, nc::Device::cuda(nc::cuda_device_count())); },
                           {"allocate", "does not exist"}),
      bad<nc::DeviceError>("DataLoader on a GPU past the last",
                           [&] {
                             nc::data::DataLoaderOptions options = loader_options();
                             options.device = nc::Device::cuda(nc::cuda_device_count());
                             nc::data::DataLoader loader(images(4), options);
                           },
                           {"DataLoader", "does not exist"}),
      bad<nc::DeviceError>("cuda::set_device past the last", [] { nc::cuda::set_device(nc::cuda_device_count()); },
                           {"cuda::set_device", "device index", "out of range"}),
      bad<nc::DeviceError>("cuda::current_stream of a negative device", [] { nc::cuda::current_stream(-1); },
                           {"cuda::current_stream", "device index -1"}),
      bad<nc::DeviceError>("cuda::memory_stats past the last", [] { nc::cuda::memory_stats(nc::cuda_device_count()); },
                           {"cuda::memory_stats", "device index"}),
      bad<nc::DeviceError>("cuda::mem_get_info of a negative device",
                           [] {
                             size_t free_bytes = 0, total_bytes = 0;
                             nc::cuda::mem_get_info(-1, &free_bytes, &total_bytes);
                           },
                           {"cuda::mem_get_info", "device index -1"}),
      bad<nc::ValueError>("cuda::destroy_stream of normcore's own stream",
                          [] { nc::cuda::destroy_stream(nc::cuda::current_stream(0)); },
                          {"cuda::destroy_stream", "own stream", "device 0"}),
  });
}
