// llm.c's token shards: read, write, glob, and TokenWindows over them. A shard is a header of
// 256 little-endian int32 (magic, version, token count, zeros) and then the tokens as
// little-endian uint16. The reader checks the header and then the file's size against the
// count before it allocates, so a lying header cannot size an allocation; then every id
// against the vocabulary.
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "core/temp_file.h"
#include "data/windows.h"
#include "normcore/data.h"
#include "normcore/error.h"

// Tokens are read into and written from memory byte for byte, and the format is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token shard I/O assumes a little-endian host");

namespace normcore {
namespace data {
namespace {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);
// Ids are uint16.
constexpr int64_t kMaxVocabulary = int64_t(1) << 16;
// Shards the error for a list without a window names before it counts the rest.
constexpr size_t kNamedShards = 4;

template <class... Args>
[[noreturn]] void fail(const std::string& path, const Args&... args) {
  throw IOError(detail::cat_str("read_token_shard: ", path, ": ", args...));
}

void check_vocab_size(const char* op, int64_t vocab_size) {
  NC_CHECK(vocab_size >= 1 && vocab_size <= kMaxVocabulary, ValueError, op,
           ": vocab_size must be in [1, 65536] (token ids are uint16), got ", vocab_size);
}

int32_t load_i32(const uint8_t* bytes) {
  int32_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

void store_i32(uint8_t* bytes, int32_t value) { std::memcpy(bytes, &value, sizeof value); }

struct CloseFile {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Reads exactly n bytes; the file's size was checked, so a short read means it changed.
void read_exactly(std::FILE* file, const std::string& path, void* dst, size_t n, const char* what) {
  if (std::fread(dst, 1, n, file) == n) return;
  if (std::ferror(file)) fail(path, "cannot read the ", what, " (", std::strerror(errno), ")");
  fail(path, "the file ended inside the ", what, "; it was truncated while being read");
}

// Windows of context + 1 tokens at stride in a shard of count tokens.
int64_t windows_in(size_t count, int64_t context, int64_t stride) {
  const int64_t tokens = static_cast<int64_t>(count);
  return tokens > context ? (tokens - context - 1) / stride + 1 : 0;
}

std::string no_window_message(const std::vector<std::string>& paths, const std::vector<std::vector<uint16_t>>& shards,
                              int64_t context) {
  std::string named;
  for (size_t s = 0; s < paths.size() && s < kNamedShards; ++s)
    named += detail::cat_str(s == 0 ? "" : ", ", paths[s], " (", shards[s].size(), " tokens)");
  if (paths.size() > kNamedShards) named += detail::cat_str(" and ", paths.size() - kNamedShards, " more");
  return detail::cat_str("TokenWindows: no window of ", context + 1, " tokens (context ", context,
                         " + 1) in the shards ", named);
}

// glob(3) reports a folder it cannot read through a function without a user argument; the
// first such folder of this thread's call is kept for the error.
thread_local std::string unreadable_folder;
thread_local int unreadable_errno = 0;

int stop_at_unreadable_folder(const char* path, int error) {
  unreadable_folder = path;
  unreadable_errno = error;
  return 1;
}

}  // namespace

std::vector<uint16_t> read_token_shard(const std::string& path, int64_t vocab_size) {
  check_vocab_size("read_token_shard", vocab_size);
  std::unique_ptr<std::FILE, CloseFile> file(std::fopen(path.c_str(), "rb"));
  if (!file) fail(path, "cannot open (", std::strerror(errno), ")");
  struct stat info;
  if (::fstat(::fileno(file.get()), &info) != 0) fail(path, "cannot stat (", std::strerror(errno), ")");
  if (!S_ISREG(info.st_mode)) fail(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  if (size < kHeaderBytes)
    fail(path, "the file holds ", size, " bytes, fewer than the ", kHeaderBytes, " of a token shard's header");

  uint8_t header[kHeaderBytes];
  read_exactly(file.get(), path, header, kHeaderBytes, "header");
  const int32_t magic = load_i32(header), version = load_i32(header + 4), count = load_i32(header + 8);
  if (magic != kShardMagic) fail(path, "bad magic ", magic, " (a token shard starts with ", kShardMagic, ")");
  if (version != kShardVersion) fail(path, "version ", version, "; normcore reads version ", kShardVersion);
  if (count < 0) fail(path, "the header says ", count, " tokens");
  const uint64_t token_bytes = size - kHeaderBytes, expected = sizeof(uint16_t) * static_cast<uint64_t>(count);
  if (token_bytes != expected)
    fail(path, token_bytes < expected ? "truncated" : "trailing bytes", ": the header says ", count, " tokens (",
         expected, " bytes) but the file holds ", token_bytes, " bytes of tokens");

  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  read_exactly(file.get(), path, tokens.data(), expected, "tokens");
  const auto past = std::find_if(tokens.begin(), tokens.end(), [&](uint16_t id) { return id >= vocab_size; });
  if (past != tokens.end())
    fail(path, "the token at position ", past - tokens.begin(), " is ", *past, ", past the vocabulary of ", vocab_size,
         " (ids 0 to ", vocab_size - 1, ")");
  return tokens;
}

void write_token_shard(const std::string& path, const Tensor& tokens) {
  NC_CHECK(tokens.defined(), ValueError, "write_token_shard: the tokens are an undefined tensor");
  NC_CHECK(tokens.dtype() == DType::I64 || tokens.dtype() == DType::I32, DTypeError,
           "write_token_shard: the tokens must be i32 or i64, got ", describe(tokens));
  NC_CHECK(tokens.dim() == 1, ShapeError, "write_token_shard: the tokens must be [N], got ", describe(tokens));
  NC_CHECK(tokens.numel() <= std::numeric_limits<int32_t>::max(), ValueError, "write_token_shard: ", tokens.numel(),
           " tokens; a shard's count is an int32, so it holds at most 2^31 - 1");
  const Tensor ids = tokens.to(Device::cpu(), DType::I64).contiguous();
  const int64_t* id = ids.data<int64_t>();
  std::vector<uint16_t> data(static_cast<size_t>(ids.numel()));
  for (size_t i = 0; i < data.size(); ++i) {
    NC_CHECK(id[i] >= 0 && id[i] < kMaxVocabulary, ValueError, "write_token_shard: the token at position ", i, " is ",
             id[i], "; a shard holds ids 0 to 65535");
    data[i] = static_cast<uint16_t>(id[i]);
  }
  uint8_t header[kHeaderBytes] = {};
  store_i32(header, kShardMagic);
  store_i32(header + 4, kShardVersion);
  store_i32(header + 8, static_cast<int32_t>(data.size()));
  detail::TempFile file("write_token_shard", path);
  file.write(header, sizeof header);
  file.write(data.data(), data.size() * sizeof(uint16_t));
  file.commit();
}

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t found{};
  unreadable_folder.clear();
  // Sorted below by bytes: glob(3) would sort by the locale's collation.
  const int rc = ::glob(pattern.c_str(), GLOB_NOSORT, stop_at_unreadable_folder, &found);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(found.gl_pathv, found.gl_pathv + found.gl_pathc);
  ::globfree(&found);
  if (rc == GLOB_NOMATCH) throw IOError(detail::cat_str("glob_files: no file matches \"", pattern, "\""));
  if (rc == GLOB_ABORTED)
    throw IOError(detail::cat_str("glob_files: \"", pattern, "\": cannot read the folder ", unreadable_folder, " (",
                                  std::strerror(unreadable_errno), ")"));
  if (rc != 0) throw IOError(detail::cat_str("glob_files: \"", pattern, "\": glob(3) ran out of memory"));
  std::sort(paths.begin(), paths.end());
  return paths;
}

TokenWindows::TokenWindows(const std::vector<std::string>& shards, int64_t context, int64_t vocab_size,
                           std::optional<int64_t> stride)
    : context_(context), stride_(stride.value_or(context)) {
  NC_CHECK(!shards.empty(), ValueError, "TokenWindows: the list of shards is empty");
  NC_CHECK(context_ >= 1, ValueError, "TokenWindows: context must be positive, got ", context_);
  NC_CHECK(stride_ >= 1, ValueError, "TokenWindows: stride must be positive, got ", stride_);
  check_vocab_size("TokenWindows", vocab_size);
  auto tokens = std::make_shared<std::vector<std::vector<uint16_t>>>();
  tokens->reserve(shards.size());
  int64_t windows = 0;
  for (const std::string& path : shards) {
    tokens->push_back(read_token_shard(path, vocab_size));
    windows += windows_in(tokens->back().size(), context_, stride_);
    window_ends_.push_back(windows);
  }
  if (windows == 0) throw ValueError(no_window_message(shards, *tokens, context_));
  shards_ = std::move(tokens);
}

Example TokenWindows::get(int64_t index) const {
  NC_CHECK(index >= 0 && index < size(), IndexError, "TokenWindows::get: index ", index, " is outside [0, ", size(),
           ")");
  // The first shard whose windows end past index holds it.
  const auto end = std::upper_bound(window_ends_.begin(), window_ends_.end(), index);
  const size_t shard = static_cast<size_t>(end - window_ends_.begin());
  const int64_t first = shard == 0 ? 0 : window_ends_[shard - 1];
  return next_token_window((*shards_)[shard].data() + (index - first) * stride_, context_);
}

}  // namespace data
}  // namespace normcore
