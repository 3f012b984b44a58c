// Fuzz target: the readers of text::BpeTokenizer's files. The input up to its first NUL byte is
// written as vocab.json, the rest as merges.txt, and the pair is loaded; the whole input is
// also loaded as a tokenizer.json. Each load must succeed or throw a normcore::Error, and a
// tokenizer that loads must give back every byte string it encodes: the input's two parts,
// with and (when it has the token) without "<|endoftext|>" as the special token.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "normcore/text.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

void check_round_trips(const normcore::text::BpeTokenizer& tokenizer, std::string_view a, std::string_view b) {
  for (const std::string_view text : {a, b}) {
    normcore_fuzz::require(tokenizer.decode(tokenizer.encode(text)) == text, "decode(encode(s)) == s");
    if (tokenizer.end_of_text() >= 0)
      normcore_fuzz::require(tokenizer.decode(tokenizer.encode(text, true)) == text, "decode(encode(s, special)) == s");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = std::min(input.find('\0'), input.size());
  const std::string_view vocab = input.substr(0, nul), merges = input.substr(std::min(nul + 1, size));
  const std::string vocab_path = normcore_fuzz::write_private_file("bpe_vocab", data, vocab.size());
  const std::string merges_path =
      normcore_fuzz::write_private_file("bpe_merges", reinterpret_cast<const uint8_t*>(merges.data()), merges.size());
  const std::string json_path = normcore_fuzz::write_private_file("bpe_tokenizer_json", data, size);
  normcore_fuzz::expect_only_normcore_errors(
      [&] { check_round_trips(normcore::text::BpeTokenizer::load(vocab_path, merges_path), vocab, merges); });
  normcore_fuzz::expect_only_normcore_errors(
      [&] { check_round_trips(normcore::text::BpeTokenizer::load_tokenizer_json(json_path), vocab, merges); });
  return 0;
}
