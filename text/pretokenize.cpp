// GPT-2's pre-tokenization (text/pretokenize.h): UTF-8 decoding, the character classes of
// the generated Unicode table, and the public pretokenize.
#include "text/pretokenize.h"

#include <algorithm>
#include <array>

#include "normcore/text.h"

namespace normcore {
namespace text {

namespace {

// A binary search of the generated ranges.
CharClass search(uint32_t cp) {
  const CodePointRange* end = kCodePointRanges + kCodePointRangeCount;
  const CodePointRange* r =
      std::upper_bound(kCodePointRanges, end, cp, [](uint32_t c, const CodePointRange& x) { return c < x.first; });
  return r != kCodePointRanges && cp <= (r - 1)->last ? (r - 1)->cls : CharClass::kOther;
}

// The first 128 code points' classes, looked up without a search.
std::array<CharClass, 128> ascii_classes() {
  std::array<CharClass, 128> classes{};
  for (uint32_t cp = 0; cp < 128; ++cp) classes[cp] = search(cp);
  return classes;
}

const std::array<CharClass, 128> kAsciiClasses = ascii_classes();

bool continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

CharClass char_class(uint32_t cp) { return cp < 128 ? kAsciiClasses[cp] : search(cp); }

Utf8Char char_at(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char b0 = byte(0);
  if (b0 < 0x80) return {b0, 1, kAsciiClasses[b0]};
  const Utf8Char invalid{kNotUtf8, 1, CharClass::kOther};
  const size_t left = text.size() - pos;
  uint32_t cp;
  uint32_t size;
  // The second byte's range for the lead bytes that restrict it (no overlong forms, no
  // surrogates, nothing past U+10FFFF).
  unsigned char low = 0x80, high = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    size = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    size = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    size = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    return invalid;
  }
  if (left < size || byte(1) < low || byte(1) > high) return invalid;
  for (uint32_t i = 1; i < size; ++i) {
    if (!continuation(byte(i))) return invalid;
    cp = cp << 6 | (byte(i) & 0x3F);
  }
  return {cp, size, char_class(cp)};
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for_each_piece(text, [&](std::string_view piece) { pieces.push_back(piece); });
  return pieces;
}

}  // namespace text
}  // namespace normcore
