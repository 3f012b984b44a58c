// Reading and writing safetensors files: an 8-byte little-endian header length, a JSON
// header naming each tensor's dtype, shape and byte range, then the raw little-endian data.
// Reads validate the whole header against the actual size before allocating anything and
// throw IOError naming the file (or "<memory>") and the reason; saves replace the target
// atomically. Loaded tensors own their memory; saving never modifies its inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "normcore/device.h"
#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace safetensors {

// Tensors in the order they are named in the save call, or in the order of their data
// in a loaded file. Saved and loaded dtypes: F32, F64, F16, BF16, I32, I64, U8, BOOL.
using TensorList = std::vector<std::pair<std::string, Tensor>>;

struct File {
  TensorList tensors;
  // The file's "__metadata__" (string keys and values); empty when it has none.
  std::map<std::string, std::string> metadata;
  // Where it came from: the path given to load(), or "<memory>".
  std::string source;

  bool contains(const std::string& name) const;
  // The tensor called name; throws IOError naming the source and name when absent.
  const Tensor& at(const std::string& name) const;
};

// Reads path and creates its tensors on device (contiguous, in the file's dtypes). The file
// is read once: to the CPU each tensor's bytes go straight into its memory (peak memory
// about the file's size); to a GPU through a 16 MiB host buffer, so host memory never holds
// a whole tensor.
File load(const std::string& path, Device device = Device::cpu());
// The same for a file already in memory; data is only read during the call.
File load_bytes(const uint8_t* data, size_t size, Device device = Device::cpu());

// Writes tensors (any device, any strides) and metadata to path. The data goes to a
// temporary file in the same directory, which is flushed to disk and then renamed over
// path, so path holds either its old content or the complete new file. A save that
// succeeds also removes the temporary files of path that saves killed earlier left behind
// (their process gone, not written for 10 minutes). Throws ValueError
// for an undefined tensor, a duplicate name or the reserved name "__metadata__", and
// IOError when the file cannot be written.
void save(const std::string& path, const TensorList& tensors, const std::map<std::string, std::string>& metadata = {});
// The bytes save() would write.
std::vector<uint8_t> save_bytes(const TensorList& tensors, const std::map<std::string, std::string>& metadata = {});

}  // namespace safetensors
}  // namespace normcore

#pragma GCC visibility pop
