// The PNM reader of data/pnm.h.
#include "data/pnm.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "normcore/error.h"

namespace normcore {
namespace data {
namespace {

// The next header token, skipping white space and '#' comments.
std::string pnm_token(std::istream& in) {
  std::string token;
  int c;
  while ((c = in.get()) != EOF) {
    if (c == '#') {
      while ((c = in.get()) != EOF && c != '\n') {
      }
      continue;
    }
    if (std::isspace(c)) {
      if (!token.empty()) break;
      continue;
    }
    token.push_back(static_cast<char>(c));
  }
  return token;
}

int64_t pnm_number(std::istream& in, const std::string& path, const char* fn, const char* what) {
  const std::string token = pnm_token(in);
  NC_CHECK(!token.empty() && token.size() < 10 && token.find_first_not_of("0123456789") == std::string::npos, IOError,
           fn, ": ", path, ": bad PNM ", what, " '", token, "'");
  return std::stoll(token);
}

}  // namespace

PnmImage read_pnm(std::istream& in, const std::string& path, const char* fn, int64_t max_side) {
  const std::string magic = pnm_token(in);
  NC_CHECK(magic == "P2" || magic == "P3" || magic == "P5" || magic == "P6", IOError, fn, ": ", path,
           ": not a PNM image (magic '", magic, "')");
  const bool plain = magic == "P2" || magic == "P3";
  PnmImage image;
  image.channels = magic == "P3" || magic == "P6" ? 3 : 1;
  image.width = pnm_number(in, path, fn, "width");
  image.height = pnm_number(in, path, fn, "height");
  const int64_t maxval = pnm_number(in, path, fn, "maximum value");
  NC_CHECK(maxval > 0 && maxval < 65536, IOError, fn, ": ", path, ": maximum value ", maxval,
           " out of range (1 to 65535)");
  NC_CHECK(image.width > 0 && image.height > 0 && image.width <= max_side && image.height <= max_side, IOError, fn,
           ": ", path, ": size ", image.width, "x", image.height, " out of range (1 to ", max_side, " a side)");
  const int64_t samples = image.width * image.height * image.channels;
  if (!plain) {
    // The header's claim against the file: the pixel bytes must be there before any buffer is.
    const auto header_end = static_cast<int64_t>(in.tellg());
    const auto file_size = static_cast<int64_t>(std::filesystem::file_size(path));
    const int64_t needed = samples * (maxval > 255 ? 2 : 1);
    NC_CHECK(header_end >= 0 && file_size - header_end >= needed, IOError, fn, ": ", path, ": ", image.width, "x",
             image.height, " pixels need ", needed, " bytes of data, the file has ",
             std::max<int64_t>(0, file_size - std::max<int64_t>(header_end, 0)));
  }
  image.samples.resize(static_cast<size_t>(samples));
  for (float& sample : image.samples) {
    int64_t v;
    if (plain) {
      v = pnm_number(in, path, fn, "pixel");
    } else {
      const int hi = in.get(), lo = maxval > 255 ? in.get() : 0;
      NC_CHECK(hi != EOF && lo != EOF, IOError, fn, ": ", path, ": pixel data is truncated");
      v = maxval > 255 ? (hi << 8 | lo) : hi;
    }
    NC_CHECK(v <= maxval, IOError, fn, ": ", path, ": pixel value ", v, " exceeds the maximum ", maxval);
    sample = static_cast<float>(v) / static_cast<float>(maxval);
  }
  return image;
}

}  // namespace data
}  // namespace normcore
