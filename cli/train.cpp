// The normcore program's classifier commands: train (a Fashion-MNIST classifier on the
// Trainer of normcore/train.h), eval (accuracy and confusion matrix of a checkpoint) and
// predict (labels of image files, or a torchvision ResNet's classes of color images).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/training.h"
#include "normcore/data.h"
#include "normcore/losses.h"
#include "normcore/models.h"
#include "normcore/train.h"

namespace cli {

namespace {

// --optimizer with its hyperparameters.
nc::train::OptimizerFactory classifier_optimizer(const std::string& name, double lr, double weight_decay) {
  if (name == "sgd") return nc::train::sgd(nc::optim::SGDOptions{lr, 0.9, 0.0, weight_decay, true});
  if (name == "adam") return nc::train::adam(nc::optim::AdamOptions{lr, 0.9, 0.999, 1e-8, weight_decay});
  if (name == "adamw") return nc::train::adamw(nc::optim::AdamWOptions{lr, 0.9, 0.999, 1e-8, weight_decay});
  throw nc::ValueError("option --optimizer: unknown optimizer '" + name + "' (sgd, adam, adamw)");
}

}  // namespace

int train(const Args& args) {
  if (const int64_t nproc = integer(args, "nproc", 1); nproc > 1)
    return launch_self(static_cast<int>(nproc), static_cast<int>(integer(args, "max-restarts", 0)));
  const nc::Device device = nc::train::DataParallelJob().device(args.options.at("device"));
  const int64_t epochs = integer(args, "epochs", 1), batch_size = integer(args, "batch-size", 1);
  const double lr = number(args, "lr"), weight_decay = number(args, "weight-decay");
  const double smoothing = number(args, "label-smoothing");
  const std::string optimizer_name = args.options.at("optimizer");
  const std::string anomaly = args.options.at("detect-anomaly");
  NC_CHECK(anomaly == "on" || anomaly == "off", ValueError, "train: --detect-anomaly must be on or off, got '", anomaly,
           "'");
  nc::train::TrainerOptions options = trainer_options(args, device);
  options.detect_anomaly = anomaly == "on";
  options.epochs = epochs;
  const nc::train::Precision checked(options.precision, device);  // bad values fail before the data loads

  nc::data::TensorDataset train_set = nc::data::load_fashion_mnist(args.options.at("data"), true);
  const nc::data::TensorDataset test_set = nc::data::load_fashion_mnist(args.options.at("data"), false);
  if (int64_t limit = integer(args, "limit", 0); limit > 0 && limit < train_set.size())
    train_set = train_set.head(limit);
  const std::string augment = args.options.at("augment");
  NC_CHECK(augment == "on" || augment == "off", ValueError, "option --augment: must be on or off, got '", augment, "'");

  // A resumed run's model is the checkpoint's (its name, its weights); the Trainer restores
  // the rest of the run.
  nc::Generator gen(options.seed);
  std::shared_ptr<nc::nn::Module> model;
  std::string model_name = args.options.at("model");
  int64_t first_epoch = 0;
  if (!options.resume.empty()) {
    nc::models::Checkpoint checkpoint = nc::models::load_checkpoint(options.resume, device, &gen);
    model = checkpoint.model;
    model_name = checkpoint.model_name;
    first_epoch = checkpoint.epoch;
  } else {
    model = nc::models::make_classifier(model_name, &gen);
  }
  options.generator = &gen;
  options.model_name = model_name;
  options.options["model"] = model_name;
  options.options["mean"] = std::to_string(nc::data::kFashionMnistMean);
  options.options["std"] = std::to_string(nc::data::kFashionMnistStd);
  options.title = "normcore train " + model_name;
  options.curves = {"loss", "accuracy"};
  options.eval_phase = "test";
  options.loss_every = 20;

  nc::train::Trainer trainer(
      model,
      [smoothing](const nc::Tensor& logits, const nc::Tensor& labels) {
        return nc::cross_entropy(logits, labels, nc::Reduction::Mean, smoothing);
      },
      classifier_optimizer(optimizer_name, lr, weight_decay), options);
  trainer.set_schedule(nc::train::cosine_schedule(integer(args, "warmup", 0), lr * 0.01));
  trainer.set_evaluate([&](nc::nn::Module& m) -> std::vector<std::pair<std::string, double>> {
    return {{"accuracy", nc::models::evaluate(m, test_set, device).accuracy}};
  });
  const int world = trainer.job().world_size();
  const int64_t train_size = train_set.size();
  int64_t params = 0;
  for (const nc::Tensor& p : model->parameters()) params += p.numel();
  trainer.on_start([&](int64_t) {
    std::printf("normcore train: model %s (%lld parameters) on %s%s in %s%s, %lld training / %lld test images, "
                "%s lr %g, batch %lld%s, %lld epochs%s\n",
                model_name.c_str(), static_cast<long long>(params), device.str().c_str(),
                trainer.job().describe(device, options.shard_optimizer).c_str(), options.precision.c_str(),
                trainer.graphed() ? " with CUDA graphs" : "", static_cast<long long>(train_size),
                static_cast<long long>(test_set.size()), optimizer_name.c_str(), lr, static_cast<long long>(batch_size),
                trainer.job().active() ? (" per rank (" + std::to_string(batch_size * world) + " in all)").c_str() : "",
                static_cast<long long>(epochs),
                first_epoch ? (", resuming after epoch " + std::to_string(first_epoch)).c_str() : "");
  });
  trainer.on_evaluation([&](const nc::train::EvalInfo& e) {
    std::printf("epoch %lld/%lld: train loss %.4f, test accuracy %.2f%% (%.1f s, %.0f samples/s)%s\n",
                static_cast<long long>(e.epoch), static_cast<long long>(epochs), e.train_loss,
                100 * e.results.at(0).second, e.seconds, e.rate, trainer.precision().scaler_report().c_str());
    std::fflush(stdout);
  });

  nc::data::DataLoaderOptions loader;
  loader.batch_size = batch_size;
  loader.workers = loader_workers(args, trainer.job(), /*sample_transforms=*/augment == "on");
  // Augmented, each sample is cropped and flipped, then normalized; otherwise the loader
  // gathers each batch at once and normalizes it whole (the same values).
  if (augment == "on")
    loader.transforms = {nc::data::transforms::random_crop(28, 28, 2), nc::data::transforms::random_horizontal_flip(),
                         nc::data::transforms::normalize()};
  else loader.batch_transforms = {nc::data::transforms::normalize_batch()};
  trainer.fit(std::make_shared<const nc::data::TensorDataset>(std::move(train_set)), loader);
  if (!options.checkpoint.empty() && trainer.is_main()) std::printf("checkpoint: %s\n", options.checkpoint.c_str());
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

}  // namespace cli
