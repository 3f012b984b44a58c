// The DataLoader over any dataset: several workers, per-sample and batch transforms,
// batches gathered at once, resuming mid-epoch, collate, and text windows.
#include <gtest/gtest.h>
#include <unistd.h>

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

using namespace data_test;
using normcore_test::throws;

namespace {

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
