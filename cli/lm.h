// The normcore program's language-model commands: train-lm (a GPT on the fortunes corpus or
// token shards) and generate (a train-lm checkpoint, or a Hugging Face GPT-2 folder with
// its tokenizer).
#pragma once

#include "cli/args.h"

namespace cli {

int train_lm(const Args& args);
int generate(const Args& args);

}  // namespace cli
