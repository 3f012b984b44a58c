// GPT-2's pre-tokenization, written out by hand over UTF-8 (normcore/text.h, pretokenize):
// for_each_piece calls f(std::string_view) on each piece of the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// in order. A header template, so that the encoder's loop inlines it.
#pragma once

#include <cstdint>
#include <string_view>

#include "text/unicode_classes.h"

namespace normcore {
namespace text {

struct Utf8Char {
  uint32_t cp;    // the code point; kNotUtf8 for a byte outside well-formed UTF-8
  uint32_t size;  // its bytes: 1 to 4
  CharClass cls;
};
inline constexpr uint32_t kNotUtf8 = 0xFFFFFFFFu;

// The character at byte pos < text.size(): well-formed UTF-8 (no overlong forms, surrogates
// or code points past U+10FFFF), else the single byte pos as kNotUtf8 of class kOther.
Utf8Char char_at(std::string_view text, size_t pos);

// The length of the contraction ('s 't 're 've 'm 'll 'd, lowercase) starting at pos, which
// holds an apostrophe; 0 when none does.
inline size_t contraction_size(std::string_view text, size_t pos) {
  const size_t left = text.size() - pos - 1;
  if (left == 0) return 0;
  const char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (left < 2) return 0;
  const char b = text[pos + 2];
  return (a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l') ? 3 : 0;
}

template <class F>
void for_each_piece(std::string_view text, F&& f) {
  const size_t size = text.size();
  size_t pos = 0;
  while (pos < size) {
    const Utf8Char c = char_at(text, pos);
    if (c.cp == '\'') {
      if (const size_t n = contraction_size(text, pos)) {
        f(text.substr(pos, n));
        pos += n;
        continue;
      }
    }
    // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": a run of one class, after an optional space.
    Utf8Char first = c;
    size_t run = pos;
    if (c.cp == ' ' && pos + 1 < size) {
      const Utf8Char next = char_at(text, pos + 1);
      if (next.cls != CharClass::kSpace) {
        first = next;
        run = pos + 1;
      }
    }
    if (first.cls != CharClass::kSpace) {
      size_t end = run + first.size;
      while (end < size) {
        const Utf8Char e = char_at(text, end);
        if (e.cls != first.cls) break;
        end += e.size;
      }
      f(text.substr(pos, end - pos));
      pos = end;
      continue;
    }
    // "\s+(?!\S)|\s+": the run of white space, less its last character when something other
    // than white space follows and the run has more than one (that character goes with the
    // next piece: " word", or a lone white-space piece).
    size_t end = pos + c.size, last = pos;
    while (end < size) {
      const Utf8Char e = char_at(text, end);
      if (e.cls != CharClass::kSpace) break;
      last = end;
      end += e.size;
    }
    if (end < size && last > pos) end = last;
    f(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace text
}  // namespace normcore
