// The normcore program's tool commands: conformance (the reference cases of a folder against
// every device), tokenize (GPT-2 token ids, cli/tokenize.h) and launch (a command as the
// local ranks of a data-parallel job).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/tokenize.h"
#include "normcore/conformance.h"
#include "normcore/distributed.h"
#include "normcore/normcore.h"

namespace cli {

namespace nc = normcore;

namespace {

// One line per case and device: verdict, file, op, dtype, device, the worst error of each
// compared tensor (absolute, and as a fraction of its tolerance), then the failure reason.
void print_case(const nc::conformance::CaseResult& r) {
  std::printf("%s %s %s %s %s", r.pass ? "PASS" : "FAIL", std::filesystem::path(r.file).filename().string().c_str(),
              r.op.empty() ? "-" : r.op.c_str(), r.dtype.empty() ? "-" : r.dtype.c_str(), r.device.str().c_str());
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const auto& t = r.tensors[i];
    std::printf("%s %s %.1e (%.2g tol)", i ? "," : " ", t.name.c_str(), t.worst_abs, t.worst_rel_to_tol);
  }
  if (!r.pass) std::printf(" -- %s", r.reason.c_str());
  std::printf("\n");
}

}  // namespace

int conformance(const Args& args) {
  NC_CHECK(args.positional.size() == 1, ValueError, "conformance: give one folder of cases, got ",
           args.positional.size(), " arguments");
  const std::string& spec = args.options.at("device");
  std::vector<nc::Device> devices;
  if (spec == "all") {
    devices.push_back(nc::Device::cpu());
    if (nc::cuda_is_available()) devices.push_back(nc::Device::cuda());
  } else {
    NC_CHECK(spec != "auto", ValueError, "conformance: --device takes cpu, cuda[:N] or all, got 'auto'");
    devices.push_back(pick_device(spec));
  }
  int passed = 0, failed = 0;
  for (const nc::Device& device : devices) {
    for (const auto& r : nc::conformance::run_dir(args.positional[0], device)) {
      print_case(r);
      (r.pass ? passed : failed) += 1;
    }
  }
  NC_CHECK(passed + failed > 0, IOError, "conformance: no .safetensors cases in '", args.positional[0], "'");
  std::printf("%d passed, %d failed\n", passed, failed);
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

int launch(const Args& args) {
  nc::distributed::LaunchOptions options;
  options.nproc = static_cast<int>(integer(args, "nproc", 1));
  options.nnodes = static_cast<int>(integer(args, "nnodes", 1));
  options.node_rank = static_cast<int>(integer(args, "node-rank", 0));
  options.master_addr = args.options.at("master-addr");
  options.master_port = static_cast<int>(integer(args, "master-port", 1));
  options.max_restarts = static_cast<int>(integer(args, "max-restarts", 0));
  NC_CHECK(!args.positional.empty(), ValueError, "no command to run: normcore launch --nproc N -- <command...>");
  return nc::distributed::launch(args.positional, options);
}

int tokenize(const Args& args) {
  return run_tokenize({args.options.at("tokenizer"), args.positional, args.options.at("out"), flag(args, "special"),
                       flag(args, "decode")});
}

}  // namespace cli
