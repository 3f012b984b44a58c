// Conformance runner: replays operator cases produced by a reference implementation
// (safetensors files with inputs, grad_out, the expected out and grad.<input>; the format is
// described in tests/data/conformance and ../shared/conformance/README.md) on a device and
// compares every result in float64 with the case's tolerances. A case that cannot run
// (unknown op, missing tensor, bad attributes, an exception) is a failure with a reason.
#pragma once

#include <string>
#include <vector>

#include "normcore/device.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace conformance {

// One compared tensor: "out" or "grad.<input>".
struct TensorResult {
  std::string name;
  double worst_abs = 0;  // max over elements of |got - expected|
  // Max over elements of |got - expected| / (atol + rtol * |expected|): <= 1 passes.
  double worst_rel_to_tol = 0;
  bool pass = false;
};

struct CaseResult {
  std::string file;   // the path the case was read from
  std::string op;     // the metadata's op ("" when absent)
  std::string dtype;  // the case dtype as normcore names it ("f32", "bf16"), or as written
  Device device;
  bool pass = false;
  std::string reason;  // why it failed or could not run; empty when it passed
  std::vector<TensorResult> tensors;
};

// Runs the case in path on device. Never throws for a bad case: the failure is in the result.
CaseResult run_case(const std::string& path, Device device);

// run_case for every *.safetensors file in dir, in sorted file-name order. Throws IOError
// when dir cannot be listed.
std::vector<CaseResult> run_dir(const std::string& dir, Device device);

}  // namespace conformance
}  // namespace normcore

#pragma GCC visibility pop
