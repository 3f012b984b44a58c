// The differential suite: seeded random op programs that PyTorch ran (tests/differential/
// generate.py wrote them with its results into tests/data/differential/cases.jsonl.gz),
// replayed here on the CPU and on every CUDA device. A case holds the inputs, the steps (one
// op each), and PyTorch's result: its dtype, shape and values (floating values computed in
// float64 from the same rounded inputs), or the fact that it refused the program, in the
// forward or in the backward; and, where an input requires grad, the gradients for a given
// upstream gradient. A case marked "differs" is one where normcore departs from PyTorch on
// purpose (docs/ERRORS.md says why); it states normcore's own outcome, which is checked.
//
// Every part of a case is checked; a case the replayer cannot run (an op it does not know, a
// malformed value) fails. The header's counts must match the cases read, so a truncated
// file fails too.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using json = nlohmann::json;
using nc::Device;
using nc::DType;
using nc::Scalar;
using nc::Tensor;

namespace {

const char* const kCasesFile = NORMCORE_TEST_DATA_DIR "/differential/cases.jsonl.gz";

struct CaseFile {
  json header;
  std::vector<json> cases;
};

// The whole file, parsed once per process.
const CaseFile& case_file() {
  static const CaseFile file = [] {
    CaseFile out;
    gzFile gz = gzopen(kCasesFile, "rb");
    if (gz == nullptr) throw std::runtime_error(std::string("cannot open ") + kCasesFile);
    std::string text;
    char buffer[1 << 16];
    int n = 0;
    while ((n = gzread(gz, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
    const bool failed = n < 0;
    gzclose(gz);
    if (failed) throw std::runtime_error(std::string("cannot read ") + kCasesFile);
    std::istringstream lines(text);
    std::string line;
    bool first = true;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      if (first) {
        out.header = json::parse(line);
        first = false;
      } else {
        out.cases.push_back(json::parse(line));
      }
    }
    return out;
  }();
  return file;
}

// A number of the file: JSON numbers, or "nan", "inf", "-inf" (JSON has none of them).
double number(const json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    throw std::runtime_error("not a number: " + s);
  }
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  return v.get<double>();
}

// A scalar operand keeps its kind: bool, integer or floating (promotion depends on it).
Scalar scalar(const json& v) {
  if (v.is_boolean()) return Scalar(v.get<bool>());
  if (v.is_number_integer()) return Scalar(v.get<int64_t>());
  return Scalar(number(v));
}

std::vector<int64_t> ints(const json& v) { return v.get<std::vector<int64_t>>(); }

nc::Reduction reduction(const json& v) {
  const std::string s = v.get<std::string>();
  if (s == "mean") return nc::Reduction::Mean;
  if (s == "sum") return nc::Reduction::Sum;
  if (s == "none") return nc::Reduction::None;
  throw std::runtime_error("unknown reduction " + s);
}

// The values are made in float64 on the CPU, rounded to the case dtype there, then moved:
// every device starts from the same bits.
Tensor make_tensor(const json& spec, Device device) {
  std::vector<double> values;
  for (const json& v : spec.at("values")) values.push_back(number(v));
  Tensor cpu = nc::from_vector(values, ints(spec.at("shape"))).to(nc::dtype_from_name(spec.at("dtype")));
  return cpu.to(device);
}

using Args = std::vector<Tensor>;
using OpFn = std::function<Tensor(const Args&, const json&)>;

template <class F>
OpFn unary(F f) {
  return [f](const Args& a, const json&) { return f(a.at(0)); };
}
template <class F>
OpFn binary(F f) {
  return [f](const Args& a, const json&) { return f(a.at(0), a.at(1)); };
}

// Every op name the generator writes, and how normcore computes it.
const std::map<std::string, OpFn>& ops() {
  static const std::map<std::string, OpFn> table = [] {
    std::map<std::string, OpFn> t;
    using TT = Tensor (*)(const Tensor&, const Tensor&);
    using TS = Tensor (*)(const Tensor&, Scalar);
    const std::map<std::string, std::pair<TT, TS>> binaries = {
        {"add", {nc::add, nc::add}},
        {"sub", {nc::sub, nc::sub}},
        {"mul", {nc::mul, nc::mul}},
        {"div", {nc::div, nc::div}},
        {"maximum", {nc::maximum, nc::maximum}},
        {"minimum", {nc::minimum, nc::minimum}},
        {"eq", {nc::eq, nc::eq}},
        {"ne", {nc::ne, nc::ne}},
        {"lt", {nc::lt, nc::lt}},
        {"le", {nc::le, nc::le}},
        {"gt", {nc::gt, nc::gt}},
        {"ge", {nc::ge, nc::ge}},
    };
    for (const auto& [name, fns] : binaries) {
      const TT tensor_fn = fns.first;
      const TS scalar_fn = fns.second;
      t[name] = binary(tensor_fn);
      t[name + "_scalar"] = [scalar_fn](const Args& a, const json& at) {
        return scalar_fn(a.at(0), scalar(at.at("scalar")));
      };
    }
    t["pow"] = binary(static_cast<TT>(nc::pow));
    t["add_rscalar"] = [](const Args& a, const json& at) { return scalar(at.at("scalar")) + a.at(0); };
    t["sub_rscalar"] = [](const Args& a, const json& at) { return scalar(at.at("scalar")) - a.at(0); };
    t["mul_rscalar"] = [](const Args& a, const json& at) { return scalar(at.at("scalar")) * a.at(0); };
    t["div_rscalar"] = [](const Args& a, const json& at) { return scalar(at.at("scalar")) / a.at(0); };

    using U = Tensor (*)(const Tensor&);
    const std::map<std::string, U> unaries = {
        {"neg", nc::neg}, {"abs", nc::abs},     {"sign", nc::sign}, {"relu", nc::relu},
        {"exp", nc::exp}, {"log", nc::log},     {"sqrt", nc::sqrt}, {"rsqrt", nc::rsqrt},
        {"sin", nc::sin}, {"cos", nc::cos},     {"tanh", nc::tanh}, {"sigmoid", nc::sigmoid},
        {"erf", nc::erf}, {"floor", nc::floor}, {"ceil", nc::ceil}, {"round", nc::round},
    };
    for (const auto& [name, fn] : unaries) t[name] = unary(fn);
    t["gelu"] = unary([](const Tensor& x) { return nc::gelu(x, false); });
    t["gelu_tanh"] = unary([](const Tensor& x) { return nc::gelu(x, true); });
    t["clamp"] = [](const Args& a, const json& at) {
      std::optional<Scalar> lo, hi;
      if (!at.at("min").is_null()) lo = scalar(at.at("min"));
      if (!at.at("max").is_null()) hi = scalar(at.at("max"));
      return nc::clamp(a.at(0), lo, hi);
    };
    t["pow_scalar"] = [](const Args& a, const json& at) { return nc::pow(a.at(0), scalar(at.at("exponent"))); };

    t["sum"] = [](const Args& a, const json& at) { return nc::sum(a.at(0), ints(at.at("dims")), at.at("keepdim")); };
    t["mean"] = [](const Args& a, const json& at) { return nc::mean(a.at(0), ints(at.at("dims")), at.at("keepdim")); };
    t["prod"] = [](const Args& a, const json& at) { return nc::prod(a.at(0), ints(at.at("dims")), at.at("keepdim")); };
    t["all"] = [](const Args& a, const json& at) { return nc::all(a.at(0), ints(at.at("dims")), at.at("keepdim")); };
    t["any"] = [](const Args& a, const json& at) { return nc::any(a.at(0), ints(at.at("dims")), at.at("keepdim")); };
    t["var"] = [](const Args& a, const json& at) {
      return nc::var(a.at(0), ints(at.at("dims")), at.at("unbiased").get<bool>(), at.at("keepdim").get<bool>());
    };
    t["norm"] = [](const Args& a, const json& at) {
      return nc::norm(a.at(0), number(at.at("p")), ints(at.at("dims")), at.at("keepdim").get<bool>());
    };
    t["max"] = unary([](const Tensor& x) { return nc::max(x); });
    t["min"] = unary([](const Tensor& x) { return nc::min(x); });
    t["max_dim"] = [](const Args& a, const json& at) { return nc::max(a.at(0), at.at("dim"), at.at("keepdim")).first; };
    t["min_dim"] = [](const Args& a, const json& at) { return nc::min(a.at(0), at.at("dim"), at.at("keepdim")).first; };
    t["argmax"] = [](const Args& a, const json& at) { return nc::argmax(a.at(0), at.at("dim"), at.at("keepdim")); };
    t["argmin"] = [](const Args& a, const json& at) { return nc::argmin(a.at(0), at.at("dim"), at.at("keepdim")); };
    t["softmax"] = [](const Args& a, const json& at) { return nc::softmax(a.at(0), at.at("dim")); };
    t["log_softmax"] = [](const Args& a, const json& at) { return nc::log_softmax(a.at(0), at.at("dim")); };

    t["matmul"] = binary(nc::matmul);
    t["transpose_last"] = unary([](const Tensor& x) { return x.dim() >= 2 ? x.transpose(-1, -2) : x; });
    t["transpose"] = [](const Args& a, const json& at) { return a.at(0).transpose(at.at("dim0"), at.at("dim1")); };
    t["permute"] = [](const Args& a, const json& at) { return a.at(0).permute(ints(at.at("dims"))); };
    t["narrow"] = [](const Args& a, const json& at) {
      return a.at(0).narrow(at.at("dim"), at.at("start"), at.at("length"));
    };
    t["slice"] = [](const Args& a, const json& at) {
      return a.at(0).slice(at.at("dim"), at.at("start"), at.at("end"), at.at("step"));
    };
    t["select"] = [](const Args& a, const json& at) { return a.at(0).select(at.at("dim"), at.at("index")); };
    t["unsqueeze"] = [](const Args& a, const json& at) { return a.at(0).unsqueeze(at.at("dim")); };
    t["squeeze"] = [](const Args& a, const json& at) { return a.at(0).squeeze(at.at("dim").get<int64_t>()); };
    t["reshape"] = [](const Args& a, const json& at) { return a.at(0).reshape(ints(at.at("shape"))); };
    t["expand"] = [](const Args& a, const json& at) { return a.at(0).expand(ints(at.at("shape"))); };
    t["flatten"] = unary([](const Tensor& x) { return x.flatten(); });
    t["t"] = unary([](const Tensor& x) { return x.t(); });
    t["contiguous"] = unary([](const Tensor& x) { return x.contiguous(); });

    t["index_select"] = [](const Args& a, const json& at) { return nc::index_select(a.at(0), at.at("dim"), a.at(1)); };
    t["gather"] = [](const Args& a, const json& at) { return nc::gather(a.at(0), at.at("dim"), a.at(1)); };
    t["scatter_add"] = [](const Args& a, const json& at) {
      return nc::scatter_add(a.at(0), at.at("dim"), a.at(1), a.at(2));
    };
    t["cat"] = [](const Args& a, const json& at) { return nc::cat(a, at.at("dim")); };
    t["stack"] = [](const Args& a, const json& at) { return nc::stack(a, at.at("dim")); };
    t["masked_fill"] = [](const Args& a, const json& at) {
      return nc::masked_fill(a.at(0), a.at(1), scalar(at.at("value")));
    };
    t["one_hot"] = [](const Args& a, const json& at) { return nc::one_hot(a.at(0), at.at("num_classes")); };
    t["where"] = [](const Args& a, const json&) { return nc::where(a.at(0), a.at(1), a.at(2)); };
    t["where_scalar"] = [](const Args& a, const json& at) {
      return nc::where(a.at(0), a.at(1), scalar(at.at("scalar")));
    };

    t["cross_entropy"] = [](const Args& a, const json& at) {
      return nc::cross_entropy(a.at(0), a.at(1), reduction(at.at("reduction")), number(at.at("label_smoothing")),
                               at.value("ignore_index", int64_t{-100}));
    };
    t["nll_loss"] = [](const Args& a, const json& at) {
      return nc::nll_loss(a.at(0), a.at(1), reduction(at.at("reduction")));
    };
    t["mse_loss"] = [](const Args& a, const json& at) {
      return nc::mse_loss(a.at(0), a.at(1), reduction(at.at("reduction")));
    };
    t["l1_loss"] = [](const Args& a, const json& at) {
      return nc::l1_loss(a.at(0), a.at(1), reduction(at.at("reduction")));
    };
    t["bce_with_logits"] = [](const Args& a, const json& at) {
      return nc::binary_cross_entropy_with_logits(a.at(0), a.at(1), reduction(at.at("reduction")));
    };
    t["layer_norm"] = [](const Args& a, const json& at) {
      return nc::layer_norm(a.at(0), ints(at.at("normalized_shape")), a.size() > 1 ? a[1] : Tensor(),
                            a.size() > 2 ? a[2] : Tensor(), number(at.at("eps")));
    };
    t["group_norm"] = [](const Args& a, const json& at) {
      return nc::group_norm(a.at(0), at.at("num_groups"), a.size() > 1 ? a[1] : Tensor(),
                            a.size() > 2 ? a[2] : Tensor(), number(at.at("eps")));
    };
    t["batch_norm"] = [](const Args& a, const json& at) {
      return nc::batch_norm(a.at(0), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, number(at.at("eps")));
    };
    t["l1_norm"] = [](const Args& a, const json& at) {
      return nc::l1_norm(a.at(0), at.at("dim"), number(at.at("eps")));
    };
    t["max_pool2d"] = unary([](const Tensor& x) { return nc::max_pool2d(x, 2); });
    t["avg_pool2d"] = unary([](const Tensor& x) { return nc::avg_pool2d(x, 2); });
    t["adaptive_avg_pool2d"] = unary([](const Tensor& x) { return nc::adaptive_avg_pool2d(x, 1); });
    t["sdpa"] = [](const Args& a, const json& at) {
      return nc::scaled_dot_product_attention(a.at(0), a.at(1), a.at(2), at.at("causal").get<bool>(), std::nullopt,
                                              at.value("enable_gqa", false));
    };
    t["frobenius_norm"] = [](const Args& a, const json& at) {
      return nc::frobenius_norm(a.at(0), number(at.at("eps")));
    };

    t["to"] = [](const Args& a, const json& at) { return a.at(0).to(nc::dtype_from_name(at.at("dtype"))); };
    t["detach"] = unary([](const Tensor& x) { return x.detach(); });
    t["fill_"] = [](const Args& a, const json& at) {
      const nc::autograd::NoGradGuard no_grad;
      Tensor x = a.at(0);
      x.fill_(scalar(at.at("value")));
      return x;
    };
    t["filled"] = [](const Args& a, const json& at) {
      const nc::autograd::NoGradGuard no_grad;
      Tensor x = a.at(0).clone();
      x.fill_(scalar(at.at("value")));
      return x;
    };
    // No tensor argument: on the device of the program's first input, else the CPU (the
    // replayer passes the device as the attribute "device" it adds).
    t["full"] = [](const Args&, const json& at) {
      return nc::full(ints(at.at("shape")), scalar(at.at("value")),
                      nc::TensorOptions(nc::dtype_from_name(at.at("dtype")),
                                        Device(at.at("device").get<std::string>())));
    };
    t["expand_copy_"] = [](const Args& a, const json& at) {
      const nc::autograd::NoGradGuard no_grad;
      Tensor y = a.at(0).clone().expand(ints(at.at("shape")));
      y.copy_(a.at(1));
      return y;
    };
    t["expand_fill_"] = [](const Args& a, const json& at) {
      const nc::autograd::NoGradGuard no_grad;
      Tensor y = a.at(0).clone().expand(ints(at.at("shape")));
      y.fill_(scalar(at.at("value")));
      return y;
    };
    return t;
  }();
  return table;
}

// Collects what disagrees in one case (empty: the case passes).
class Mismatches {
 public:
  void add(std::string what) { items_.push_back(std::move(what)); }
  bool empty() const { return items_.empty(); }
  std::string text() const {
    std::string out;
    for (const std::string& s : items_) out += (out.empty() ? "" : "; ") + s;
    return out;
  }

 private:
  std::vector<std::string> items_;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Floating values match within rtol of the largest expected magnitude (at least 1): sums
// and differences of rounded terms err relative to their terms, not to their result. NaN
// matches NaN, an infinity only itself; integers and bools match exactly.
void compare(const std::string& what, const Tensor& actual, const json& expected, double rtol, Mismatches& out) {
  const std::string dtype = expected.at("dtype");
  if (dtype != nc::dtype_name(actual.dtype())) {
    out.add(what + ": dtype " + nc::dtype_name(actual.dtype()) + ", PyTorch " + dtype);
    return;
  }
  const std::vector<int64_t> shape = ints(expected.at("shape"));
  if (shape != actual.shape()) {
    out.add(what + ": shape " + shape_text(actual.shape()) + ", PyTorch " + shape_text(shape));
    return;
  }
  const std::vector<double> got = actual.to(Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
  std::vector<double> want;
  for (const json& v : expected.at("values")) want.push_back(number(v));
  if (got.size() != want.size()) {
    out.add(what + ": " + std::to_string(got.size()) + " values, the file has " + std::to_string(want.size()));
    return;
  }
  double scale = 1.0;
  for (double w : want) {
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
  }
  const double tolerance = nc::is_floating(actual.dtype()) ? rtol * scale : 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool same = std::isnan(w) ? std::isnan(g) : std::isinf(w) ? g == w : std::fabs(g - w) <= tolerance;
    if (!same) {
      std::ostringstream s;
      s.precision(17);
      s << what << "[" << i << "] = " << g << ", PyTorch " << w << " (tolerance " << tolerance << ")";
      out.add(s.str());
      return;
    }
  }
}

double grad_rtol(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-9;
    case DType::F32: return 2e-5;
    default: return 4e-3;
  }
}

void run_steps(const json& steps, std::map<std::string, Tensor>& env, Device device) {
  for (const json& s : steps) {
    const std::string op = s.at("op");
    const auto it = ops().find(op);
    if (it == ops().end()) throw std::runtime_error("the replayer has no op " + op);
    Args args;
    for (const json& name : s.at("args")) args.push_back(env.at(name.get<std::string>()));
    json attrs = s.at("attrs");
    attrs["device"] = device.str();
    env[s.at("out").get<std::string>()] = it->second(args, attrs);
  }
}

// The result of a program: its last step's output, or, when that step writes in place (it
// changes a tensor saved for the gradient), the step before it.
const Tensor& program_result(const json& steps, std::map<std::string, Tensor>& env) {
  const json& last = steps.back();
  const json& at = last.at("op") == "fill_" && steps.size() > 1 ? steps[steps.size() - 2] : last;
  return env.at(at.at("out").get<std::string>());
}

// Runs one case on one device; returns what disagrees with PyTorch (or with normcore's
// documented outcome, for a case marked "differs").
std::string replay(const json& c, Device device) {
  Mismatches out;
  std::map<std::string, Tensor> env;
  std::vector<std::pair<std::string, Tensor>> leaves;
  for (const json& input : c.at("inputs")) {
    Tensor t = make_tensor(input, device);
    if (input.at("requires_grad").get<bool>()) t.requires_grad_();
    env[input.at("name").get<std::string>()] = t;
    leaves.emplace_back(input.at("name").get<std::string>(), t);
  }
  const json& steps = c.at("steps");
  const std::string error = c.value("error", "");
  try {
    run_steps(steps, env, device);
    // On CUDA an index out of range is raised at the host's next wait for the device.
    if (device.is_cuda()) nc::cuda::synchronize(device.index);
  } catch (const nc::Error& e) {
    if (error != "forward") out.add(std::string("normcore refused the program: ") + e.what());
    return out.text();
  }
  if (error == "forward")
    return "normcore ran a program PyTorch refuses (" + c.at("pytorch_error").get<std::string>() + ")";
  const Tensor& result = program_result(steps, env);
  if (error == "backward") {
    try {
      result.backward(nc::ones_like(result));
      return "normcore ran a backward PyTorch refuses (" + c.at("pytorch_error").get<std::string>() + ")";
    } catch (const nc::Error&) {
      return "";
    }
  }
  compare("result", result, c.at("result"), c.at("rtol").get<double>(), out);
  if (!c.contains("grads")) return out.text();
  if (!result.requires_grad()) return out.text() + (out.empty() ? "" : "; ") + "the result does not require grad";
  std::vector<double> grad_out;
  for (const json& v : c.at("grad_out")) grad_out.push_back(number(v));
  const Tensor upstream = nc::from_vector(grad_out, result.shape()).to(result.dtype()).to(device);
  try {
    result.backward(upstream);
  } catch (const nc::Error& e) {
    return out.text() + (out.empty() ? "" : "; ") + "backward: " + e.what();
  }
  const json& grads = c.at("grads");
  for (const auto& [name, leaf] : leaves) {
    if (!leaf.requires_grad()) continue;
    if (!grads.contains(name)) {
      out.add("the case has no gradient for " + name + ", which requires grad");
      continue;
    }
    const json& want = grads.at(name);
    const Tensor grad = leaf.grad();
    if (want.is_null() != !grad.defined()) {
      out.add("grad " + name + (want.is_null() ? ": defined, PyTorch none" : ": undefined, PyTorch has one"));
    } else if (grad.defined()) {
      // A gradient is as precise as the narrower of its leaf and the result it comes from.
      compare("grad " + name, grad, want, std::max(grad_rtol(leaf.dtype()), c.at("rtol").get<double>()), out);
    }
  }
  return out.text();
}

std::vector<Device> devices() {
  std::vector<Device> out = {Device::cpu()};
  if (nc::cuda_is_available()) out.push_back(Device::cuda(0));
  return out;
}

TEST(Differential, FileHoldsTheCountsOfItsHeader) {
  const CaseFile& file = case_file();
  ASSERT_TRUE(file.header.contains("seed"));
  std::map<std::string, int64_t> read;
  for (const json& c : file.cases) ++read[c.at("family").get<std::string>()];
  int64_t total = 0;
  for (const auto& [family, count] : file.header.at("cases").items()) {
    EXPECT_EQ(read[family], count.get<int64_t>()) << family;
    total += count.get<int64_t>();
  }
  EXPECT_EQ(static_cast<int64_t>(file.cases.size()), total);
  EXPECT_GE(total, 4000);
}

// Every deliberate difference a case names is explained in docs/ERRORS.md (its key appears
// there, in backquotes).
TEST(Differential, DeliberateDifferencesAreDocumented) {
  std::ifstream in(NORMCORE_TEST_DATA_DIR "/../../docs/ERRORS.md");
  ASSERT_TRUE(in) << "cannot read docs/ERRORS.md";
  const std::string errors((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, int64_t> keys;
  for (const json& c : case_file().cases) {
    if (c.contains("differs")) ++keys[c.at("differs").get<std::string>()];
  }
  for (const auto& [key, count] : keys) {
    EXPECT_NE(errors.find("`" + key + "`"), std::string::npos)
        << key << " (" << count << " cases) is not in docs/ERRORS.md";
  }
}

class DifferentialFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(DifferentialFamily, MatchesPyTorch) {
  const std::string family = GetParam();
  for (Device device : devices()) {
    int64_t ran = 0, failed = 0;
    for (const json& c : case_file().cases) {
      if (c.at("family") != family) continue;
      ++ran;
      std::string problem;
      try {
        problem = replay(c, device);
      } catch (const std::exception& e) {
        problem = std::string("the replayer failed: ") + e.what();
      }
      if (!problem.empty()) {
        ++failed;
        ADD_FAILURE() << device.str() << " " << c.at("id").get<std::string>() << ": " << problem
                      << "\n  case: " << c.dump();
      }
    }
    EXPECT_GT(ran, 0) << "no cases of family " << family;
    std::printf("differential %s on %s: %lld cases, %lld disagree\n", family.c_str(), device.str().c_str(),
                static_cast<long long>(ran), static_cast<long long>(failed));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DifferentialFamily,
                         ::testing::Values("broadcast", "scalar", "unary", "reduce", "views", "matmul", "indexing",
                                           "losses", "norms", "promotion", "autograd", "edges", "rounding"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
