// The normcore program's commands, each a function of its parsed options (main.cpp holds
// the options and picks the command).
#pragma once

#include <vector>

#include "cli/args.h"

namespace cli {

int train(const Args& args);        // train.cpp: a Fashion-MNIST classifier
int eval(const Args& args);         // train.cpp
int predict(const Args& args);      // train.cpp
int train_lm(const Args& args);     // train_lm.cpp: a GPT on bytes or token shards
int generate(const Args& args);     // generate.cpp
int conformance(const Args& args);  // tools.cpp
int tokenize(const Args& args);     // tools.cpp
int launch(const Args& args);       // tools.cpp
int onnx_test(const Args& args);    // onnx_test.cpp (when built with ONNX)
int onnx_run(const Args& args);     // onnx_run.cpp (when built with ONNX)

}  // namespace cli
