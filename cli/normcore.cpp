// The normcore command-line program: train, evaluate and use Fashion-MNIST classifiers,
// train a byte-level GPT on the fortunes corpus and write text with it, and check the ops
// against reference cases.
//   normcore train [options]            train, print test accuracy per epoch, save a checkpoint
//   normcore eval --checkpoint F        test accuracy and confusion matrix
//   normcore predict --checkpoint F IMAGE...   label 28x28 PGM/PNG images
//   normcore train-lm [options]         train a GPT, print validation loss, save a checkpoint
//   normcore generate --checkpoint F --prompt TEXT   continue a text, streaming it
//   normcore conformance DIR [--device cpu|cuda|all]   run every case in DIR; exit 0 when all pass
//   normcore tokenize --tokenizer DIR [FILE...]   GPT-2 token ids of text, printed or as a shard
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "normcore/conformance.h"
#include "normcore/data.h"
#include "normcore/distributed.h"
#include "normcore/gpt.h"
#include "normcore/models.h"
#include "normcore/optim.h"
#include "normcore/text.h"
#include "cli/args.h"
#include "cli/lm.h"
#include "cli/tokenize.h"
#include "cli/training.h"

namespace nc = normcore;

namespace {

using namespace cli;

const char* kDefaultData = "/usr/share/datasets/fashion-mnist";

const std::vector<OptionSpec> kTrainOptions = {
    {"data", kDefaultData, "folder with the Fashion-MNIST .gz files"},
    {"model", "mlp-layernorm", "mlp, mlp-layernorm, mlp-groupnorm, mlp-l1norm, mlp-frobnorm, cnn-gn or cnn-bn"},
    {"epochs", "12", "passes over the training set"},
    {"batch-size", "128", "samples per step"},
    {"lr", "0.001", "peak learning rate"},
    {"optimizer", "adamw", "sgd (with momentum 0.9), adam or adamw"},
    {"weight-decay", "0.0001", "weight decay"},
    {"label-smoothing", "0.1", "cross-entropy label smoothing"},
    {"warmup", "200", "warm-up steps of the cosine learning-rate schedule"},
    {"clip", "5.0", "clip the gradient norm to this (0: off)"},
    {"seed", "0", "seed of initialization, dropout and shuffling"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
    {"out", "normcore-fashion.safetensors", "checkpoint written after every epoch"},
    {"log", "", "metrics as JSON lines (epoch, train loss, samples/s and lr at its end; test accuracy), appended on "
                "--resume"},
    {"plot", "", "an SVG of the loss and accuracy curves, rewritten after every epoch"},
    {"resume", "", "checkpoint to continue from (its model, seed and state; other options as given)"},
    {"limit", "0", "use only the first N training samples (0: all)"},
    {"workers", "auto", "data-loading threads (0: load on the training thread; auto: with --augment on half the "
                        "cores among the job's ranks, 1 to 4, else 1); the batches do not depend on it"},
    {"augment", "off", "on: each training image randomly cropped (28 x 28 of the image padded by 2) and mirrored"},
    {"stop-after", "0", "stop after this many epochs, as if interrupted (0: run all)"},
    {"detect-anomaly", "off", "on: check every op's result and gradient for NaN/Inf, naming the op (slow)"},
    {"precision", "fp32", "fp32, tf32 (f32 on TF32 tensor cores), bf16 or fp16 (autocast; fp16 with loss scaling)"},
    {"cuda-graph", "auto", "on: replay each training step as one CUDA graph; auto: on for CUDA unless "
                           "--detect-anomaly or data-parallel; off"},
    {"nproc", "1", "data-parallel processes on this machine (one per GPU, started through 'normcore launch'); "
                   "--batch-size is per process"},
    {"timeout", "300", "data-parallel: seconds a rank waits for the others (meeting, a collective) before the job "
                       "fails"},
};
const std::vector<OptionSpec> kEvalOptions = {
    {"checkpoint", "normcore-fashion.safetensors", "checkpoint to evaluate"},
    {"data", kDefaultData, "folder with the Fashion-MNIST .gz files"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
};
const std::vector<OptionSpec> kPredictOptions = {
    {"checkpoint", "normcore-fashion.safetensors", "checkpoint to use"},
    {"resnet", "", "instead: a torchvision ResNet (resnet18, resnet34, resnet50, resnet101) classifying color "
                   "images (PPM, PGM or PNG, any size)"},
    {"weights", "", "with --resnet: its state_dict as safetensors"},
    {"labels", "", "with --resnet: a file of class names, one a line (empty: class numbers)"},
    {"top", "5", "with --resnet: the most likely classes printed per image"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
};
const std::vector<OptionSpec> kTrainLmOptions = {
    {"data", nc::models::kFortunesDir, "fortunes folder (its files without a '.') or one fortune file (bytes); or "
                                       "token shards in llm.c's format, a path or pattern ending in .bin "
                                       "('dir/*_train_*.bin')"},
    {"val-data", "", "with token shards: the validation shards (a path or pattern)"},
    {"vocab", "50257", "with token shards: the vocabulary (GPT-2's by default; every id is checked against it)"},
    {"model", "", "gpt2, gpt2-medium, gpt2-large or gpt2-xl: GPT-2's sizes (the size options given override "
                  "them); empty: the sizes below"},
    {"layers", "6", "transformer blocks"},
    {"heads", "6", "attention heads"},
    {"embed", "384", "embedding width (divisible by heads)"},
    {"context", "256", "tokens of context"},
    {"norm", "layernorm", "layernorm or rmsnorm"},
    {"dropout", "0.1", "dropout on the embeddings and the residual branches (0 with --model unless given)"},
    {"batch-size", "64", "windows per step"},
    {"workers", "auto", "data-loading threads (0: load on the training thread; auto: 1); the batches do not "
                        "depend on it"},
    {"steps", "3000", "optimizer steps"},
    {"lr", "0.001", "peak learning rate"},
    {"min-lr", "0.0001", "learning rate at the end of the cosine schedule"},
    {"warmup", "100", "warm-up steps of the cosine schedule"},
    {"weight-decay", "0.1", "AdamW weight decay of the matrices and embeddings (not biases or norms)"},
    {"clip", "1.0", "clip the gradient norm to this (0: off)"},
    {"eval-interval", "250", "steps between validation losses and checkpoints"},
    {"eval-batches", "8", "validation batches (of batch-size windows, evenly spaced)"},
    {"sample", "300", "bytes of text to print at the end"},
    {"precision", "fp32", "fp32, tf32 (f32 on TF32 tensor cores), bf16 or fp16 (autocast; fp16 with loss scaling)"},
    {"cuda-graph", "auto", "on: replay each training step as one CUDA graph; auto: on for CUDA unless "
                           "data-parallel; off"},
    {"seed", "0", "seed of initialization, batches and dropout"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
    {"out", "normcore-gpt.safetensors", "checkpoint written at every evaluation"},
    {"log", "", "metrics as JSON lines (step, loss, lr, tokens/s; validation loss), appended on --resume"},
    {"plot", "", "an SVG of the train and validation loss curves, rewritten at every evaluation"},
    {"resume", "", "checkpoint to continue from (its model, seed and state; other options as given)"},
    {"init", "", "initial weights: a train-lm checkpoint's model, or a safetensors file under the model's "
                 "state_dict names (e.g. saved by another trainer); not with --resume"},
    {"hf-out", "", "also write the trained model to this folder as a Hugging Face GPT-2 checkpoint "
                   "(config.json, model.safetensors) at the end"},
    {"shuffle", "on", "on: the training windows in a new random order each epoch; off: in order"},
    {"recompute", "none", "gelu: keep only each MLP's GELU input for the backward and compute its output again "
                          "there (less memory, one more pass); none: keep both"},
    {"attention", "auto", "CUDA attention engine: auto (cuDNN's fused attention from 2^21 scores a call, else "
                          "normcore's kernels), native (normcore's kernels: no cuDNN workspace, which is 2 x B x "
                          "heads x context^2 bytes in the backward) or cudnn"},
    {"stop-after", "0", "stop after this many steps, as if interrupted (0: run all)"},
    {"benchmark", "0", "time this many training steps after 3 warm-up steps and print ms/step, tokens/s and peak "
                       "device memory; no evaluation, checkpoint or sample (0: train)"},
    {"nproc", "1", "data-parallel processes on this machine (one per GPU, started through 'normcore launch'); "
                   "--batch-size is per process"},
    {"timeout", "300", "data-parallel: seconds a rank waits for the others (meeting, a collective) before the job "
                       "fails"},
};
const std::vector<OptionSpec> kGenerateOptions = {
    {"checkpoint", "normcore-gpt.safetensors", "GPT checkpoint (from train-lm)"},
    {"model", "", "a Hugging Face GPT-2 folder (config.json, model.safetensors) instead of --checkpoint"},
    {"tokenizer", "", "with --model: GPT-2's tokenizer files (encoder.json and vocab.bpe, vocab.json and "
                      "merges.txt, or tokenizer.json); empty: those in the model's folder"},
    {"prompt", "", "text to continue (empty: start a new fortune; with --model, a new document)"},
    {"tokens", "300", "bytes (tokens with --model) to generate; past the context the model sees the last "
                      "context ones"},
    {"temperature", "0.8", "sampling temperature (0: greedy)"},
    {"top-k", "0", "sample among the k most likely tokens (0: all)"},
    {"top-p", "1", "then among the most likely tokens whose probabilities add up to P (1: all)"},
    {"seed", "0", "seed of the sampling: the same seed gives the same text"},
    {"device", "auto", "auto, cpu or cuda[:N]"},
};
const std::vector<OptionSpec> kLaunchOptions = {
    {"nproc", "1", "ranks on this machine, usually one per GPU"},
    {"nnodes", "1", "machines in the job, each running one launcher"},
    {"node-rank", "0", "this machine's index among them, 0 to nnodes - 1"},
    {"master-addr", "127.0.0.1", "address of node 0, where rank 0 serves the rendezvous"},
    {"master-port", "29500", "port of the rendezvous on node 0"},
};
const std::vector<OptionSpec> kTokenizeOptions = {
    {"tokenizer", "", "folder of GPT-2's tokenizer files: encoder.json and vocab.bpe, vocab.json and merges.txt, "
                      "or tokenizer.json"},
    {"out", "", "write the ids as an llm.c token shard (.bin) instead of printing them"},
    {"special", nullptr, "\"<|endoftext|>\" in the text is GPT-2's end-of-text token (otherwise it is text)"},
    {"decode", nullptr, "read token ids instead (printed ones, or token shards ending in .bin) and print their text"},
};
const std::vector<OptionSpec> kConformanceOptions = {
    {"device", "all", "cpu, cuda[:N], or all (the CPU, then cuda:0 when there is one)"},
};

void usage(std::ostream& os) {
  os << "usage: normcore <command> [options]\n\n"
        "commands:\n"
        "  train     train a Fashion-MNIST classifier\n"
        "  eval      print a checkpoint's test accuracy and confusion matrix\n"
        "  predict   classify 28x28 PGM or PNG images with a checkpoint, or color images with a ResNet\n"
        "  train-lm  train a byte-level GPT on the fortunes corpus\n"
        "  generate  continue a prompt with a GPT checkpoint\n"
        "  conformance  run the reference cases in a folder against every device\n"
        "  tokenize  GPT-2 token ids of text (stdin or files), printed or written as a token shard\n"
        "  launch    run a command as the local ranks of a data-parallel job\n\n"
        "'normcore <command> --help' lists a command's options.\n";
}

void command_usage(std::ostream& os, const std::string& command, const std::vector<OptionSpec>& specs) {
  os << "usage: normcore " << command << " [options]" << (command == "predict" ? " IMAGE..." : command == "conformance" ? " DIR" : command == "tokenize" ? " [FILE...]" : command == "launch" ? " -- COMMAND..." : "") << "\n\noptions:\n";
  for (const OptionSpec& s : specs)
    os << "  --" << std::left << std::setw(18) << s.name << s.help
       << (s.fallback && *s.fallback ? std::string(" (default ") + s.fallback + ")" : "") << "\n";
}

// ---------------------------------------------------------------- commands
int train(const Args& args) {
  if (const int64_t nproc = integer(args, "nproc", 1); nproc > 1) return launch_self(static_cast<int>(nproc));
  DataParallelJob job;
  const bool main_rank = job.is_main();
  nc::Device device = job.device(args.options.at("device"));
  const int64_t epochs = integer(args, "epochs", 1), batch_size = integer(args, "batch-size", 1);
  uint64_t seed = static_cast<uint64_t>(integer(args, "seed", 0));
  const double lr = number(args, "lr"), weight_decay = number(args, "weight-decay");
  const double smoothing = number(args, "label-smoothing"), clip = number(args, "clip");
  const std::string optimizer_name = args.options.at("optimizer");
  const std::string out = args.options.at("out"), resume = args.options.at("resume");
  std::string model_name = args.options.at("model");
  const std::string anomaly = args.options.at("detect-anomaly");
  NC_CHECK(anomaly == "on" || anomaly == "off", ValueError, "train: --detect-anomaly must be on or off, got '",
           anomaly, "'");
  nc::autograd::set_anomaly_enabled(anomaly == "on");
  Precision precision(args.options.at("precision"), device);

  nc::data::TensorDataset train_set = nc::data::load_fashion_mnist(args.options.at("data"), true);
  const nc::data::TensorDataset test_set = nc::data::load_fashion_mnist(args.options.at("data"), false);
  if (int64_t limit = integer(args, "limit", 0); limit > 0 && limit < train_set.size()) train_set = train_set.head(limit);
  const std::string augment = args.options.at("augment");
  NC_CHECK(augment == "on" || augment == "off", ValueError, "option --augment: must be on or off, got '", augment,
           "'");

  nc::Generator gen(seed);
  std::shared_ptr<nc::nn::Module> model;
  int64_t first_epoch = 0;
  nc::models::Checkpoint checkpoint;
  if (!resume.empty()) {
    checkpoint = nc::models::load_checkpoint(resume, device, &gen);
    model = checkpoint.model;
    model_name = checkpoint.model_name;
    first_epoch = checkpoint.epoch;
    // The run continues with the checkpoint's seed and generator position, so that it draws
    // the dropout masks and batch orders an uninterrupted run would.
    auto saved_seed = checkpoint.metadata.find("option.seed");
    auto offset = checkpoint.metadata.find("option.rng.offset");
    NC_CHECK(saved_seed != checkpoint.metadata.end() && offset != checkpoint.metadata.end(), IOError,
             "--resume ", resume, ": the checkpoint has no random-generator state");
    seed = std::stoull(saved_seed->second);
    gen.manual_seed(seed);
    gen.set_offset(std::stoull(offset->second));
  } else {
    model = nc::models::make_classifier(model_name, &gen);
    model->to(device);
  }
  model->train();
  job.start(args, model, device, gen, seed);

  std::unique_ptr<nc::optim::Optimizer> optimizer;
  if (optimizer_name == "sgd") {
    optimizer = std::make_unique<nc::optim::SGD>(model->parameters(),
                                                 nc::optim::SGDOptions{lr, 0.9, 0.0, weight_decay, true});
  } else if (optimizer_name == "adam") {
    optimizer = std::make_unique<nc::optim::Adam>(model->parameters(),
                                                  nc::optim::AdamOptions{lr, 0.9, 0.999, 1e-8, weight_decay});
  } else if (optimizer_name == "adamw") {
    optimizer = std::make_unique<nc::optim::AdamW>(model->parameters(),
                                                   nc::optim::AdamWOptions{lr, 0.9, 0.999, 1e-8, weight_decay});
  } else {
    throw nc::ValueError("option --optimizer: unknown optimizer '" + optimizer_name + "' (sgd, adam, adamw)");
  }

  nc::data::DataLoaderOptions loader_options =
      job.loader_options(args, batch_size, seed, device, /*sample_transforms=*/augment == "on");
  // Augmented, each sample is cropped and flipped, then normalized; otherwise the loader
  // gathers each batch at once and normalizes it whole (the same values).
  if (augment == "on")
    loader_options.transforms = {nc::data::transforms::random_crop(28, 28, 2),
                                 nc::data::transforms::random_horizontal_flip(), nc::data::transforms::normalize()};
  else
    loader_options.batch_transforms = {nc::data::transforms::normalize_batch()};
  nc::data::DataLoader loader(train_set, loader_options);
  const int64_t steps = epochs * loader.num_batches();
  const int64_t warmup = std::min(integer(args, "warmup", 0), steps - 1);
  nc::optim::CosineLR schedule(*optimizer, warmup, steps, lr * 0.01);
  if (!resume.empty()) {
    precision.take_state(checkpoint.optimizer_state);
    if (!checkpoint.optimizer_state.empty()) optimizer->load_state_dict(checkpoint.optimizer_state);
    if (!checkpoint.schedule_state.empty()) schedule.load_state_dict(checkpoint.schedule_state);
  }

  std::map<std::string, std::string> saved_options;
  for (const auto& [k, v] : args.options)
    if (k != "resume" && k != "help" && k != "stop-after") saved_options[k] = v;
  saved_options["seed"] = std::to_string(seed);
  saved_options["model"] = model_name;
  saved_options["mean"] = std::to_string(nc::data::kFashionMnistMean);
  saved_options["std"] = std::to_string(nc::data::kFashionMnistStd);

  int64_t params = 0;
  for (const nc::Tensor& p : model->parameters()) params += p.numel();
  const bool graphed = use_cuda_graph(args, device, anomaly == "on", job.active);
  nc::GraphedStep train_step(
      [&](const std::vector<nc::Tensor>& in) {
        nc::Tensor loss;
        {
          nc::autocast::Guard autocast(precision.dtype, precision.autocast);
          const nc::Tensor logits = job.ddp ? (*job.ddp)(in[0]) : (*model)(in[0]);
          loss = nc::nn::cross_entropy(logits, in[1], nc::nn::Reduction::Mean, smoothing);
        }
        optimizer->zero_grad();
        precision.backward_and_step(loss, optimizer->params(), clip,
                                    [&](const nc::Tensor& found_inf) { optimizer->step_unless(found_inf); });
        return loss;
      },
      graphed);
  const std::string ranks = job.describe(device);
  if (main_rank) {
    std::printf("normcore train: model %s (%lld parameters) on %s%s in %s%s, %lld training / %lld test images, "
                "%s lr %g, batch %lld%s, %lld epochs%s\n",
                model_name.c_str(), static_cast<long long>(params), device.str().c_str(), ranks.c_str(),
                args.options.at("precision").c_str(), graphed ? " with CUDA graphs" : "",
                static_cast<long long>(train_set.size()), static_cast<long long>(test_set.size()),
                optimizer_name.c_str(), lr, static_cast<long long>(batch_size),
                job.active ? (" per rank (" + std::to_string(batch_size * job.world_size()) + " in all)").c_str() : "",
                static_cast<long long>(epochs),
                first_epoch ? (", resuming after epoch " + std::to_string(first_epoch)).c_str() : "");
  }

  const int64_t stop_after = integer(args, "stop-after", 0);
  const int64_t last_epoch = stop_after > 0 ? std::min(epochs, stop_after) : epochs;
  RunMetrics metrics(args, main_rank, !resume.empty(), "normcore train " + model_name, "epoch", {"loss", "accuracy"});
  for (int64_t epoch = first_epoch; epoch < last_epoch; ++epoch) {
    loader.begin_epoch(static_cast<uint64_t>(epoch));
    Progress progress("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(epochs), loader.num_batches(),
                      "samples");
    double loss_sum = 0;
    int64_t loss_count = 0, samples = 0;
    for (nc::data::Batch batch; loader.next(batch);) {
      const nc::Tensor loss = train_step({batch.inputs, batch.targets});
      schedule.step();
      samples += batch.targets.size(0);
      // Reading the loss waits for the device: do it for the progress display only (rank 0's
      // batches in a data-parallel job).
      if (main_rank && (batch.index % 20 == 0 || batch.index + 1 == loader.num_batches())) {
        loss_sum += loss.item<double>();
        ++loss_count;
        progress.update(batch.index + 1, samples * job.world_size(), loss_sum / static_cast<double>(loss_count));
      }
    }
    if (!main_rank) continue;  // the others go on to the next epoch and wait in its first all-reduce
    progress.finish();
    double train_seconds = progress.elapsed();
    nc::models::Evaluation e = nc::models::evaluate(*model, test_set, device);
    const double train_loss = loss_sum / static_cast<double>(std::max<int64_t>(loss_count, 1));
    const double samples_per_s = static_cast<double>(samples * job.world_size()) / train_seconds;
    metrics.log(epoch + 1, "train", {{"loss", train_loss}, {"lr", optimizer->lr()}, {"samples_per_s", samples_per_s}});
    metrics.log(epoch + 1, "test", {{"accuracy", e.accuracy}});
    metrics.plot();
    std::printf("epoch %lld/%lld: train loss %.4f, test accuracy %.2f%% (%.1f s, %.0f samples/s)%s\n",
                static_cast<long long>(epoch + 1), static_cast<long long>(epochs),
                loss_sum / static_cast<double>(std::max<int64_t>(loss_count, 1)), 100 * e.accuracy, train_seconds,
                static_cast<double>(samples * job.world_size()) / train_seconds, precision.scaler_report().c_str());
    std::fflush(stdout);
    if (!out.empty()) {
      saved_options["rng.offset"] = std::to_string(gen.offset());
      nc::nn::NamedTensors optimizer_state = optimizer->state_dict();
      precision.add_state(optimizer_state);
      nc::models::save_checkpoint(out, model_name, *model, epoch + 1, optimizer_state, schedule.state_dict(),
                                  saved_options);
    }
  }
  job.finish();
  if (!out.empty() && main_rank) std::printf("checkpoint: %s\n", out.c_str());
  return 0;
}

int eval(const Args& args) {
  nc::Device device = pick_device(args.options.at("device"));
  nc::models::Checkpoint c = nc::models::load_checkpoint(args.options.at("checkpoint"), device);
  const nc::data::TensorDataset test = nc::data::load_fashion_mnist(args.options.at("data"), false);
  nc::models::Evaluation e = nc::models::evaluate(*c.model, test, device);
  const auto& names = nc::models::fashion_mnist_classes();
  std::printf("%s: model %s after %lld epochs, test accuracy %.2f%% on %s\n\n", args.options.at("checkpoint").c_str(),
              c.model_name.c_str(), static_cast<long long>(c.epoch), 100 * e.accuracy, device.str().c_str());
  std::printf("confusion matrix (rows: true class, columns: predicted)\n%12s", "");
  for (size_t j = 0; j < names.size(); ++j) std::printf("%6zu", j);
  std::printf("\n");
  for (size_t i = 0; i < names.size(); ++i) {
    std::printf("%2zu %-9.9s", i, names[i].c_str());
    for (size_t j = 0; j < names.size(); ++j) std::printf("%6lld", static_cast<long long>(e.confusion[i][j]));
    std::printf("\n");
  }
  return 0;
}

int launch(const Args& args) {
  nc::distributed::LaunchOptions options;
  options.nproc = static_cast<int>(integer(args, "nproc", 1));
  options.nnodes = static_cast<int>(integer(args, "nnodes", 1));
  options.node_rank = static_cast<int>(integer(args, "node-rank", 0));
  options.master_addr = args.options.at("master-addr");
  options.master_port = static_cast<int>(integer(args, "master-port", 1));
  NC_CHECK(!args.positional.empty(), ValueError, "no command to run: normcore launch --nproc N -- <command...>");
  return nc::distributed::launch(args.positional, options);
}

int tokenize(const Args& args) {
  return run_tokenize({args.options.at("tokenizer"), args.positional, args.options.at("out"), flag(args, "special"),
                       flag(args, "decode")});
}

int predict(const Args& args) {
  NC_CHECK(!args.positional.empty(), ValueError, "predict: give at least one image file");
  nc::Device device = pick_device(args.options.at("device"));
  if (const std::string& name = args.options.at("resnet"); !name.empty()) {
    NC_CHECK(!args.options.at("weights").empty(), ValueError, "--resnet: give its weights with --weights");
    const nc::models::ImageClassifier classifier(name, args.options.at("weights"), device, args.options.at("labels"));
    const int64_t top = integer(args, "top", 1);
    for (const std::string& path : args.positional) {
      std::printf("%s:", path.c_str());
      for (const auto& p : classifier.predict(nc::data::read_color_image(path), top))
        std::printf(" %s (class %lld, %.1f%%)", p.name.c_str(), static_cast<long long>(p.label), 100 * p.probability);
      std::printf("\n");
    }
    return 0;
  }
  nc::models::Classifier classifier(args.options.at("checkpoint"), device);
  for (const std::string& path : args.positional) {
    auto p = classifier.predict(nc::models::read_image(path));
    std::printf("%s: %s (class %lld, %.1f%%)\n", path.c_str(), p.name.c_str(), static_cast<long long>(p.label),
                100 * p.probability);
  }
  return 0;
}

// One line per case and device: verdict, file, op, dtype, device, the worst error of each
// compared tensor (absolute, and as a fraction of its tolerance), then the failure reason.
void print_case(const nc::conformance::CaseResult& r) {
  std::printf("%s %s %s %s %s", r.pass ? "PASS" : "FAIL", std::filesystem::path(r.file).filename().string().c_str(),
              r.op.empty() ? "-" : r.op.c_str(), r.dtype.empty() ? "-" : r.dtype.c_str(), r.device.str().c_str());
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const auto& t = r.tensors[i];
    std::printf("%s %s %.1e (%.2g tol)", i ? "," : " ", t.name.c_str(), t.worst_abs, t.worst_rel_to_tol);
  }
  if (!r.pass) std::printf(" -- %s", r.reason.c_str());
  std::printf("\n");
}

int conformance(const Args& args) {
  NC_CHECK(args.positional.size() == 1, ValueError, "conformance: give one folder of cases, got ",
           args.positional.size(), " arguments");
  const std::string& spec = args.options.at("device");
  std::vector<nc::Device> devices;
  if (spec == "all") {
    devices.push_back(nc::Device::cpu());
    if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  } else {
    NC_CHECK(spec != "auto", ValueError, "conformance: --device takes cpu, cuda[:N] or all, got 'auto'");
    devices.push_back(pick_device(spec));
  }
  int passed = 0, failed = 0;
  for (const nc::Device& device : devices) {
    for (const auto& r : nc::conformance::run_dir(args.positional[0], device)) {
      print_case(r);
      (r.pass ? passed : failed) += 1;
    }
  }
  NC_CHECK(passed + failed > 0, IOError, "conformance: no .safetensors cases in '", args.positional[0], "'");
  std::printf("%d passed, %d failed\n", passed, failed);
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  const std::vector<OptionSpec>* specs = command == "train"     ? &kTrainOptions
                                         : command == "eval"    ? &kEvalOptions
                                         : command == "predict" ? &kPredictOptions
                                         : command == "train-lm" ? &kTrainLmOptions
                                         : command == "generate" ? &kGenerateOptions
                                         : command == "conformance" ? &kConformanceOptions
                                         : command == "launch" ? &kLaunchOptions
                                         : command == "tokenize" ? &kTokenizeOptions
                                                                : nullptr;
  if (!specs) {
    std::cerr << "normcore: unknown command '" << command << "'\n\n";
    usage(std::cerr);
    return 2;
  }
  g_argv.assign(argv, argv + argc);
  try {
    Args args = parse(argc, argv, *specs);
    if (args.options.count("help")) {
      command_usage(std::cout, command, *specs);
      return 0;
    }
    if (command == "train") return train(args);
    if (command == "eval") return eval(args);
    if (command == "conformance") return conformance(args);
    if (command == "train-lm") return train_lm(args);
    if (command == "generate") return generate(args);
    if (command == "launch") return launch(args);
    if (command == "tokenize") return tokenize(args);
    return predict(args);
  } catch (const nc::ValueError& e) {
    std::cerr << "normcore " << command << ": " << e.what() << "\n";
    return 2;
  } catch (const nc::Error& e) {
    std::cerr << "normcore " << command << ": " << e.what() << "\n";
    return 1;
  }
}
