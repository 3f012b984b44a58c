// PNM images (PGM and PPM, binary and plain) as read by data::read_color_image and
// models::read_image: one parser, its messages naming the calling function.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace normcore {
namespace data {

struct PnmImage {
  int64_t width = 0, height = 0, channels = 0;  // channels: 1 (P2/P5) or 3 (P3/P6)
  std::vector<float> samples;                   // row-major, channels interleaved, in [0, 1]
};

// Reads a P2, P3, P5 or P6 image from in (opened in binary mode on path, at its start).
// Sides of 1 to max_side, maximum values of 1 to 65535; a binary file must hold the bytes
// its header claims before anything is allocated. IOError "<fn>: <path>: ..." otherwise.
PnmImage read_pnm(std::istream& in, const std::string& path, const char* fn, int64_t max_side);

}  // namespace data
}  // namespace normcore
