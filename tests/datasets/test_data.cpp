// Data loading: IDX round trips through files this test writes (plain, gzip, multi-member
// gzip), one malformed file per defect (each an IOError naming the file and the reason), the
// real Fashion-MNIST files against values computed with Python's gzip module, and the
// DataLoader's batching, ordering, sharding by rank, normalization, error propagation and
// shutdown.
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
#include "tests/test_support.h"

namespace nc = normcore;
namespace ncd = normcore::data;
namespace fs = std::filesystem;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the test writes big-endian IDX data byte by byte");

namespace {

using Bytes = std::vector<uint8_t>;
using normcore_test::throws;

const char* const kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

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

// The tensor's elements in row-major order as raw bytes.
Bytes bytes_of(const nc::Tensor& t) {
  const nc::Tensor host = t.to(nc::Device::cpu()).contiguous();
  const uint8_t* data = static_cast<const uint8_t*>(host.data_ptr());
  return Bytes(data, data + host.nbytes());
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

bool have_fashion_mnist() {
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                           "t10k-labels-idx1-ubyte.gz"})
    if (!fs::exists(fs::path(kFashionMnistDir) / name)) return false;
  return true;
}

// Loaded once: decompressing the training images takes a noticeable fraction of a second.
const ncd::TensorDataset& fashion_mnist(bool train) {
  static const ncd::TensorDataset train_set = ncd::load_fashion_mnist(kFashionMnistDir, true);
  static const ncd::TensorDataset test_set = ncd::load_fashion_mnist(kFashionMnistDir, false);
  return train ? train_set : test_set;
}

#define SKIP_WITHOUT_FASHION_MNIST() \
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed in " << kFashionMnistDir

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

// ---- DataLoader ----

// n samples of shape sample_shape; pixel k of sample i is (31 i + k) mod 256 and its label
// is i, so a batch's labels say which samples it holds.
ncd::TensorDataset numbered(int64_t n, const nc::Shape& sample_shape = {2, 3}) {
  nc::Shape shape = {n};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  nc::Tensor images = nc::empty(shape, nc::TensorOptions(nc::DType::U8));
  const int64_t row = n ? images.numel() / n : 0;
  uint8_t* pixels = images.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < row; ++k) pixels[i * row + k] = static_cast<uint8_t>((31 * i + k) % 256);
  return ncd::TensorDataset(images, nc::arange(n));
}

float normalized(int v, float mean = ncd::kFashionMnistMean, float stddev = ncd::kFashionMnistStd) {
  return (static_cast<float>(v) / 255.0f - mean) / stddev;
}

// Fashion-MNIST's normalization, as training uses it.
ncd::DataLoaderOptions options(int64_t batch_size, bool shuffle = false, uint64_t seed = 0) {
  ncd::DataLoaderOptions o;
  o.batch_size = batch_size;
  o.shuffle = shuffle;
  o.seed = seed;
  o.transforms = {ncd::transforms::normalize()};
  return o;
}

// The sample indices of one epoch, in the order the loader gave them.
std::vector<int64_t> epoch_samples(ncd::DataLoader& loader, uint64_t epoch) {
  loader.begin_epoch(epoch);
  std::vector<int64_t> samples;
  for (ncd::Batch batch; loader.next(batch);) {
    const std::vector<int64_t> labels = batch.targets.to_vector<int64_t>();
    samples.insert(samples.end(), labels.begin(), labels.end());
  }
  return samples;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t(0));
  return v;
}

struct BatchingCase {
  const char* name;
  int64_t samples;
  nc::Shape sample_shape;
  int64_t batch_size;
  bool drop_last;
  bool flatten;
  std::vector<int64_t> batch_sizes;
  nc::Shape image_shape;  // of one sample in a batch
};

TEST(DataLoader, BatchShapesAndDtypes) {
  const BatchingCase cases[] = {
      {"partial_last", 10, {2, 3}, 4, false, false, {4, 4, 2}, {1, 2, 3}},
      {"drop_last", 10, {2, 3}, 4, true, false, {4, 4}, {1, 2, 3}},
      {"flatten", 10, {2, 3}, 4, false, true, {4, 4, 2}, {6}},
      {"channels", 5, {3, 2, 2}, 2, false, false, {2, 2, 1}, {3, 2, 2}},
      {"channels_flatten", 5, {3, 2, 2}, 5, false, true, {5}, {12}},
      {"batch_larger_than_dataset", 3, {2, 3}, 100, false, false, {3}, {1, 2, 3}},
      {"drop_last_exact", 8, {2, 3}, 4, true, false, {4, 4}, {1, 2, 3}},
  };
  for (const BatchingCase& c : cases) {
    SCOPED_TRACE(c.name);
    ncd::DataLoaderOptions o = options(c.batch_size);
    o.drop_last = c.drop_last;
    if (c.flatten) o.transforms.push_back(ncd::transforms::flatten());
    ncd::DataLoader loader(numbered(c.samples, c.sample_shape), o);
    EXPECT_EQ(loader.size(), c.samples);
    EXPECT_EQ(loader.num_batches(), static_cast<int64_t>(c.batch_sizes.size()));
    loader.begin_epoch(0);
    ncd::Batch batch;
    for (size_t b = 0; b < c.batch_sizes.size(); ++b) {
      ASSERT_TRUE(loader.next(batch));
      nc::Shape expected = {c.batch_sizes[b]};
      expected.insert(expected.end(), c.image_shape.begin(), c.image_shape.end());
      EXPECT_EQ(batch.index, static_cast<int64_t>(b));
      EXPECT_EQ(batch.inputs.shape(), expected);
      EXPECT_EQ(batch.inputs.dtype(), nc::DType::F32);
      EXPECT_EQ(batch.inputs.device(), nc::Device::cpu());
      EXPECT_TRUE(batch.inputs.is_contiguous());
      EXPECT_EQ(batch.targets.shape(), (nc::Shape{c.batch_sizes[b]}));
      EXPECT_EQ(batch.targets.dtype(), nc::DType::I64);
    }
    EXPECT_FALSE(loader.next(batch));
    EXPECT_FALSE(loader.next(batch));  // an exhausted epoch stays exhausted
  }
}

TEST(DataLoader, WithoutShuffleSamplesComeInOrder) {
  ncd::DataLoader loader(numbered(23), options(5));
  EXPECT_EQ(epoch_samples(loader, 0), iota(23));
  EXPECT_EQ(epoch_samples(loader, 1), iota(23));
}

TEST(DataLoader, EverySampleOncePerEpochWithItsOwnPixels) {
  const int64_t n = 1000;
  ncd::DataLoader loader(numbered(n), options(64, /*shuffle=*/true, /*seed=*/3));
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    SCOPED_TRACE(epoch);
    loader.begin_epoch(epoch);
    std::vector<int64_t> seen;
    for (ncd::Batch batch; loader.next(batch);) {
      const std::vector<int64_t> labels = batch.targets.to_vector<int64_t>();
      const std::vector<float> pixels = batch.inputs.to_vector<float>();
      for (size_t r = 0; r < labels.size(); ++r)
        for (int k = 0; k < 6; ++k)
          ASSERT_EQ(pixels[r * 6 + k], normalized(static_cast<int>((31 * labels[r] + k) % 256)));
      seen.insert(seen.end(), labels.begin(), labels.end());
    }
    EXPECT_NE(seen, iota(n));  // shuffled
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, iota(n));
  }
}

TEST(DataLoader, ShuffleIsPhiloxFisherYates) {
  // From an independent Python Philox-4x32-10 (it reproduces Random123's known answer for
  // counter 0, key 0) running the documented Fisher-Yates.
  struct Case {
    uint64_t seed;
    uint64_t epoch;
    std::vector<int64_t> order;
  };
  const Case cases[] = {
      {42, 0, {4, 1, 6, 3, 7, 9, 0, 5, 2, 8}},
      {42, 1, {8, 9, 3, 4, 5, 1, 7, 6, 2, 0}},
      {7, 0, {0, 6, 8, 7, 2, 9, 4, 3, 5, 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.seed);
    ncd::DataLoader loader(numbered(10), options(3, true, c.seed));
    EXPECT_EQ(epoch_samples(loader, c.epoch), c.order);
  }
}

TEST(DataLoader, OrderDependsOnSeedAndEpochOnly) {
  ncd::DataLoader a(numbered(200), options(16, true, 5));
  ncd::DataLoader b(numbered(200), options(7, true, 5));
  ncd::DataLoader other_seed(numbered(200), options(16, true, 6));
  const std::vector<int64_t> epoch3 = epoch_samples(a, 3);
  EXPECT_EQ(epoch_samples(b, 3), epoch3);  // batch size does not change the order
  EXPECT_NE(epoch_samples(a, 4), epoch3);
  EXPECT_EQ(epoch_samples(a, 3), epoch3);  // an epoch can be replayed
  EXPECT_NE(epoch_samples(other_seed, 3), epoch3);
}

// ---- sharding by rank (PyTorch's DistributedSampler with drop_last=False) ----

ncd::DataLoaderOptions sharded(int64_t batch_size, bool shuffle, int num_replicas, int rank, uint64_t seed = 5) {
  ncd::DataLoaderOptions o = options(batch_size, shuffle, seed);
  o.num_replicas = num_replicas;
  o.rank = rank;
  return o;
}

// One rank's epoch: its samples in order and its batches' sizes; every row's pixels are
// checked to be those of the sample its label names.
struct RankEpoch {
  std::vector<int64_t> samples;
  std::vector<int64_t> batch_sizes;
};

RankEpoch rank_epoch(ncd::DataLoader& loader, uint64_t epoch) {
  loader.begin_epoch(epoch);
  RankEpoch out;
  for (ncd::Batch batch; loader.next(batch);) {
    EXPECT_EQ(batch.index, static_cast<int64_t>(out.batch_sizes.size()));
    const std::vector<int64_t> labels = batch.targets.to_vector<int64_t>();
    const std::vector<float> pixels = batch.inputs.to_vector<float>();
    for (size_t r = 0; r < labels.size(); ++r)
      EXPECT_EQ(pixels[r * 6 + 5], normalized(static_cast<int>((31 * labels[r] + 5) % 256))) << labels[r];
    out.samples.insert(out.samples.end(), labels.begin(), labels.end());
    out.batch_sizes.push_back(static_cast<int64_t>(labels.size()));
  }
  return out;
}

TEST(DataLoader, ShardsInterleaveToThePaddedEpochOrder) {
  const int64_t batch_size = 3;
  for (int64_t n : {int64_t(1), int64_t(2), int64_t(13), int64_t(24)}) {
    for (bool shuffle : {false, true}) {
      ncd::DataLoader single(numbered(n), options(batch_size, shuffle, 5));
      for (int replicas : {1, 2, 3, 4, 5}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " shuffle " << shuffle << " num_replicas " << replicas);
        const int64_t share = (n + replicas - 1) / replicas;
        const int64_t padding = share * replicas - n;
        const int64_t batches = (share + batch_size - 1) / batch_size;
        for (uint64_t epoch : {0, 1}) {
          const std::vector<int64_t> order = epoch_samples(single, epoch);
          ASSERT_EQ(static_cast<int64_t>(order.size()), n);
          std::vector<RankEpoch> ranks;
          for (int rank = 0; rank < replicas; ++rank) {
            ncd::DataLoader loader(numbered(n), sharded(batch_size, shuffle, replicas, rank));
            EXPECT_EQ(loader.size(), share);
            EXPECT_EQ(loader.num_batches(), batches);
            ranks.push_back(rank_epoch(loader, epoch));
          }
          // Every rank: the same number of samples and batches, the same batch sizes.
          for (int rank = 0; rank < replicas; ++rank) {
            EXPECT_EQ(static_cast<int64_t>(ranks[rank].samples.size()), share) << rank;
            EXPECT_EQ(static_cast<int64_t>(ranks[rank].batch_sizes.size()), batches) << rank;
            EXPECT_EQ(ranks[rank].batch_sizes, ranks[0].batch_sizes) << rank;
          }
          // Position p of the padded order is element p / replicas of rank p % replicas.
          std::vector<int64_t> interleaved;
          for (int64_t p = 0; p < share * replicas; ++p)
            interleaved.push_back(ranks[p % replicas].samples[static_cast<size_t>(p / replicas)]);
          std::vector<int64_t> padded = order;
          for (int64_t p = n; p < share * replicas; ++p) padded.push_back(order[static_cast<size_t>(p % n)]);
          EXPECT_EQ(interleaved, padded);
          // Together the shares hold every sample once, plus the padding's repeats only.
          std::vector<int64_t> counts(static_cast<size_t>(n), 0);
          for (const RankEpoch& r : ranks)
            for (int64_t sample : r.samples) ++counts[static_cast<size_t>(sample)];
          int64_t repeats = 0;
          for (int64_t c : counts) {
            EXPECT_GE(c, 1);
            repeats += c - 1;
          }
          EXPECT_EQ(repeats, padding);
          if (padding < n) {  // the padding repeats the order's first samples, once each
            for (int64_t p = 0; p < n; ++p)
              EXPECT_EQ(counts[static_cast<size_t>(order[static_cast<size_t>(p)])], p < padding ? 2 : 1) << p;
          }
        }
      }
    }
  }
}

TEST(DataLoader, ShardsOfAKnownShuffle) {
  // The order of ShuffleIsPhiloxFisherYates (seed 42, epoch 0), padded with its first
  // samples to 12 for 3 and 4 replicas.
  struct Case {
    int num_replicas;
    std::vector<std::vector<int64_t>> shares;
  };
  const Case cases[] = {
      {1, {{4, 1, 6, 3, 7, 9, 0, 5, 2, 8}}},
      {2, {{4, 6, 7, 0, 2}, {1, 3, 9, 5, 8}}},
      {3, {{4, 3, 0, 8}, {1, 7, 5, 4}, {6, 9, 2, 1}}},
      {4, {{4, 7, 2}, {1, 9, 8}, {6, 0, 4}, {3, 5, 1}}},
  };
  for (const Case& c : cases) {
    for (int rank = 0; rank < c.num_replicas; ++rank) {
      SCOPED_TRACE(::testing::Message() << "num_replicas " << c.num_replicas << " rank " << rank);
      ncd::DataLoader loader(numbered(10), sharded(3, true, c.num_replicas, rank, 42));
      EXPECT_EQ(epoch_samples(loader, 0), c.shares[rank]);
    }
  }
}

TEST(DataLoader, OneReplicaIsTheUnshardedLoader) {
  const ncd::DataLoaderOptions defaults;
  EXPECT_EQ(defaults.num_replicas, 1);
  EXPECT_EQ(defaults.rank, 0);
  for (bool shuffle : {false, true}) {
    for (bool drop_last : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "shuffle " << shuffle << " drop_last " << drop_last);
      ncd::DataLoaderOptions plain = options(4, shuffle, 8);
      plain.drop_last = drop_last;
      ncd::DataLoaderOptions one = sharded(4, shuffle, 1, 0, 8);
      one.drop_last = drop_last;
      ncd::DataLoader a(numbered(23), plain);
      ncd::DataLoader b(numbered(23), one);
      EXPECT_EQ(b.size(), 23);
      EXPECT_EQ(b.num_batches(), a.num_batches());
      for (uint64_t epoch : {0, 1}) {
        a.begin_epoch(epoch);
        b.begin_epoch(epoch);
        int64_t batches = 0;
        for (ncd::Batch expected, got; a.next(expected); ++batches) {
          ASSERT_TRUE(b.next(got));
          EXPECT_EQ(got.index, expected.index);
          EXPECT_EQ(bytes_of(got.inputs), bytes_of(expected.inputs));
          EXPECT_EQ(bytes_of(got.targets), bytes_of(expected.targets));
        }
        ncd::Batch rest;
        EXPECT_FALSE(b.next(rest));
        EXPECT_EQ(batches, drop_last ? 5 : 6);
      }
    }
  }
}

TEST(DataLoader, DropLastDropsEachRanksIncompleteBatch) {
  // 10 samples over 3 ranks: 4 each (two of them padding); batches of 3 leave one of 1.
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(rank);
    ncd::DataLoaderOptions o = sharded(3, true, 3, rank);
    o.drop_last = true;
    ncd::DataLoader loader(numbered(10), o);
    EXPECT_EQ(loader.size(), 4);
    EXPECT_EQ(loader.num_batches(), 1);
    const RankEpoch epoch = rank_epoch(loader, 0);
    EXPECT_EQ(epoch.batch_sizes, (std::vector<int64_t>{3}));
    ncd::DataLoader whole(numbered(10), sharded(3, true, 3, rank));
    const std::vector<int64_t> share = epoch_samples(whole, 0);
    EXPECT_EQ(epoch.samples, std::vector<int64_t>(share.begin(), share.begin() + 3));
  }
}

TEST(DataLoader, Normalization) {
  // One image holding every pixel value.
  nc::Tensor images = nc::arange(256, nc::TensorOptions(nc::DType::U8)).reshape({1, 16, 16});
  const ncd::TensorDataset data(images, nc::zeros({1}, nc::TensorOptions(nc::DType::I64)));
  struct Case {
    float mean;
    float stddev;
  };
  for (const Case& c : {Case{ncd::kFashionMnistMean, ncd::kFashionMnistStd}, Case{0.5f, 0.25f}, Case{0, 1}}) {
    SCOPED_TRACE(c.mean);
    ncd::DataLoaderOptions o = options(1);
    o.transforms = {ncd::transforms::normalize({c.mean}, {c.stddev}), ncd::transforms::flatten()};
    ncd::DataLoader loader(data, o);
    loader.begin_epoch(0);
    ncd::Batch batch;
    ASSERT_TRUE(loader.next(batch));
    const std::vector<float> values = batch.inputs.to_vector<float>();
    ASSERT_EQ(values.size(), 256u);
    for (int v = 0; v < 256; ++v) EXPECT_FLOAT_EQ(values[v], normalized(v, c.mean, c.stddev)) << v;
  }
  EXPECT_NEAR(normalized(0), -0.2860 / 0.3530, 1e-6);
  EXPECT_NEAR(normalized(255), (1 - 0.2860) / 0.3530, 1e-6);
}

template <class E>
bool is(const nc::Error& e) {
  return dynamic_cast<const E*>(&e) != nullptr;
}

TEST(DataLoader, RejectsBadArguments) {
  struct Case {
    const char* name;
    std::function<void()> make;
    std::function<bool(const nc::Error&)> right_type;
    const char* reason;
  };
  const auto with = [](ncd::TensorDataset data, std::function<void(ncd::DataLoaderOptions&)> edit) {
    return [=] {
      ncd::DataLoaderOptions o = options(4);
      edit(o);
      ncd::DataLoader loader(data, o);
    };
  };
  const auto keep = [](ncd::DataLoaderOptions&) {};
  const ncd::TensorDataset good = numbered(10);
  const nc::Tensor labels = good.targets();
  const Case cases[] = {
      {"zero_batch", with(good, [](auto& o) { o.batch_size = 0; }), is<nc::ValueError>,
       "batch_size must be positive, got 0"},
      {"negative_batch", with(good, [](auto& o) { o.batch_size = -3; }), is<nc::ValueError>, "got -3"},
      {"empty", with(numbered(0), keep), is<nc::ValueError>, "the dataset is empty"},
      {"count_mismatch", [=] { ncd::TensorDataset(good.inputs(), nc::arange(9)); }, is<nc::ShapeError>,
       "10 inputs but 9 targets"},
      {"undefined_inputs", [=] { ncd::TensorDataset(nc::Tensor(), labels); }, is<nc::ValueError>,
       "inputs are an undefined tensor"},
      {"undefined_targets", [=] { ncd::TensorDataset(good.inputs(), nc::Tensor()); }, is<nc::ValueError>,
       "targets are an undefined tensor"},
      {"negative_workers", with(good, [](auto& o) { o.workers = -2; }), is<nc::ValueError>,
       "workers must not be negative, got -2"},
      {"drop_last_no_batch",
       with(good,
            [](auto& o) {
              o.batch_size = 11;
              o.drop_last = true;
            }),
       is<nc::ValueError>, "leaves no batch"},
      // 10 samples are enough for a batch of 4, a share of 10 over 3 ranks (4, padded) is not
      // enough for a batch of 5.
      {"drop_last_no_batch_per_rank",
       with(good,
            [](auto& o) {
              o.batch_size = 5;
              o.drop_last = true;
              o.num_replicas = 3;
              o.rank = 2;
            }),
       is<nc::ValueError>,
       "DataLoader: drop_last with 4 samples per rank (10 in the dataset, num_replicas 3) "
       "and batch_size 5 leaves no batch"},
      {"zero_replicas", with(good, [](auto& o) { o.num_replicas = 0; }), is<nc::ValueError>,
       "DataLoader: num_replicas must be positive, got 0"},
      {"negative_replicas",
       with(good,
            [](auto& o) {
              o.num_replicas = -2;
              o.rank = -1;
            }),
       is<nc::ValueError>, "DataLoader: num_replicas must be positive, got -2"},
      {"negative_rank",
       with(good,
            [](auto& o) {
              o.num_replicas = 2;
              o.rank = -1;
            }),
       is<nc::ValueError>, "DataLoader: rank -1 is outside [0, num_replicas) for num_replicas 2"},
      {"rank_is_num_replicas",
       with(good,
            [](auto& o) {
              o.num_replicas = 2;
              o.rank = 2;
            }),
       is<nc::ValueError>, "DataLoader: rank 2 is outside [0, num_replicas) for num_replicas 2"},
      {"rank_without_replicas", with(good, [](auto& o) { o.rank = 1; }), is<nc::ValueError>,
       "DataLoader: rank 1 is outside [0, num_replicas) for num_replicas 1"},
      {"missing_gpu", with(good, [](auto& o) { o.device = nc::Device::cuda(99); }), is<nc::DeviceError>,
       "cuda:99 does not exist"},
      {"next_before_epoch",
       [=] {
         ncd::DataLoader loader(good, options(4));
         ncd::Batch batch;
         loader.next(batch);
       },
       is<nc::ValueError>, "call begin_epoch(epoch) first"},
      {"epoch_too_large", [=] { ncd::DataLoader(good, options(4)).begin_epoch(uint64_t(1) << 32); }, is<nc::ValueError>,
       "is not below 2^32"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    try {
      c.make();
      ADD_FAILURE() << "expected an error with \"" << c.reason << "\"";
    } catch (const nc::Error& e) {
      EXPECT_TRUE(c.right_type(e)) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.reason), std::string::npos) << e.what();
    }
  }
}

// A transform that throws for a sample whose target is negative.
ncd::Transform reject_negative_targets() {
  return [](ncd::Example sample, ncd::SampleRandom&) {
    const int64_t target = sample.target.item<int64_t>();
    if (target < 0) throw nc::ValueError("transform: negative target " + std::to_string(target));
    return sample;
  };
}

TEST(DataLoader, TransformErrorsReachTheCaller) {
  // Sample 25's target is made negative: it lands in the third batch of 10. The batches
  // made before the failure come first, with any number of workers.
  ncd::TensorDataset numbers = numbered(40);
  const ncd::TensorDataset data(numbers.inputs(),
                                nc::where(nc::eq(numbers.targets(), int64_t(25)), int64_t(-1), numbers.targets()));
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE(workers);
    ncd::DataLoaderOptions o = options(10);
    o.workers = workers;
    o.transforms.push_back(reject_negative_targets());
    ncd::DataLoader loader(data, o);
    for (uint64_t epoch : {0, 1}) {  // the next epoch starts cleanly after the failure
      loader.begin_epoch(epoch);
      ncd::Batch batch;
      ASSERT_TRUE(loader.next(batch));
      ASSERT_TRUE(loader.next(batch));
      EXPECT_EQ(batch.index, 1);
      try {
        loader.next(batch);
        ADD_FAILURE() << "expected the transform's ValueError";
      } catch (const nc::ValueError& e) {
        EXPECT_STREQ(e.what(), "transform: negative target -1");
      }
      EXPECT_FALSE(loader.next(batch));  // the failure ended the epoch
    }
  }
}

TEST(DataLoader, ForeignExceptionTypesSurvive) {
  ncd::DataLoaderOptions o = options(4);
  o.transforms.push_back(
      [](ncd::Example, ncd::SampleRandom&) -> ncd::Example { throw std::out_of_range("from the transform"); });
  ncd::DataLoader loader(numbered(8), o);
  loader.begin_epoch(0);
  ncd::Batch batch;
  EXPECT_THROW(loader.next(batch), std::out_of_range);
}

TEST(DataLoader, TransformsRunOnTheWorkersAndTheirEditsArrive) {
  const std::thread::id caller = std::this_thread::get_id();
  std::mutex mutex;
  std::vector<std::thread::id> threads;
  ncd::DataLoaderOptions o = options(4);
  o.workers = 2;
  o.transforms.push_back([&](ncd::Example sample, ncd::SampleRandom&) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      threads.push_back(std::this_thread::get_id());
    }
    sample.input = nc::zeros_like(sample.input);
    return sample;
  });
  ncd::DataLoader loader(numbered(8), o);
  loader.begin_epoch(0);
  for (ncd::Batch batch; loader.next(batch);) EXPECT_EQ(nc::max(batch.inputs).item<float>(), 0.0f);
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(threads.size(), 8u);
  for (const auto& id : threads) EXPECT_NE(id, caller);
}

TEST(DataLoader, RestartingMidEpochBeginsAfresh) {
  ncd::DataLoader reference(numbered(100), options(8, true, 11));
  const std::vector<int64_t> epoch1 = epoch_samples(reference, 1);
  ncd::DataLoader loader(numbered(100), options(8, true, 11));
  loader.begin_epoch(0);
  ncd::Batch batch;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next(batch));
  EXPECT_EQ(epoch_samples(loader, 1), epoch1);
  loader.begin_epoch(2);
  ASSERT_TRUE(loader.next(batch));
  EXPECT_EQ(batch.index, 0);
}

TEST(DataLoader, DestructionStopsTheThreadAtAnyPoint) {
  const ncd::TensorDataset data = numbered(1000);
  { ncd::DataLoader never_started(data, options(1)); }
  {
    ncd::DataLoader loader(data, options(1));
    loader.begin_epoch(0);
  }  // queue filling up
  {
    ncd::DataLoader loader(data, options(1));
    loader.begin_epoch(0);
    ncd::Batch batch;
    ASSERT_TRUE(loader.next(batch));
    ASSERT_TRUE(loader.next(batch));
  }
  {
    // The workers are inside a slow transform when the loader goes away.
    ncd::DataLoaderOptions o = options(1);
    o.workers = 3;
    o.transforms.push_back([](ncd::Example sample, ncd::SampleRandom&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return sample;
    });
    ncd::DataLoader loader(data, o);
    loader.begin_epoch(0);
    ncd::Batch batch;
    ASSERT_TRUE(loader.next(batch));
  }
  {
    ncd::DataLoaderOptions o = options(10);
    o.transforms.push_back(
        [](ncd::Example, ncd::SampleRandom&) -> ncd::Example { throw std::runtime_error("never read"); });
    ncd::DataLoader failed_unread(data, o);
    failed_unread.begin_epoch(0);
  }
}

TEST(DataLoader, FullFashionMnistEpochCoversEverySample) {
  SKIP_WITHOUT_FASHION_MNIST();
  const ncd::TensorDataset& train = fashion_mnist(true);
  ncd::DataLoaderOptions o = options(128, true, 0);
  o.transforms.push_back(ncd::transforms::flatten());
  ncd::DataLoader loader(train, o);
  EXPECT_EQ(loader.num_batches(), 469);
  loader.begin_epoch(0);
  int64_t batches = 0, samples = 0;
  double sum = 0, sum_squares = 0;
  std::vector<int64_t> histogram(10, 0);
  for (ncd::Batch batch; loader.next(batch); ++batches) {
    ASSERT_EQ(batch.inputs.size(1), 784);
    samples += batch.targets.numel();
    for (int64_t l : batch.targets.to_vector<int64_t>()) ++histogram[l];
    for (float v : batch.inputs.to_vector<float>()) {
      sum += v;
      sum_squares += double(v) * v;
    }
  }
  EXPECT_EQ(batches, 469);
  EXPECT_EQ(samples, 60000);
  EXPECT_EQ(histogram, std::vector<int64_t>(10, 6000));
  // The constants are the training set's own statistics (mean 0.28604, std 0.35302).
  const double count = 60000.0 * 784;
  EXPECT_NEAR(sum / count, 0.000115, 1e-5);
  EXPECT_NEAR(std::sqrt(sum_squares / count - (sum / count) * (sum / count)), 1.0000687, 1e-5);
}

TEST(DataLoader, CudaBatchesMatchCpuBatches) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const ncd::TensorDataset data = numbered(300, {28, 28});
  ncd::DataLoaderOptions o = options(32, true, 9);
  o.transforms = {ncd::transforms::random_crop(26, 26, 1), ncd::transforms::random_horizontal_flip(),
                  ncd::transforms::normalize()};
  ncd::DataLoader cpu(data, o);
  o.device = nc::Device::cuda(0);
  o.workers = 3;
  ncd::DataLoader gpu(data, o);
  for (uint64_t epoch : {0, 1}) {
    cpu.begin_epoch(epoch);
    gpu.begin_epoch(epoch);
    ncd::Batch expected, got;
    int64_t batches = 0;
    while (cpu.next(expected)) {
      ASSERT_TRUE(gpu.next(got));
      EXPECT_EQ(got.inputs.device(), nc::Device::cuda(0));
      EXPECT_EQ(got.targets.device(), nc::Device::cuda(0));
      EXPECT_EQ(bytes_of(got.inputs), bytes_of(expected.inputs));
      EXPECT_EQ(bytes_of(got.targets), bytes_of(expected.targets));
      ++batches;
    }
    EXPECT_FALSE(gpu.next(got));
    EXPECT_EQ(batches, gpu.num_batches());
  }
  gpu.begin_epoch(2);  // destroyed with uploads in flight and batches queued
  ncd::Batch batch;
  ASSERT_TRUE(gpu.next(batch));
}

// ---- any dataset, several workers, per-sample transforms ----

// One epoch's batches: index, then the bytes of inputs and targets.
struct EpochBytes {
  std::vector<int64_t> indices;
  std::vector<Bytes> inputs, targets;
  bool operator==(const EpochBytes& o) const {
    return indices == o.indices && inputs == o.inputs && targets == o.targets;
  }
};

EpochBytes epoch_bytes(ncd::DataLoader& loader, uint64_t epoch, int64_t first_batch = 0) {
  loader.begin_epoch(epoch, first_batch);
  EpochBytes out;
  for (ncd::Batch batch; loader.next(batch);) {
    out.indices.push_back(batch.index);
    out.inputs.push_back(bytes_of(batch.inputs));
    out.targets.push_back(bytes_of(batch.targets));
  }
  return out;
}

ncd::DataLoaderOptions augmenting(int64_t batch_size, int workers, int num_replicas = 1, int rank = 0) {
  ncd::DataLoaderOptions o = sharded(batch_size, true, num_replicas, rank, 21);
  o.workers = workers;
  o.transforms = {ncd::transforms::random_crop(5, 4, 2), ncd::transforms::random_horizontal_flip(),
                  ncd::transforms::normalize()};
  return o;
}

TEST(DataLoader, TheSameBatchesForAnyNumberOfWorkers) {
  const ncd::TensorDataset data = numbered(203, {3, 6, 5});
  for (int replicas : {1, 2}) {
    for (int rank = 0; rank < replicas; ++rank) {
      SCOPED_TRACE(::testing::Message() << "num_replicas " << replicas << " rank " << rank);
      ncd::DataLoader one(data, augmenting(16, 1, replicas, rank));
      const EpochBytes epoch0 = epoch_bytes(one, 0), epoch1 = epoch_bytes(one, 1);
      ASSERT_EQ(static_cast<int64_t>(epoch0.inputs.size()), one.num_batches());
      EXPECT_NE(epoch0.inputs, epoch1.inputs);  // each epoch draws its own crops and flips
      for (int workers : {0, 2, 4}) {
        SCOPED_TRACE(workers);
        ncd::DataLoader loader(data, augmenting(16, workers, replicas, rank));
        EXPECT_TRUE(epoch_bytes(loader, 0) == epoch0);
        EXPECT_TRUE(epoch_bytes(loader, 1) == epoch1);
      }
    }
  }
}

// ---- batches gathered at once (Dataset::get_batch) and batch transforms ----

TEST(DataLoader, GatheredBatchesAreTheSamplesBatches) {
  const ncd::TensorDataset data = numbered(203, {6, 5});
  // get_batch gives what get() gives, stacked; an index outside the dataset is named.
  const std::optional<ncd::Example> rows = data.get_batch({7, 0, 202, 7});
  ASSERT_TRUE(rows.has_value());
  EXPECT_EQ(rows->input.shape(), (nc::Shape{4, 6, 5}));
  const std::vector<int64_t> picked = {7, 0, 202, 7};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(bytes_of(rows->input.select(0, i)), bytes_of(data.get(picked[static_cast<size_t>(i)]).input));
    EXPECT_EQ(bytes_of(rows->target.select(0, i)), bytes_of(data.get(picked[static_cast<size_t>(i)]).target));
  }
  throws<nc::IndexError>([&] { data.get_batch({3, 203}); }, {"TensorDataset::get_batch", "203", "[0, 203)"})();
  // The loader's batches: per-sample normalize() and gathered batches with normalize_batch()
  // hold the same bytes, for any number of workers and ranks.
  for (int replicas : {1, 2}) {
    ncd::DataLoaderOptions per_sample = sharded(16, true, replicas, replicas - 1, 23);
    per_sample.transforms = {ncd::transforms::normalize()};
    ncd::DataLoader reference(data, per_sample);
    const EpochBytes expected = epoch_bytes(reference, 3);
    for (int workers : {0, 1, 3}) {
      SCOPED_TRACE(::testing::Message() << "num_replicas " << replicas << ", workers " << workers);
      ncd::DataLoaderOptions gathered = sharded(16, true, replicas, replicas - 1, 23);
      gathered.workers = workers;
      gathered.transforms.clear();
      gathered.batch_transforms = {ncd::transforms::normalize_batch()};
      ncd::DataLoader loader(data, gathered);
      EXPECT_TRUE(epoch_bytes(loader, 3) == expected);
    }
  }
}

// A dataset without get_batch: the loader stacks its samples, then runs the batch
// transforms; they also run after per-sample transforms.
TEST(DataLoader, BatchTransformsFollowStackingAndSampleTransforms) {
  struct Squares : ncd::Dataset {
    int64_t size() const override { return 10; }
    ncd::Example get(int64_t i) const override {
      return {nc::full({2, 2}, static_cast<double>(i * i), nc::TensorOptions(nc::DType::F32)),
              nc::full({}, i, nc::TensorOptions(nc::DType::I64))};
    }
  };
  ncd::DataLoaderOptions o = options(4);
  o.batch_transforms = {[](ncd::Batch b) {
    b.targets = nc::mul(b.targets, nc::Scalar(int64_t{10}));
    return b;
  }};
  o.transforms = {[](ncd::Example e, ncd::SampleRandom&) {
    e.input = nc::add(e.input, nc::Scalar(1.0));
    return e;
  }};
  ncd::DataLoader loader(std::make_shared<const Squares>(), o);
  loader.begin_epoch(0);
  ncd::Batch batch;
  ASSERT_TRUE(loader.next(batch));
  EXPECT_EQ(batch.targets.to_vector<int64_t>(), (std::vector<int64_t>{0, 10, 20, 30}));
  EXPECT_EQ(batch.inputs.select(0, 3).to_vector<float>(), std::vector<float>(4, 10.0f));
  // normalize_batch names its op and what is wrong.
  ncd::Batch flat{nc::zeros({4, 5}, nc::TensorOptions(nc::DType::U8)), nc::zeros({4}), 0};
  throws<nc::ShapeError>([&] { ncd::transforms::normalize_batch()(flat); },
                         {"normalize_batch", "[B, H, W] or [B, C, H, W]", "[4, 5]"})();
  ncd::Batch wrong{nc::zeros({4, 3, 5, 5}, nc::TensorOptions(nc::DType::U8)), nc::zeros({4}), 0};
  throws<nc::ShapeError>(
      [&] {
        ncd::transforms::normalize_batch({0.5f, 0.5f}, {1, 1})(wrong);
      },
      {"normalize_batch", "2 means", "3 channels"})();
  o.batch_transforms = {nullptr};
  throws<nc::ValueError>([&] { ncd::DataLoader bad(std::make_shared<const Squares>(), o); },
                         {"DataLoader", "batch transform 0", "empty"})();
}

TEST(DataLoader, CudaGatheredBatchesMatchCpuBatches) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const ncd::TensorDataset data = numbered(300, {28, 28});
  // Gathered batches, normalized whole, staged through page-locked memory: the CPU's bytes.
  ncd::DataLoaderOptions g = options(32, true, 9);
  g.transforms.clear();
  g.batch_transforms = {ncd::transforms::normalize_batch()};
  ncd::DataLoader gathered_cpu(data, g);
  g.device = nc::Device::cuda(0);
  g.workers = 2;
  ncd::DataLoader gathered_gpu(data, g);
  const EpochBytes on_cpu = epoch_bytes(gathered_cpu, 4), on_gpu = epoch_bytes(gathered_gpu, 4);
  EXPECT_TRUE(on_gpu == on_cpu);
  EXPECT_EQ(static_cast<int64_t>(on_gpu.inputs.size()), gathered_gpu.num_batches());
}

TEST(DataLoader, BeginEpochAtABatchResumesTheEpoch) {
  const ncd::TensorDataset data = numbered(50, {4, 4});
  ncd::DataLoader loader(data, augmenting(6, 2));
  const EpochBytes whole = epoch_bytes(loader, 3);
  ASSERT_EQ(whole.indices.size(), 9u);
  for (int64_t first : {0, 1, 5, 8, 9}) {
    SCOPED_TRACE(first);
    const EpochBytes rest = epoch_bytes(loader, 3, first);
    EXPECT_EQ(rest.indices, std::vector<int64_t>(whole.indices.begin() + first, whole.indices.end()));
    EXPECT_EQ(rest.inputs, std::vector<Bytes>(whole.inputs.begin() + first, whole.inputs.end()));
    EXPECT_EQ(rest.targets, std::vector<Bytes>(whole.targets.begin() + first, whole.targets.end()));
  }
}

TEST(DataLoader, SampleRandomDependsOnSeedEpochAndPositionOnly) {
  const auto draws = [](uint64_t seed, uint64_t epoch, uint64_t position) {
    ncd::SampleRandom random(seed, epoch, position);
    std::vector<uint32_t> out;
    for (int i = 0; i < 9; ++i) out.push_back(random.bits());  // past one Philox block
    return out;
  };
  EXPECT_EQ(draws(1, 2, 3), draws(1, 2, 3));
  EXPECT_NE(draws(1, 2, 3), draws(1, 2, 4));
  EXPECT_NE(draws(1, 2, 3), draws(1, 3, 3));
  EXPECT_NE(draws(1, 2, 3), draws(2, 2, 3));
  ncd::SampleRandom random(5, 0, 0);
  std::vector<int64_t> counts(7, 0);
  double sum = 0;
  for (int i = 0; i < 7000; ++i) {
    const int64_t k = random.integer(-3, 4);
    ASSERT_GE(k, -3);
    ASSERT_LT(k, 4);
    ++counts[static_cast<size_t>(k + 3)];
    const double u = random.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  for (int64_t c : counts) EXPECT_NEAR(c, 1000, 150);  // about 5 standard deviations
  EXPECT_NEAR(sum / 7000, 0.5, 0.02);
}

// A 2-channel u8 image whose pixel (c, y, x) is 100 c + 10 y + x + 1 (never 0).
nc::Tensor coded_image(int64_t height, int64_t width) {
  std::vector<uint8_t> values;
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t y = 0; y < height; ++y)
      for (int64_t x = 0; x < width; ++x) values.push_back(static_cast<uint8_t>(100 * c + 10 * y + x + 1));
  return nc::from_vector(values, {2, height, width});
}

ncd::Example apply(const ncd::Transform& transform, const nc::Tensor& input, uint64_t position) {
  ncd::SampleRandom random(0, 0, position);
  return transform(ncd::Example{input, nc::zeros({})}, random);
}

TEST(DataTransforms, RandomCropIsAWindowOfThePaddedImage) {
  const nc::Tensor image = coded_image(4, 5);
  const std::vector<uint8_t> pixels = image.to_vector<uint8_t>();
  const auto padded = [&](int64_t c, int64_t y, int64_t x) -> uint8_t {  // padding 1
    y -= 1;
    x -= 1;
    if (y < 0 || y >= 4 || x < 0 || x >= 5) return 0;
    return pixels[static_cast<size_t>((c * 4 + y) * 5 + x)];
  };
  const ncd::Transform crop = ncd::transforms::random_crop(3, 4, 1);
  std::vector<int64_t> seen(4 * 4, 0);  // (top, left) of the padded 6 x 7 image
  for (uint64_t position = 0; position < 400; ++position) {
    const nc::Tensor out = apply(crop, image, position).input;
    ASSERT_EQ(out.shape(), (nc::Shape{2, 3, 4}));
    ASSERT_EQ(out.dtype(), nc::DType::U8);
    const std::vector<uint8_t> got = out.to_vector<uint8_t>();
    int matches = 0;
    for (int64_t top = 0; top < 4; ++top)
      for (int64_t left = 0; left < 4; ++left) {
        bool same = true;
        for (int64_t c = 0; c < 2; ++c)
          for (int64_t y = 0; y < 3; ++y)
            for (int64_t x = 0; x < 4; ++x)
              same = same && got[static_cast<size_t>((c * 3 + y) * 4 + x)] == padded(c, top + y, left + x);
        if (same) {
          ++seen[static_cast<size_t>(top * 4 + left)];
          ++matches;
        }
      }
    ASSERT_EQ(matches, 1) << "position " << position;  // pixels are unique, so one place fits
  }
  for (int64_t count : seen) EXPECT_GT(count, 5);  // every place is drawn (25 expected)
  // Without padding, a crop the image's size is the image; a 2-D image stays 2-D.
  EXPECT_EQ(bytes_of(apply(ncd::transforms::random_crop(4, 5), image, 3).input), bytes_of(image));
  const nc::Tensor plane = image.select(0, 1);
  EXPECT_EQ(apply(ncd::transforms::random_crop(2, 2, 0), plane, 3).input.shape(), (nc::Shape{2, 2}));
  EXPECT_THROW(apply(ncd::transforms::random_crop(7, 2, 1), image, 0), nc::ShapeError);
}

TEST(DataTransforms, RandomHorizontalFlipMirrorsRows) {
  const nc::Tensor image = coded_image(3, 4).to(nc::DType::F32);
  const std::vector<float> pixels = image.to_vector<float>();
  std::vector<float> mirrored(pixels.size());
  for (int64_t row = 0; row < 6; ++row)
    for (int64_t x = 0; x < 4; ++x)
      mirrored[static_cast<size_t>(row * 4 + x)] = pixels[static_cast<size_t>(row * 4 + 3 - x)];
  for (double p : {0.0, 0.5, 1.0}) {
    SCOPED_TRACE(p);
    const ncd::Transform flip = ncd::transforms::random_horizontal_flip(p);
    int flipped = 0;
    for (uint64_t position = 0; position < 1000; ++position) {
      const std::vector<float> got = apply(flip, image, position).input.to_vector<float>();
      if (got == mirrored) ++flipped;
      else ASSERT_EQ(got, pixels);
    }
    EXPECT_NEAR(flipped, 1000 * p, 80);  // 5 standard deviations at p = 0.5
  }
}

TEST(DataTransforms, NormalizePerChannel) {
  const nc::Tensor image = coded_image(2, 2);  // u8 [2, 2, 2]
  const ncd::Transform normalize = ncd::transforms::normalize({0.1f, 0.5f}, {0.2f, 0.25f});
  const ncd::Example out = apply(normalize, image, 0);
  ASSERT_EQ(out.input.shape(), (nc::Shape{2, 2, 2}));
  ASSERT_EQ(out.input.dtype(), nc::DType::F32);
  const std::vector<uint8_t> pixels = image.to_vector<uint8_t>();
  const std::vector<float> got = out.input.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) {
    const float mean = i < 4 ? 0.1f : 0.5f, stddev = i < 4 ? 0.2f : 0.25f;
    EXPECT_FLOAT_EQ(got[i], (pixels[i] / 255.0f - mean) / stddev) << i;
  }
  // f32 images are taken as they are; a 2-D one gets its channel.
  const nc::Tensor f32 = nc::from_vector(std::vector<float>{0.5f, 1.5f}, {1, 2});
  const nc::Tensor one = apply(ncd::transforms::normalize({0.5f}, {2.0f}), f32, 0).input;
  EXPECT_EQ(one.shape(), (nc::Shape{1, 1, 2}));
  EXPECT_EQ(one.to_vector<float>(), (std::vector<float>{0.0f, 0.5f}));
  EXPECT_THROW(apply(normalize, coded_image(2, 2).to(nc::DType::I32), 0), nc::DTypeError);
  EXPECT_THROW(apply(ncd::transforms::normalize({0, 0, 0}, {1, 1, 1}), image, 0), nc::ShapeError);
  EXPECT_THROW(apply(normalize, nc::zeros({4}, nc::TensorOptions(nc::DType::U8)), 0), nc::ShapeError);
}

// A dataset computed on the fly: sample i is input f32 [i, 2 i] and target i.
class Computed : public ncd::Dataset {
 public:
  explicit Computed(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  ncd::Example get(int64_t index) const override {
    const float v = static_cast<float>(index);
    return {nc::from_vector(std::vector<float>{v, 2 * v}, {2}), nc::from_vector(std::vector<int64_t>{index}, {})};
  }

 private:
  int64_t n_;
};

TEST(DataLoader, AnyDatasetAndCollate) {
  ncd::DataLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  o.workers = 3;
  ncd::DataLoader loader(Computed(10), o);
  loader.begin_epoch(0);
  ncd::Batch batch;
  ASSERT_TRUE(loader.next(batch));
  ASSERT_TRUE(loader.next(batch));
  EXPECT_EQ(batch.inputs.shape(), (nc::Shape{4, 2}));
  EXPECT_EQ(batch.inputs.to_vector<float>(), (std::vector<float>{4, 8, 5, 10, 6, 12, 7, 14}));
  EXPECT_EQ(batch.targets.to_vector<int64_t>(), (std::vector<int64_t>{4, 5, 6, 7}));
  // A collate of one's own: the inputs summed per batch, the first target.
  o.collate = [](const std::vector<ncd::Example>& samples) {
    ncd::Batch b = ncd::collate(samples);
    b.inputs = nc::sum(b.inputs, {0});
    b.targets = b.targets.narrow(0, 0, 1);
    return b;
  };
  ncd::DataLoader summing(std::make_shared<Computed>(10), o);
  summing.begin_epoch(0);
  std::vector<float> sums;
  for (ncd::Batch b; summing.next(b);) {
    const std::vector<float> v = b.inputs.to_vector<float>();
    sums.insert(sums.end(), v.begin(), v.end());
  }
  EXPECT_EQ(sums, (std::vector<float>{6, 12, 22, 44, 17, 34}));
  // A collate that gives nothing is named.
  o.collate = [](const std::vector<ncd::Example>&) { return ncd::Batch(); };
  ncd::DataLoader empty(Computed(10), o);
  empty.begin_epoch(0);
  try {
    empty.next(batch);
    ADD_FAILURE() << "expected a ValueError";
  } catch (const nc::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("collate gave batch 0 an undefined inputs tensor"), std::string::npos)
        << e.what();
  }
}

TEST(DataLoader, UnlikeSamplesAreNamedWhenStacked) {
  const ncd::TensorDataset data = numbered(6, {4, 4});
  ncd::DataLoaderOptions o = options(3);
  // Sample 4 loses a row: the second batch cannot be stacked.
  o.transforms.push_back([](ncd::Example sample, ncd::SampleRandom&) {
    if (sample.target.item<int64_t>() == 4) sample.input = sample.input.narrow(1, 0, 3);
    return sample;
  });
  ncd::DataLoader loader(data, o);
  loader.begin_epoch(0);
  ncd::Batch batch;
  ASSERT_TRUE(loader.next(batch));
  try {
    loader.next(batch);
    ADD_FAILURE() << "expected a ShapeError";
  } catch (const nc::ShapeError& e) {
    EXPECT_NE(
        std::string(e.what()).find("collate: sample 1's input is f32 [1, 3, 4] cpu, sample 0's is f32 [1, 4, 4] cpu"),
        std::string::npos)
        << e.what();
  }
}

TEST(DataText, WindowsOfAStream) {
  const ncd::TextWindows windows("abcdefg", 3);
  EXPECT_EQ(windows.size(), 4);
  const ncd::Example first = windows.get(0), last = windows.get(3);
  EXPECT_EQ(first.input.dtype(), nc::DType::I64);
  EXPECT_EQ(first.input.to_vector<int64_t>(), (std::vector<int64_t>{'a', 'b', 'c'}));
  EXPECT_EQ(first.target.to_vector<int64_t>(), (std::vector<int64_t>{'b', 'c', 'd'}));
  EXPECT_EQ(last.input.to_vector<int64_t>(), (std::vector<int64_t>{'d', 'e', 'f'}));
  EXPECT_EQ(last.target.to_vector<int64_t>(), (std::vector<int64_t>{'e', 'f', 'g'}));
  // Bytes above 127 are tokens 128 to 255, not negative.
  EXPECT_EQ(ncd::TextWindows(std::string("\xff\x80x", 3), 1).get(0).input.to_vector<int64_t>(),
            (std::vector<int64_t>{255}));
  // Through the loader: every window once per epoch, in batches [B, context].
  ncd::DataLoaderOptions o;
  o.batch_size = 3;
  o.seed = 4;
  o.workers = 2;
  ncd::DataLoader loader(ncd::TextWindows("abcdefghij", 4), o);  // 6 windows
  loader.begin_epoch(0);
  std::vector<int64_t> starts;
  for (ncd::Batch batch; loader.next(batch);) {
    ASSERT_EQ(batch.inputs.shape(), (nc::Shape{3, 4}));
    ASSERT_EQ(batch.targets.shape(), (nc::Shape{3, 4}));
    const std::vector<int64_t> in = batch.inputs.to_vector<int64_t>(), out = batch.targets.to_vector<int64_t>();
    for (size_t r = 0; r < 3; ++r) {
      starts.push_back(in[r * 4] - 'a');
      for (size_t t = 0; t < 4; ++t) {
        EXPECT_EQ(in[r * 4 + t], 'a' + starts.back() + static_cast<int64_t>(t));
        EXPECT_EQ(out[r * 4 + t], in[r * 4 + t] + 1);
      }
    }
  }
  std::sort(starts.begin(), starts.end());
  EXPECT_EQ(starts, iota(6));
}

}  // namespace
