// What the normcore program's training commands (train, train-lm) share on top of the
// Trainer (normcore/train.h): the options every run takes, the --workers of its loader, and
// its own launch with --nproc.
#pragma once

#include <string>
#include <vector>

#include "cli/args.h"
#include "normcore/train.h"

namespace cli {

namespace nc = normcore;

// The command line as given, for --nproc, which runs the program again under the launcher.
inline std::vector<std::string> g_argv;  // main() sets it

// --nproc N (N > 1): runs this program's command line, without --nproc and --max-restarts,
// as N ranks through the launcher (MASTER_PORT from the environment when set), starting them
// all again at most max_restarts times after a failure.
int launch_self(int nproc, int max_restarts);

// The Trainer's options from the options both commands take (--precision, --cuda-graph,
// --clip, --seed, --out, --resume (auto: --out when it exists), --log, --plot, --stop-after,
// --timeout); the given
// options, but --resume, --help, --stop-after and --max-restarts, are saved in the checkpoints.
nc::train::TrainerOptions trainer_options(const Args& args, const nc::Device& device);

// --workers: auto (from the cores with per-sample transforms, which the caller says it has;
// one otherwise, where a worker gathers a batch faster than a step uses it) or a number.
int loader_workers(const Args& args, const nc::train::DataParallelJob& job, bool sample_transforms);

}  // namespace cli
