// torchvision's ResNets (normcore/models.h: resnet, load_resnet): the same modules under the
// same names, so a torchvision state_dict saved as safetensors loads as it is. ResNet v1.5:
// a bottleneck block strides in its 3x3 convolution, as torchvision's does. fuse_resnet makes
// the inference form: each BatchNorm folded into its convolution, and the bias, the
// residual and the ReLU in the convolution's epilogue (conv2d_fused), in NCHW or NHWC.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "normcore/models.h"

#include "normcore/autograd.h"
#include "normcore/data.h"
#include "normcore/nn.h"
#include "normcore/ops.h"
#include "normcore/safetensors.h"

namespace normcore {
namespace models {

namespace {

std::shared_ptr<nn::Conv2d> conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, Generator* gen) {
  return std::make_shared<nn::Conv2d>(in, out, kernel, stride, kernel / 2, 1, 1, /*bias=*/false, gen);
}

// BasicBlock (two 3x3 convolutions) or, with bottleneck, Bottleneck (1x1, 3x3, 1x1 with 4x
// the width out); downsample (a strided 1x1 convolution and its BatchNorm) where the
// identity's shape changes.
class Block : public nn::Module {
 public:
  Block(int64_t in, int64_t planes, int64_t stride, bool bottleneck, Generator* gen) {
    const int64_t out = bottleneck ? 4 * planes : planes;
    if (bottleneck) {
      conv1 = register_module("conv1", conv(in, planes, 1, 1, gen));
      bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
      conv2 = register_module("conv2", conv(planes, planes, 3, stride, gen));
      bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
      conv3 = register_module("conv3", conv(planes, out, 1, 1, gen));
      bn3 = register_module("bn3", std::make_shared<nn::BatchNorm2d>(out));
    } else {
      conv1 = register_module("conv1", conv(in, planes, 3, stride, gen));
      bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
      conv2 = register_module("conv2", conv(planes, planes, 3, 1, gen));
      bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
    }
    if (stride != 1 || in != out) {
      downsample =
          register_module("downsample", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                                            conv(in, out, 1, stride, gen), std::make_shared<nn::BatchNorm2d>(out)}));
    }
  }

  Tensor forward(const Tensor& x) override {
    Tensor y = relu((*bn1)((*conv1)(x)));
    y = (*bn2)((*conv2)(y));
    if (conv3) y = (*bn3)((*conv3)(relu(y)));
    return relu(add(y, downsample ? (*downsample)(x) : x));
  }

  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<nn::Sequential> downsample;
};

class ResNet : public nn::Module {
 public:
  ResNet(const std::vector<int64_t>& depths, bool bottleneck, int64_t num_classes, Generator* gen) {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(3, 64, 7, 2, 3, 1, 1, /*bias=*/false, gen));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(64));
    maxpool = register_module("maxpool", std::make_shared<nn::MaxPool2d>(3, 2, 1));
    int64_t in = 64;
    for (size_t i = 0; i < depths.size(); ++i) {
      const int64_t planes = int64_t{64} << i;
      auto layer = std::make_shared<nn::Sequential>();
      for (int64_t b = 0; b < depths[i]; ++b) {
        layer->push_back(std::make_shared<Block>(in, planes, b == 0 && i > 0 ? 2 : 1, bottleneck, gen));
        in = bottleneck ? 4 * planes : planes;
      }
      layers.push_back(register_module("layer" + std::to_string(i + 1), layer));
    }
    avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    fc = register_module("fc", std::make_shared<nn::Linear>(in, num_classes, true, gen));
  }

  Tensor forward(const Tensor& x) override {
    NC_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 3, ShapeError, "ResNet: input must be [N, 3, H, W], got ",
             x.defined() ? describe(x) : std::string("undefined"));
    Tensor y = (*maxpool)(relu((*bn1)((*conv1)(x))));
    for (const auto& layer : layers) y = (*layer)(y);
    y = (*avgpool)(y);
    return (*fc)(y.reshape({y.size(0), y.size(1)}));
  }

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::MaxPool2d> maxpool;
  std::vector<std::shared_ptr<nn::Sequential>> layers;
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Linear> fc;
};

// ---- the inference form: every BatchNorm folded into its convolution ----

// One folded convolution: its weights (as buffers, so that to() moves them) and geometry.
struct FoldedConv {
  Tensor weight, bias;
  Size2 stride, padding;
};

FoldedConv fold(nn::Module& owner, const std::string& name, const nn::Conv2d& conv, const nn::BatchNorm& bn,
                ConvLayout layout) {
  nn::ConvWeights w = nn::fold_batch_norm(conv, bn, layout);
  return {owner.register_buffer(name + "_weight", w.weight), owner.register_buffer(name + "_bias", w.bias), conv.stride,
          conv.padding};
}

Tensor run(const FoldedConv& c, const Tensor& x, const Tensor& residual, bool relu, ConvLayout layout) {
  return conv2d_fused(x, c.weight, c.bias, residual, relu, c.stride, c.padding, 1, 1, layout);
}

class FusedBlock : public nn::Module {
 public:
  FusedBlock(const Block& b, ConvLayout layout) : layout_(layout) {
    conv1_ = fold(*this, "conv1", *b.conv1, *b.bn1, layout);
    conv2_ = fold(*this, "conv2", *b.conv2, *b.bn2, layout);
    if (b.conv3) conv3_ = fold(*this, "conv3", *b.conv3, *b.bn3, layout);
    if (b.downsample) {
      const auto& d = b.downsample->children();
      downsample_ = fold(*this, "downsample", dynamic_cast<const nn::Conv2d&>(*d.at(0)),
                         dynamic_cast<const nn::BatchNorm&>(*d.at(1)), layout);
      has_downsample_ = true;
    }
    bottleneck_ = static_cast<bool>(b.conv3);
  }

  Tensor forward(const Tensor& x) override {
    const Tensor identity = has_downsample_ ? run(downsample_, x, Tensor(), false, layout_) : x;
    Tensor y = run(conv1_, x, Tensor(), true, layout_);
    if (!bottleneck_) return run(conv2_, y, identity, true, layout_);
    y = run(conv2_, y, Tensor(), true, layout_);
    return run(conv3_, y, identity, true, layout_);
  }

 private:
  ConvLayout layout_;
  FoldedConv conv1_, conv2_, conv3_, downsample_;
  bool bottleneck_ = false, has_downsample_ = false;
};

class FusedResNet : public nn::Module {
 public:
  FusedResNet(const ResNet& r, ConvLayout layout) : layout_(layout) {
    stem_ = fold(*this, "conv1", *r.conv1, *r.bn1, ConvLayout::NCHW);
    maxpool_ = r.maxpool;
    auto blocks = std::make_shared<nn::Sequential>();
    for (const auto& layer : r.layers)
      for (const auto& block : layer->children())
        blocks->push_back(std::make_shared<FusedBlock>(dynamic_cast<const Block&>(*block), layout));
    blocks_ = register_module("blocks", blocks);
    fc_weight_ = register_buffer("fc_weight", r.fc->weight.detach());
    fc_bias_ = register_buffer("fc_bias", r.fc->bias.detach());
    train(false);
  }

  Tensor forward(const Tensor& x) override {
    NC_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 3, ShapeError, "ResNet: input must be [N, 3, H, W], got ",
             x.defined() ? describe(x) : std::string("undefined"));
    autograd::NoGradGuard no_grad;
    // The stem's 3 input channels stay NCHW; the blocks run in layout.
    Tensor y = (*maxpool_)(run(stem_, x, Tensor(), true, ConvLayout::NCHW));
    const bool nhwc = layout_ == ConvLayout::NHWC;
    if (nhwc) y = y.permute({0, 2, 3, 1}).contiguous();
    y = (*blocks_)(y);
    return linear(mean(y, nhwc ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 3}), fc_weight_, fc_bias_);
  }

 private:
  ConvLayout layout_;
  FoldedConv stem_;
  std::shared_ptr<nn::MaxPool2d> maxpool_;
  std::shared_ptr<nn::Sequential> blocks_;
  Tensor fc_weight_, fc_bias_;
};

}  // namespace

std::shared_ptr<nn::Module> resnet(const std::string& name, int64_t num_classes, Generator* gen) {
  NC_CHECK(num_classes >= 1, ValueError, "resnet: num_classes must be positive, got ", num_classes);
  if (name == "resnet18") return std::make_shared<ResNet>(std::vector<int64_t>{2, 2, 2, 2}, false, num_classes, gen);
  if (name == "resnet34") return std::make_shared<ResNet>(std::vector<int64_t>{3, 4, 6, 3}, false, num_classes, gen);
  if (name == "resnet50") return std::make_shared<ResNet>(std::vector<int64_t>{3, 4, 6, 3}, true, num_classes, gen);
  if (name == "resnet101") return std::make_shared<ResNet>(std::vector<int64_t>{3, 4, 23, 3}, true, num_classes, gen);
  throw ValueError("resnet: unknown model '" + name + "' (resnet18, resnet34, resnet50 or resnet101)");
}

std::shared_ptr<nn::Module> fuse_resnet(const nn::Module& model, ConvLayout layout) {
  const auto* r = dynamic_cast<const ResNet*>(&model);
  NC_CHECK(r != nullptr, ValueError, "fuse_resnet: the model is not one of models::resnet's");
  NC_CHECK(!model.is_training(), ValueError,
           "fuse_resnet: the model is in training mode; its BatchNorms fold with their running statistics, which "
           "evaluation mode uses (call eval() first)");
  return std::make_shared<FusedResNet>(*r, layout);
}

std::shared_ptr<nn::Module> load_resnet(const std::string& name, const std::string& path, Device device) {
  const safetensors::File file = safetensors::load(path);
  NC_CHECK(file.contains("fc.weight") && file.at("fc.weight").dim() == 2, IOError, "load_resnet: ", path,
           " has no 2-D \"fc.weight\" (a torchvision ResNet's state_dict is needed)");
  const int64_t classes = file.at("fc.weight").size(0);
  std::shared_ptr<nn::Module> model = resnet(name, classes);
  try {  // the names and shapes of the file against the model's, naming the file
    model->load_state_dict(file.tensors);
  } catch (const ShapeError& e) {
    throw ShapeError("load_resnet: " + path + " is not a " + name + ": " + e.what());
  } catch (const ValueError& e) {
    throw ValueError("load_resnet: " + path + " is not a " + name + ": " + e.what());
  }
  model->to(device);
  model->eval();
  return model;
}

ImageClassifier::ImageClassifier(const std::string& name, const std::string& weights, Device device,
                                 const std::string& labels, int64_t resize, int64_t crop)
    : device_(device), resize_(resize), crop_(crop) {
  NC_CHECK(crop >= 1 && resize >= crop, ValueError, "ImageClassifier: expects 1 <= crop <= resize, got crop ", crop,
           " and resize ", resize);
  const std::shared_ptr<nn::Module> model = load_resnet(name, weights, device);
  int64_t classes = 0;
  for (const auto& [key, tensor] : model->named_parameters())
    if (key == "fc.weight") classes = tensor.size(0);
  model_ = fuse_resnet(*model, device.is_cpu() ? ConvLayout::NCHW : ConvLayout::NHWC);
  if (labels.empty()) {
    for (int64_t i = 0; i < classes; ++i) names_.push_back(std::to_string(i));
    return;
  }
  std::ifstream in(labels);
  NC_CHECK(in.good(), IOError, "ImageClassifier: cannot open the labels file ", labels);
  for (std::string line; std::getline(in, line) && static_cast<int64_t>(names_.size()) <= classes;) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    names_.push_back(line);
  }
  NC_CHECK(static_cast<int64_t>(names_.size()) == classes, IOError, "ImageClassifier: ", labels, " has ",
           static_cast<int64_t>(names_.size()) > classes ? "more than " + std::to_string(classes)
                                                         : std::to_string(names_.size()),
           " lines, the model ", classes, " classes (one name a line)");
}

Tensor ImageClassifier::probabilities(const Tensor& images) const {
  NC_CHECK(images.defined() && images.dim() == 4 && images.size(1) == 3 && images.size(2) == crop_ &&
               images.size(3) == crop_,
           ShapeError, "ImageClassifier::probabilities: expects preprocessed images [B, 3, ", crop_, ", ", crop_,
           "], got ", images.defined() ? describe(images) : "undefined");
  NC_CHECK(is_floating(images.dtype()), DTypeError, "ImageClassifier::probabilities: expects float images, got ",
           describe(images));
  autograd::InferenceModeGuard inference;
  return softmax((*model_)(images.to(device_, DType::F32)), 1);
}

std::vector<ImageClassifier::Prediction> ImageClassifier::predict(const Tensor& image, int64_t k) const {
  NC_CHECK(k >= 1, ValueError, "ImageClassifier::predict: k must be positive, got ", k);
  const Tensor batch = data::imagenet_preprocess(image, resize_, crop_).unsqueeze(0);
  const std::vector<float> p = probabilities(batch).select(0, 0).to(Device::cpu()).to_vector<float>();
  std::vector<int64_t> order(p.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  const auto n = std::min<int64_t>(k, static_cast<int64_t>(order.size()));
  std::partial_sort(order.begin(), order.begin() + n, order.end(),
                    [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  std::vector<Prediction> out;
  for (int64_t i = 0; i < n; ++i) out.push_back({order[i], names_[order[i]], p[order[i]]});
  return out;
}

}  // namespace models
}  // namespace normcore
