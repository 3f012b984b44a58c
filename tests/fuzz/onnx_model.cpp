// Fuzz target: onnx::Model::parse on arbitrary bytes. It must give a model whose graph was
// checked whole (its inputs and outputs listed with valid dtypes and dims), or throw a
// normcore::Error; never crash or allocate what the bytes merely claim (an initializer's
// dims are checked against its data before anything is allocated).
#include <cstddef>
#include <cstdint>
#include <string>

#include "normcore/onnx.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  normcore_fuzz::expect_only_normcore_errors([&] {
    const normcore::onnx::Model model =
        normcore::onnx::Model::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz.onnx");
    for (const auto* list : {&model.inputs(), &model.outputs()})
      for (const auto& v : *list)
        for (int64_t d : v.dims) normcore_fuzz::require(d >= -1, "a value's dims are sizes or -1 (open)");
    normcore_fuzz::require(model.opset() >= 1 && model.opset() <= 17, "the opset is one normcore runs");
  });
  return 0;
}
