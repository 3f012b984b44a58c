// Fuzz target: safetensors::load_bytes on arbitrary bytes. It must return a File whose
// tensors can be read in full, or throw a normcore::Error; anything else (a crash, a
// sanitizer report, another exception, a huge allocation) is a finding.
#include <cstddef>
#include <cstdint>

#include "normcore/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  normcore_fuzz::expect_only_normcore_errors([&] {
    const normcore::safetensors::File file = normcore::safetensors::load_bytes(data, size);
    for (const auto& [name, tensor] : file.tensors) normcore_fuzz::touch(tensor);
  });
  return 0;
}
