// GPT-2's tokenizer: byte-level byte-pair encoding (BPE) over the pieces of GPT-2's
// pre-tokenization pattern. Any byte string encodes, valid UTF-8 or not, and decodes back to
// itself. The vocabulary and merges come from OpenAI's files (encoder.json, vocab.bpe) or
// Hugging Face's (vocab.json, merges.txt, or tokenizer.json); the readers throw IOError naming
// the file and the line or field of a defect, and allocate only for what a file holds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace text {

// The pieces GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// cuts text into, in order, as views of text; their concatenation is text. Classes follow Unicode 15.0 (\s is
// White_Space). A byte that is not part of well-formed UTF-8 counts as one character of
// none of the classes (as punctuation does).
std::vector<std::string_view> pretokenize(std::string_view text);

// The special token that separates documents in GPT-2's training data.
inline constexpr const char* kEndOfText = "<|endoftext|>";

class BpeTokenizer {
 public:
  // From a folder holding encoder.json and vocab.bpe (OpenAI), else vocab.json and merges.txt
  // (Hugging Face), else tokenizer.json. IOError naming the folder when it holds none of them.
  static BpeTokenizer load(const std::string& dir);
  // From a vocabulary (a JSON object of token -> id: encoder.json or vocab.json) and a merges
  // file (vocab.bpe or merges.txt: an optional "#version" line, then one merge a line, two
  // tokens separated by a space, in rank order).
  static BpeTokenizer load(const std::string& vocab_path, const std::string& merges_path);
  // From a Hugging Face tokenizer.json of GPT-2's kind: a BPE model with a vocabulary and
  // merges ("a b" strings or [a, b] pairs) and a ByteLevel pre-tokenizer without a prefix
  // space. Its added tokens must be in the vocabulary under the same ids.
  static BpeTokenizer load_tokenizer_json(const std::string& path);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // The token ids of text's bytes. With special, each "<|endoftext|>" in text is the special
  // token (end_of_text()); without, it is text like any other. ValueError for special with a
  // vocabulary that lacks the token. Encodings of words are cached (safe from several threads).
  std::vector<int32_t> encode(std::string_view text, bool special = false) const;
  // The bytes the ids stand for: decode(encode(s)) == s for every s. IndexError naming the
  // position and the id for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

  int64_t vocab_size() const;
  int64_t merge_count() const;
  // The id of "<|endoftext|>", or -1 when the vocabulary lacks it.
  int32_t end_of_text() const;

 private:
  class Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace text
}  // namespace normcore

#pragma GCC visibility pop
