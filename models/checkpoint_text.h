// What the checkpoint readers of models/ share: splitting a file's tensors by prefix and
// reading numbers from its metadata, which anyone may have written. Internal to models/
// (not installed).
#pragma once

#include <exception>
#include <string>
#include <type_traits>

#include "normcore/nn.h"
#include "normcore/safetensors.h"

namespace normcore {
namespace models {

// The "prefix.rest" entries of a list, as "rest".
inline nn::NamedTensors take_prefixed(const safetensors::TensorList& all, const std::string& prefix) {
  nn::NamedTensors out;
  for (const auto& [name, t] : all)
    if (name.compare(0, prefix.size(), prefix) == 0) out.emplace_back(name.substr(prefix.size()), t);
  return out;
}

// text as a whole number (std::stoll) or double (std::stod): false when it is empty, out of
// range or followed by anything else.
template <class T>
bool parse_whole(const std::string& text, T* value) {
  size_t used = 0;
  try {
    if constexpr (std::is_same_v<T, double>) *value = std::stod(text, &used);
    else *value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used > 0 && used == text.size();
}

}  // namespace models
}  // namespace normcore
