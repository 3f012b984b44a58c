// The normcore program's training options and its own launch (cli/training.h).
#include "cli/training.h"

#include <cstdlib>
#include <filesystem>

#include "normcore/distributed.h"
#include "normcore/error.h"

namespace cli {

int launch_self(int nproc, int max_restarts) {
  NC_CHECK(std::getenv("WORLD_SIZE") == nullptr, ValueError, "option --nproc ", nproc,
           ": this process is already a rank of a job (WORLD_SIZE is set)");
  std::vector<std::string> command{std::filesystem::read_symlink("/proc/self/exe").string()};
  for (size_t i = 1; i < g_argv.size(); ++i) {
    if (g_argv[i] == "--nproc" || g_argv[i] == "--max-restarts") {
      ++i;
    } else if (g_argv[i].rfind("--nproc=", 0) != 0 && g_argv[i].rfind("--max-restarts=", 0) != 0) {
      command.push_back(g_argv[i]);
    }
  }
  nc::distributed::LaunchOptions options;
  options.nproc = nproc;
  options.max_restarts = max_restarts;
  options.master_port = nc::distributed::Env::from_environment().master_port;
  return nc::distributed::launch(command, options);
}

nc::train::TrainerOptions trainer_options(const Args& args, const nc::Device& device) {
  nc::train::TrainerOptions o;
  o.device = device;
  o.precision = args.options.at("precision");
  o.cuda_graph = args.options.at("cuda-graph");
  o.clip = number(args, "clip");
  o.seed = static_cast<uint64_t>(integer(args, "seed", 0));
  o.checkpoint = args.options.at("out");
  o.resume = args.options.at("resume");
  // auto: the run's own checkpoint when there is one (a job started again after a failure).
  if (o.resume == "auto") o.resume = std::filesystem::exists(o.checkpoint) ? o.checkpoint : "";
  o.log = args.options.at("log");
  o.plot = args.options.at("plot");
  o.stop_after = integer(args, "stop-after", 0);
  o.timeout_s = number(args, "timeout");
  const std::string& shard = args.options.at("shard-optimizer");
  NC_CHECK(shard == "on" || shard == "off", ValueError, "option --shard-optimizer must be on or off, got '", shard,
           "'");
  o.shard_optimizer = shard == "on";
  NC_CHECK(!o.shard_optimizer || std::getenv("WORLD_SIZE") != nullptr, ValueError,
           "option --shard-optimizer on shares the optimizer's state among data-parallel ranks: give --nproc 2 or "
           "more (or run under normcore launch)");
  const std::string& reduce = args.options.at("reduce-precision");
  NC_CHECK(reduce == "auto" || reduce == "bf16", ValueError, "option --reduce-precision must be auto or bf16, got '",
           reduce, "'");
  if (reduce == "bf16") o.reduce_dtype = nc::DType::BF16;
  for (const auto& [k, v] : args.options)
    if (k != "resume" && k != "help" && k != "stop-after" && k != "max-restarts") o.options[k] = v;
  return o;
}

int loader_workers(const Args& args, const nc::train::DataParallelJob& job, bool sample_transforms) {
  const std::string& workers = args.options.at("workers");
  const bool whole = !workers.empty() && workers.find_first_not_of("0123456789") == std::string::npos;
  NC_CHECK(workers == "auto" || (whole && workers.size() <= 4), ValueError,
           "option --workers expects auto or a whole number from 0 to 9999, got '", workers, "'");
  return workers != "auto" ? std::stoi(workers) : sample_transforms ? job.auto_workers() : 1;
}

}  // namespace cli
