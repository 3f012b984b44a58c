// Fuzz target: read_token_shard on arbitrary bytes written to a private file, then
// TokenWindows over it, every window read. Each must succeed or throw a normcore::Error; the
// tokens must be exactly what the file holds after its header, all inside the vocabulary,
// and every window the tokens at its place. Header bytes 12 to 15, which the format leaves
// zero, choose the vocabulary (65536 minus the u16 at 12), the context (1 + byte 14 mod 16)
// and the stride (1 + byte 15 mod 16), so that the fuzzer can reach every limit; a shard
// with zeros there reads with every id allowed, at context 1 and stride 1.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "normcore/data.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

constexpr size_t kHeaderBytes = 1024;

struct Choices {
  int64_t vocab_size = 65536;
  int64_t context = 1;
  int64_t stride = 1;
};

Choices choices_of(const uint8_t* data, size_t size) {
  Choices c;
  if (size < 16) return c;
  c.vocab_size = 65536 - (int64_t(data[12]) | int64_t(data[13]) << 8);
  c.context = 1 + data[14] % 16;
  c.stride = 1 + data[15] % 16;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = normcore_fuzz::write_private_file("token_shard", data, size);
  const Choices c = choices_of(data, size);
  normcore_fuzz::expect_only_normcore_errors([&] {
    const std::vector<uint16_t> tokens = normcore::data::read_token_shard(path, c.vocab_size);
    normcore_fuzz::require(size == kHeaderBytes + 2 * tokens.size(),
                           "the tokens are the file's bytes after the header");
    normcore_fuzz::require(tokens.empty() || std::memcmp(tokens.data(), data + kHeaderBytes, 2 * tokens.size()) == 0,
                           "the tokens are the file's uint16 values");
    for (uint16_t id : tokens) normcore_fuzz::require(id < c.vocab_size, "every token is inside the vocabulary");

    const normcore::data::TokenWindows windows({path}, c.context, c.vocab_size, c.stride);
    const int64_t count = static_cast<int64_t>(tokens.size());
    normcore_fuzz::require(windows.size() == (count - c.context - 1) / c.stride + 1, "the windows fill the shard");
    for (int64_t i = 0; i < windows.size(); ++i) {
      const normcore::data::Example sample = windows.get(i);
      const std::vector<int64_t> input = sample.input.to_vector<int64_t>();
      const std::vector<int64_t> target = sample.target.to_vector<int64_t>();
      for (int64_t t = 0; t < c.context; ++t) {
        const size_t place = static_cast<size_t>(i * c.stride + t);
        normcore_fuzz::require(input[t] == tokens[place] && target[t] == tokens[place + 1],
                               "a window holds the tokens at its place");
      }
    }
  });
  return 0;
}
