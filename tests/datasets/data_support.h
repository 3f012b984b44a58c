// What the data tests share (test_data.cpp, test_data_loader.cpp, test_data_batches.cpp):
// the Fashion-MNIST files when Debian's package is installed, a tensor's bytes, a numbered
// dataset whose labels name their samples, and the loader options the tests start from.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <numeric>
#include <vector>

#include "normcore/data.h"
#include "normcore/ops.h"
#include "normcore/tensor.h"

namespace data_test {

namespace nc = normcore;
namespace ncd = normcore::data;
namespace fs = std::filesystem;

using Bytes = std::vector<uint8_t>;

inline const char* const kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// The tensor's elements in row-major order as raw bytes.
inline Bytes bytes_of(const nc::Tensor& t) {
  const nc::Tensor host = t.to(nc::Device::cpu()).contiguous();
  const uint8_t* data = static_cast<const uint8_t*>(host.data_ptr());
  return Bytes(data, data + host.nbytes());
}

inline bool have_fashion_mnist() {
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                           "t10k-labels-idx1-ubyte.gz"})
    if (!fs::exists(fs::path(kFashionMnistDir) / name)) return false;
  return true;
}

// Loaded once: decompressing the training images takes a noticeable fraction of a second.
inline const ncd::TensorDataset& fashion_mnist(bool train) {
  static const ncd::TensorDataset train_set = ncd::load_fashion_mnist(kFashionMnistDir, true);
  static const ncd::TensorDataset test_set = ncd::load_fashion_mnist(kFashionMnistDir, false);
  return train ? train_set : test_set;
}

// n samples of shape sample_shape; pixel k of sample i is (31 i + k) mod 256 and its label
// is i, so a batch's labels say which samples it holds.
inline ncd::TensorDataset numbered(int64_t n, const nc::Shape& sample_shape = {2, 3}) {
  nc::Shape shape = {n};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  nc::Tensor images = nc::empty(shape, nc::TensorOptions(nc::DType::U8));
  const int64_t row = n ? images.numel() / n : 0;
  uint8_t* pixels = images.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < row; ++k) pixels[i * row + k] = static_cast<uint8_t>((31 * i + k) % 256);
  return ncd::TensorDataset(images, nc::arange(n));
}

inline float normalized(int v, float mean = ncd::kFashionMnistMean, float stddev = ncd::kFashionMnistStd) {
  return (static_cast<float>(v) / 255.0f - mean) / stddev;
}

// Fashion-MNIST's normalization, as training uses it.
inline ncd::DataLoaderOptions options(int64_t batch_size, bool shuffle = false, uint64_t seed = 0) {
  ncd::DataLoaderOptions o;
  o.batch_size = batch_size;
  o.shuffle = shuffle;
  o.seed = seed;
  o.transforms = {ncd::transforms::normalize()};
  return o;
}

// The sample indices of one epoch, in the order the loader gave them.
inline std::vector<int64_t> epoch_samples(ncd::DataLoader& loader, uint64_t epoch) {
  loader.begin_epoch(epoch);
  std::vector<int64_t> samples;
  for (ncd::Batch batch; loader.next(batch);) {
    const std::vector<int64_t> labels = batch.targets.to_vector<int64_t>();
    samples.insert(samples.end(), labels.begin(), labels.end());
  }
  return samples;
}

inline std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t(0));
  return v;
}

inline ncd::DataLoaderOptions sharded(int64_t batch_size, bool shuffle, int num_replicas, int rank, uint64_t seed = 5) {
  ncd::DataLoaderOptions o = options(batch_size, shuffle, seed);
  o.num_replicas = num_replicas;
  o.rank = rank;
  return o;
}

}  // namespace data_test

#define SKIP_WITHOUT_FASHION_MNIST()    \
  if (!data_test::have_fashion_mnist()) \
  GTEST_SKIP() << "Fashion-MNIST is not installed in " << data_test::kFashionMnistDir
