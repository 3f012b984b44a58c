// The character classes of GPT-2's pre-tokenization pattern: \p{L}, \p{N}, \s and the rest,
// for any code point. The ranges are generated from the Unicode Character Database by
// scripts/make_unicode_classes.py (text/unicode_classes.cpp); char_class looks them up.
#pragma once

#include <cstddef>
#include <cstdint>

namespace normcore {
namespace text {

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

struct CodePointRange {
  uint32_t first;
  uint32_t last;  // inclusive
  CharClass cls;
};

// Sorted by first, disjoint; a code point in none of them is kOther.
extern const CodePointRange kCodePointRanges[];
extern const size_t kCodePointRangeCount;

// The class of code point cp (any value: past U+10FFFF is kOther).
CharClass char_class(uint32_t cp);

}  // namespace text
}  // namespace normcore
