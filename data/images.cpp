// Color images for the ImageNet-style classifiers (normcore/data.h): PPM, PGM and PNG files
// of any size as f32 [3, H, W] in [0, 1], bilinear resizing, and torchvision's evaluation
// preprocessing (resize the shorter side, center crop, normalize). A file's header is
// checked against the bytes the file holds before any pixel buffer is allocated.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#ifdef NORMCORE_HAS_PNG
#include <png.h>
#endif

#include "normcore/data.h"

#include "data/pnm.h"
#include "normcore/error.h"
#include "normcore/ops.h"

namespace normcore {
namespace data {
namespace {

constexpr int64_t kMaxSide = 16384;  // the largest width or height read_color_image accepts

// Gray or RGB PNM as [3, H, W] planes; gray is repeated into the three channels.
Tensor read_pnm_planes(const std::string& path, std::ifstream& in) {
  const PnmImage image = read_pnm(in, path, "read_color_image", kMaxSide);
  const int64_t plane = image.width * image.height;
  std::vector<float> planes(static_cast<size_t>(3 * plane));
  for (int64_t p = 0; p < plane; ++p)
    for (int64_t c = 0; c < 3; ++c)
      planes[static_cast<size_t>(c * plane + p)] =
          image.samples[static_cast<size_t>(p * image.channels + (image.channels == 3 ? c : 0))];
  return from_vector(planes, {3, image.height, image.width});
}

#ifdef NORMCORE_HAS_PNG
Tensor read_png(const std::string& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  NC_CHECK(png_image_begin_read_from_file(&image, path.c_str()), IOError, "read_color_image: ", path,
           ": not a readable PNG (", image.message, ")");
  image.format = PNG_FORMAT_RGB;
  const int64_t width = image.width, height = image.height;
  if (width > kMaxSide || height > kMaxSide) {
    png_image_free(&image);
    throw IOError(detail::cat_str("read_color_image: ", path, ": size ", width, "x", height, " out of range (1 to ",
                                  kMaxSide, " a side)"));
  }
  std::vector<uint8_t> rgb(PNG_IMAGE_SIZE(image));
  NC_CHECK(png_image_finish_read(&image, nullptr, rgb.data(), 0, nullptr), IOError, "read_color_image: ", path,
           ": corrupted PNG (", image.message, ")");
  std::vector<float> planes(rgb.size());
  const int64_t plane = width * height;
  for (int64_t p = 0; p < plane; ++p)
    for (int64_t c = 0; c < 3; ++c)
      planes[static_cast<size_t>(c * plane + p)] = static_cast<float>(rgb[static_cast<size_t>(3 * p + c)]) / 255.0f;
  return from_vector(planes, {3, height, width});
}
#endif

}  // namespace

Tensor read_color_image(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  NC_CHECK(in.good(), IOError, "read_color_image: cannot open ", path);
  char head[8] = {0};
  in.read(head, 8);
  in.clear();
  in.seekg(0);
  if (head[0] == 'P' && (head[1] == '2' || head[1] == '3' || head[1] == '5' || head[1] == '6'))
    return read_pnm_planes(path, in);
  if (static_cast<unsigned char>(head[0]) == 0x89 && head[1] == 'P' && head[2] == 'N' && head[3] == 'G') {
#ifdef NORMCORE_HAS_PNG
    return read_png(path);
#else
    throw IOError("read_color_image: " + path + " is a PNG, but normcore was built without libpng; use PPM");
#endif
  }
  throw IOError("read_color_image: " + path + " is neither a PPM or PGM (P6/P3/P5/P2) nor a PNG image");
}

Tensor resize_bilinear(const Tensor& image, int64_t height, int64_t width) {
  const char* op = "resize_bilinear";
  NC_CHECK(image.defined() && image.dim() == 3 && image.size(1) > 0 && image.size(2) > 0, ShapeError, op,
           ": expects an image [C, H, W] with H, W >= 1, got ", image.defined() ? describe(image) : "undefined");
  NC_CHECK(height >= 1 && width >= 1 && height <= kMaxSide && width <= kMaxSide, ValueError, op,
           ": the size must be 1 to ", kMaxSide, " a side, got ", height, "x", width);
  const int64_t channels = image.size(0), in_h = image.size(1), in_w = image.size(2);
  const std::vector<float> src = image.to(Device::cpu(), DType::F32).contiguous().to_vector<float>();
  std::vector<float> dst(static_cast<size_t>(channels * height * width));
  // Half-pixel centers (align_corners = False): output pixel i samples input (i + 0.5) * in / out - 0.5,
  // clamped at 0, between its two neighbours.
  auto taps = [](int64_t out, int64_t in, std::vector<int64_t>& lo, std::vector<int64_t>& hi, std::vector<float>& w) {
    const double scale = static_cast<double>(in) / static_cast<double>(out);
    for (int64_t i = 0; i < out; ++i) {
      const double x = std::max(0.0, (static_cast<double>(i) + 0.5) * scale - 0.5);
      const auto x0 = std::min(static_cast<int64_t>(x), in - 1);
      lo[i] = x0;
      hi[i] = std::min(x0 + 1, in - 1);
      w[i] = static_cast<float>(x - static_cast<double>(x0));
    }
  };
  std::vector<int64_t> y0(height), y1(height), x0(width), x1(width);
  std::vector<float> wy(height), wx(width);
  taps(height, in_h, y0, y1, wy);
  taps(width, in_w, x0, x1, wx);
  for (int64_t c = 0; c < channels; ++c) {
    const float* s = src.data() + c * in_h * in_w;
    float* d = dst.data() + c * height * width;
    for (int64_t i = 0; i < height; ++i)
      for (int64_t j = 0; j < width; ++j) {
        const float top = s[y0[i] * in_w + x0[j]] * (1 - wx[j]) + s[y0[i] * in_w + x1[j]] * wx[j];
        const float bottom = s[y1[i] * in_w + x0[j]] * (1 - wx[j]) + s[y1[i] * in_w + x1[j]] * wx[j];
        d[i * width + j] = top * (1 - wy[i]) + bottom * wy[i];
      }
  }
  return from_vector(dst, {channels, height, width});
}

Tensor imagenet_preprocess(const Tensor& image, int64_t resize, int64_t crop) {
  const char* op = "imagenet_preprocess";
  NC_CHECK(image.defined() && image.dim() == 3 && image.size(0) == 3, ShapeError, op,
           ": expects an RGB image [3, H, W] in [0, 1], got ", image.defined() ? describe(image) : "undefined");
  NC_CHECK(crop >= 1 && resize >= crop, ValueError, op, ": expects 1 <= crop <= resize, got crop ", crop,
           " and resize ", resize);
  // The shorter side to `resize`, the other in proportion (torchvision's Resize(int)).
  const int64_t h = image.size(1), w = image.size(2);
  const int64_t new_h = h <= w ? resize : static_cast<int64_t>(static_cast<double>(resize) * h / w);
  const int64_t new_w = h <= w ? static_cast<int64_t>(static_cast<double>(resize) * w / h) : resize;
  const Tensor resized = resize_bilinear(image, new_h, new_w);
  // The center crop (torchvision's CenterCrop: the offset rounded).
  const auto top = static_cast<int64_t>(std::round((new_h - crop) / 2.0));
  const auto left = static_cast<int64_t>(std::round((new_w - crop) / 2.0));
  const Tensor cropped = resized.narrow(1, top, crop).narrow(2, left, crop);
  const Tensor mean = from_vector<float>({0.485f, 0.456f, 0.406f}, {3, 1, 1});
  const Tensor stddev = from_vector<float>({0.229f, 0.224f, 0.225f}, {3, 1, 1});
  return div(sub(cropped, mean), stddev).contiguous();
}

}  // namespace data
}  // namespace normcore
