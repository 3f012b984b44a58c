// Data files: IDX round trips through files this test writes (plain, gzip, multi-member
// gzip), one malformed file per defect (each an IOError naming the file and the reason), and
// the real Fashion-MNIST files against values computed with Python's gzip module.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "normcore/data.h"
#include "normcore/ops.h"
#include "normcore/tensor.h"
#include "tests/datasets/data_support.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace ncd = normcore::data;
namespace fs = std::filesystem;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the test writes big-endian IDX data byte by byte");

using namespace data_test;

namespace {

using normcore_test::throws;

// ---- writing test files ----

Bytes idx_header(uint8_t type_code, const std::vector<uint32_t>& dims) {
  Bytes bytes = {0, 0, type_code, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(d >> shift));
  return bytes;
}

// values in IDX byte order (big-endian).
template <class T>
Bytes big_endian(const std::vector<T>& values) {
  Bytes bytes(values.size() * sizeof(T));
  for (size_t i = 0; i < values.size(); ++i) {
    std::memcpy(bytes.data() + i * sizeof(T), &values[i], sizeof(T));
    std::reverse(bytes.begin() + i * sizeof(T), bytes.begin() + (i + 1) * sizeof(T));
  }
  return bytes;
}

Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void write_plain(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

Bytes read_plain(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes bytes gzip-compressed, as members members (split evenly), the way gzip -c a b > c does.
void write_gzip(const fs::path& path, const Bytes& bytes, int members = 1) {
  fs::remove(path);
  size_t begin = 0;
  for (int m = 0; m < members; ++m) {
    const size_t end = bytes.size() * (m + 1) / members;
    gzFile file = gzopen(path.c_str(), "ab");
    ASSERT_NE(file, nullptr) << path;
    if (end > begin)
      ASSERT_EQ(gzwrite(file, bytes.data() + begin, static_cast<unsigned>(end - begin)), int(end - begin));
    ASSERT_EQ(gzclose(file), Z_OK);
    begin = end;
  }
}

Bytes gzip_bytes(const fs::path& scratch, const Bytes& bytes) {
  write_gzip(scratch, bytes);
  Bytes compressed = read_plain(scratch);
  fs::remove(scratch);
  return compressed;
}

template <class T>
Bytes host_bytes(const std::vector<T>& values) {
  const uint8_t* data = reinterpret_cast<const uint8_t*>(values.data());
  return Bytes(data, data + values.size() * sizeof(T));
}

void expect_io_error(const std::function<void()>& read, const std::string& path, const std::string& reason) {
  try {
    read();
    ADD_FAILURE() << "expected IOError with \"" << reason << "\"";
  } catch (const nc::IOError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(reason), std::string::npos) << message;
  }
}

// A fresh directory per test, removed afterwards.
class DataFiles : public normcore_test::TempDirTest {};

// ---- IDX round trips ----

struct RoundTripCase {
  const char* name;
  Bytes file;  // uncompressed IDX
  nc::DType dtype;
  nc::Shape shape;
  Bytes expected;  // tensor bytes in host order
};

template <class T>
RoundTripCase round_trip(const char* name, uint8_t code, const std::vector<uint32_t>& dims, std::vector<T> values) {
  nc::Shape shape(dims.begin(), dims.end());
  return {name, concat(idx_header(code, dims), big_endian(values)), nc::dtype_of<T>::value, shape, host_bytes(values)};
}

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<uint8_t>((i * 131 + i / 7) % 256);
  return values;
}

std::vector<RoundTripCase> round_trip_cases() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return {
      round_trip<uint8_t>("u8_matrix", 0x08, {2, 3}, {0, 1, 2, 127, 128, 255}),
      round_trip<int32_t>("i32_vector", 0x0C, {4}, {0, -1, std::numeric_limits<int32_t>::min(), 123456789}),
      round_trip<float>("f32_specials", 0x0D, {2, 2}, {1.5f, -0.0f, inf, nan}),
      round_trip<double>("f64_vector", 0x0E, {3}, {3.141592653589793, -1e300, 4.9e-324}),
      round_trip<uint8_t>("empty_vector", 0x08, {0}, {}),
      round_trip<uint8_t>("zero_inner_dim", 0x08, {2, 0, 3}, {}),
      round_trip<uint8_t>("eight_dims", 0x08, {1, 2, 1, 1, 1, 1, 1, 2}, {9, 8, 7, 6}),
      // More than one 64 KiB chunk, so the gzip reader grows its buffer.
      round_trip<uint8_t>("u8_large", 0x08, {300, 700}, pattern(300 * 700)),
  };
}

class IdxFiles : public DataFiles {};

TEST_F(IdxFiles, RoundTripsPlainAndGzip) {
  for (const RoundTripCase& c : round_trip_cases()) {
    SCOPED_TRACE(c.name);
    for (int members : {0, 1, 3}) {  // 0: plain
      SCOPED_TRACE(members);
      const fs::path path = dir_ / (std::string(c.name) + (members ? ".gz" : ""));
      if (members) write_gzip(path, c.file, members);
      else write_plain(path, c.file);
      const nc::Tensor t = ncd::read_idx(path.string());
      EXPECT_EQ(t.dtype(), c.dtype);
      EXPECT_EQ(t.shape(), c.shape);
      EXPECT_TRUE(t.is_contiguous());
      EXPECT_EQ(t.device(), nc::Device::cpu());
      EXPECT_EQ(bytes_of(t), c.expected);
    }
  }
}

TEST_F(IdxFiles, MissingFileOrDirectory) {
  const std::string missing = (dir_ / "missing-idx1-ubyte.gz").string();
  expect_io_error([&] { ncd::read_idx(missing); }, missing, "cannot open");
  expect_io_error([&] { ncd::read_idx(dir_.string()); }, dir_.string(), "not a regular file");
}

// ---- malformed IDX files ----

struct MalformedCase {
  const char* name;
  std::function<Bytes()> make_bytes;  // the file's bytes
  const char* reason;                 // must appear in the error message
};

// u8 [2, 3] holding 0..5.
Bytes valid_idx() { return concat(idx_header(0x08, {2, 3}), {0, 1, 2, 3, 4, 5}); }

std::vector<MalformedCase> malformed_cases(const fs::path& scratch) {
  const auto gz = [scratch](std::function<Bytes()> raw) { return [=] { return gzip_bytes(scratch, raw()); }; };
  const auto fixed = [](Bytes bytes) { return [=] { return bytes; }; };
  // The compressed valid file with one byte changed; negative at counts from the end.
  const auto edited_gzip = [scratch](long at, uint8_t value) {
    return [=] {
      Bytes bytes = gzip_bytes(scratch, valid_idx());
      bytes[at < 0 ? bytes.size() + at : at] = value;
      return bytes;
    };
  };
  const Bytes text = {'h', 'e', 'l', 'l', 'o', ' ', 'i', 'd', 'x', '\n'};
  const Bytes valid = valid_idx();
  const Bytes short_by_one(valid.begin(), valid.end() - 1);
  return {
      {"empty_file", fixed({}), "file is empty"},
      {"one_byte", fixed({0}), "neither gzip nor IDX"},
      {"text", fixed(text), "neither gzip nor IDX: starts with 0x68 0x65"},
      {"gzip_of_text", gz([=] { return text; }), "bad IDX magic 0x68 0x65 0x6C 0x6C"},
      {"short_magic", fixed({0, 0, 8}), "truncated header"},
      {"gzip_short_magic", gz([] {
         return Bytes{0, 0};
       }),
       "truncated header"},
      {"signed_8_bit", fixed(concat(idx_header(0x09, {2}), {1, 2})), "unsupported IDX type code 0x09 (signed 8-bit)"},
      {"signed_16_bit", fixed(concat(idx_header(0x0B, {1}), {1, 2})), "unsupported IDX type code 0x0B (signed 16-bit)"},
      {"unknown_type", fixed(concat(idx_header(0x07, {1}), {1})), "unknown IDX type code 0x07"},
      {"zero_dims", fixed(idx_header(0x08, {})), "declares 0 dims"},
      {"nine_dims", fixed(idx_header(0x08, {1, 1, 1, 1, 1, 1, 1, 1, 1})), "declares 9 dims (at most 8"},
      {"truncated_dims", fixed(Bytes{0, 0, 8, 2, 0, 0, 0, 2, 0, 0}), "truncated header"},
      {"count_overflow", fixed(idx_header(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF})), "overflow the byte count"},
      // (2^32 - 1)^2 elements still fit in 64 bits; their bytes as f64 do not.
      {"byte_overflow", fixed(idx_header(0x0E, {0xFFFFFFFF, 0xFFFFFFFF})), "overflow the byte count"},
      {"over_4_gib", fixed(idx_header(0x08, {65536, 65537})), "exceed the limit of 4294967296 bytes"},
      {"gzip_over_4_gib", gz([] {
         return idx_header(0x0D, {1 << 30, 2});
       }),
       "exceed the limit"},
      {"empty_but_huge", fixed(idx_header(0x08, {0, 0xFFFFFFFF, 0xFFFFFFFF})), "exceed the limit"},
      // At the limit the header passes; the few bytes present do not.
      {"exactly_4_gib", fixed(concat(idx_header(0x08, {65536, 65536}), {1, 2, 3})),
       "promise 4294967296 bytes of data but the file holds 3"},
      {"gzip_exactly_4_gib", gz([] {
         return concat(idx_header(0x08, {65536, 65536}), {1, 2, 3});
       }),
       "promise 4294967296 bytes of data but the file holds 3"},
      {"truncated_data", fixed(short_by_one),
       "truncated data: dims [2, 3] promise 6 bytes of data but the file holds 5"},
      {"gzip_truncated_data", gz([=] { return short_by_one; }), "truncated data"},
      {"trailing_data", fixed(concat(valid, {7, 7})), "trailing data: 2 bytes after the 6 bytes"},
      {"gzip_trailing_data", gz([=] {
         return concat(valid, {7, 7, 7});
       }),
       "trailing data: 3 bytes after the 6 bytes"},
      {"gzip_huge_trailing_data", gz([=] { return concat(valid, Bytes(size_t(3) << 20, 0)); }),
       "trailing data: more than 1048576 bytes"},
      {"gzip_cut_short",
       [=] {
         Bytes bytes = gzip_bytes(scratch, concat(idx_header(0x08, {1000}), pattern(1000)));
         bytes.resize(bytes.size() / 2);
         return bytes;
       },
       "gzip stream is truncated"},
      {"gzip_without_trailer",
       [=] {
         Bytes bytes = gzip_bytes(scratch, valid);
         bytes.resize(bytes.size() - 3);
         return bytes;
       },
       "gzip stream is truncated"},
      {"gzip_bad_crc", edited_gzip(-8, 0x5A), "corrupted gzip stream (zlib: incorrect data check)"},
      {"gzip_bad_length", edited_gzip(-1, 0x5A), "corrupted gzip stream (zlib: incorrect length check)"},
      {"gzip_bad_method", edited_gzip(2, 7), "corrupted gzip stream (zlib: unknown compression method)"},
      // BFINAL = 1 with the reserved block type 3.
      {"gzip_bad_block", edited_gzip(10, 0xFF), "corrupted gzip stream (zlib: invalid block type)"},
      {"gzip_then_garbage", [=] { return concat(gzip_bytes(scratch, valid), text); },
       "trailing bytes after the end of the gzip stream that are not a gzip member"},
      {"gzip_then_one_byte", [=] { return concat(gzip_bytes(scratch, valid), {0x1f}); }, "not a gzip member"},
  };
}

TEST_F(IdxFiles, EachDefectIsAnIOError) {
  const fs::path scratch = dir_ / "scratch.gz";
  for (const MalformedCase& c : malformed_cases(scratch)) {
    SCOPED_TRACE(c.name);
    const std::string path = (dir_ / c.name).string();
    write_plain(path, c.make_bytes());
    expect_io_error([&] { ncd::read_idx(path); }, path, c.reason);
  }
}

// ---- the Fashion-MNIST files (Debian's dataset-fashion-mnist) ----

struct SplitFacts {
  bool train;
  int64_t samples;
  std::vector<int64_t> first_labels;
  int64_t first_image_sum;
  int64_t last_image_sum;
  int64_t pixel_sum;  // over the whole split
};

// Computed with Python's gzip module from the files themselves.
const SplitFacts kSplits[] = {
    {true, 60000, {9, 0, 0, 3, 0}, 76247, 16684, 3431114169},
    {false, 10000, {9, 2, 1, 1, 6}, 33456, 24390, 573469082},
};

TEST(DataFashionMnist, SplitsMatchTheFiles) {
  SKIP_WITHOUT_FASHION_MNIST();
  for (const SplitFacts& s : kSplits) {
    SCOPED_TRACE(s.train ? "train" : "t10k");
    const ncd::TensorDataset& d = fashion_mnist(s.train);
    ASSERT_EQ(d.inputs().dtype(), nc::DType::U8);
    ASSERT_EQ(d.inputs().shape(), (nc::Shape{s.samples, 28, 28}));
    ASSERT_EQ(d.targets().dtype(), nc::DType::I64);
    ASSERT_EQ(d.targets().shape(), (nc::Shape{s.samples}));
    const std::vector<int64_t> labels = d.targets().to_vector<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(labels.begin(), labels.begin() + 5), s.first_labels);
    std::vector<int64_t> histogram(10, 0);
    for (int64_t l : labels) ++histogram[l];
    EXPECT_EQ(histogram, std::vector<int64_t>(10, s.samples / 10));
    EXPECT_EQ(nc::sum(d.inputs().select(0, 0)).item<int64_t>(), s.first_image_sum);
    EXPECT_EQ(nc::sum(d.inputs().select(0, s.samples - 1)).item<int64_t>(), s.last_image_sum);
    EXPECT_EQ(nc::sum(d.inputs()).item<int64_t>(), s.pixel_sum);
  }
}

TEST(DataFashionMnist, ReadIdxGivesTheStoredLabels) {
  SKIP_WITHOUT_FASHION_MNIST();
  const nc::Tensor labels = ncd::read_idx(std::string(kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(labels.dtype(), nc::DType::U8);
  EXPECT_EQ(labels.shape(), (nc::Shape{10000}));
  EXPECT_EQ(labels.narrow(0, 0, 5).to_vector<int>(), (std::vector<int>{9, 2, 1, 1, 6}));
}

// ---- Fashion-MNIST layouts written by the test ----

struct SplitFiles {
  Bytes images;
  Bytes labels;
};

SplitFiles small_split(const std::vector<uint8_t>& labels, uint32_t rows = 28, uint32_t cols = 28) {
  const uint32_t n = static_cast<uint32_t>(labels.size());
  return {concat(idx_header(0x08, {n, rows, cols}), pattern(size_t(n) * rows * cols)),
          concat(idx_header(0x08, {n}), labels)};
}

class DataFashionMnistFiles : public DataFiles {
 protected:
  // Writes the split's two files into dir_, gzip-compressed or plain.
  void write_split(const std::string& split, const SplitFiles& files, bool compressed) {
    const std::string suffix = compressed ? ".gz" : "";
    const fs::path images = dir_ / (split + "-images-idx3-ubyte" + suffix);
    const fs::path labels = dir_ / (split + "-labels-idx1-ubyte" + suffix);
    if (compressed) {
      write_gzip(images, files.images);
      write_gzip(labels, files.labels);
    } else {
      write_plain(images, files.images);
      write_plain(labels, files.labels);
    }
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
};

TEST_F(DataFashionMnistFiles, GzipAndPlainLayoutsLoad) {
  write_split("train", small_split({3, 1, 4}), true);
  write_split("t10k", small_split({9, 0}), false);
  const ncd::TensorDataset train = ncd::load_fashion_mnist(dir_.string(), true);
  EXPECT_EQ(train.inputs().shape(), (nc::Shape{3, 28, 28}));
  EXPECT_EQ(bytes_of(train.inputs()), host_bytes(pattern(3 * 28 * 28)));
  EXPECT_EQ(train.targets().to_vector<int64_t>(), (std::vector<int64_t>{3, 1, 4}));
  const ncd::TensorDataset test = ncd::load_fashion_mnist(dir_.string(), false);
  EXPECT_EQ(test.inputs().shape(), (nc::Shape{2, 28, 28}));
  EXPECT_EQ(test.targets().to_vector<int64_t>(), (std::vector<int64_t>{9, 0}));
}

TEST_F(DataFashionMnistFiles, EachDefectNamesTheFile) {
  struct Case {
    const char* name;
    SplitFiles files;
    const char* file;  // the file the message must name
    const char* reason;
  };
  SplitFiles i32_labels = small_split({1, 2});
  i32_labels.labels = concat(idx_header(0x0C, {2}), big_endian<int32_t>({1, 2}));
  const Case cases[] = {
      {"label_10", small_split({1, 2, 10}), "train-labels-idx1-ubyte.gz", "label 10 at index 2 is outside [0, 10)"},
      {"count_mismatch",
       {small_split({1, 2, 3}).images, small_split({1, 2}).labels},
       "train-labels-idx1-ubyte.gz",
       "holds 2 labels but"},
      {"image_shape", small_split({1, 2}, 28, 27), "train-images-idx3-ubyte.gz",
       "expected images u8 [N, 28, 28], got u8 [2, 28, 27]"},
      {"i32_labels", i32_labels, "train-labels-idx1-ubyte.gz", "expected labels u8 [N], got i32 [2]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    write_split("train", c.files, true);
    expect_io_error([&] { ncd::load_fashion_mnist(dir_.string(), true); }, path(c.file), c.reason);
  }
}

TEST_F(DataFashionMnistFiles, MissingFilesAreNamed) {
  expect_io_error([&] { ncd::load_fashion_mnist(dir_.string(), false); }, path("t10k-images-idx3-ubyte.gz"),
                  "cannot open");
}

}  // namespace
