// Fuzz target: onnx::read_tensor_file (an ONNX TensorProto, as backend tests' input_N.pb) on
// arbitrary bytes written to a private file. It must return a tensor that can be read in full,
// or throw a normcore::Error.
#include <cstddef>
#include <cstdint>

#include "normcore/onnx.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = normcore_fuzz::write_private_file("onnx_tensor", data, size);
  normcore_fuzz::expect_only_normcore_errors([&] { normcore_fuzz::touch(normcore::onnx::read_tensor_file(path)); });
  return 0;
}
