// The datasets (tensor rows, text windows, Fashion-MNIST), the per-sample transforms and
// the DataLoader. The loader's workers each take the next batch number to make (at most two
// per worker ahead of the caller), make it (get, transforms, collate) and leave it in a map
// by number; next() takes the batches out in order and copies them to the device on the
// caller's thread. Page-locked batch memory is carved from slabs, so that cudaHostAlloc is
// paid per slab and not per batch; a slab is freed with the last batch in it, which waits
// for its uploads.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "base/philox.h"
#include "base/shape.h"
#include "data/windows.h"
#include "normcore/data.h"
#include "normcore/ops.h"

namespace normcore {
namespace data {
namespace {

template <class... Args>
[[noreturn]] void fail_file(const std::string& path, const Args&... args) {
  throw IOError(detail::cat_str("load_fashion_mnist: ", path, ": ", args...));
}

// name.gz in dir when it exists, else name when that exists, else name.gz (so that the
// error names the file the distribution ships).
std::string dataset_file(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path compressed = fs::path(dir) / (name + ".gz");
  const fs::path plain = fs::path(dir) / name;
  std::error_code ignored;
  if (!fs::exists(compressed, ignored) && fs::exists(plain, ignored)) return plain.string();
  return compressed.string();
}

// Batches a worker may make ahead of the caller.
constexpr int64_t kAheadPerWorker = 2;
// Host batches kept after their upload was queued: a slab is then freed (which waits for the
// uploads from it) two batches later, when those uploads have almost surely finished.
constexpr size_t kRetainedUploads = 2;
constexpr size_t kSlabBytes = size_t(8) << 20;
constexpr size_t kAlignBytes = 256;

size_t align_up(size_t bytes) { return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

// Contiguous tensors carved out of page-locked slabs; used by the loader thread alone.
class PinnedArena {
 public:
  explicit PinnedArena(size_t slab_bytes) : slab_bytes_(slab_bytes) {}

  Tensor take(const Shape& shape, DType dtype) {
    const size_t nbytes = static_cast<size_t>(detail::checked_numel(shape, "DataLoader")) * dtype_size(dtype);
    size_t start = align_up(used_);
    if (!slab_ || start + nbytes > slab_->nbytes) {
      slab_ = allocate_storage(std::max(slab_bytes_, nbytes), Device::cpu(), /*pinned=*/true);
      start = 0;
    }
    used_ = start + nbytes;
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = slab_;
    impl->shape = shape;
    impl->strides = detail::contiguous_strides(shape);
    impl->offset = static_cast<int64_t>(start / dtype_size(dtype));
    impl->dtype = dtype;
    return Tensor(std::move(impl));
  }

 private:
  size_t slab_bytes_;
  Storage slab_;
  size_t used_ = 0;
};

// Stacks samples into tensors from allocate(shape, dtype) (contiguous CPU tensors).
template <class Allocate>
Batch stack_samples(const std::vector<Example>& samples, Allocate allocate) {
  NC_CHECK(!samples.empty(), ValueError, "collate: no samples");
  const auto stack = [&](Tensor Example::*part, const char* what) {
    const Tensor& first = samples[0].*part;
    for (size_t r = 0; r < samples.size(); ++r) {
      const Tensor& t = samples[r].*part;
      NC_CHECK(t.defined(), ValueError, "collate: sample ", r, " of the batch has an undefined ", what);
      NC_CHECK(t.device().is_cpu(), DeviceError, "collate: sample ", r, "'s ", what, " is ", describe(t),
               "; datasets and transforms give CPU tensors");
      NC_CHECK(t.dtype() == first.dtype(), DTypeError, "collate: sample ", r, "'s ", what, " is ", describe(t),
               ", sample 0's is ", describe(first), "; a batch's samples must have one dtype");
      NC_CHECK(t.shape() == first.shape(), ShapeError, "collate: sample ", r, "'s ", what, " is ", describe(t),
               ", sample 0's is ", describe(first), "; a batch's samples must have one shape");
    }
    Shape shape = {static_cast<int64_t>(samples.size())};
    shape.insert(shape.end(), first.shape().begin(), first.shape().end());
    Tensor out = allocate(shape, first.dtype());
    const size_t bytes = first.nbytes();
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    for (size_t r = 0; r < samples.size(); ++r) {
      const Tensor src = (samples[r].*part).contiguous();
      if (bytes) std::memcpy(dst + r * bytes, src.data_ptr(), bytes);
    }
    return out;
  };
  Batch batch;
  batch.inputs = stack(&Example::input, "input");
  batch.targets = stack(&Example::target, "target");
  return batch;
}

// An image transform's view of its input: [C, H, W] (C = 1 for [H, W]), contiguous.
struct Image {
  Tensor data;
  int64_t channels, height, width;
};

Image image_of(const char* op, const Tensor& x) {
  NC_CHECK(x.defined(), ValueError, op, ": the sample's input is undefined");
  NC_CHECK(x.dim() == 2 || x.dim() == 3, ShapeError, op, ": the input must be an image [H, W] or [C, H, W], got ",
           describe(x));
  NC_CHECK(x.device().is_cpu(), DeviceError, op, ": the input must be on the CPU, got ", describe(x));
  const int64_t channels = x.dim() == 3 ? x.size(0) : 1;
  return Image{x.contiguous(), channels, x.size(-2), x.size(-1)};
}

// Tensor of the image's rank with these sizes (channels dropped for a 2-D image).
Shape image_shape(const Tensor& like, int64_t channels, int64_t height, int64_t width) {
  return like.dim() == 3 ? Shape{channels, height, width} : Shape{height, width};
}

constexpr uint64_t kTransformKeyTag = 0x7472616e73666f72ull;  // keeps transforms' draws apart from the shuffle's

}  // namespace

// ---------------------------------------------------------------- datasets
TensorDataset::TensorDataset(Tensor inputs, Tensor targets) {
  NC_CHECK(inputs.defined(), ValueError, "TensorDataset: the inputs are an undefined tensor");
  NC_CHECK(targets.defined(), ValueError, "TensorDataset: the targets are an undefined tensor");
  NC_CHECK(inputs.dim() >= 1, ValueError, "TensorDataset: the inputs must have a sample dimension, got ",
           describe(inputs));
  NC_CHECK(targets.dim() >= 1, ValueError, "TensorDataset: the targets must have a sample dimension, got ",
           describe(targets));
  NC_CHECK(inputs.size(0) == targets.size(0), ShapeError, "TensorDataset: ", inputs.size(0), " inputs but ",
           targets.size(0), " targets (inputs ", describe(inputs), ", targets ", describe(targets), ")");
  inputs_ = inputs.to(Device::cpu()).detach();
  targets_ = targets.to(Device::cpu()).detach();
}

Example TensorDataset::get(int64_t index) const {
  NC_CHECK(index >= 0 && index < size(), IndexError, "TensorDataset::get: index ", index, " is outside [0, ", size(),
           ")");
  return Example{inputs_.select(0, index), targets_.select(0, index)};
}

std::optional<Example> TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  for (size_t i = 0; i < indices.size(); ++i)
    NC_CHECK(indices[i] >= 0 && indices[i] < size(), IndexError, "TensorDataset::get_batch: index ", indices[i],
             " (at ", i, ") is outside [0, ", size(), ")");
  const Tensor rows = from_vector<int64_t>(indices, {static_cast<int64_t>(indices.size())});
  return Example{index_select(inputs_, 0, rows), index_select(targets_, 0, rows)};
}

TensorDataset TensorDataset::head(int64_t n) const {
  NC_CHECK(n >= 0 && n <= size(), ValueError, "TensorDataset::head: ", n, " samples of a dataset of ", size());
  return TensorDataset(inputs_.narrow(0, 0, n), targets_.narrow(0, 0, n));
}

TextWindows::TextWindows(std::string stream, int64_t context) : stream_(std::move(stream)), context_(context) {
  NC_CHECK(context_ >= 1, ValueError, "TextWindows: context must be positive, got ", context_);
  NC_CHECK(static_cast<int64_t>(stream_.size()) > context_, ValueError, "TextWindows: a stream of ", stream_.size(),
           " bytes holds no window of ", context_ + 1, " bytes");
}

Example TextWindows::get(int64_t index) const {
  NC_CHECK(index >= 0 && index < size(), IndexError, "TextWindows::get: index ", index, " is outside [0, ", size(),
           ")");
  return next_token_window(reinterpret_cast<const unsigned char*>(stream_.data()) + index, context_);
}

TensorDataset load_fashion_mnist(const std::string& dir, bool train) {
  const std::string split = train ? "train" : "t10k";
  const std::string images_path = dataset_file(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = dataset_file(dir, split + "-labels-idx1-ubyte");
  const Tensor images = read_idx(images_path);
  const Tensor labels = read_idx(labels_path);
  if (images.dtype() != DType::U8 || images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28)
    fail_file(images_path, "expected images u8 [N, 28, 28], got ", dtype_name(images.dtype()), " ", images.shape());
  if (labels.dtype() != DType::U8 || labels.dim() != 1)
    fail_file(labels_path, "expected labels u8 [N], got ", dtype_name(labels.dtype()), " ", labels.shape());
  if (labels.size(0) != images.size(0))
    fail_file(labels_path, "holds ", labels.size(0), " labels but ", images_path, " holds ", images.size(0), " images");
  const uint8_t* values = labels.data<uint8_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    if (values[i] >= 10) fail_file(labels_path, "label ", int(values[i]), " at index ", i, " is outside [0, 10)");
  return TensorDataset(images, labels.to(DType::I64));
}

// ---------------------------------------------------------------- transforms
SampleRandom::SampleRandom(uint64_t seed, uint64_t epoch, uint64_t position) {
  const philox::Words k = philox::generate(seed ^ kTransformKeyTag, (epoch << 32) | (position & 0xffffffffull));
  key_ = (static_cast<uint64_t>(k.w[0]) << 32) | k.w[1];
}

uint32_t SampleRandom::bits() {
  if (used_ == 4) {
    const philox::Words w = philox::generate(key_, counter_++);
    std::copy(w.w, w.w + 4, words_);
    used_ = 0;
  }
  return words_[used_++];
}

double SampleRandom::uniform() {
  const uint32_t hi = bits();
  return philox::uniform_double(hi, bits());
}

int64_t SampleRandom::integer(int64_t low, int64_t high) {
  NC_CHECK(high > low, ValueError, "SampleRandom::integer: the range [", low, ", ", high, ") is empty");
  philox::Words w{};
  w.w[0] = bits();
  w.w[1] = bits();
  return philox::uniform_int(w, low, static_cast<uint64_t>(high) - static_cast<uint64_t>(low));
}

namespace transforms {

namespace {

// normalize's arithmetic: (x / 255 - mean[c]) / stddev[c] for u8 pixels (through a table
// per channel), (x - mean[c]) / stddev[c] for f32, over images of `channels` planes.
struct Normalizer {
  std::vector<float> mean, stddev, table;

  Normalizer(std::vector<float> mean_arg, std::vector<float> stddev_arg, const char* op)
      : mean(std::move(mean_arg)), stddev(std::move(stddev_arg)) {
    NC_CHECK(!mean.empty() && mean.size() == stddev.size(), ValueError, op,
             ": mean and stddev must hold as many values (one, or one per channel), got ", mean.size(), " and ",
             stddev.size());
    for (size_t c = 0; c < mean.size(); ++c) {
      NC_CHECK(std::isfinite(mean[c]), ValueError, op, ": mean must be finite, got ", mean[c]);
      NC_CHECK(std::isfinite(stddev[c]) && stddev[c] > 0, ValueError, op, ": stddev must be positive and finite, got ",
               stddev[c]);
    }
    table.resize(mean.size() * 256);
    for (size_t c = 0; c < mean.size(); ++c)
      for (int v = 0; v < 256; ++v) table[c * 256 + v] = (static_cast<float>(v) / 255.0f - mean[c]) / stddev[c];
  }

  // data: `images` contiguous images of channels x plane values, u8 or f32 (`input` names
  // the tensor in errors); returns them normalized, f32 of `shape`.
  Tensor operator()(const char* op, const Tensor& input, const Tensor& data, int64_t images, int64_t channels,
                    int64_t plane, const Shape& shape) const {
    NC_CHECK(data.dtype() == DType::U8 || data.dtype() == DType::F32, DTypeError, op,
             ": the input must be u8 or f32, got ", describe(input));
    NC_CHECK(mean.size() == 1 || static_cast<int64_t>(mean.size()) == channels, ShapeError, op, ": ", mean.size(),
             " means and standard deviations for an image of ", channels, " channels (", describe(input), ")");
    Tensor out = empty(shape, TensorOptions(DType::F32));
    float* dst = out.data<float>();
    for (int64_t n = 0; n < images; ++n)
      for (int64_t c = 0; c < channels; ++c) {
        const size_t k = mean.size() == 1 ? 0 : static_cast<size_t>(c);
        const int64_t at = (n * channels + c) * plane;
        if (data.dtype() == DType::U8) {
          const uint8_t* src = data.data<uint8_t>() + at;
          const float* lut = table.data() + k * 256;
          for (int64_t i = 0; i < plane; ++i) dst[at + i] = lut[src[i]];
        } else {
          const float* src = data.data<float>() + at;
          for (int64_t i = 0; i < plane; ++i) dst[at + i] = (src[i] - mean[k]) / stddev[k];
        }
      }
    return out;
  }
};

}  // namespace

Transform normalize(std::vector<float> mean, std::vector<float> stddev) {
  const auto normalizer = std::make_shared<const Normalizer>(std::move(mean), std::move(stddev), "normalize");
  return [normalizer](Example sample, SampleRandom&) {
    const Image image = image_of("normalize", sample.input);
    sample.input = (*normalizer)("normalize", sample.input, image.data, 1, image.channels, image.height * image.width,
                                 {image.channels, image.height, image.width});
    return sample;
  };
}

BatchTransform normalize_batch(std::vector<float> mean, std::vector<float> stddev) {
  const auto normalizer = std::make_shared<const Normalizer>(std::move(mean), std::move(stddev), "normalize_batch");
  return [normalizer](Batch batch) {
    const Tensor& x = batch.inputs;
    NC_CHECK(x.defined(), ValueError, "normalize_batch: the batch's inputs are undefined");
    NC_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError,
             "normalize_batch: the inputs must be images [B, H, W] or [B, C, H, W], got ", describe(x));
    NC_CHECK(x.device().is_cpu(), DeviceError, "normalize_batch: the inputs must be on the CPU, got ", describe(x));
    const int64_t images = x.size(0), channels = x.dim() == 4 ? x.size(1) : 1;
    const int64_t height = x.size(-2), width = x.size(-1);
    batch.inputs = (*normalizer)("normalize_batch", x, x.contiguous(), images, channels, height * width,
                                 {images, channels, height, width});
    return batch;
  };
}

Transform random_crop(int64_t height, int64_t width, int64_t padding) {
  NC_CHECK(height > 0 && width > 0, ValueError, "random_crop: the crop must be at least 1 x 1, got ", height, " x ",
           width);
  NC_CHECK(padding >= 0, ValueError, "random_crop: padding must not be negative, got ", padding);
  return [height, width, padding](Example sample, SampleRandom& random) {
    const Image image = image_of("random_crop", sample.input);
    const int64_t padded_h = image.height + 2 * padding, padded_w = image.width + 2 * padding;
    NC_CHECK(padded_h >= height && padded_w >= width, ShapeError, "random_crop: a ", height, " x ", width, " crop of ",
             describe(sample.input), " padded by ", padding, " (", padded_h, " x ", padded_w, ")");
    // The crop's top-left corner in padded coordinates, then in the image's.
    const int64_t top = random.integer(0, padded_h - height + 1) - padding;
    const int64_t left = random.integer(0, padded_w - width + 1) - padding;
    const Tensor& src = image.data;
    Tensor out = zeros(image_shape(sample.input, image.channels, height, width), TensorOptions(src.dtype()));
    const size_t elem = dtype_size(src.dtype());
    const int64_t col0 = std::max<int64_t>(0, -left), col1 = std::min(width, image.width - left);
    const auto* from = static_cast<const uint8_t*>(src.data_ptr());
    auto* to = static_cast<uint8_t*>(out.data_ptr());
    for (int64_t c = 0; c < image.channels && col1 > col0; ++c)
      for (int64_t y = std::max<int64_t>(0, -top); y < std::min(height, image.height - top); ++y)
        std::memcpy(to + ((c * height + y) * width + col0) * elem,
                    from + ((c * image.height + top + y) * image.width + left + col0) * elem,
                    static_cast<size_t>(col1 - col0) * elem);
    sample.input = out;
    return sample;
  };
}

Transform random_horizontal_flip(double p) {
  NC_CHECK(p >= 0 && p <= 1, ValueError, "random_horizontal_flip: p must be in [0, 1], got ", p);
  return [p](Example sample, SampleRandom& random) {
    const Image image = image_of("random_horizontal_flip", sample.input);
    if (!(random.uniform() < p)) return sample;
    const Tensor& src = image.data;
    Tensor out = empty(sample.input.shape(), TensorOptions(src.dtype()));
    const size_t elem = dtype_size(src.dtype());
    const auto* from = static_cast<const uint8_t*>(src.data_ptr());
    auto* to = static_cast<uint8_t*>(out.data_ptr());
    for (int64_t row = 0; row < image.channels * image.height; ++row)
      for (int64_t x = 0; x < image.width; ++x)
        std::memcpy(to + (row * image.width + x) * elem, from + (row * image.width + image.width - 1 - x) * elem, elem);
    sample.input = out;
    return sample;
  };
}

Transform flatten() {
  return [](Example sample, SampleRandom&) {
    NC_CHECK(sample.input.defined(), ValueError, "flatten: the sample's input is undefined");
    sample.input = sample.input.reshape({sample.input.numel()});
    return sample;
  };
}

}  // namespace transforms

Batch collate(const std::vector<Example>& samples) {
  return stack_samples(samples, [](const Shape& shape, DType dtype) { return empty(shape, TensorOptions(dtype)); });
}

// ---------------------------------------------------------------- DataLoader
class DataLoader::Impl {
 public:
  Impl(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  ~Impl();

  void begin_epoch(uint64_t epoch, int64_t first_batch);
  bool next(Batch& out);
  int64_t num_batches() const { return batches_; }
  int64_t size() const { return share_; }

 private:
  // A made batch, or what failed while making it.
  struct Made {
    Batch batch;
    std::exception_ptr error;
  };

  std::vector<int64_t> epoch_order(uint64_t epoch) const;
  std::vector<int64_t> rank_share(const std::vector<int64_t>& order) const;
  Batch make_batch(int64_t index, PinnedArena* arena) const;
  // The batch transforms, then (with an arena) the tensors into page-locked memory.
  Batch finish_batch(Batch batch, PinnedArena* arena) const;
  void run_worker() noexcept;
  void stop_workers();

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  int64_t samples_ = 0;  // in the dataset
  int64_t share_ = 0;    // this rank's per epoch, padding included
  int64_t batches_ = 0;
  int64_t ahead_ = 0;  // batches made and not yet taken, at most

  // Written only while no worker runs.
  std::vector<int64_t> order_;  // this rank's share of the epoch
  uint64_t epoch_ = 0;
  bool started_ = false;
  std::vector<std::thread> workers_;

  std::mutex mutex_;
  std::condition_variable made_cv_;   // a batch was made
  std::condition_variable space_cv_;  // a batch was taken or the loader is stopping
  int64_t to_make_ = 0;               // the next batch number a worker takes
  int64_t to_give_ = 0;               // the next batch number next() hands out
  int64_t end_ = 0;                   // the epoch's end (earlier after a failure)
  std::map<int64_t, Made> made_;
  bool stopping_ = false;

  std::deque<Batch> retained_;  // host batches whose uploads were queued last
};

DataLoader::Impl::Impl(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  NC_CHECK(dataset_ != nullptr, ValueError, "DataLoader: the dataset is null");
  samples_ = dataset_->size();
  NC_CHECK(samples_ > 0, ValueError, "DataLoader: the dataset is empty (size() is ", samples_, ")");
  // The shuffle draws sample positions from 32-bit counter halves.
  NC_CHECK(samples_ <= int64_t(std::numeric_limits<uint32_t>::max()), ValueError, "DataLoader: ", samples_,
           " samples are more than the ", std::numeric_limits<uint32_t>::max(), " supported");
  NC_CHECK(options_.batch_size > 0, ValueError, "DataLoader: batch_size must be positive, got ", options_.batch_size);
  NC_CHECK(options_.workers >= 0, ValueError, "DataLoader: workers must not be negative, got ", options_.workers);
  NC_CHECK(options_.num_replicas >= 1, ValueError, "DataLoader: num_replicas must be positive, got ",
           options_.num_replicas);
  NC_CHECK(options_.rank >= 0 && options_.rank < options_.num_replicas, ValueError, "DataLoader: rank ", options_.rank,
           " is outside [0, num_replicas) for num_replicas ", options_.num_replicas);
  for (size_t t = 0; t < options_.transforms.size(); ++t)
    NC_CHECK(options_.transforms[t] != nullptr, ValueError, "DataLoader: transform ", t, " is empty");
  for (size_t t = 0; t < options_.batch_transforms.size(); ++t)
    NC_CHECK(options_.batch_transforms[t] != nullptr, ValueError, "DataLoader: batch transform ", t, " is empty");
  // Padding to a multiple of num_replicas gives every rank the same count.
  share_ = (samples_ + options_.num_replicas - 1) / options_.num_replicas;
  NC_CHECK(!options_.drop_last || share_ >= options_.batch_size, ValueError, "DataLoader: drop_last with ", share_,
           " samples per rank (", samples_, " in the dataset, num_replicas ", options_.num_replicas,
           ") and batch_size ", options_.batch_size, " leaves no batch");
  const Device device = options_.device;
  if (device.is_cuda())
    NC_CHECK(device.index >= 0 && device.index < cuda_device_count(), DeviceError, "DataLoader: device ", device,
             " does not exist (", cuda_device_count(), " CUDA device(s) visible)");
  const int64_t full = share_ / options_.batch_size;
  batches_ = options_.drop_last || share_ % options_.batch_size == 0 ? full : full + 1;
  ahead_ = kAheadPerWorker * std::max(options_.workers, 1);
}

DataLoader::Impl::~Impl() {
  try {
    stop_workers();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "normcore: DataLoader: stopping the workers failed: %s\n", e.what());
  }
}

std::vector<int64_t> DataLoader::Impl::epoch_order(uint64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(samples_));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!options_.shuffle) return order;
  // Fisher-Yates from the back; step i draws from counter (epoch, i). The modulo's bias is
  // below 2^-32 for i < 2^32.
  for (uint64_t i = order.size() - 1; i > 0; --i) {
    const philox::Words r = philox::generate(options_.seed, (epoch << 32) | i);
    const int64_t j = philox::uniform_int(r, 0, i + 1);
    std::swap(order[i], order[static_cast<size_t>(j)]);
  }
  return order;
}

// Positions rank, rank + num_replicas, ... of the order padded cyclically to share_ *
// num_replicas samples (more than once round when the dataset has fewer samples than ranks,
// as DistributedSampler does).
std::vector<int64_t> DataLoader::Impl::rank_share(const std::vector<int64_t>& order) const {
  if (options_.num_replicas == 1) return order;
  std::vector<int64_t> share(static_cast<size_t>(share_));
  for (int64_t k = 0; k < share_; ++k) {
    const int64_t position = options_.rank + k * options_.num_replicas;
    share[static_cast<size_t>(k)] = order[static_cast<size_t>(position % samples_)];
  }
  return share;
}

void DataLoader::Impl::begin_epoch(uint64_t epoch, int64_t first_batch) {
  NC_CHECK(epoch <= std::numeric_limits<uint32_t>::max(), ValueError, "DataLoader::begin_epoch: epoch ", epoch,
           " is not below 2^32");
  NC_CHECK(first_batch >= 0 && first_batch <= batches_, ValueError, "DataLoader::begin_epoch: first_batch ",
           first_batch, " is outside [0, ", batches_, "] for an epoch of ", batches_, " batches");
  stop_workers();
  order_ = rank_share(epoch_order(epoch));
  epoch_ = epoch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    made_.clear();
    to_make_ = to_give_ = first_batch;
    end_ = batches_;
    stopping_ = false;
  }
  started_ = true;
  for (int w = 0; w < options_.workers; ++w) workers_.emplace_back(&Impl::run_worker, this);
}

Batch DataLoader::Impl::make_batch(int64_t index, PinnedArena* arena) const {
  const int64_t first = index * options_.batch_size;
  const int64_t rows = std::min(options_.batch_size, share_ - first);
  // Without per-sample transforms or a collate of the user's, the dataset may gather the
  // batch at once; the batch transforms follow, then the copy into page-locked memory.
  if (options_.transforms.empty() && !options_.collate) {
    const auto begin = order_.begin() + first;
    if (std::optional<Example> gathered = dataset_->get_batch(std::vector<int64_t>(begin, begin + rows))) {
      Batch batch{gathered->input, gathered->target, index};
      NC_CHECK(batch.inputs.defined() && batch.targets.defined() && batch.inputs.dim() >= 1 &&
                   batch.targets.dim() >= 1 && batch.inputs.size(0) == rows && batch.targets.size(0) == rows &&
                   batch.inputs.device().is_cpu() && batch.targets.device().is_cpu(),
               ValueError, "DataLoader: the dataset's get_batch gave batch ", index, " inputs ", describe(batch.inputs),
               " and targets ", describe(batch.targets), " for ", rows,
               " samples (CPU tensors with the samples first)");
      return finish_batch(std::move(batch), arena);
    }
  }
  std::vector<Example> samples(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    Example sample = dataset_->get(order_[static_cast<size_t>(first + r)]);
    if (!options_.transforms.empty()) {
      // The sample's place in the (padded) epoch order, the same for any rank count.
      const int64_t position = options_.rank + (first + r) * options_.num_replicas;
      SampleRandom random(options_.seed, epoch_, static_cast<uint64_t>(position));
      for (const Transform& transform : options_.transforms) sample = transform(std::move(sample), random);
    }
    samples[static_cast<size_t>(r)] = std::move(sample);
  }
  Batch batch;
  if (options_.collate) {
    batch = options_.collate(samples);
    NC_CHECK(batch.inputs.defined() && batch.targets.defined(), ValueError, "DataLoader: collate gave batch ", index,
             " an undefined ", batch.inputs.defined() ? "targets" : "inputs", " tensor");
  } else if (arena && options_.batch_transforms.empty()) {
    batch = stack_samples(samples, [&](const Shape& shape, DType dtype) { return arena->take(shape, dtype); });
  } else {
    batch = collate(samples);
  }
  batch.index = index;
  return finish_batch(std::move(batch), arena);
}

Batch DataLoader::Impl::finish_batch(Batch batch, PinnedArena* arena) const {
  const int64_t index = batch.index;
  for (const BatchTransform& transform : options_.batch_transforms) {
    batch = transform(std::move(batch));
    NC_CHECK(batch.inputs.defined() && batch.targets.defined(), ValueError, "DataLoader: a batch transform gave batch ",
             index, " an undefined ", batch.inputs.defined() ? "targets" : "inputs", " tensor");
  }
  batch.index = index;
  if (arena && !options_.collate) {
    // Into page-locked memory, from which the upload is asynchronous.
    auto pinned = [&](const Tensor& t) {
      if (t.is_pinned()) return t;
      Tensor out = arena->take(t.shape(), t.dtype());
      out.copy_(t);
      return out;
    };
    batch.inputs = pinned(batch.inputs);
    batch.targets = pinned(batch.targets);
  }
  return batch;
}

void DataLoader::Impl::run_worker() noexcept {
  std::unique_ptr<PinnedArena> arena;
  for (;;) {
    int64_t index;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      space_cv_.wait(lock, [&] { return stopping_ || to_make_ >= end_ || to_make_ < to_give_ + ahead_; });
      if (stopping_ || to_make_ >= end_) return;
      index = to_make_++;
    }
    Made made;
    try {
      if (!arena && options_.device.is_cuda() && !options_.collate) arena = std::make_unique<PinnedArena>(kSlabBytes);
      made.batch = make_batch(index, arena.get());
    } catch (...) {
      made.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      made_.emplace(index, std::move(made));
    }
    made_cv_.notify_all();
  }
}

bool DataLoader::Impl::next(Batch& out) {
  NC_CHECK(started_, ValueError, "DataLoader::next: no epoch has begun; call begin_epoch(epoch) first");
  Batch host;
  if (options_.workers == 0) {
    if (to_give_ >= end_) return false;
    try {
      host = make_batch(to_give_++, nullptr);
    } catch (...) {
      end_ = to_give_;  // the failure ends the epoch
      throw;
    }
  } else {
    Made made;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (to_give_ >= end_) return false;
      made_cv_.wait(lock, [&] { return made_.count(to_give_) != 0; });
      auto it = made_.find(to_give_);
      made = std::move(it->second);
      made_.erase(it);
      ++to_give_;
      if (made.error) {
        end_ = to_give_;  // the failure ends the epoch; the workers stop
        stopping_ = true;
      }
    }
    space_cv_.notify_all();
    if (made.error) std::rethrow_exception(made.error);
    host = std::move(made.batch);
  }
  if (options_.device.is_cpu()) {
    out = std::move(host);
    return true;
  }
  out.inputs = host.inputs.to(options_.device);
  out.targets = host.targets.to(options_.device);
  out.index = host.index;
  retained_.push_back(std::move(host));
  if (retained_.size() > kRetainedUploads) retained_.pop_front();
  return true;
}

void DataLoader::Impl::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  space_cv_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  made_.clear();
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : impl_(std::make_unique<Impl>(std::move(dataset), std::move(options))) {}
DataLoader::~DataLoader() = default;
void DataLoader::begin_epoch(uint64_t epoch, int64_t first_batch) { impl_->begin_epoch(epoch, first_batch); }
bool DataLoader::next(Batch& out) { return impl_->next(out); }
int64_t DataLoader::num_batches() const { return impl_->num_batches(); }
int64_t DataLoader::size() const { return impl_->size(); }

}  // namespace data
}  // namespace normcore
