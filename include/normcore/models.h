// Ready-made image classifiers for 28x28 grayscale images (Fashion-MNIST), their
// checkpoints, and image files. A checkpoint is normcore/train.h's format (the model name
// as "model", the model's tensors, optionally the optimizer and schedule state, the epochs
// done and the training options), from which the model is rebuilt; files of the older
// "normcore-classifier" format load as well.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "normcore/data.h"
#include "normcore/nn.h"
#include "normcore/random.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace models {

// The model names make_classifier accepts ("mlp", ...).
std::vector<std::string> classifier_names();

// A classifier from [B, 1, 28, 28] (or [B, 784]) images to [B, 10] logits:
//   "mlp": Flatten, Linear(784, 512), ReLU, Dropout(0.2), Linear(512, 256), ReLU,
//          Dropout(0.2), Linear(256, 10).
//   "mlp-layernorm", "mlp-groupnorm" (16 groups), "mlp-l1norm", "mlp-frobnorm": the same
//          with LayerNorm, GroupNorm, L1Norm or FrobeniusNorm after each hidden Linear.
//   "cnn-gn": [Conv2d(3x3, padding 1, no bias), GroupNorm(8), ReLU] x 2, MaxPool2d(2),
//          the same with 64 channels, MaxPool2d(2), Flatten, Dropout(0.3),
//          Linear(3136, 256), ReLU, Dropout(0.3), Linear(256, 10) (32 then 64 channels).
//   "cnn-bn": the same with BatchNorm2d in place of GroupNorm.
// The CNNs need [B, 1, 28, 28] images.
// Throws ValueError naming the known models for an unknown name.
std::shared_ptr<nn::Module> make_classifier(const std::string& name, Generator* gen = nullptr);

// torchvision's ResNets: "resnet18", "resnet34" (basic blocks), "resnet50", "resnet101"
// (bottleneck blocks, v1.5: the stride in the 3x3 convolution), [N, 3, H, W] images to
// [N, num_classes] logits, with torchvision's module layout and state_dict names
// (conv1.weight, bn1.running_mean, layer1.0.conv1.weight, layer2.0.downsample.0.weight,
// fc.weight, ...), so a torchvision state_dict saved as safetensors loads with
// load_state_dict. The initialization is that of normcore's layers, not torchvision's.
// ValueError naming the known models for an unknown name.
std::shared_ptr<nn::Module> resnet(const std::string& name, int64_t num_classes = 1000, Generator* gen = nullptr);
// The inference form of a ResNet from resnet() in evaluation mode: each BatchNorm folded into
// the convolution before it (nn::fold_batch_norm) and each block's additions and ReLUs in its
// convolutions' epilogues (conv2d_fused), the blocks' activations in layout (NHWC is the
// faster on CUDA tensor cores; the input and the output are as resnet()'s). A copy of the
// weights, on the model's device and dtype; forward only (no gradients). ValueError for
// another model or one in training mode.
std::shared_ptr<nn::Module> fuse_resnet(const nn::Module& model, ConvLayout layout = ConvLayout::NHWC);
// The ResNet name from a safetensors file of its state_dict (the classes from fc.weight), on
// device in eval mode. IOError for an unreadable file or one without fc.weight; ValueError or
// ShapeError naming the file and every missing, unexpected or mis-shaped tensor.
std::shared_ptr<nn::Module> load_resnet(const std::string& name, const std::string& path,
                                        Device device = Device::cpu());

// A torchvision ResNet (load_resnet) classifying color images: each image [3, H, W] in
// [0, 1] (data::read_color_image) through data::imagenet_preprocess(resize, crop), the
// logits' softmax over the classes, named by a labels file (one name a line, as many lines
// as the model has classes) or by their indices.
class ImageClassifier {
 public:
  ImageClassifier(const std::string& name, const std::string& weights, Device device = Device::cpu(),
                  const std::string& labels = "", int64_t resize = 256, int64_t crop = 224);
  struct Prediction {
    int64_t label;
    std::string name;
    double probability;
  };
  // The k most likely classes of an image, most likely first.
  std::vector<Prediction> predict(const Tensor& image, int64_t k = 5) const;
  // The class probabilities [B, classes] of preprocessed images [B, 3, crop, crop].
  Tensor probabilities(const Tensor& images) const;
  int64_t classes() const { return static_cast<int64_t>(names_.size()); }
  const std::string& class_name(int64_t label) const { return names_.at(static_cast<size_t>(label)); }

 private:
  std::shared_ptr<nn::Module> model_;
  Device device_;
  std::vector<std::string> names_;
  int64_t resize_, crop_;
};

struct Evaluation {
  double accuracy = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true label][predicted label], 10 x 10
};

// Test accuracy and confusion matrix of a classifier over a labelled dataset (each sample
// through transforms: Fashion-MNIST's normalization by default), in batches of 1000 on
// device, in eval mode with recording off. The model is left in training mode.
Evaluation evaluate(nn::Module& model, const data::Dataset& dataset, Device device,
                    const std::vector<data::Transform>& transforms = {data::transforms::normalize()});

// Fashion-MNIST's class names, by label.
const std::vector<std::string>& fashion_mnist_classes();

struct Checkpoint {
  std::string model_name;
  std::shared_ptr<nn::Module> model;  // rebuilt and loaded, on the requested device
  int64_t epoch = 0;                  // epochs completed
  nn::NamedTensors optimizer_state;   // "optim." prefix removed; empty if none was saved
  nn::NamedTensors schedule_state;    // "schedule." prefix removed
  std::map<std::string, std::string> metadata;
};

// Writes the checkpoint atomically (a temporary file renamed over path).
void save_checkpoint(const std::string& path, const std::string& model_name, const nn::Module& model, int64_t epoch,
                     const nn::NamedTensors& optimizer_state, const nn::NamedTensors& schedule_state,
                     const std::map<std::string, std::string>& options);
// Reads a checkpoint and rebuilds its model on device (its dropout layers drawing from
// gen, or the default generator). Throws IOError for a file that is not a normcore
// checkpoint, naming what is missing.
Checkpoint load_checkpoint(const std::string& path, Device device = Device::cpu(), Generator* gen = nullptr);

// Reads a 28x28 grayscale image, binary or plain PGM (P5/P2) or, where normcore was built
// with libpng, PNG (gray, or color converted to gray), as f32 [1, 28, 28] in [0, 1].
// Throws IOError naming the file and the problem (other sizes included).
Tensor read_image(const std::string& path);

// Loads a classifier checkpoint once and labels images with it.
class Classifier {
 public:
  explicit Classifier(const std::string& checkpoint, Device device = Device::cpu());
  struct Prediction {
    int64_t label;
    std::string name;
    double probability;
  };
  // image: f32 [1, 28, 28] or [28, 28] in [0, 1] (as read_image gives).
  Prediction predict(const Tensor& image) const;
  // The class probabilities [B, 10] (on the classifier's device) of a batch of images
  // [B, 1, 28, 28], [B, 28, 28] or [B, 784] in [0, 1], any float dtype and device.
  Tensor probabilities(const Tensor& images) const;
  const std::string& model_name() const { return checkpoint_.model_name; }

 private:
  Checkpoint checkpoint_;
  Device device_;
};

}  // namespace models
}  // namespace normcore

#pragma GCC visibility pop
