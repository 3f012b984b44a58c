// The DataLoader: batching, ordering, sharding by rank, normalization, error propagation,
// shutdown, and CUDA batches against CPU batches.
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

// ---- DataLoader ----

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

}  // namespace
