// Data loading: the IDX file format (MNIST, Fashion-MNIST), the Fashion-MNIST dataset, and a
// DataLoader that batches, shuffles, normalizes and (for data-parallel training) shards a
// dataset on a background thread.
// Readers validate everything before allocating from a size the file states and throw
// IOError naming the file and the defect. Loaded tensors live on the CPU and own their memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "normcore/device.h"
#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace data {

// Reads an IDX file, gzip-compressed or plain (told apart by the first two bytes).
// The tensor has the stored shape and the dtype of the type code: 0x08 -> u8, 0x0C -> i32,
// 0x0D -> f32, 0x0E -> f64 (big-endian in the file). Signed 8- and 16-bit data, 0 or more
// than 8 dims, more than 4 GiB of data, missing or extra data bytes, and a corrupted,
// truncated or trailing-garbage gzip stream are IOErrors.
Tensor read_idx(const std::string& path);

// Images u8 [N, H, W] or [N, C, H, W]; labels i64 [N].
struct Dataset {
  Tensor images;
  Tensor labels;
};

// Fashion-MNIST's training (train = true: 60000 samples) or test split (10000) from dir,
// which holds {train,t10k}-{images-idx3,labels-idx1}-ubyte, each gzip-compressed (".gz")
// or plain. Images u8 [N, 28, 28], labels i64 [N] in [0, 10). Throws IOError naming the
// file when a file is unreadable, has another shape or dtype, or a label is 10 or more.
Dataset load_fashion_mnist(const std::string& dir, bool train);

// Fashion-MNIST's training-set pixel mean and standard deviation (of x / 255).
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;

// One batch: images f32 [B, C, H, W] (C = 1 for [N, H, W] datasets) or [B, C*H*W] when
// flattened, labels i64 [B], both on the loader's device; index counts batches in the epoch.
struct Batch {
  Tensor images;
  Tensor labels;
  int64_t index = 0;
};

struct DataLoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  // Drop the last batch of this rank's share when it would be smaller than batch_size.
  bool drop_last = false;
  // The processes of a data-parallel job: num_replicas is the world size, rank this process's
  // place in it. As PyTorch's DistributedSampler with drop_last=False: each epoch's order
  // (the same on every rank, given the same seed) is padded by repeating its first samples,
  // cyclically, to a multiple of num_replicas, and rank r takes its positions r,
  // r + num_replicas, r + 2 * num_replicas, ... So every rank gets ceil(N / num_replicas)
  // samples and the same number of batches, and the ranks' shares interleaved in position
  // order are the padded epoch order. The padding is never dropped; drop_last only drops a
  // rank's last incomplete batch. With num_replicas = 1 the loader is the unsharded one.
  int num_replicas = 1;
  int rank = 0;
  Device device = Device::cpu();
  // Images become (x / 255 - mean) / stddev in f32.
  float mean = kFashionMnistMean;
  float stddev = kFashionMnistStd;
  // Images [B, C*H*W] instead of [B, C, H, W].
  bool flatten = false;
  // Runs on the loader's thread on each batch's CPU tensors, before the copy to the device
  // (augmentation, checks). What it throws is rethrown by the next() that reaches the batch.
  std::function<void(Batch&)> transform;
};

// Iterates over a dataset in batches. A background thread gathers and normalizes up to two
// batches ahead (into page-locked memory when the device is a GPU); next() copies a batch to
// the device on the calling thread, so the copy is queued on that device's current stream
// before the work that uses it. One thread drives a loader; the loader keeps the dataset's
// tensors alive.
//
//   DataLoader loader(data::load_fashion_mnist(dir, true), options);
//   for (uint64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.begin_epoch(epoch);
//     for (Batch batch; loader.next(batch);) { ... }
//   }
class DataLoader {
 public:
  // Throws ValueError for batch_size <= 0, an empty dataset, stddev <= 0, num_replicas < 1, rank
  // outside [0, num_replicas), or drop_last with a rank's share smaller than one batch;
  // ShapeError / DTypeError when images and labels are not as Dataset describes or their counts
  // differ; DeviceError for a device that does not exist.
  DataLoader(Dataset dataset, DataLoaderOptions options);
  // Stops the background thread, also in the middle of an epoch.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts epoch number epoch (< 2^32), abandoning any unfinished one. With shuffle, the
  // order is a Fisher-Yates shuffle drawn from Philox-4x32-10 keyed by seed, so it depends
  // on seed and epoch alone, on every platform; without, samples come in dataset order.
  // The loader then gives this rank's share of that order (see DataLoaderOptions::rank).
  void begin_epoch(uint64_t epoch);
  // The next batch of the epoch into out; false once the epoch is exhausted. Rethrows what
  // failed while the batch was being prepared; the epoch then ends. Throws ValueError
  // before the first begin_epoch().
  bool next(Batch& out);

  // This rank's batches per epoch (the same on every rank).
  int64_t num_batches() const;
  // This rank's samples per epoch, padding included: ceil(N / num_replicas) of a dataset of
  // N samples (N itself when num_replicas = 1).
  int64_t size() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace data
}  // namespace normcore

#pragma GCC visibility pop
