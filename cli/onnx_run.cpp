// normcore onnx-run: an ONNX model on input files. Without inputs it lists the graph's inputs
// and outputs; with them (TensorProto .pb files in the graph's input order, or one
// .safetensors file holding them by name, or --random) it runs the model on --device and
// prints each output's dtype, shape and first values, writes them with --out, and with
// --repeat N times N more runs and prints their median (with --cuda-graph, the runs after the
// second replay a CUDA graph); --profile N prints where N eager runs spent their time, per op
// type.
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>

#include "cli/commands.h"
#include "normcore/normcore.h"
#include "normcore/onnx.h"

namespace nc = normcore;

namespace cli {

namespace {

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + (dims[i] < 0 ? "?" : std::to_string(dims[i]));
  return out + "]";
}

void list(const nc::onnx::Model& model) {
  std::cout << "opset " << model.opset() << "\n";
  for (const auto& v : model.inputs())
    std::cout << "input  " << v.name << ": " << nc::dtype_name(v.dtype) << " " << dims_str(v.dims) << "\n";
  for (const auto& v : model.outputs())
    std::cout << "output " << v.name << ": " << nc::dtype_name(v.dtype) << " " << dims_str(v.dims) << "\n";
}

// Inputs of the graph's dims: normal floats, zeros of other dtypes; a dim the file leaves
// open is a ValueError (its size is the caller's to give, in a file).
std::vector<nc::Tensor> random_inputs(const nc::onnx::Model& model, uint64_t seed) {
  nc::Generator gen(seed);
  std::vector<nc::Tensor> out;
  for (const auto& v : model.inputs()) {
    NC_CHECK(std::all_of(v.dims.begin(), v.dims.end(), [](int64_t d) { return d >= 0; }), ValueError,
             "onnx-run: input '", v.name, "' has open dims ", dims_str(v.dims),
             ": --random needs them all; give the inputs as files");
    out.push_back(nc::is_floating(v.dtype) ? nc::randn(v.dims, nc::DType::F32, &gen).to(v.dtype)
                                           : nc::zeros(v.dims, nc::TensorOptions(v.dtype)));
  }
  return out;
}

std::vector<nc::Tensor> file_inputs(const nc::onnx::Model& model, const std::vector<std::string>& files) {
  std::vector<nc::Tensor> out;
  if (files.size() == 1 && files[0].size() > 12 && files[0].substr(files[0].size() - 12) == ".safetensors") {
    const nc::safetensors::File file = nc::safetensors::load(files[0]);
    for (const auto& v : model.inputs()) out.push_back(file.at(v.name));
    return out;
  }
  NC_CHECK(files.size() == model.inputs().size(), ValueError, "onnx-run: the model takes ", model.inputs().size(),
           " inputs, got ", files.size(), " files (TensorProto .pb files in the graph's order, or one .safetensors)");
  for (const std::string& f : files) out.push_back(nc::onnx::read_tensor_file(f));
  return out;
}

void print(const nc::onnx::ValueInfo& info, const nc::Tensor& t) {
  std::cout << info.name << ": " << nc::dtype_name(t.dtype()) << " " << nc::shape_str(t.shape());
  const nc::Tensor flat = t.to(nc::Device::cpu(), nc::DType::F64).contiguous().reshape({-1});
  const int64_t shown = std::min<int64_t>(flat.numel(), 8);
  const std::vector<double> v =
      flat.numel() > 0 ? flat.narrow(0, 0, shown).contiguous().to_vector<double>() : std::vector<double>{};
  std::cout << " [";
  for (int64_t i = 0; i < shown; ++i) std::cout << (i ? ", " : "") << std::setprecision(6) << v[i];
  std::cout << (flat.numel() > shown ? ", ...]" : "]") << "\n";
}

}  // namespace

int onnx_run(const Args& args) {
  NC_CHECK(!args.positional.empty(), ValueError, "onnx-run: name the model (MODEL.onnx [INPUT...])");
  const nc::onnx::Model model = nc::onnx::Model::load(args.positional[0]);
  const std::vector<std::string> files(args.positional.begin() + 1, args.positional.end());
  const bool random = flag(args, "random");
  if (files.empty() && !random) {
    list(model);
    return 0;
  }
  NC_CHECK(files.empty() || !random, ValueError, "onnx-run: give input files or --random, not both");
  const nc::Device device = pick_device(args.options.at("device"));
  if (device.is_cuda()) nc::cuda::set_allow_tf32(flag(args, "tf32"));
  std::vector<nc::Tensor> inputs = random ? random_inputs(model, 0) : file_inputs(model, files);
  for (nc::Tensor& t : inputs) t = t.to(device);
  const bool graph = flag(args, "cuda-graph");
  std::vector<nc::Tensor> outputs = model.run(inputs, graph);
  for (size_t i = 0; i < outputs.size(); ++i) print(model.outputs()[i], outputs[i]);
  const int64_t repeat = integer(args, "repeat", 0);
  if (repeat > 0) {
    std::vector<double> ms;
    for (int64_t r = 0; r < repeat; ++r) {
      const auto start = std::chrono::steady_clock::now();
      outputs = model.run(inputs, graph);
      if (device.is_cuda()) nc::cuda::synchronize(device.index);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(ms.begin(), ms.end());
    if (graph && device.is_cuda()) std::cout << "CUDA graph: " << model.cuda_graph_state(inputs) << "\n";
    std::cout << "median of " << repeat << " runs on " << device.str() << ": " << std::fixed << std::setprecision(3)
              << ms[ms.size() / 2] << " ms (fastest " << ms.front() << ")\n";
  }
  const int64_t profile_runs = integer(args, "profile", 0);
  if (profile_runs > 0) {
    const std::vector<nc::onnx::Model::OpTime> times = model.profile(inputs, static_cast<int>(profile_runs));
    double total = 0;
    for (const auto& t : times) total += t.ms;
    std::cout << "profile, mean of " << profile_runs << " eager runs on " << device.str()
              << " (waiting after every node): " << std::fixed << std::setprecision(3) << total << " ms\n";
    for (const auto& t : times) {
      std::cout << "  " << std::left << std::setw(24) << t.op << std::right << std::setw(5) << t.nodes << " nodes "
                << std::setw(10) << t.ms << " ms " << std::setw(6) << std::setprecision(1)
                << (total > 0 ? 100 * t.ms / total : 0.0) << "%\n"
                << std::setprecision(3);
    }
  }
  const std::string out = args.options.at("out");
  if (!out.empty()) {
    nc::safetensors::TensorList named;
    for (size_t i = 0; i < outputs.size(); ++i) named.emplace_back(model.outputs()[i].name, outputs[i]);
    nc::safetensors::save(out, named);
    std::cout << "wrote " << outputs.size() << " outputs to " << out << "\n";
  }
  return 0;
}

}  // namespace cli
