// ONNX models on normcore's ops: onnx::Model reads a .onnx file (with the protobuf classes of
// Debian's libonnx-dev, linked into the library when it was there at build time), checks the
// graph before anything runs (opset, every node's op and attributes against the supported set,
// inputs defined before use, initializers' sizes against their bytes) and runs it on CPU or
// CUDA tensors. docs/ONNX.md lists the ops and how a model runs. In a library built without
// the importer (`normcore: ONNX importer off` at configure time) every function here throws
// Error saying so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "normcore/tensor.h"

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {
namespace onnx {

// An input or output of the graph: its name, dtype and dims (-1 where the file leaves a dim
// unnamed or symbolic).
struct ValueInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> dims;
};

class Model {
 public:
  // Reads and checks path: IOError naming the file for what cannot be read or parsed, or
  // for a graph that refers to a value nothing defines; ValueError naming the node, the op
  // and the attribute for what normcore does not run (ops, attributes, dtypes, opsets past
  // 17).
  static Model load(const std::string& path);
  // The same from the file's bytes; name stands for the file in messages.
  static Model parse(const std::string& bytes, const std::string& name);

  // The graph's inputs that are not initializers, and its outputs.
  const std::vector<ValueInfo>& inputs() const;
  const std::vector<ValueInfo>& outputs() const;
  int64_t opset() const;

  // Runs the graph on inputs (in inputs()' order, any device; the graph's constants go to
  // the first input's device, the CPU without inputs) and returns the outputs in outputs()'
  // order, recording no gradients. The initializers are copied to a device by the first run
  // there and kept for the later ones (one copy per device; runs on several threads share
  // it). ShapeError or DTypeError naming the input for one that does not fit.
  //
  // With cuda_graph on a CUDA device, runs of one input signature (dtypes and shapes) become
  // a CUDA graph: the first runs eagerly and keeps the values that depend on the shapes only
  // (shape arithmetic, masks built from shapes), the second captures the rest and every
  // later one copies the inputs in and replays it, which takes the host's time per op away.
  // Outputs are copies. When the graph reads a value that depends on the input data on the
  // host, that signature stays eager (cuda_graph_state says why).
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, bool cuda_graph = false) const;
  // "not run", "recorded" (one eager run), "captured", or "eager: " and the reason the
  // capture failed, for the signature of inputs.
  std::string cuda_graph_state(const std::vector<Tensor>& inputs) const;

  // Where a run's time goes: runs the graph eagerly `runs` times on inputs (as run() does,
  // but waiting for the device after every node) and returns, per op type (a fused
  // convolution as "Conv+Add+Relu" and the like), the nodes of that type and their mean
  // milliseconds a run, the most expensive first. Waiting after each node makes the total
  // larger than a run's on a GPU; the shares are what it is for.
  struct OpTime {
    std::string op;
    int64_t nodes = 0;
    double ms = 0;
  };
  std::vector<OpTime> profile(const std::vector<Tensor>& inputs, int runs = 1) const;

  struct Impl;

 private:
  Model() = default;  // a Model comes from load or parse
  std::shared_ptr<const Impl> impl_;
};

// A TensorProto file (an ONNX backend test's input_N.pb, output_N.pb) as a CPU tensor.
// IOError naming the file for bytes that are not one, or whose data does not match its dims.
Tensor read_tensor_file(const std::string& path);

// The ops run() supports, for messages and docs.
const std::vector<std::string>& supported_ops();

}  // namespace onnx
}  // namespace normcore

#pragma GCC visibility pop
