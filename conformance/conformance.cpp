// Conformance runner: reads a case (metadata op, attrs, dtype, tolerances, no_grad; inputs,
// grad_out, expected out, grad.<input> and after.<buffer>), runs the op forward and backward
// on the requested device through the public functional ops, and compares in float64. Ops
// are one row each in op_table(); adding an op is one row. Every problem with a case becomes
// its failure reason: a case whose op has no row, or that holds a tensor the runner would
// not compare, fails.
#include "normcore/conformance.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "normcore/attention.h"
#include "normcore/autograd.h"
#include "normcore/conv.h"
#include "normcore/error.h"
#include "normcore/fused.h"
#include "normcore/losses.h"
#include "normcore/nn.h"
#include "normcore/norms.h"
#include "normcore/ops.h"
#include "normcore/safetensors.h"
#include "normcore/tensor.h"

namespace normcore {
namespace conformance {
namespace {

using json = nlohmann::json;

// The case's inputs by name, on the run device; an absent optional input is not in the map.
using Inputs = std::map<std::string, Tensor>;

Tensor optional_input(const Inputs& inputs, const std::string& name) {
  auto it = inputs.find(name);
  return it == inputs.end() ? Tensor() : it->second;
}

// ---- attributes (a JSON object in the metadata's "attrs") ----
double attr_number(const json& attrs, const char* key, double fallback) {
  if (!attrs.contains(key)) return fallback;
  NC_CHECK(attrs[key].is_number(), ValueError, "attribute '", key, "' must be a number, got ", attrs[key].dump());
  return attrs[key].get<double>();
}

int64_t attr_integer(const json& attrs, const char* key, std::optional<int64_t> fallback = std::nullopt) {
  if (!attrs.contains(key)) {
    NC_CHECK(fallback.has_value(), ValueError, "attribute '", key, "' is missing");
    return *fallback;
  }
  NC_CHECK(attrs[key].is_number_integer(), ValueError, "attribute '", key, "' must be an integer, got ",
           attrs[key].dump());
  return attrs[key].get<int64_t>();
}

std::vector<int64_t> attr_integer_list(const json& attrs, const char* key) {
  NC_CHECK(attrs.contains(key), ValueError, "attribute '", key, "' is missing");
  const json& value = attrs[key];
  NC_CHECK(value.is_array(), ValueError, "attribute '", key, "' must be a list of integers, got ", value.dump());
  std::vector<int64_t> out;
  for (const json& v : value) {
    NC_CHECK(v.is_number_integer(), ValueError, "attribute '", key, "' must be a list of integers, got ", value.dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

bool attr_bool(const json& attrs, const char* key, std::optional<bool> fallback = std::nullopt) {
  if (!attrs.contains(key)) {
    NC_CHECK(fallback.has_value(), ValueError, "attribute '", key, "' is missing");
    return *fallback;
  }
  NC_CHECK(attrs[key].is_boolean(), ValueError, "attribute '", key, "' must be true or false, got ", attrs[key].dump());
  return attrs[key].get<bool>();
}

// An [h, w] pair, or one integer for both. Missing or null: fallback (Size2() when none is
// given, which the pooling ops read as "the kernel size").
Size2 attr_pair(const json& attrs, const char* key, std::optional<Size2> fallback = std::nullopt) {
  if (!attrs.contains(key) || attrs[key].is_null()) {
    NC_CHECK(fallback.has_value(), ValueError, "attribute '", key, "' is missing");
    return *fallback;
  }
  if (attrs[key].is_number_integer()) return Size2(attrs[key].get<int64_t>());
  const std::vector<int64_t> v = attr_integer_list(attrs, key);
  NC_CHECK(v.size() == 2, ValueError, "attribute '", key, "' must be [h, w], got ", attrs[key].dump());
  return Size2(v[0], v[1]);
}

// "mean" (the default), "sum" or "none".
Reduction attr_reduction(const json& attrs, const char* key) {
  if (!attrs.contains(key)) return Reduction::Mean;
  const json& value = attrs[key];
  NC_CHECK(value.is_string(), ValueError, "attribute '", key, "' must be a string, got ", value.dump());
  const std::string name = value.get<std::string>();
  if (name == "mean") return Reduction::Mean;
  if (name == "sum") return Reduction::Sum;
  NC_CHECK(name == "none", ValueError, "attribute '", key, "' must be \"mean\", \"sum\" or \"none\", got \"", name,
           "\"");
  return Reduction::None;
}

// ---- the ops ----
// [*, in] x, [out, in] weight, [out] bias (optional) -> [*, out], as matmul then add
Tensor linear_composed(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = matmul(x, weight.t());
  return bias.defined() ? y + bias : y;
}

struct OpSpec {
  std::string name;
  std::vector<std::string> required_inputs;
  std::vector<std::string> optional_inputs;
  std::vector<std::string> attrs;  // the attribute names the op accepts
  std::function<Tensor(const Inputs&, const json&)> forward;
};

const std::vector<OpSpec>& op_table() {
  static const std::vector<OpSpec> table = {
      {"layer_norm",
       {"x"},
       {"weight", "bias"},
       {"normalized_shape", "eps"},
       [](const Inputs& in, const json& a) {
         return layer_norm(in.at("x"), attr_integer_list(a, "normalized_shape"), optional_input(in, "weight"),
                           optional_input(in, "bias"), attr_number(a, "eps", 1e-5));
       }},
      {"rms_norm",
       {"x"},
       {"weight"},
       {"normalized_shape", "eps"},
       [](const Inputs& in, const json& a) {
         return rms_norm(in.at("x"), attr_integer_list(a, "normalized_shape"), optional_input(in, "weight"),
                         attr_number(a, "eps", 1e-6));
       }},
      {"group_norm",
       {"x"},
       {"weight", "bias"},
       {"num_groups", "eps"},
       [](const Inputs& in, const json& a) {
         return group_norm(in.at("x"), attr_integer(a, "num_groups"), optional_input(in, "weight"),
                           optional_input(in, "bias"), attr_number(a, "eps", 1e-5));
       }},
      {"l1_norm",
       {"x"},
       {},
       {"dim", "eps"},
       [](const Inputs& in, const json& a) {
         return l1_norm(in.at("x"), attr_integer(a, "dim", 1), attr_number(a, "eps", 1e-12));
       }},
      {"frobenius_norm",
       {"x"},
       {},
       {"eps"},
       [](const Inputs& in, const json& a) { return frobenius_norm(in.at("x"), attr_number(a, "eps", 1e-12)); }},
      {"linear",
       {"x", "weight"},
       {"bias"},
       {},
       [](const Inputs& in, const json&) {
         return linear_composed(in.at("x"), in.at("weight"), optional_input(in, "bias"));
       }},
      // [B, in] -> linear [B, OUT] -> group_norm -> min over dim 1 [B, 1] -> + bias [1, OUT, 1, 1]
      // -> [1, OUT, B, 1] (NumPy broadcasting).
      {"gemm_group_norm_min_bias",
       {"x", "linear.weight", "bias"},
       {"linear.bias", "group_norm.weight", "group_norm.bias"},
       {"num_groups", "eps"},
       [](const Inputs& in, const json& a) {
         return gemm_group_norm_min_bias(in.at("x"), in.at("linear.weight"), optional_input(in, "linear.bias"),
                                         optional_input(in, "group_norm.weight"), optional_input(in, "group_norm.bias"),
                                         in.at("bias"), attr_integer(a, "num_groups"), attr_number(a, "eps", 1e-5));
       }},
      {"conv2d",
       {"x", "weight"},
       {"bias"},
       {"stride", "padding", "dilation", "groups"},
       [](const Inputs& in, const json& a) {
         return conv2d(in.at("x"), in.at("weight"), optional_input(in, "bias"), attr_pair(a, "stride", Size2(1)),
                       attr_pair(a, "padding", Size2(0)), attr_pair(a, "dilation", Size2(1)),
                       attr_integer(a, "groups", 1));
       }},
      {"max_pool2d",
       {"x"},
       {},
       {"kernel_size", "stride", "padding", "dilation", "ceil_mode"},
       [](const Inputs& in, const json& a) {
         return max_pool2d(in.at("x"), attr_pair(a, "kernel_size"), attr_pair(a, "stride", Size2()),
                           attr_pair(a, "padding", Size2(0)), attr_pair(a, "dilation", Size2(1)),
                           attr_bool(a, "ceil_mode", false));
       }},
      {"avg_pool2d",
       {"x"},
       {},
       {"kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"},
       [](const Inputs& in, const json& a) {
         return avg_pool2d(in.at("x"), attr_pair(a, "kernel_size"), attr_pair(a, "stride", Size2()),
                           attr_pair(a, "padding", Size2(0)), attr_bool(a, "ceil_mode", false),
                           attr_bool(a, "count_include_pad", true));
       }},
      {"adaptive_avg_pool2d",
       {"x"},
       {},
       {"output_size"},
       [](const Inputs& in, const json& a) { return adaptive_avg_pool2d(in.at("x"), attr_pair(a, "output_size")); }},
      // running_mean and running_var are buffers: updated in place in training (the case's
      // after.<name> tensors hold their expected values).
      {"batch_norm",
       {"x", "running_mean", "running_var"},
       {"weight", "bias"},
       {"training", "momentum", "eps"},
       [](const Inputs& in, const json& a) {
         return batch_norm(in.at("x"), in.at("running_mean"), in.at("running_var"), optional_input(in, "weight"),
                           optional_input(in, "bias"), attr_bool(a, "training"), attr_number(a, "momentum", 0.1),
                           attr_number(a, "eps", 1e-5));
       }},
      {"scaled_dot_product_attention",
       {"q", "k", "v"},
       {},
       {"is_causal", "scale", "enable_gqa"},
       [](const Inputs& in, const json& a) {
         std::optional<double> scale;
         if (a.contains("scale") && !a["scale"].is_null()) scale = attr_number(a, "scale", 0.0);
         return scaled_dot_product_attention(in.at("q"), in.at("k"), in.at("v"), attr_bool(a, "is_causal", false),
                                             scale, attr_bool(a, "enable_gqa", false));
       }},
      {"gelu",
       {"x"},
       {},
       {"approximate"},
       [](const Inputs& in, const json& a) {
         std::string approximate = "none";
         if (a.contains("approximate")) {
           NC_CHECK(a["approximate"].is_string(), ValueError, "attribute 'approximate' must be a string, got ",
                    a["approximate"].dump());
           approximate = a["approximate"].get<std::string>();
         }
         NC_CHECK(approximate == "none" || approximate == "tanh", ValueError,
                  "attribute 'approximate' must be \"none\" or \"tanh\", got \"", approximate, "\"");
         return gelu(in.at("x"), approximate == "tanh");
       }},
      {"softmax",
       {"x"},
       {},
       {"dim"},
       [](const Inputs& in, const json& a) { return softmax(in.at("x"), attr_integer(a, "dim")); }},
      {"log_softmax",
       {"x"},
       {},
       {"dim"},
       [](const Inputs& in, const json& a) { return log_softmax(in.at("x"), attr_integer(a, "dim")); }},
      {"cross_entropy",
       {"x", "target"},
       {},
       {"reduction", "label_smoothing", "ignore_index"},
       [](const Inputs& in, const json& a) {
         return cross_entropy(in.at("x"), in.at("target"), attr_reduction(a, "reduction"),
                              attr_number(a, "label_smoothing", 0.0), attr_integer(a, "ignore_index", -100));
       }},
      {"embedding",
       {"weight", "indices"},
       {},
       {"padding_idx"},
       [](const Inputs& in, const json& a) {
         std::optional<int64_t> padding_idx;
         if (a.contains("padding_idx") && !a["padding_idx"].is_null()) padding_idx = attr_integer(a, "padding_idx");
         return embedding(in.at("weight"), in.at("indices"), padding_idx);
       }},
  };
  return table;
}

// ---- reading the case ----
const std::string& metadata(const safetensors::File& file, const std::string& key) {
  auto it = file.metadata.find(key);
  NC_CHECK(it != file.metadata.end(), ValueError, "metadata has no '", key, "'");
  return it->second;
}

double metadata_number(const safetensors::File& file, const std::string& key) {
  const std::string& text = metadata(file, key);
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  NC_CHECK(!text.empty() && end && *end == '\0' && std::isfinite(value) && value >= 0, ValueError, "metadata '", key,
           "' must be a non-negative number, got '", text, "'");
  return value;
}

// Safetensors spells dtypes "F32", "BF16"; normcore "f32", "bf16".
DType case_dtype(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  DType dtype = dtype_from_name(lower);
  NC_CHECK(is_floating(dtype), DTypeError, "metadata 'dtype' must be a floating dtype, got '", text, "'");
  return dtype;
}

json parse_attrs(const safetensors::File& file, const OpSpec& spec) {
  auto it = file.metadata.find("attrs");
  json attrs = json::object();
  if (it != file.metadata.end()) {
    try {
      attrs = json::parse(it->second);
    } catch (const json::exception& e) {
      throw ValueError(detail::cat_str("metadata 'attrs' is not valid JSON (", e.what(), ")"));
    }
  }
  NC_CHECK(attrs.is_object(), ValueError, "metadata 'attrs' must be a JSON object, got ", attrs.dump());
  for (auto item = attrs.begin(); item != attrs.end(); ++item) {
    bool known = std::find(spec.attrs.begin(), spec.attrs.end(), item.key()) != spec.attrs.end();
    NC_CHECK(known, ValueError, "unknown attribute '", item.key(), "' for op ", spec.name);
  }
  return attrs;
}

// ---- comparing ----
std::string format_number(double v) {
  std::ostringstream s;
  s.precision(8);
  s << v;
  return s.str();
}

// Compares got with expected element by element in float64; *note says why it failed.
TensorResult compare(const std::string& name, const Tensor& got, const Tensor& expected, double rtol, double atol,
                     std::string* note) {
  const double inf = std::numeric_limits<double>::infinity();
  TensorResult r;
  r.name = name;
  if (got.shape() != expected.shape()) {
    r.worst_abs = r.worst_rel_to_tol = inf;
    *note = detail::cat_str(name, ": shape ", shape_str(got.shape()), ", expected ", shape_str(expected.shape()));
    return r;
  }
  if (got.dtype() != expected.dtype()) {
    r.worst_abs = r.worst_rel_to_tol = inf;
    *note = detail::cat_str(name, ": dtype ", dtype_name(got.dtype()), ", expected ", dtype_name(expected.dtype()));
    return r;
  }
  const std::vector<double> g = got.to(Device::cpu(), DType::F64).to_vector<double>();
  const std::vector<double> e = expected.to(Device::cpu(), DType::F64).to_vector<double>();
  int64_t failures = 0, first_failure = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    double diff = 0, ratio = 0;
    bool ok = true;
    if (std::isnan(g[i]) || std::isnan(e[i])) {
      ok = std::isnan(g[i]) && std::isnan(e[i]);
      diff = ratio = ok ? 0 : inf;
    } else if (g[i] == e[i]) {
      ok = true;  // also equal infinities
    } else if (std::isinf(g[i]) || std::isinf(e[i])) {
      ok = false;
      diff = ratio = inf;
    } else {
      diff = std::fabs(g[i] - e[i]);
      const double tol = atol + rtol * std::fabs(e[i]);
      ok = diff <= tol;
      ratio = tol > 0 ? diff / tol : inf;
    }
    if (!ok && failures++ == 0) first_failure = static_cast<int64_t>(i);
    r.worst_abs = std::max(r.worst_abs, diff);
    r.worst_rel_to_tol = std::max(r.worst_rel_to_tol, ratio);
  }
  r.pass = failures == 0;
  if (!r.pass)
    *note = detail::cat_str(name, ": ", failures, " of ", g.size(), " elements beyond tolerance (first at flat index ",
                            first_failure, ": got ", format_number(g[first_failure]), ", expected ",
                            format_number(e[first_failure]), ")");
  return r;
}

// Turns autograd recording on for the run, whatever the caller's setting, and restores it.
class GradEnabled {
 public:
  GradEnabled() : previous_(autograd::is_grad_enabled()) { autograd::set_grad_enabled(true); }
  ~GradEnabled() { autograd::set_grad_enabled(previous_); }
  GradEnabled(const GradEnabled&) = delete;
  GradEnabled& operator=(const GradEnabled&) = delete;

 private:
  bool previous_;
};

bool is_expected_name(const std::string& name) {
  return name == "out" || name == "grad_out" || name.rfind("grad.", 0) == 0 || name.rfind("after.", 0) == 0;
}

// The metadata's "no_grad": a JSON list of input names (absent: none).
std::set<std::string> parse_no_grad(const safetensors::File& file) {
  auto it = file.metadata.find("no_grad");
  std::set<std::string> names;
  if (it == file.metadata.end()) return names;
  json list;
  try {
    list = json::parse(it->second);
  } catch (const json::exception& e) {
    throw ValueError(detail::cat_str("metadata 'no_grad' is not valid JSON (", e.what(), ")"));
  }
  NC_CHECK(list.is_array(), ValueError, "metadata 'no_grad' must be a JSON list of input names, got ", list.dump());
  for (const json& name : list) {
    NC_CHECK(name.is_string(), ValueError, "metadata 'no_grad' must be a JSON list of input names, got ", list.dump());
    names.insert(name.get<std::string>());
  }
  return names;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Fills result (op, dtype, tensors, pass, reason); throws on anything that stops the run.
void run_case_impl(const std::string& path, Device device, CaseResult& result) {
  const safetensors::File file = safetensors::load(path);
  result.op = metadata(file, "op");
  result.dtype = metadata(file, "dtype");
  const DType dtype = case_dtype(result.dtype);
  result.dtype = dtype_name(dtype);
  const double rtol = metadata_number(file, "rtol"), atol = metadata_number(file, "atol");
  const double grad_rtol = metadata_number(file, "grad_rtol"), grad_atol = metadata_number(file, "grad_atol");

  const auto& table = op_table();
  auto spec = std::find_if(table.begin(), table.end(), [&](const OpSpec& s) { return s.name == result.op; });
  NC_CHECK(spec != table.end(), ValueError, "unknown op '", result.op, "'");
  const json attrs = parse_attrs(file, *spec);
  const std::set<std::string> no_grad = parse_no_grad(file);

  // Every tensor must be an input the op takes, grad_out, out, the gradient of an input or
  // the after-value of a no_grad input.
  std::vector<std::string> input_names;
  for (const auto& entry : file.tensors) {
    const std::string& name = entry.first;
    if (is_expected_name(name)) continue;
    bool known = contains(spec->required_inputs, name) || contains(spec->optional_inputs, name);
    NC_CHECK(known, ValueError, "unexpected tensor '", name, "' for op ", spec->name);
    input_names.push_back(name);
  }
  for (const std::string& name : no_grad)
    NC_CHECK(contains(input_names, name), ValueError, "metadata 'no_grad' names '", name,
             "', which is not an input of the case");
  for (const std::string& name : spec->required_inputs)
    NC_CHECK(file.contains(name), ValueError, "missing tensor '", name, "'");
  NC_CHECK(file.contains("grad_out"), ValueError, "missing tensor 'grad_out'");
  NC_CHECK(file.contains("out"), ValueError, "missing tensor 'out'");
  for (const std::string& name : input_names) {
    if (!no_grad.count(name)) NC_CHECK(file.contains("grad." + name), ValueError, "missing tensor 'grad.", name, "'");
  }
  for (const auto& entry : file.tensors) {
    const std::string& name = entry.first;
    if (name.rfind("grad.", 0) == 0) {
      const std::string input = name.substr(5);
      NC_CHECK(contains(input_names, input), ValueError, "unexpected tensor '", name, "': the case has no input '",
               input, "'");
      NC_CHECK(!no_grad.count(input), ValueError, "unexpected tensor '", name, "': input '", input, "' is in no_grad");
    } else if (name.rfind("after.", 0) == 0) {
      const std::string input = name.substr(6);
      NC_CHECK(contains(input_names, input) && no_grad.count(input), ValueError, "unexpected tensor '", name,
               "': after.<name> is for inputs in no_grad, and '", input, "' is not one");
    }
  }

  Inputs inputs;
  for (const std::string& name : input_names) {
    const Tensor& stored = file.at(name);
    if (no_grad.count(name)) {
      NC_CHECK(stored.dtype() == dtype || stored.dtype() == DType::I64, DTypeError, "input '", name, "' is ",
               dtype_name(stored.dtype()), " but a no_grad input must be the case dtype ", dtype_name(dtype),
               " or i64");
      inputs[name] = stored.to(device).detach().clone();  // a buffer the op may write to
      continue;
    }
    NC_CHECK(stored.dtype() == dtype, DTypeError, "input '", name, "' is ", dtype_name(stored.dtype()),
             " but the case dtype is ", dtype_name(dtype));
    Tensor input = stored.to(device).detach();
    input.requires_grad_(true);
    inputs[name] = input;
  }

  GradEnabled grad_enabled;
  const Tensor out = spec->forward(inputs, attrs);
  std::vector<std::string> notes;
  std::string note;
  result.tensors.push_back(compare("out", out, file.at("out"), rtol, atol, &note));
  if (!note.empty()) notes.push_back(note);

  out.backward(file.at("grad_out").to(device));
  for (const std::string& name : input_names) {
    if (no_grad.count(name)) {
      // A no_grad input must get no gradient, and ends as its after-value, or, without one,
      // exactly as it was.
      NC_CHECK(!inputs[name].grad().defined(), ValueError, "input '", name, "' is in no_grad but received a gradient");
      const bool has_after = file.contains("after." + name);
      note.clear();
      result.tensors.push_back(compare("after." + name, inputs[name],
                                       has_after ? file.at("after." + name) : file.at(name), has_after ? rtol : 0,
                                       has_after ? atol : 0, &note));
      if (!note.empty()) notes.push_back(note);
      continue;
    }
    // An input that did not reach the output has a zero gradient.
    Tensor grad = inputs[name].grad();
    if (!grad.defined()) grad = zeros_like(inputs[name]);
    note.clear();
    result.tensors.push_back(compare("grad." + name, grad, file.at("grad." + name), grad_rtol, grad_atol, &note));
    if (!note.empty()) notes.push_back(note);
  }

  result.pass = notes.empty();
  for (size_t i = 0; i < notes.size(); ++i) result.reason += (i ? "; " : "") + notes[i];
}

}  // namespace

CaseResult run_case(const std::string& path, Device device) {
  CaseResult result;
  result.file = path;
  result.device = device;
  try {
    run_case_impl(path, device, result);
  } catch (const std::exception& e) {
    result.pass = false;
    result.reason = e.what();
  }
  return result;
}

std::vector<CaseResult> run_dir(const std::string& dir, Device device) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  NC_CHECK(!ec, IOError, "conformance: cannot list '", dir, "' (", ec.message(), ")");
  std::vector<std::string> paths;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    NC_CHECK(!ec, IOError, "conformance: cannot list '", dir, "' (", ec.message(), ")");
    if (it->path().extension() == ".safetensors") paths.push_back(it->path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<CaseResult> results;
  for (const std::string& path : paths) results.push_back(run_case(path, device));
  return results;
}

}  // namespace conformance
}  // namespace normcore
