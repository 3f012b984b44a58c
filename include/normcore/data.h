// Data loading: the IDX file format (MNIST, Fashion-MNIST), llm.c's token shards, the
// Dataset interface with tensor, text-window, token-window and Fashion-MNIST datasets,
// per-sample transforms, and a DataLoader that shuffles, transforms, batches and (for
// data-parallel training) shards any dataset on worker threads.
// Readers validate everything before allocating from a size the file states and throw
// IOError naming the file and the defect. Loaded tensors live on the CPU and own their memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

// ---------------------------------------------------------------- color images
// Reads a color image of any size (1 to 16384 pixels a side) as f32 [3, H, W] in [0, 1]:
// binary or plain PPM (P6/P3), PGM (P5/P2, gray repeated into the three channels) or, where
// normcore was built with libpng, PNG (gray, RGB or with alpha, composed to RGB). IOError
// naming the file and the problem; a header claiming more pixels than the file holds is one.
Tensor read_color_image(const std::string& path);
// image [C, H, W] resized to [C, height, width] by bilinear interpolation with half-pixel
// centers (F.interpolate's bilinear with align_corners = false, no antialiasing), in f32 on
// the CPU.
Tensor resize_bilinear(const Tensor& image, int64_t height, int64_t width);
// torchvision's evaluation transform for ImageNet models on an RGB image [3, H, W] in [0, 1]:
// the shorter side resized to `resize` (the other in proportion), the center `crop` x
// `crop` cut out, each channel normalized with ImageNet's mean (0.485, 0.456, 0.406) and
// standard deviation (0.229, 0.224, 0.225). Resizing is bilinear without antialiasing, so a
// photo much larger than `resize` comes out smoother in torchvision (PIL filters when it
// shrinks); scale such images down first to match it closely.
Tensor imagenet_preprocess(const Tensor& image, int64_t resize = 256, int64_t crop = 224);

// ---------------------------------------------------------------- datasets
// One sample: what a model reads and what it should give. Tensors on the CPU.
struct Example {
  Tensor input;
  Tensor target;
};

// A dataset is a size and a way to get one sample by its index. The DataLoader's workers
// call get() from several threads at once, so get() must not change shared state without
// a lock of its own. What it returns may be views of the dataset's memory: the loader
// reads samples and never writes them.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Sample index, 0 <= index < size().
  virtual Example get(int64_t index) const = 0;
  // The samples at indices (each in [0, size())) at once: inputs [n, ...] and targets
  // [n, ...], CPU tensors holding what get() gives for each, stacked in order. The loader
  // calls it for each batch when it has no per-sample transforms and no collate of the
  // user's; a dataset whose samples are rows of tensors gathers them in one indexed copy.
  // nullopt (the default): no faster way than get() per sample, which the loader then does.
  virtual std::optional<Example> get_batch(const std::vector<int64_t>& indices) const {
    (void)indices;
    return std::nullopt;
  }
};

// Samples that are rows of two tensors: sample i is {inputs[i], targets[i]} (views).
class TensorDataset : public Dataset {
 public:
  TensorDataset() = default;
  // ValueError for an undefined tensor or a 0-dim one; ShapeError when their first
  // dimensions differ. Both are moved to the CPU.
  TensorDataset(Tensor inputs, Tensor targets);
  int64_t size() const override { return inputs_.defined() ? inputs_.size(0) : 0; }
  Example get(int64_t index) const override;
  // The rows at indices, gathered by index_select (IndexError naming an index outside
  // [0, size())).
  std::optional<Example> get_batch(const std::vector<int64_t>& indices) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }
  // The first n samples (n <= size()), sharing memory.
  TensorDataset head(int64_t n) const;

 private:
  Tensor inputs_;
  Tensor targets_;
};

// Every window of context + 1 bytes of a byte stream: sample i has input the bytes
// [i, i + context) and target the bytes [i + 1, i + context + 1), both i64 [context]
// (next-token prediction). size() = stream size - context. ValueError for context < 1 or a
// stream of context bytes or fewer.
class TextWindows : public Dataset {
 public:
  TextWindows(std::string stream, int64_t context);
  int64_t size() const override { return static_cast<int64_t>(stream_.size()) - context_; }
  Example get(int64_t index) const override;
  int64_t context() const { return context_; }

 private:
  std::string stream_;
  int64_t context_;
};

// ---------------------------------------------------------------- token shards
// llm.c's token shards (its GPT-2 training data): a header of 256 little-endian int32
// (20240520, the version 1, the token count, then zeros), then the tokens as little-endian
// uint16, so token ids are 0 to 65535.

// The tokens of the shard at path. IOError naming the file and the defect for a file that
// cannot be opened or is not a regular file, one shorter than the 1024-byte header, another
// magic or version, a negative count, fewer or more than 2 * count bytes of tokens (nothing
// is allocated before the count is checked against the file's size), and a token id >=
// vocab_size (naming its position and the id). ValueError for vocab_size outside [1, 65536].
std::vector<uint16_t> read_token_shard(const std::string& path, int64_t vocab_size);

// Writes tokens, i32 or i64 [N] on any device, as a shard at path: to a temporary file in
// the same folder, flushed to disk and renamed over path, so path holds either its old
// content or the whole shard. ValueError for an undefined tensor, more than 2^31 - 1 tokens
// or an id outside [0, 65535] (naming the first one and its position); DTypeError and
// ShapeError for another dtype or rank; IOError when the file cannot be written.
void write_token_shard(const std::string& path, const Tensor& tokens);

// The paths pattern names (POSIX glob(3): *, ?, [...]), sorted by their bytes (whatever the
// locale), e.g. the shards "fineweb_train_*.bin" of a training set. IOError naming the
// pattern when nothing matches or a folder on the way cannot be read.
std::vector<std::string> glob_files(const std::string& pattern);

// Windows of context + 1 tokens of token shards, for next-token prediction: a window at
// position p of a shard gives input the tokens [p, p + context) and target the tokens
// [p + 1, p + context + 1), both i64 [context]. Windows start at 0, stride, 2 * stride, ...
// of each shard for as long as they fit, so none crosses from one shard into the next; a
// shard of n >= context + 1 tokens holds (n - context - 1) / stride + 1 of them, a shorter
// one none. The default stride is context, llm.c's placement: consecutive windows share one
// token, and (n - 1) / context windows cover the shard. Samples number the windows of the
// shards in the order given, each shard's in order of position.
// Every shard is read whole into memory, 2 bytes a token (a shard of 100M tokens takes
// 200 MB), and checked as read_token_shard checks it; copies of the dataset share the tokens.
// ValueError for no shard, context < 1, stride < 1, vocab_size outside [1, 65536] and shards
// that hold no window (naming them); read_token_shard's IOErrors.
class TokenWindows : public Dataset {
 public:
  TokenWindows(const std::vector<std::string>& shards, int64_t context, int64_t vocab_size,
               std::optional<int64_t> stride = std::nullopt);
  int64_t size() const override { return window_ends_.empty() ? 0 : window_ends_.back(); }
  Example get(int64_t index) const override;
  int64_t context() const { return context_; }
  int64_t stride() const { return stride_; }

 private:
  std::shared_ptr<const std::vector<std::vector<uint16_t>>> shards_;
  // window_ends_[s]: the windows of shards 0 to s.
  std::vector<int64_t> window_ends_;
  int64_t context_;
  int64_t stride_;
};

// Fashion-MNIST's training (train = true: 60000 samples) or test split (10000) from dir,
// which holds {train,t10k}-{images-idx3,labels-idx1}-ubyte, each gzip-compressed (".gz")
// or plain. Inputs u8 [N, 28, 28], targets i64 [N] in [0, 10). Throws IOError naming the
// file when a file is unreadable, has another shape or dtype, or a label is 10 or more.
TensorDataset load_fashion_mnist(const std::string& dir, bool train);

// Fashion-MNIST's training-set pixel mean and standard deviation (of x / 255).
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;

// ---------------------------------------------------------------- per-sample transforms
// The random numbers of one sample's transforms: Philox-4x32-10 keyed by the loader's seed,
// the epoch and the sample's position in the epoch's order, so that a sample's draws depend
// on neither the worker that makes it, nor the number of workers, nor the batch size.
class SampleRandom {
 public:
  SampleRandom(uint64_t seed, uint64_t epoch, uint64_t position);
  uint32_t bits();
  // Uniform on [0, 1), 53 bits.
  double uniform();
  // Uniform on [low, high); ValueError when high <= low.
  int64_t integer(int64_t low, int64_t high);

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
  uint32_t words_[4] = {0, 0, 0, 0};
  int used_ = 4;
};

// A per-sample transform: the sample in, the changed sample out (CPU tensors). It runs on
// a loader worker, several at once, so it must not change shared state without a lock.
using Transform = std::function<Example(Example sample, SampleRandom& random)>;

namespace transforms {
// Images u8 or f32, [H, W] or [C, H, W], to f32 [C, H, W] (C = 1 for [H, W]) holding
// (x - mean[c]) / stddev[c], where x is the pixel divided by 255 for u8 and the value for
// f32 (as PyTorch's ToTensor then Normalize). mean and stddev hold one value for all
// channels or one per channel. The target is kept.
Transform normalize(std::vector<float> mean = {kFashionMnistMean}, std::vector<float> stddev = {kFashionMnistStd});
// A height x width window of the image ([H, W] or [C, H, W], any dtype) padded by
// `padding` zeros on every side, at a uniformly drawn place.
Transform random_crop(int64_t height, int64_t width, int64_t padding = 0);
// The image mirrored left to right with probability p.
Transform random_horizontal_flip(double p = 0.5);
// The input as one dimension (a view).
Transform flatten();
}  // namespace transforms

struct Batch;
// A transform of a whole batch (CPU tensors, inputs [B, ...] and targets [B, ...]): runs on
// a loader worker after the batch is gathered or stacked, before it goes to the device.
using BatchTransform = std::function<Batch(Batch batch)>;

namespace transforms {
// normalize() for a batch of images [B, H, W] or [B, C, H, W], u8 or f32: f32
// [B, C, H, W] (C = 1 for [B, H, W]) holding, bit for bit, what normalize() gives each
// sample. With a dataset that gathers batches (get_batch) and no per-sample transforms, the
// loader then never makes a sample on its own.
BatchTransform normalize_batch(std::vector<float> mean = {kFashionMnistMean},
                               std::vector<float> stddev = {kFashionMnistStd});
}  // namespace transforms

// ---------------------------------------------------------------- the loader
// One batch: inputs [B, ...] and targets [B, ...] (the samples' shapes, stacked), both on
// the loader's device; index counts batches in the epoch.
struct Batch {
  Tensor inputs;
  Tensor targets;
  int64_t index = 0;
};

// Stacks the samples' inputs and their targets (each sample's the same shape and dtype;
// ShapeError or DTypeError naming the sample otherwise) into contiguous CPU tensors.
Batch collate(const std::vector<Example>& samples);

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
  // Threads that make batches (get, transforms, collate), each a whole batch at a time;
  // 0 makes them in next(), on the calling thread. The batches do not depend on it.
  int workers = 1;
  // Applied in order to each sample after get().
  std::vector<Transform> transforms;
  // Applied in order to each batch after it is stacked (or gathered by the dataset's
  // get_batch, when there are no per-sample transforms and no collate).
  std::vector<BatchTransform> batch_transforms;
  // Turns a batch's samples into a Batch on the CPU (collate() when empty). Runs on a worker.
  std::function<Batch(const std::vector<Example>&)> collate;
};

// Iterates over a dataset in batches. Worker threads make up to two batches each ahead of
// the caller (stacked into page-locked memory when the device is a GPU and collate is the
// default); next() hands them out in order and copies a batch to the device on the calling
// thread, so the copy is queued on that device's current stream before the work that uses
// it. One thread drives a loader; the loader keeps the dataset alive.
//
//   DataLoaderOptions options;
//   options.transforms = {transforms::normalize()};
//   DataLoader loader(data::load_fashion_mnist(dir, true), options);
//   for (uint64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.begin_epoch(epoch);
//     for (Batch batch; loader.next(batch);) { ... }
//   }
class DataLoader {
 public:
  // Throws ValueError for a null or empty dataset, batch_size <= 0, workers < 0,
  // num_replicas < 1, rank outside [0, num_replicas), or drop_last with a rank's share
  // smaller than one batch; DeviceError for a device that does not exist.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  // A copy of a dataset given by value (TensorDataset, TextWindows, your own).
  template <class D, class = std::enable_if_t<std::is_base_of<Dataset, std::decay_t<D>>::value>>
  DataLoader(D&& dataset, DataLoaderOptions options)
      : DataLoader(std::make_shared<const std::decay_t<D>>(std::forward<D>(dataset)), std::move(options)) {}
  // Stops the workers, also in the middle of an epoch.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts epoch number epoch (< 2^32) at batch first_batch (to resume within an epoch),
  // abandoning any unfinished one. With shuffle, the order is a Fisher-Yates shuffle drawn
  // from Philox-4x32-10 keyed by seed, so it depends on seed and epoch alone, on every
  // platform; without, samples come in dataset order. The loader then gives this rank's
  // share of that order (see DataLoaderOptions::rank).
  void begin_epoch(uint64_t epoch, int64_t first_batch = 0);
  // The next batch of the epoch into out; false once the epoch is exhausted. Rethrows what
  // failed while the batch was being made (in get, a transform or collate), naming the
  // batch; the epoch then ends. Throws ValueError before the first begin_epoch().
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
