// Fuzz target: read_idx (plain or gzip IDX) on arbitrary bytes written to a private file.
// It must return a tensor that can be read in full, or throw a normcore::Error.
#include <cstddef>
#include <cstdint>

#include "normcore/data.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = normcore_fuzz::write_private_file("idx", data, size);
  normcore_fuzz::expect_only_normcore_errors([&] { normcore_fuzz::touch(normcore::data::read_idx(path)); });
  return 0;
}
