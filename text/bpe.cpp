// text::BpeTokenizer's vocabulary checks, encoder and decoder (normcore/text.h). The files
// are read by text/bpe_files.cpp. Tokens are kept as the bytes they stand for: the byte
// alphabet of the files is undone once, when they are read.
#include <array>
#include <climits>
#include <unordered_map>

#include "normcore/error.h"
#include "text/bpe_impl.h"
#include "text/pretokenize.h"

namespace normcore {
namespace text {

namespace {

// GPT-2's byte alphabet (bytes_to_unicode): the printable bytes '!' to '~', U+00A1 to U+00AC
// and U+00AE to U+00FF stand for themselves; the other 68 bytes, in order, for U+0100 on.
struct ByteAlphabet {
  std::array<uint32_t, 256> char_of{};  // byte -> code point
  std::array<int16_t, 324> byte_of{};   // code point -> byte, -1 for none
  ByteAlphabet() {
    byte_of.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char_of[b] = printable ? b : next++;
      byte_of[char_of[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteAlphabet kAlphabet;

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {  // the alphabet's code points are below U+0800
    s += static_cast<char>(0xC0 | cp >> 6);
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The bytes a token spelt in the byte alphabet stands for.
std::string token_bytes(const std::string& token, int64_t id, const std::string& where) {
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    const Utf8Char c = char_at(token, pos);
    NC_CHECK(c.cp < kAlphabet.byte_of.size() && kAlphabet.byte_of[c.cp] >= 0, IOError, where, ": token \"", token,
             "\" (id ", id, ") holds a character outside GPT-2's byte alphabet at byte ", pos);
    bytes += static_cast<char>(kAlphabet.byte_of[c.cp]);
    pos += c.size;
  }
  NC_CHECK(!bytes.empty(), IOError, where, ": the empty token (id ", id, ")");
  return bytes;
}

}  // namespace

BpeTokenizer::Impl::Impl(const BpeSource& source) {
  const std::string& where = source.vocab_where;
  const size_t count = source.vocab.size();
  NC_CHECK(count > 0 && count <= INT32_MAX, IOError, where, ": ", count, " tokens (1 to 2^31 - 1 expected)");
  std::unordered_map<std::string, int32_t> ids;  // as the file spells the token
  ids.reserve(count);
  tokens_.resize(count);
  std::vector<const std::string*> spelling(count, nullptr);
  for (const auto& [token, id] : source.vocab) {
    NC_CHECK(id >= 0 && static_cast<size_t>(id) < count, IOError, where, ": token \"", token, "\" has id ", id,
             ", outside [0, ", count, "): the ids must number the ", count, " tokens from 0");
    NC_CHECK(spelling[id] == nullptr, IOError, where, ": id ", id, " is given to both \"", *spelling[id], "\" and \"",
             token, "\"");
    NC_CHECK(ids.emplace(token, static_cast<int32_t>(id)).second, IOError, where, ": token \"", token,
             "\" appears twice");
    spelling[id] = &token;
    tokens_[id] = token_bytes(token, id, where);
  }
  for (int b = 0; b < 256; ++b) {
    const std::string spelt = utf8_of(kAlphabet.char_of[b]);
    const auto it = ids.find(spelt);
    NC_CHECK(it != ids.end(), IOError, where, ": no token for byte ", b, " (\"", spelt,
             "\"); a byte-level vocabulary has one for each of the 256 bytes");
    byte_tokens_[b] = it->second;
  }
  if (const auto it = ids.find(kEndOfText); it != ids.end()) end_of_text_ = it->second;

  const std::string& merges_where = source.merges_where;
  NC_CHECK(source.merges.size() <= INT32_MAX, IOError, merges_where, ": more than 2^31 - 1 merges");
  const auto id_of = [&](const std::string& token, const std::string& at) {
    const auto it = ids.find(token);
    NC_CHECK(it != ids.end(), IOError, merges_where, " ", at, ": \"", token, "\" is not in the vocabulary (", where,
             ")");
    return it->second;
  };
  merges_.reserve(source.merges.size());
  for (size_t rank = 0; rank < source.merges.size(); ++rank) {
    const BpeSource::Merge& m = source.merges[rank];
    const int32_t first = id_of(m.first, m.where), second = id_of(m.second, m.where);
    const int32_t merged = id_of(m.first + m.second, m.where);
    const bool inserted = merges_.emplace(pair_key(first, second), Merge{static_cast<int32_t>(rank), merged}).second;
    NC_CHECK(inserted, IOError, merges_where, " ", m.where, ": the merge \"", m.first, " ", m.second, "\" comes twice");
  }
}

void BpeTokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> parts(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) parts[i] = byte_tokens_[static_cast<unsigned char>(piece[i])];
  // As OpenAI's encoder: take the pair of lowest rank, merge each of its occurrences from the
  // left, and start again until no pair has a rank.
  while (parts.size() > 1) {
    const Merge* best = nullptr;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = merges_.find(pair_key(parts[i], parts[i + 1]));
      if (it != merges_.end() && (best == nullptr || it->second.rank < best->rank)) {
        best = &it->second;
        best_at = i;
      }
    }
    if (best == nullptr) break;
    const int32_t first = parts[best_at], second = parts[best_at + 1];
    size_t kept = best_at;
    for (size_t i = best_at; i < parts.size();) {
      if (i + 1 < parts.size() && parts[i] == first && parts[i + 1] == second) {
        parts[kept++] = best->id;
        i += 2;
      } else {
        parts[kept++] = parts[i++];
      }
    }
    parts.resize(kept);
  }
  out.insert(out.end(), parts.begin(), parts.end());
}

void BpeTokenizer::Impl::encode_piece_cached(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_tokens_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (const auto it = cache_.find(piece); it != cache_.end()) {
    const auto [offset, count] = it->second;
    out.insert(out.end(), cache_ids_.begin() + offset, cache_ids_.begin() + offset + count);
    return;
  }
  const size_t before = out.size();
  encode_piece(piece, out);
  // Long pieces (runs of one class) are rare and would fill the cache: not kept.
  if (piece.size() > kCachedPieceBytes) return;
  if (cache_.size() >= kCacheLimit) {
    cache_.clear();
    cache_keys_.clear();
    cache_ids_.clear();
  }
  const auto offset = static_cast<uint32_t>(cache_ids_.size());
  const auto count = static_cast<uint32_t>(out.size() - before);
  cache_ids_.insert(cache_ids_.end(), out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
  cache_keys_.emplace_back(piece);
  cache_.emplace(std::string_view(cache_keys_.back()), std::make_pair(offset, count));
}

std::vector<int32_t> BpeTokenizer::Impl::encode(std::string_view text, bool special) const {
  NC_CHECK(!special || end_of_text_ >= 0, ValueError,
           "BpeTokenizer::encode: special tokens asked for, but the "
           "vocabulary has no \"",
           kEndOfText, "\"");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4);
  const std::lock_guard<std::mutex> lock(cache_mutex_);
  const auto plain = [&](std::string_view part) {
    for_each_piece(part, [&](std::string_view piece) { encode_piece_cached(piece, ids); });
  };
  if (!special) {
    plain(text);
    return ids;
  }
  const std::string_view separator(kEndOfText);
  size_t start = 0;
  for (size_t found; (found = text.find(separator, start)) != std::string_view::npos;
       start = found + separator.size()) {
    plain(text.substr(start, found - start));
    ids.push_back(end_of_text_);
  }
  plain(text.substr(start));
  return ids;
}

std::string BpeTokenizer::Impl::decode(const std::vector<int32_t>& ids) const {
  size_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    NC_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), IndexError, "BpeTokenizer::decode: id ", ids[i], " at position ", i,
             " is outside the vocabulary of ", vocab_size(), " tokens");
    bytes += tokens_[ids[i]].size();
  }
  std::string text;
  text.reserve(bytes);
  for (int32_t id : ids) text += tokens_[id];
  return text;
}

// ---------------------------------------------------------------- the public class
BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool special) const {
  return impl_->encode(text, special);
}
std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const { return impl_->decode(ids); }
int64_t BpeTokenizer::vocab_size() const { return impl_->vocab_size(); }
int64_t BpeTokenizer::merge_count() const { return impl_->merge_count(); }
int32_t BpeTokenizer::end_of_text() const { return impl_->end_of_text(); }

}  // namespace text
}  // namespace normcore
