// The inside of text::BpeTokenizer (normcore/text.h): what the file readers
// (text/bpe_files.cpp) hand over, and the checked vocabulary and merges the encoder uses
// (text/bpe.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "normcore/text.h"

namespace normcore {
namespace text {

// A vocabulary and merges as a file states them, before any check. Tokens are spelt in
// GPT-2's byte alphabet (each byte one character: bytes_to_unicode of OpenAI's encoder).
struct BpeSource {
  std::string vocab_where;                             // the file (and field) holding the vocabulary, for messages
  std::vector<std::pair<std::string, int64_t>> vocab;  // token -> id, in the file's order
  std::string merges_where;
  struct Merge {
    std::string first, second;
    std::string where;  // "line 7" or "[6]": the merge's place in merges_where
  };
  std::vector<Merge> merges;  // in rank order
};

class BpeTokenizer::Impl {
 public:
  // Checks source: ids 0 to n - 1, each once; every token in the byte alphabet; a token for
  // each of the 256 bytes; every merge of two tokens of the vocabulary whose concatenation
  // is one too, each pair once. IOError naming the file and the token, id or line otherwise.
  explicit Impl(const BpeSource& source);

  std::vector<int32_t> encode(std::string_view text, bool special) const;
  std::string decode(const std::vector<int32_t>& ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t merge_count() const { return static_cast<int64_t>(merges_.size()); }
  int32_t end_of_text() const { return end_of_text_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  static uint64_t pair_key(int32_t first, int32_t second) {
    return static_cast<uint64_t>(static_cast<uint32_t>(first)) << 32 | static_cast<uint32_t>(second);
  }
  // Appends the ids of one piece: its bytes' tokens, merged pair by pair, lowest rank first.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // encode_piece through the cache; cache_mutex_ held.
  void encode_piece_cached(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // id -> the token's bytes
  int32_t byte_tokens_[256];         // byte -> the id of its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t end_of_text_ = -1;

  // Pieces already encoded: the piece's bytes (kept in cache_keys_, whose elements never
  // move) -> the offset and count of its ids in cache_ids_. Pieces of up to kCachedPieceBytes
  // are kept; the cache is emptied when it holds kCacheLimit of them, so that it stays
  // bounded (under 32 MiB of ids) whatever the text.
  static constexpr size_t kCachedPieceBytes = 64;
  static constexpr size_t kCacheLimit = 1 << 17;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache_;
  mutable std::deque<std::string> cache_keys_;
  mutable std::vector<int32_t> cache_ids_;
};

}  // namespace text
}  // namespace normcore
