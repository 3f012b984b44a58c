// The normcore program's tokenize command (cli/tokenize.h).
#include "cli/tokenize.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "normcore/data.h"
#include "normcore/error.h"
#include "normcore/tensor.h"
#include "normcore/text.h"

namespace nc = normcore;

namespace {

// The bytes of a file, or of standard input for "-".
std::string read_input(const std::string& path) {
  std::ostringstream bytes;
  if (path == "-") {
    bytes << std::cin.rdbuf();
  } else {
    std::ifstream in(path, std::ios::binary);
    NC_CHECK(in.good() && !std::filesystem::is_directory(path), IOError, "cannot open ", path);
    bytes << in.rdbuf();
  }
  return bytes.str();
}

}  // namespace

int run_tokenize(const TokenizeOptions& options) {
  NC_CHECK(!options.tokenizer.empty(), ValueError, "tokenize: --tokenizer must name a folder of tokenizer files");
  const auto start = std::chrono::steady_clock::now();
  const nc::text::BpeTokenizer tokenizer = nc::text::BpeTokenizer::load(options.tokenizer);
  const std::vector<std::string> inputs = options.inputs.empty() ? std::vector<std::string>{"-"} : options.inputs;
  if (options.decode) {
    for (const std::string& path : inputs) {
      std::vector<int32_t> ids;
      if (path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0) {
        for (uint16_t id : nc::data::read_token_shard(path, tokenizer.vocab_size())) ids.push_back(id);
      } else {
        std::istringstream text(read_input(path));
        for (std::string word; text >> word;) {
          char* end = nullptr;
          const long long id = std::strtoll(word.c_str(), &end, 10);
          NC_CHECK(*end == '\0' && id >= INT32_MIN && id <= INT32_MAX, ValueError, "tokenize --decode: '", word,
                   "' in ", path, " is not a token id");
          ids.push_back(static_cast<int32_t>(id));
        }
      }
      const std::string bytes = tokenizer.decode(ids);
      std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    }
    return 0;
  }
  const auto loaded = std::chrono::steady_clock::now();
  std::vector<int32_t> ids;
  size_t bytes = 0;
  for (const std::string& path : inputs) {
    const std::string text = read_input(path);
    bytes += text.size();
    const std::vector<int32_t> part = tokenizer.encode(text, options.special);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  const double load_s = std::chrono::duration<double>(loaded - start).count();
  const double encode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - loaded).count();
  const std::string& out = options.out;
  if (out.empty()) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    line += "\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    return 0;
  }
  nc::data::write_token_shard(out, nc::from_vector(ids, {static_cast<int64_t>(ids.size())}));
  std::printf("normcore tokenize: %zu bytes of %zu input(s) -> %zu tokens, written to %s (tokenizer loaded in "
              "%.3f s, encoded in %.3f s: %.1f MB/s)\n",
              bytes, inputs.size(), ids.size(), out.c_str(), load_s, encode_s,
              encode_s > 0 ? static_cast<double>(bytes) / encode_s / 1e6 : 0.0);
  return 0;
}
