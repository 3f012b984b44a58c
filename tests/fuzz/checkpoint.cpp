// Fuzz target: models::load_checkpoint and a Classifier's first prediction on arbitrary
// bytes written to a private file. Each must succeed or throw a normcore::Error.
#include <cstddef>
#include <cstdint>

#include "normcore/models.h"
#include "normcore/normcore.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = normcore_fuzz::write_private_file("checkpoint", data, size);
  normcore_fuzz::expect_only_normcore_errors([&] {
    const normcore::models::Classifier classifier(path);
    classifier.predict(normcore::zeros({1, 28, 28}));
  });
  return 0;
}
