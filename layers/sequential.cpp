// Sequential: an ordered list of children named by position, applied one after another.
#include <string>

#include "normcore/nn.h"

namespace normcore {
namespace nn {

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  NC_CHECK(module != nullptr, ValueError, "Sequential::push_back: module ", layers_.size(), " is null");
  layers_.push_back(register_module(std::to_string(layers_.size()), std::move(module)));
}

std::shared_ptr<Module> Sequential::operator[](size_t i) const {
  NC_CHECK(i < layers_.size(), IndexError, "Sequential: index ", i, " is out of range for ", layers_.size(),
           " modules");
  return layers_[i];
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& layer : layers_) y = (*layer)(y);
  return y;
}

}  // namespace nn
}  // namespace normcore
