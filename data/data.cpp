// Fashion-MNIST loading and the DataLoader. The loader's thread makes CPU batches (rows
// gathered in the order of this rank's share of the epoch, pixels normalized through a
// 256-entry table) and hands them over through a queue of two; next() copies them to the
// device on the caller's thread. Page-locked batch memory is carved from slabs, so that
// cudaHostAlloc is paid per slab and not per batch; a slab is freed with the last batch in
// it, which waits for its uploads.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "base/philox.h"
#include "base/shape.h"
#include "normcore/data.h"

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

constexpr size_t kQueueDepth = 2;
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

}  // namespace

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  const std::string split = train ? "train" : "t10k";
  const std::string images_path = dataset_file(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = dataset_file(dir, split + "-labels-idx1-ubyte");
  const Tensor images = read_idx(images_path);
  const Tensor labels = read_idx(labels_path);
  if (images.dtype() != DType::U8 || images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28)
    fail_file(images_path, "expected images u8 [N, 28, 28], got ", dtype_name(images.dtype()), " ",
              images.shape());
  if (labels.dtype() != DType::U8 || labels.dim() != 1)
    fail_file(labels_path, "expected labels u8 [N], got ", dtype_name(labels.dtype()), " ", labels.shape());
  if (labels.size(0) != images.size(0))
    fail_file(labels_path, "holds ", labels.size(0), " labels but ", images_path, " holds ", images.size(0),
              " images");
  const uint8_t* values = labels.data<uint8_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    if (values[i] >= 10)
      fail_file(labels_path, "label ", int(values[i]), " at index ", i, " is outside [0, 10)");
  return Dataset{images, labels.to(DType::I64)};
}

// ---------------------------------------------------------------- DataLoader
class DataLoader::Impl {
 public:
  Impl(Dataset dataset, DataLoaderOptions options);
  ~Impl();

  void begin_epoch(uint64_t epoch);
  bool next(Batch& out);
  int64_t num_batches() const { return batches_; }
  int64_t size() const { return share_; }

 private:
  std::vector<int64_t> epoch_order(uint64_t epoch) const;
  std::vector<int64_t> rank_share(const std::vector<int64_t>& order) const;
  Batch make_batch(int64_t index, PinnedArena* arena) const;
  void run_worker() noexcept;
  // Waits for room in the queue; false when the loader is stopping.
  bool push(Batch batch);
  void stop_worker();

  DataLoaderOptions options_;
  Tensor images_;  // u8, contiguous, CPU
  Tensor labels_;  // i64, contiguous, CPU
  int64_t samples_ = 0;  // in the dataset
  int64_t share_ = 0;    // this rank's per epoch, padding included
  int64_t row_len_ = 0;
  Shape sample_shape_;
  int64_t batches_ = 0;
  size_t slab_bytes_ = 0;
  float table_[256];

  std::vector<int64_t> order_;  // this rank's share of the epoch; written only while no worker runs
  bool started_ = false;
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable ready_;  // a batch was queued or the worker finished
  std::condition_variable space_;  // a batch left the queue or the loader is stopping
  std::deque<Batch> queue_;
  bool stopping_ = false;
  bool worker_done_ = false;
  std::exception_ptr worker_error_;
  std::deque<Batch> retained_;  // host batches whose uploads were queued last
};

DataLoader::Impl::Impl(Dataset dataset, DataLoaderOptions options) : options_(std::move(options)) {
  const Tensor& images = dataset.images;
  const Tensor& labels = dataset.labels;
  NC_CHECK(images.defined(), ValueError, "DataLoader: the dataset's images are an undefined tensor");
  NC_CHECK(labels.defined(), ValueError, "DataLoader: the dataset's labels are an undefined tensor");
  NC_CHECK(images.dtype() == DType::U8, DTypeError, "DataLoader: images must be u8, got ", describe(images));
  NC_CHECK(images.dim() == 3 || images.dim() == 4, ShapeError,
           "DataLoader: images must be [N, H, W] or [N, C, H, W], got ", describe(images));
  NC_CHECK(labels.dtype() == DType::I64, DTypeError, "DataLoader: labels must be i64, got ", describe(labels));
  NC_CHECK(labels.dim() == 1, ShapeError, "DataLoader: labels must be [N], got ", describe(labels));
  NC_CHECK(images.size(0) == labels.size(0), ShapeError, "DataLoader: ", images.size(0), " images but ",
           labels.size(0), " labels (images ", describe(images), ", labels ", describe(labels), ")");
  samples_ = images.size(0);
  NC_CHECK(samples_ > 0, ValueError, "DataLoader: the dataset is empty (images ", describe(images), ")");
  // The shuffle draws sample positions from 32-bit counter halves.
  NC_CHECK(samples_ <= int64_t(std::numeric_limits<uint32_t>::max()), ValueError, "DataLoader: ", samples_,
           " samples are more than the ", std::numeric_limits<uint32_t>::max(), " supported");
  NC_CHECK(options_.batch_size > 0, ValueError, "DataLoader: batch_size must be positive, got ",
           options_.batch_size);
  NC_CHECK(options_.num_replicas >= 1, ValueError, "DataLoader: num_replicas must be positive, got ",
           options_.num_replicas);
  NC_CHECK(options_.rank >= 0 && options_.rank < options_.num_replicas, ValueError, "DataLoader: rank ",
           options_.rank, " is outside [0, num_replicas) for num_replicas ", options_.num_replicas);
  // Padding to a multiple of num_replicas gives every rank the same count.
  share_ = (samples_ + options_.num_replicas - 1) / options_.num_replicas;
  NC_CHECK(std::isfinite(options_.mean), ValueError, "DataLoader: mean must be finite, got ", options_.mean);
  NC_CHECK(std::isfinite(options_.stddev) && options_.stddev > 0, ValueError,
           "DataLoader: stddev must be positive and finite, got ", options_.stddev);
  NC_CHECK(!options_.drop_last || share_ >= options_.batch_size, ValueError, "DataLoader: drop_last with ",
           share_, " samples per rank (", samples_, " in the dataset, num_replicas ", options_.num_replicas,
           ") and batch_size ", options_.batch_size, " leaves no batch");
  const Device device = options_.device;
  if (device.is_cuda())
    NC_CHECK(device.index >= 0 && device.index < cuda_device_count(), DeviceError, "DataLoader: device ",
             device, " does not exist (", cuda_device_count(), " CUDA device(s) visible)");

  images_ = images.to(Device::cpu()).contiguous();
  labels_ = labels.to(Device::cpu()).contiguous();
  row_len_ = images_.numel() / samples_;
  if (options_.flatten)
    sample_shape_ = {row_len_};
  else if (images_.dim() == 3)
    sample_shape_ = {1, images_.size(1), images_.size(2)};
  else
    sample_shape_ = {images_.size(1), images_.size(2), images_.size(3)};
  const int64_t full = share_ / options_.batch_size;
  batches_ = options_.drop_last || share_ % options_.batch_size == 0 ? full : full + 1;
  const size_t rows = static_cast<size_t>(std::min(options_.batch_size, share_));
  slab_bytes_ = std::max(kSlabBytes, align_up(rows * row_len_ * sizeof(float)) + align_up(rows * sizeof(int64_t)));
  for (int v = 0; v < 256; ++v) table_[v] = (static_cast<float>(v) / 255.0f - options_.mean) / options_.stddev;
}

DataLoader::Impl::~Impl() {
  try {
    stop_worker();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "normcore: DataLoader: stopping the loader thread failed: %s\n", e.what());
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

void DataLoader::Impl::begin_epoch(uint64_t epoch) {
  NC_CHECK(epoch <= std::numeric_limits<uint32_t>::max(), ValueError, "DataLoader::begin_epoch: epoch ", epoch,
           " is not below 2^32");
  stop_worker();
  order_ = rank_share(epoch_order(epoch));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.clear();
    stopping_ = false;
    worker_done_ = false;
    worker_error_ = nullptr;
  }
  started_ = true;
  worker_ = std::thread(&Impl::run_worker, this);
}

Batch DataLoader::Impl::make_batch(int64_t index, PinnedArena* arena) const {
  const int64_t first = index * options_.batch_size;
  const int64_t rows = std::min(options_.batch_size, share_ - first);
  Shape image_shape = {rows};
  image_shape.insert(image_shape.end(), sample_shape_.begin(), sample_shape_.end());
  Batch batch;
  batch.index = index;
  batch.images = arena ? arena->take(image_shape, DType::F32) : empty(image_shape, TensorOptions(DType::F32));
  batch.labels = arena ? arena->take({rows}, DType::I64) : empty({rows}, TensorOptions(DType::I64));
  const uint8_t* pixels = images_.data<uint8_t>();
  const int64_t* labels = labels_.data<int64_t>();
  float* out = batch.images.data<float>();
  int64_t* out_labels = batch.labels.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t sample = order_[static_cast<size_t>(first + r)];
    const uint8_t* row = pixels + sample * row_len_;
    float* dst = out + r * row_len_;
    for (int64_t k = 0; k < row_len_; ++k) dst[k] = table_[row[k]];
    out_labels[r] = labels[sample];
  }
  return batch;
}

void DataLoader::Impl::run_worker() noexcept {
  std::exception_ptr error;
  try {
    std::unique_ptr<PinnedArena> arena;
    if (options_.device.is_cuda()) arena = std::make_unique<PinnedArena>(slab_bytes_);
    for (int64_t b = 0; b < batches_; ++b) {
      Batch batch = make_batch(b, arena.get());
      if (options_.transform) options_.transform(batch);
      if (!push(std::move(batch))) break;
    }
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    worker_error_ = error;
    worker_done_ = true;
  }
  ready_.notify_all();
}

bool DataLoader::Impl::push(Batch batch) {
  std::unique_lock<std::mutex> lock(mutex_);
  space_.wait(lock, [&] { return stopping_ || queue_.size() < kQueueDepth; });
  if (stopping_) return false;
  queue_.push_back(std::move(batch));
  lock.unlock();
  ready_.notify_one();
  return true;
}

bool DataLoader::Impl::next(Batch& out) {
  NC_CHECK(started_, ValueError, "DataLoader::next: no epoch has begun; call begin_epoch(epoch) first");
  Batch host;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !queue_.empty() || worker_done_; });
    if (queue_.empty()) {
      // The batches made before a failure come first; then the failure, once.
      if (worker_error_) std::rethrow_exception(std::exchange(worker_error_, nullptr));
      return false;
    }
    host = std::move(queue_.front());
    queue_.pop_front();
  }
  space_.notify_one();
  if (options_.device.is_cpu()) {
    out = std::move(host);
    return true;
  }
  out.images = host.images.to(options_.device);
  out.labels = host.labels.to(options_.device);
  out.index = host.index;
  retained_.push_back(std::move(host));
  if (retained_.size() > kRetainedUploads) retained_.pop_front();
  return true;
}

void DataLoader::Impl::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  space_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.clear();
}

DataLoader::DataLoader(Dataset dataset, DataLoaderOptions options)
    : impl_(std::make_unique<Impl>(std::move(dataset), std::move(options))) {}
DataLoader::~DataLoader() = default;
void DataLoader::begin_epoch(uint64_t epoch) { impl_->begin_epoch(epoch); }
bool DataLoader::next(Batch& out) { return impl_->next(out); }
int64_t DataLoader::num_batches() const { return impl_->num_batches(); }
int64_t DataLoader::size() const { return impl_->size(); }

}  // namespace data
}  // namespace normcore
