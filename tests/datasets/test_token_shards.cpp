// llm.c's token shards: a write/read round trip checked byte by byte, TokenWindows' windows
// (exact tokens, stride, no window across shards) and its batches through the DataLoader
// for 0 and 2 workers, and one bad input per row (malformed shards written by hand, bad
// arguments), each with the error class and the fragments its message must hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "normcore/data.h"
#include "normcore/tensor.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace ncd = normcore::data;
namespace fs = std::filesystem;
using normcore_test::throws;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the test writes little-endian shards from memory");

namespace {

constexpr int32_t kMagic = 20240520;
constexpr int64_t kGpt2Vocabulary = 50257;

// A shard's bytes as llm.c writes them, from header fields given apart so that a test can
// make them lie.
std::string shard_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  return bytes;
}

std::string shard_bytes(const std::vector<uint16_t>& tokens) {
  return shard_bytes(kMagic, 1, static_cast<int32_t>(tokens.size()), tokens);
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// count tokens first, first + 1, ...
std::vector<uint16_t> run_of(uint16_t first, size_t count) {
  std::vector<uint16_t> tokens(count);
  for (size_t i = 0; i < count; ++i) tokens[i] = static_cast<uint16_t>(first + i);
  return tokens;
}

std::vector<int64_t> run_of_i64(int64_t first, int64_t count) {
  std::vector<int64_t> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = first + i;
  return values;
}

class TokenShards : public normcore_test::TempDirTest {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
};

TEST_F(TokenShards, WriteThenRead) {
  const std::vector<int64_t> ids = {0, 1, 50256, 65535, 7, 256};
  const std::string path = (dir_ / "shard.bin").string();
  ncd::write_token_shard(path, nc::from_vector<int64_t>(ids, {6}));
  // The bytes llm.c writes, and nothing left next to them.
  const std::vector<uint16_t> expected = {0, 1, 50256, 65535, 7, 256};
  EXPECT_EQ(read_all(path), shard_bytes(expected));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  EXPECT_EQ(ncd::read_token_shard(path, 65536), expected);

  // An i32 tensor, a strided view and an empty shard write too; a write replaces the file.
  const std::vector<int32_t> wide = {5, 0, 6, 0, 7, 0};
  ncd::write_token_shard(path, nc::from_vector<int32_t>(wide, {3, 2}).select(1, 0));
  EXPECT_EQ(ncd::read_token_shard(path, 8), (std::vector<uint16_t>{5, 6, 7}));
  ncd::write_token_shard(path, nc::from_vector<int64_t>({}, {0}));
  EXPECT_EQ(read_all(path).size(), 1024u);
  EXPECT_TRUE(ncd::read_token_shard(path, 1).empty());
}

TEST_F(TokenShards, WindowsAtStrideWithinEachShard) {
  // 10 tokens (100 to 109), 3 tokens (too few for a window of 4), 7 tokens (200 to 206).
  const std::vector<std::string> shards = {write("a.bin", shard_bytes(run_of(100, 10))),
                                           write("short.bin", shard_bytes(run_of(300, 3))),
                                           write("b.bin", shard_bytes(run_of(200, 7)))};
  struct Case {
    std::optional<int64_t> stride;
    std::vector<int64_t> starts;  // the first input token of each window, in sample order
  };
  const Case cases[] = {
      // llm.c's placement: (10 - 1) / 3 = 3 windows, none; (7 - 1) / 3 = 2.
      {std::nullopt, {100, 103, 106, 200, 203}},
      {2, {100, 102, 104, 106, 200, 202}},
      // Every window: the last of a shard ends at its last token, never in the next shard.
      {1, {100, 101, 102, 103, 104, 105, 106, 200, 201, 202, 203}},
      {5, {100, 105, 200}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.stride.value_or(0));
    const ncd::TokenWindows windows(shards, 3, 400, c.stride);
    EXPECT_EQ(windows.context(), 3);
    EXPECT_EQ(windows.stride(), c.stride.value_or(3));
    ASSERT_EQ(windows.size(), static_cast<int64_t>(c.starts.size()));
    for (size_t i = 0; i < c.starts.size(); ++i) {
      const ncd::Example sample = windows.get(static_cast<int64_t>(i));
      EXPECT_EQ(sample.input.dtype(), nc::DType::I64);
      EXPECT_TRUE(sample.input.device().is_cpu());
      EXPECT_EQ(sample.input.shape(), (nc::Shape{3}));
      EXPECT_EQ(sample.input.to_vector<int64_t>(), run_of_i64(c.starts[i], 3)) << "window " << i;
      EXPECT_EQ(sample.target.to_vector<int64_t>(), run_of_i64(c.starts[i] + 1, 3)) << "window " << i;
    }
    throws<nc::IndexError>([&] { windows.get(windows.size()); }, {"TokenWindows::get", "outside [0, "})();
    throws<nc::IndexError>([&] { windows.get(-1); }, {"TokenWindows::get", "index -1"})();
  }
}

TEST_F(TokenShards, LoaderBatchesDoNotDependOnWorkers) {
  const std::vector<std::string> shards = {write("a.bin", shard_bytes(run_of(0, 41))),
                                           write("b.bin", shard_bytes(run_of(1000, 18)))};
  const ncd::TokenWindows windows(shards, 4, 2000);
  ASSERT_EQ(windows.size(), 10 + 4);
  const auto epoch_of = [&](int workers) {
    ncd::DataLoaderOptions o;
    o.batch_size = 4;
    o.seed = 11;
    o.workers = workers;
    ncd::DataLoader loader(windows, o);
    loader.begin_epoch(2);
    std::vector<std::vector<int64_t>> batches;
    for (ncd::Batch batch; loader.next(batch);) {
      EXPECT_EQ(batch.inputs.shape(), (nc::Shape{batch.inputs.size(0), 4}));
      batches.push_back(batch.inputs.to_vector<int64_t>());
      batches.push_back(batch.targets.to_vector<int64_t>());
    }
    return batches;
  };
  const std::vector<std::vector<int64_t>> inline_batches = epoch_of(0);
  EXPECT_EQ(inline_batches, epoch_of(2));
  // Every window once: inputs start at 0, 4, ..., 36 and 1000, 1004, ..., 1012.
  std::vector<int64_t> starts;
  for (size_t b = 0; b < inline_batches.size(); b += 2)
    for (size_t r = 0; r < inline_batches[b].size(); r += 4) starts.push_back(inline_batches[b][r]);
  std::sort(starts.begin(), starts.end());
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 1000, 1004, 1008, 1012}));
}

TEST_F(TokenShards, EachMalformedShardIsAnIOError) {
  struct Case {
    const char* name;
    std::string bytes;
    std::vector<std::string> fragments;
  };
  const std::string two = shard_bytes({1, 2});
  const Case cases[] = {
      {"empty", "", {"holds 0 bytes, fewer than the 1024"}},
      {"short_header", two.substr(0, 100), {"holds 100 bytes, fewer than the 1024"}},
      {"magic", shard_bytes(20240522, 1, 2, {1, 2}), {"bad magic 20240522", "starts with 20240520"}},
      {"version", shard_bytes(kMagic, 2, 2, {1, 2}), {"version 2", "reads version 1"}},
      {"negative_count", shard_bytes(kMagic, 1, -1, {1, 2}), {"the header says -1 tokens"}},
      {"truncated", two.substr(0, two.size() - 1), {"truncated", "says 2 tokens (4 bytes)", "holds 3 bytes of tokens"}},
      {"trailing", two + "x", {"trailing bytes", "says 2 tokens (4 bytes)", "holds 5 bytes of tokens"}},
      // A count of 2^31 - 1 in a file of 4 token bytes fails before anything is allocated.
      {"huge_count",
       shard_bytes(kMagic, 1, std::numeric_limits<int32_t>::max(), {1, 2}),
       {"truncated", "says 2147483647 tokens (4294967294 bytes)", "holds 4 bytes of tokens"}},
      {"past_vocabulary",
       shard_bytes({17, 50256, 0, 50300, 60000}),
       {"the token at position 3 is 50300", "past the vocabulary of 50257"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = write(std::string(c.name) + ".bin", c.bytes);
    std::vector<std::string> fragments = c.fragments;
    fragments.insert(fragments.begin(), "read_token_shard: " + path + ": ");
    throws<nc::IOError>([&] { ncd::read_token_shard(path, kGpt2Vocabulary); }, fragments)();
    // TokenWindows reads through read_token_shard and lets its errors through.
    throws<nc::IOError>([&] { ncd::TokenWindows({path}, 1, kGpt2Vocabulary); }, fragments)();
  }
}

TEST_F(TokenShards, BadArgumentsAndPaths) {
  const std::string missing = (dir_ / "missing.bin").string();
  const std::string no_folder = (dir_ / "no").string();
  const std::string one = write("one.bin", shard_bytes({1}));
  const std::string five = write("five.bin", shard_bytes(run_of(0, 5)));
  write("other.txt", "");
  const std::vector<std::string> six(6, one);
  const std::vector<std::function<void()>> checks = {
      throws<nc::IOError>([&] { ncd::read_token_shard(missing, 10); }, {"read_token_shard", missing, "cannot open"}),
      throws<nc::IOError>([&] { ncd::read_token_shard(dir_.string(), 10); }, {dir_.string(), "not a regular file"}),
      throws<nc::ValueError>([&] { ncd::read_token_shard(one, 0); }, {"read_token_shard", "vocab_size", "got 0"}),
      throws<nc::ValueError>([&] { ncd::read_token_shard(one, 65537); }, {"[1, 65536]", "got 65537"}),
      throws<nc::ValueError>([&] { ncd::write_token_shard(missing, nc::Tensor()); },
                             {"write_token_shard", "undefined"}),
      throws<nc::DTypeError>([&] { ncd::write_token_shard(missing, nc::zeros({2})); },
                             {"write_token_shard", "f32 [2]"}),
      throws<nc::ShapeError>(
          [&] {
            ncd::write_token_shard(missing, nc::zeros({1, 2}, nc::DType::I64));
          },
          {"write_token_shard", "[N]", "[1, 2]"}),
      throws<nc::ValueError>(
          [&] {
            ncd::write_token_shard(missing, nc::from_vector<int64_t>({4, 65536, -1}, {3}));
          },
          {"write_token_shard", "position 1 is 65536", "0 to 65535"}),
      throws<nc::ValueError>([&] { ncd::write_token_shard(missing, nc::from_vector<int32_t>({-3}, {1})); },
                             {"position 0 is -3"}),
      throws<nc::IOError>([&] { ncd::write_token_shard(no_folder + "/x.bin", nc::zeros({1}, nc::DType::I64)); },
                          {"write_token_shard", "x.bin", "cannot create a temporary file"}),
      throws<nc::IOError>([&] { ncd::glob_files((dir_ / "*.none").string()); },
                          {"glob_files: no file matches", (dir_ / "*.none").string()}),
      throws<nc::IOError>([&] { ncd::glob_files(no_folder + "/*.bin"); },
                          {"glob_files", "cannot read the folder", no_folder}),
      throws<nc::ValueError>([&] { ncd::TokenWindows({}, 4, 10); }, {"TokenWindows", "empty"}),
      throws<nc::ValueError>([&] { ncd::TokenWindows({five}, 0, 10); }, {"TokenWindows", "context", "got 0"}),
      throws<nc::ValueError>([&] { ncd::TokenWindows({five}, 2, 10, 0); }, {"TokenWindows", "stride", "got 0"}),
      throws<nc::ValueError>([&] { ncd::TokenWindows({five}, 2, 65537); }, {"TokenWindows", "vocab_size"}),
      // Files are not read before the arguments are checked.
      throws<nc::ValueError>([&] { ncd::TokenWindows({missing}, -1, 10); }, {"TokenWindows", "context"}),
      // A context of 5 needs 6 tokens: no shard holds a window.
      throws<nc::ValueError>(
          [&] {
            ncd::TokenWindows({one, five}, 5, 10);
          },
          {"TokenWindows: no window of 6 tokens (context 5 + 1)", one + " (1 tokens)", five + " (5 tokens)"}),
      throws<nc::ValueError>([&] { ncd::TokenWindows(six, 1, 10); }, {one + " (1 tokens)", " and 2 more"}),
      throws<nc::IOError>(
          [&] {
            ncd::TokenWindows({five, missing}, 2, 10);
          },
          {missing, "cannot open"}),
      throws<nc::IOError>([&] { ncd::TokenWindows({five}, 2, 4); }, {five, "position 4 is 4"}),
  };
  for (size_t i = 0; i < checks.size(); ++i) {
    SCOPED_TRACE(i);
    checks[i]();
  }
  EXPECT_FALSE(fs::exists(missing));
}

TEST_F(TokenShards, GlobSortsByBytes) {
  for (const char* name : {"train_10.bin", "train_2.bin", "Train_3.bin", "train_1.bin", "val_1.bin"})
    write(name, shard_bytes({1}));
  fs::create_directory(dir_ / "train_dir.bin");
  const std::string d = dir_.string() + "/";
  EXPECT_EQ(ncd::glob_files(d + "train_*.bin"),
            (std::vector<std::string>{d + "train_1.bin", d + "train_10.bin", d + "train_2.bin", d + "train_dir.bin"}));
  EXPECT_EQ(ncd::glob_files(d + "[Tv]*_?.bin"), (std::vector<std::string>{d + "Train_3.bin", d + "val_1.bin"}));
}

}  // namespace
