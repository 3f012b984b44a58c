// Fuzz target: read_color_image (PPM, PGM, PNG) on arbitrary bytes written to a private
// file. It must return an image [3, H, W] with values in [0, 1] that can be read in full, or
// throw a normcore::Error.
#include <cstddef>
#include <cstdint>

#include "normcore/data.h"
#include "normcore/ops.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = normcore_fuzz::write_private_file("image", data, size);
  normcore_fuzz::expect_only_normcore_errors([&] {
    const normcore::Tensor image = normcore::data::read_color_image(path);
    normcore_fuzz::require(image.dim() == 3 && image.size(0) == 3, "an image is [3, H, W]");
    normcore_fuzz::require(image.numel() == 0 ||
                               (normcore::min(image).item<double>() >= 0 && normcore::max(image).item<double>() <= 1),
                           "pixel values lie in [0, 1]");
  });
  return 0;
}
