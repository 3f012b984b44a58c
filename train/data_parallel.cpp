// The data-parallel side of a training run (normcore/train.h: DataParallelJob): the rank's
// device, joining the process group, DistributedDataParallel, the rank's own generator.
#include <algorithm>
#include <cstdlib>
#include <thread>

#include "normcore/cuda.h"
#include "normcore/error.h"
#include "normcore/train.h"

namespace normcore {
namespace train {

DataParallelJob::DataParallelJob()
    : env_(distributed::Env::from_environment()), active_(std::getenv("WORLD_SIZE") != nullptr) {}

Device DataParallelJob::device(const std::string& spec) const {
  if (!active_) {
    if (spec == "auto") return best_device();
    Device d(spec);
    NC_CHECK(d.is_cpu() || d.index < cuda_device_count(), DeviceError, "--device ", spec, ": no such device (",
             cuda_device_count(), " CUDA device(s) visible)");
    return d;
  }
  if (spec == "cpu") return Device::cpu();
  NC_CHECK(spec == "auto" || spec == "cuda", ValueError, "--device ", spec,
           ": a data-parallel rank takes --device auto, cuda (meaning cuda:LOCAL_RANK) or cpu");
  if (spec == "auto" && !cuda_is_available()) return Device::cpu();
  NC_CHECK(env_.local_rank < cuda_device_count(), DeviceError, "--device ", spec, ": local rank ", env_.local_rank,
           " needs cuda:", env_.local_rank, " but ", cuda_device_count(), " CUDA device(s) are visible");
  return Device::cuda(env_.local_rank);
}

void DataParallelJob::start(std::shared_ptr<nn::Module> model, Device device, Generator& gen, uint64_t seed,
                            double timeout_s, const distributed::DataParallelOptions& ddp_options) {
  if (!active_) return;
  if (env_.rank > 0) {
    const uint64_t offset = gen.offset();
    gen.manual_seed(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(env_.rank));
    gen.set_offset(offset);
  }
  NC_CHECK(timeout_s > 0 && timeout_s <= 86400, ValueError, "option --timeout must be in (0, 86400] seconds, got ",
           timeout_s);
  distributed::ProcessGroupOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  group_ = std::make_unique<distributed::ProcessGroup>(env_, device, options);
  ddp_ = std::make_unique<distributed::DistributedDataParallel>(std::move(model), *group_, ddp_options);
}

std::string DataParallelJob::describe(const Device& device, bool sharded_optimizer) const {
  if (!active_ || !group_) return "";
  return " (rank 0 of " + std::to_string(env_.world_size) + " over " + group_->backend() +
         (device.is_cuda() ? "; rank r on cuda:LOCAL_RANK" : "") +
         (sharded_optimizer ? ", optimizer state sharded" : "") + ")";
}

int DataParallelJob::auto_workers() const {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / 2 / std::max(world_size(), 1), 1, 4);
}

void DataParallelJob::finish() {
  if (group_) group_->barrier();
}

}  // namespace train
}  // namespace normcore
