// Classifier models, checkpoints and image files for the command-line program and for
// programs that embed a trained model.
#include "normcore/models.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>

#include "data/pnm.h"
#include "models/checkpoint_text.h"
#include "normcore/autograd.h"
#include "normcore/ops.h"
#include "normcore/safetensors.h"
#include "normcore/train.h"
#ifdef NORMCORE_HAS_PNG
#include <png.h>
#endif

namespace normcore {
namespace models {

namespace {

constexpr int64_t kSide = 28;

// A normalization layer over `features` features, or none.
std::shared_ptr<nn::Module> make_norm(const std::string& norm, int64_t features) {
  if (norm == "layernorm") return std::make_shared<nn::LayerNorm>(std::vector<int64_t>{features});
  if (norm == "groupnorm") return std::make_shared<nn::GroupNorm>(16, features);
  if (norm == "l1norm") return std::make_shared<nn::L1Norm>(1);
  if (norm == "frobnorm") return std::make_shared<nn::FrobeniusNorm>();
  return nullptr;
}

// Flatten, then two hidden blocks Linear -> [norm] -> ReLU -> Dropout(0.2), then the
// classifier layer. Without a norm the indices match PyTorch's nn.Sequential of the same
// layers (1, 4 and 7 for the Linear layers).
std::shared_ptr<nn::Module> make_mlp(const std::string& norm, Generator* gen) {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Flatten>());
  int64_t in = kSide * kSide;
  for (int64_t width : {512, 256}) {
    net->push_back(std::make_shared<nn::Linear>(in, width, true, gen));
    if (auto n = make_norm(norm, width)) net->push_back(n);
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::Dropout>(0.2, gen));
    in = width;
  }
  net->push_back(std::make_shared<nn::Linear>(in, 10, true, gen));
  return net;
}

// A CNN: two stages of [Conv2d(3x3, padding 1) -> norm -> ReLU] x 2 -> MaxPool2d(2)
// (32 then 64 channels: 28x28 -> 14x14 -> 7x7), then Flatten, Dropout(0.3),
// Linear(64 * 7 * 7, 256), ReLU, Dropout(0.3), Linear(256, 10). norm is "groupnorm"
// (GroupNorm with 8 groups) or "batchnorm" (BatchNorm2d); the convolutions have no bias
// since the norm's shift follows. The indices are those of PyTorch's nn.Sequential of the
// same layers.
std::shared_ptr<nn::Module> make_cnn(const std::string& norm, Generator* gen) {
  auto net = std::make_shared<nn::Sequential>();
  int64_t in = 1;
  for (int64_t channels : {32, 64}) {
    for (int repeat = 0; repeat < 2; ++repeat) {
      net->push_back(std::make_shared<nn::Conv2d>(in, channels, 3, 1, 1, 1, 1, false, gen));
      if (norm == "groupnorm") net->push_back(std::make_shared<nn::GroupNorm>(8, channels));
      else net->push_back(std::make_shared<nn::BatchNorm2d>(channels));
      net->push_back(std::make_shared<nn::ReLU>());
      in = channels;
    }
    net->push_back(std::make_shared<nn::MaxPool2d>(2));
  }
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Dropout>(0.3, gen));
  net->push_back(std::make_shared<nn::Linear>(in * 7 * 7, 256, true, gen));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Dropout>(0.3, gen));
  net->push_back(std::make_shared<nn::Linear>(256, 10, true, gen));
  return net;
}

}  // namespace

std::vector<std::string> classifier_names() {
  return {"mlp", "mlp-layernorm", "mlp-groupnorm", "mlp-l1norm", "mlp-frobnorm", "cnn-gn", "cnn-bn"};
}

std::shared_ptr<nn::Module> make_classifier(const std::string& name, Generator* gen) {
  if (name == "mlp") return make_mlp("", gen);
  for (const char* norm : {"layernorm", "groupnorm", "l1norm", "frobnorm"})
    if (name == std::string("mlp-") + norm) return make_mlp(norm, gen);
  if (name == "cnn-gn") return make_cnn("groupnorm", gen);
  if (name == "cnn-bn") return make_cnn("batchnorm", gen);
  std::string known;
  for (const std::string& n : classifier_names()) known += (known.empty() ? "" : ", ") + n;
  throw ValueError("make_classifier: unknown model '" + name + "' (known: " + known + ")");
}

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

Evaluation evaluate(nn::Module& model, const data::Dataset& dataset, Device device,
                    const std::vector<data::Transform>& transforms) {
  data::DataLoaderOptions options;
  options.batch_size = 1000;
  options.shuffle = false;
  options.device = device;
  options.transforms = transforms;
  // The loader lives within this call, the caller's dataset longer.
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](const data::Dataset*) {}), options);
  loader.begin_epoch(0);
  model.eval();
  autograd::InferenceModeGuard inference;
  Evaluation e;
  e.confusion.assign(10, std::vector<int64_t>(10, 0));
  int64_t correct = 0, seen = 0;
  const int64_t classes = static_cast<int64_t>(e.confusion.size());
  for (data::Batch batch; loader.next(batch);) {
    const Tensor logits = model(batch.inputs);
    NC_CHECK(logits.dim() == 2 && logits.size(1) == classes, ShapeError, "evaluate: the model gives ", describe(logits),
             " for ", batch.inputs.size(0), " images; expected ", classes, " scores per image");
    std::vector<int64_t> predicted = argmax(logits, 1).to_vector<int64_t>();
    std::vector<int64_t> truth = batch.targets.to_vector<int64_t>();
    for (size_t i = 0; i < truth.size(); ++i) {
      NC_CHECK(truth[i] >= 0 && truth[i] < classes, IndexError, "evaluate: label ", truth[i], " of sample ",
               seen + static_cast<int64_t>(i), " is outside 0 to ", classes - 1);
      ++e.confusion[truth[i]][predicted[i]];
      correct += truth[i] == predicted[i];
    }
    seen += static_cast<int64_t>(truth.size());
  }
  model.train();
  e.accuracy = seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0;
  return e;
}

void save_checkpoint(const std::string& path, const std::string& model_name, const nn::Module& model, int64_t epoch,
                     const nn::NamedTensors& optimizer_state, const nn::NamedTensors& schedule_state,
                     const std::map<std::string, std::string>& options) {
  train::TrainingState state;
  state.model = model_name;
  state.model_state = model.state_dict();
  state.optimizer_state = optimizer_state;
  state.schedule_state = schedule_state;
  state.epoch = epoch;
  state.batch = 0;
  state.options = options;
  train::save_training_state(path, state);
}

Checkpoint load_checkpoint(const std::string& path, Device device, Generator* gen) {
  train::TrainingState state;
  try {
    state = train::load_training_state(path);
  } catch (const IOError& e) {
    throw IOError(std::string("load_checkpoint: ") + e.what());
  }
  NC_CHECK(state.model != "gpt", IOError, "load_checkpoint: ", path, " holds a GPT, not a classifier");
  NC_CHECK(state.epoch >= 0, IOError, "load_checkpoint: ", path, " was saved within an epoch (step ", state.step,
           "), not at an epoch's end");
  Checkpoint c;
  c.model_name = state.model;
  c.epoch = state.epoch;
  c.model = make_classifier(c.model_name, gen);
  c.model->load_state_dict(state.model_state);
  c.model->to(device);
  c.optimizer_state = std::move(state.optimizer_state);
  c.schedule_state = std::move(state.schedule_state);
  c.metadata = std::move(state.metadata);
  return c;
}

// ---------------------------------------------------------------- images
namespace {

Tensor from_gray(const std::vector<float>& pixels, const std::string& path, int64_t width, int64_t height) {
  NC_CHECK(width == kSide && height == kSide, IOError, "read_image: ", path, " is ", width, "x", height, ", expected ",
           kSide, "x", kSide, " (Fashion-MNIST's size)");
  return from_vector(pixels, {1, kSide, kSide});
}

Tensor read_pgm(const std::string& path, std::ifstream& in) {
  const data::PnmImage image = data::read_pnm(in, path, "read_image", 4096);
  return from_gray(image.samples, path, image.width, image.height);
}

#ifdef NORMCORE_HAS_PNG
Tensor read_png(const std::string& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  NC_CHECK(png_image_begin_read_from_file(&image, path.c_str()), IOError, "read_image: ", path,
           ": not a readable PNG (", image.message, ")");
  image.format = PNG_FORMAT_GRAY;
  if (image.width != kSide || image.height != kSide) {
    png_image_free(&image);
    throw IOError(detail::cat_str("read_image: ", path, " is ", image.width, "x", image.height, ", expected ", kSide,
                                  "x", kSide, " (Fashion-MNIST's size)"));
  }
  std::vector<uint8_t> gray(PNG_IMAGE_SIZE(image));
  NC_CHECK(png_image_finish_read(&image, nullptr, gray.data(), 0, nullptr), IOError, "read_image: ", path,
           ": corrupted PNG (", image.message, ")");
  std::vector<float> pixels(gray.size());
  for (size_t i = 0; i < gray.size(); ++i) pixels[i] = static_cast<float>(gray[i]) / 255.0f;
  return from_gray(pixels, path, image.width, image.height);
}
#endif

}  // namespace

Tensor read_image(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  NC_CHECK(in.good(), IOError, "read_image: cannot open ", path);
  char head[8] = {0};
  in.read(head, 8);
  in.clear();
  in.seekg(0);
  if (head[0] == 'P' && (head[1] == '5' || head[1] == '2')) return read_pgm(path, in);
  if (static_cast<unsigned char>(head[0]) == 0x89 && head[1] == 'P' && head[2] == 'N' && head[3] == 'G') {
#ifdef NORMCORE_HAS_PNG
    return read_png(path);
#else
    throw IOError("read_image: " + path + " is a PNG, but normcore was built without libpng; use PGM");
#endif
  }
  throw IOError("read_image: " + path + " is neither a PGM (P5/P2) nor a PNG image");
}

// ---------------------------------------------------------------- Classifier
Classifier::Classifier(const std::string& checkpoint, Device device)
    : checkpoint_(load_checkpoint(checkpoint, device)), device_(device) {
  checkpoint_.model->eval();
}

Classifier::Prediction Classifier::predict(const Tensor& image) const {
  NC_CHECK(image.defined(), ValueError, "Classifier::predict: argument 'image' is an undefined tensor");
  NC_CHECK(image.numel() == kSide * kSide, ShapeError, "Classifier::predict: expects a 28x28 image, got ",
           describe(image));
  const Tensor probs = probabilities(image.reshape({1, kSide * kSide}));
  const int64_t label = argmax(probs, 1).item<int64_t>();
  return Prediction{label, fashion_mnist_classes()[label], probs.select(0, 0).select(0, label).item<double>()};
}

Tensor Classifier::probabilities(const Tensor& images) const {
  NC_CHECK(images.defined(), ValueError, "Classifier::probabilities: argument 'images' is an undefined tensor");
  NC_CHECK(is_floating(images.dtype()), DTypeError, "Classifier::probabilities: expects float images, got ",
           describe(images));
  const int64_t batch = images.dim() > 0 ? images.size(0) : 0;
  NC_CHECK(images.dim() >= 2 && images.numel() == batch * kSide * kSide, ShapeError,
           "Classifier::probabilities: expects images [B, 1, 28, 28], [B, 28, 28] or [B, 784], got ", describe(images));
  double mean = 0.2860, stddev = 0.3530;
  // The checkpoint's normalization; a value that is not a finite number (std: positive) is
  // an IOError naming it, since the file may come from anywhere.
  auto option = [&](const char* key, double& value) {
    auto it = checkpoint_.metadata.find(std::string("option.") + key);
    if (it == checkpoint_.metadata.end()) return;
    double parsed = 0;
    NC_CHECK(parse_whole(it->second, &parsed) && std::isfinite(parsed), IOError, "Classifier: the checkpoint's option.",
             key, " is '", it->second, "', not a finite number");
    value = parsed;
  };
  option("mean", mean);
  option("std", stddev);
  NC_CHECK(stddev > 0, IOError, "Classifier: the checkpoint's option.std is ", stddev, ", not positive");
  autograd::InferenceModeGuard inference;
  Tensor x = (images.to(device_, DType::F32).reshape({batch, 1, kSide, kSide}) - mean) / stddev;
  return softmax((*checkpoint_.model)(x), 1);
}

}  // namespace models
}  // namespace normcore
