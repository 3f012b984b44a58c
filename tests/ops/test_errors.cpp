// Bad calls, one row each: the call, the normcore::Error subtype it must throw, and the
// substrings its message must contain (the op's name and the argument, shape, dtype or
// value at fault), following the contract in error.h: "<op>: <argument> <what is wrong>".
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "normcore/models.h"
#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

struct BadCall {
  std::string what;
  std::function<void()> call;
  std::function<void(const std::function<void()>&)> expect_type;
  std::vector<std::string> substrings;
};

template <class E>
BadCall bad(std::string what, std::function<void()> call, std::vector<std::string> substrings) {
  return BadCall{std::move(what), std::move(call), [](const std::function<void()>& f) { EXPECT_THROW(f(), E); },
                 std::move(substrings)};
}

// Runs call and checks that it throws a normcore::Error whose message holds every substring.
void expect_message_contains(const std::function<void()>& call, const std::vector<std::string>& substrings) {
  try {
    call();
    ADD_FAILURE() << "no exception thrown";
  } catch (const nc::Error& e) {
    const std::string message = e.what();
    for (const std::string& s : substrings)
      EXPECT_NE(message.find(s), std::string::npos) << "message \"" << message << "\" lacks \"" << s << "\"";
  }
}

void run_table(const std::vector<BadCall>& table) {
  for (const BadCall& c : table) {
    SCOPED_TRACE(c.what);
    c.expect_type(c.call);
    expect_message_contains(c.call, c.substrings);
  }
}

Tensor i64(std::vector<int64_t> v, nc::Shape shape) { return nc::from_vector<int64_t>(v, shape); }
Tensor flags(std::vector<bool> v, nc::Shape shape) { return nc::from_vector<bool>(v, shape); }

// A zero f32 leaf that requires grad.
Tensor leaf(nc::Shape shape) {
  Tensor t = nc::zeros(shape);
  t.requires_grad_();
  return t;
}

Tensor f64_scalar(double v) { return nc::full({}, v, DType::F64); }
Tensor i64_scalar(int64_t v) { return nc::full({}, v, DType::I64); }

// The state_dict of an optimizer over one [2] parameter after one step (so it has state).
nc::optim::StateDict sgd_state() {
  nc::optim::SGD sgd({leaf({2})}, {/*lr=*/0.1, /*momentum=*/0.9});
  sgd.params()[0].set_grad(nc::ones({2}));
  sgd.step();
  return sgd.state_dict();
}
nc::optim::StateDict adam_state() {
  nc::optim::Adam adam({leaf({2})});
  adam.params()[0].set_grad(nc::ones({2}));
  adam.step();
  return adam.state_dict();
}
// state with entry name set to t (appended when absent), or without it.
nc::optim::StateDict with_entry(nc::optim::StateDict state, const std::string& name, Tensor t) {
  for (auto& entry : state) {
    if (entry.first == name) {
      entry.second = t;
      return state;
    }
  }
  state.emplace_back(name, t);
  return state;
}
nc::optim::StateDict without_entry(const nc::optim::StateDict& state, const std::string& name) {
  nc::optim::StateDict out;
  for (const auto& entry : state)
    if (entry.first != name) out.push_back(entry);
  return out;
}

// A dataset of n blank 2x2 images with the given dtypes and label count.
nc::data::TensorDataset images(int64_t n, DType image_dtype = DType::U8, int64_t labels = -1,
                               DType label_dtype = DType::I64) {
  return {nc::zeros({n, 2, 2}, image_dtype), nc::zeros({labels < 0 ? n : labels}, label_dtype)};
}
nc::data::DataLoaderOptions loader_options(int64_t batch_size = 2) {
  nc::data::DataLoaderOptions options;
  options.batch_size = batch_size;
  return options;
}

// A directory for the rows that read or write files, removed with its contents.
class ScratchDir {
 public:
  ScratchDir() : path_(std::filesystem::temp_directory_path() / ("normcore_errors_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string path(const std::string& name = "") const { return (path_ / name).string(); }
  // Writes bytes to name and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

 private:
  std::filesystem::path path_;
};

}  // namespace

TEST(Errors, ShapeErrors) {
  const Tensor m23 = nc::zeros({2, 3});
  run_table({
      bad<nc::ShapeError>("add broadcast", [&] { nc::add(m23, nc::zeros({4})); }, {"add", "[2, 3]", "[4]"}),
      bad<nc::ShapeError>("mul broadcast", [&] { nc::zeros({2}) * nc::zeros({3}); }, {"mul", "[2]", "[3]"}),
      bad<nc::ShapeError>("eq broadcast",
                          [&] {
                            nc::eq(nc::zeros({2, 2}), nc::zeros({3, 1}));
                          },
                          {"eq", "[2, 2]", "[3, 1]"}),
      bad<nc::ShapeError>("where broadcast",
                          [&] {
                            nc::where(flags({true, false}, {2}), nc::zeros({3}), 1.0);
                          },
                          {"where", "[2]", "[3]"}),
      bad<nc::ShapeError>("broadcast_shapes", [&] { nc::broadcast_shapes({2}, {3}, "my_op"); },
                          {"my_op", "[2]", "[3]"}),
      bad<nc::ShapeError>("masked_fill mask that does not broadcast with x",
                          [&] {
                            nc::masked_fill(nc::zeros({3}), nc::zeros({2, 2}, DType::Bool), 1);
                          },
                          {"masked_fill", "[3]", "[2, 2]", "broadcast"}),
      bad<nc::ValueError>("maximum(u8, 256)", [&] { nc::maximum(nc::zeros({2}, DType::U8), 256); },
                          {"maximum", "256", "u8"}),
      bad<nc::ValueError>("minimum(u8, -256)", [&] { nc::minimum(nc::zeros({2}, DType::U8), -256); },
                          {"minimum", "-256", "u8"}),
      bad<nc::ShapeError>("infinity norm over an empty dim",
                          [&] {
                            nc::norm(nc::zeros({2, 0}), INFINITY, {1});
                          },
                          {"norm", "infinity", "dim 1", "[2, 0]"}),
      bad<nc::ShapeError>("copy_ from a shape that does not broadcast",
                          [&] {
                            nc::zeros({2, 3}).copy_(nc::zeros({4}));
                          },
                          {"copy_", "[2, 3]", "[4]"}),
      bad<nc::ShapeError>("copy_ from more dims", [&] { nc::zeros({3}).copy_(m23); },
                          {"copy_", "src", "[2, 3]", "[3]"}),
      bad<nc::ShapeError>("matmul inner size",
                          [&] {
                            nc::matmul(m23, nc::zeros({4, 5}));
                          },
                          {"matmul", "[2, 3]", "[4, 5]"}),
      bad<nc::ShapeError>("matmul 1-D inner size", [&] { nc::matmul(nc::zeros({3}), nc::zeros({4})); },
                          {"matmul", "[3]", "[4]"}),
      bad<nc::ShapeError>("matmul batch broadcast",
                          [&] {
                            nc::matmul(nc::zeros({2, 3, 4}), nc::zeros({3, 4, 5}));
                          },
                          {"matmul", "[2]", "[3]"}),
      bad<nc::ShapeError>("matmul 0-dim", [&] { nc::matmul(nc::full({}, 1.0), nc::zeros({2})); },
                          {"matmul", "at least 1 dim", "[]"}),
      bad<nc::ShapeError>("view element count", [&] { m23.view({4}); }, {"view", "[4]", "6 elements"}),
      bad<nc::ShapeError>("view two -1",
                          [&] {
                            m23.view({-1, -1});
                          },
                          {"view", "only one size may be -1"}),
      bad<nc::ShapeError>("view -1 that does not divide",
                          [&] {
                            m23.view({4, -1});
                          },
                          {"view", "[4, -1]", "6"}),
      bad<nc::ShapeError>("view of a non-contiguous tensor", [&] { m23.t().view({6}); },
                          {"view", "[3, 2]", "[6]", "reshape"}),
      bad<nc::ShapeError>("reshape element count",
                          [&] {
                            m23.reshape({4, 2});
                          },
                          {"reshape", "[4, 2]", "6 elements"}),
      bad<nc::ShapeError>("reshape negative size",
                          [&] {
                            m23.reshape({-2, -3});
                          },
                          {"reshape", "-2"}),
      bad<nc::ShapeError>("expand",
                          [&] {
                            m23.expand({4, 3});
                          },
                          {"expand", "[2, 3]", "[4, 3]"}),
      bad<nc::ShapeError>("expand to fewer dims", [&] { m23.expand({3}); }, {"expand", "[2, 3]", "[3]"}),
      bad<nc::ShapeError>("permute dim count", [&] { m23.permute({0}); }, {"permute", "[0]"}),
      bad<nc::ShapeError>("t of 3-D",
                          [&] {
                            nc::zeros({2, 3, 4}).t();
                          },
                          {"t:", "[2, 3, 4]"}),
      bad<nc::ShapeError>("cat sizes",
                          [&] {
                            nc::cat({m23, nc::zeros({2, 4})});
                          },
                          {"cat", "[2, 4]", "[2, 3]"}),
      bad<nc::ShapeError>("cat ranks",
                          [&] {
                            nc::cat({m23, nc::zeros({2, 3, 1})});
                          },
                          {"cat", "[2, 3, 1]"}),
      bad<nc::ShapeError>("cat 0-dim",
                          [&] {
                            nc::cat({nc::full({}, 1.0), nc::full({}, 2.0)});
                          },
                          {"cat", "zero-dim"}),
      bad<nc::ShapeError>("stack shapes",
                          [&] {
                            nc::stack({nc::zeros({2}), nc::zeros({3})});
                          },
                          {"stack", "[3]", "[2]"}),
      bad<nc::ShapeError>("split sizes",
                          [&] {
                            nc::split(nc::zeros({5}), std::vector<int64_t>{2, 2});
                          },
                          {"split", "[2, 2]", "5"}),
      bad<nc::ShapeError>("split 0-dim", [&] { nc::split(nc::full({}, 1.0), 1); }, {"split", "0-dim"}),
      bad<nc::ShapeError>("index_select 2-D index",
                          [&] {
                            nc::index_select(m23, 0, i64({0, 1}, {1, 2}));
                          },
                          {"index_select", "index", "[1, 2]"}),
      bad<nc::ShapeError>("index_select 0-dim x", [&] { nc::index_select(nc::full({}, 1.0), 0, i64({0}, {1})); },
                          {"index_select", "x", "[]"}),
      bad<nc::ShapeError>("gather index rank",
                          [&] {
                            nc::gather(m23, 1, i64({0, 0}, {2}));
                          },
                          {"gather", "index", "[2]", "[2, 3]"}),
      bad<nc::ShapeError>("gather index too large off dim",
                          [&] {
                            nc::gather(m23, 1, i64({0, 0, 0}, {3, 1}));
                          },
                          {"gather", "[3, 1]", "[2, 3]"}),
      bad<nc::ShapeError>("scatter_add index larger than src",
                          [&] {
                            nc::scatter_add(m23, 1, i64({0, 0, 0, 0}, {2, 2}), nc::zeros({2, 1}));
                          },
                          {"scatter_add", "src", "[2, 1]", "[2, 2]"}),
      bad<nc::ShapeError>("scatter_add src rank",
                          [&] {
                            nc::scatter_add(m23, 1, i64({0, 0}, {2, 1}), nc::zeros({2}));
                          },
                          {"scatter_add", "src", "[2]", "[2, 1]"}),
      bad<nc::ShapeError>("item of several elements", [&] { nc::zeros({2}).item(); }, {"item", "[2]"}),
      bad<nc::ShapeError>("from_vector size",
                          [&] {
                            nc::from_vector<float>({1, 2, 3}, {2, 2});
                          },
                          {"from_vector", "3 values", "[2, 2]"}),
      bad<nc::ShapeError>("negative size",
                          [&] {
                            nc::zeros({2, -1});
                          },
                          {"negative size", "[2, -1]"}),
      bad<nc::ShapeError>("max of empty", [&] { nc::max(nc::zeros({0})); }, {"max", "empty", "[0]"}),
      bad<nc::ShapeError>("min of empty",
                          [&] {
                            nc::min(nc::zeros({2, 0}));
                          },
                          {"min", "empty", "[2, 0]"}),
      bad<nc::ShapeError>("argmax of empty", [&] { nc::argmax(nc::zeros({0})); }, {"argmax", "empty"}),
      bad<nc::ShapeError>("argmin over an empty dim",
                          [&] {
                            nc::argmin(nc::zeros({0, 2}), 0);
                          },
                          {"argmin", "dim 0", "size 0"}),
      bad<nc::ShapeError>("reshape two -1",
                          [&] {
                            m23.reshape({-1, -1});
                          },
                          {"reshape", "only one size may be -1"}),
      bad<nc::ShapeError>("expand -1 in a new leading dim",
                          [&] {
                            nc::zeros({3}).expand({-1, 3});
                          },
                          {"expand", "-1", "[-1, 3]"}),
      bad<nc::ShapeError>("expand to a negative size", [&] { nc::zeros({1}).expand({-2}); }, {"expand", "[1]", "[-2]"}),
      bad<nc::ShapeError>("item<T> of several elements", [&] { m23.item<float>(); }, {"item", "[2, 3]"}),
      bad<nc::ShapeError>("gather 0-dim x", [&] { nc::gather(nc::full({}, 1.0), 0, i64({0}, {1})); },
                          {"gather", "x", "[]"}),
      bad<nc::ShapeError>("scatter_add index rank", [&] { nc::scatter_add(m23, 1, i64({0}, {1}), nc::zeros({1})); },
                          {"scatter_add", "index", "[1]", "[2, 3]"}),
      bad<nc::ShapeError>("scatter_add 0-dim x",
                          [&] { nc::scatter_add(nc::full({}, 1.0), 0, i64({0}, {1}), nc::zeros({1})); },
                          {"scatter_add", "x", "[]"}),
  });
}

TEST(Errors, IndexErrors) {
  const Tensor m23 = nc::zeros({2, 3});
  const Tensor v3 = nc::zeros({3});
  run_table({
      bad<nc::IndexError>("sum dim", [&] { nc::sum(m23, {2}); }, {"sum", "dim 2", "2 dims"}),
      bad<nc::IndexError>("sum negative dim", [&] { nc::sum(m23, {-3}); }, {"sum", "dim -3"}),
      bad<nc::IndexError>("sum repeated dim",
                          [&] {
                            nc::sum(m23, {1, -1});
                          },
                          {"sum", "dim -1", "more than once"}),
      bad<nc::IndexError>("mean dim", [&] { nc::mean(m23, {5}); }, {"mean", "dim 5"}),
      bad<nc::IndexError>("var dim", [&] { nc::var(m23, {2}); }, {"var", "dim 2"}),
      bad<nc::IndexError>("prod dim", [&] { nc::prod(m23, {-4}); }, {"prod", "dim -4"}),
      bad<nc::IndexError>("norm dim", [&] { nc::norm(m23, 2, {2}); }, {"norm", "dim 2"}),
      bad<nc::IndexError>("all dim", [&] { nc::all(m23, {2}); }, {"all", "dim 2"}),
      bad<nc::IndexError>("any dim", [&] { nc::any(m23, {2}); }, {"any", "dim 2"}),
      bad<nc::IndexError>("max dim", [&] { nc::max(m23, 2); }, {"max", "dim 2"}),
      bad<nc::IndexError>("min dim", [&] { nc::min(m23, -3); }, {"min", "dim -3"}),
      bad<nc::IndexError>("argmax dim", [&] { nc::argmax(m23, 2); }, {"argmax", "dim 2"}),
      bad<nc::IndexError>("argmin dim", [&] { nc::argmin(m23, 2); }, {"argmin", "dim 2"}),
      bad<nc::IndexError>("size", [&] { m23.size(2); }, {"Tensor::size", "dim 2"}),
      bad<nc::IndexError>("stride", [&] { m23.stride(-3); }, {"Tensor::stride", "dim -3"}),
      bad<nc::IndexError>("transpose", [&] { m23.transpose(0, 3); }, {"transpose", "dim 3"}),
      bad<nc::IndexError>("transpose of 0-dim", [&] { nc::full({}, 1.0).transpose(0, 1); }, {"transpose", "dim 1"}),
      bad<nc::IndexError>("permute dim",
                          [&] {
                            m23.permute({0, 2});
                          },
                          {"permute", "dim 2"}),
      bad<nc::IndexError>("permute repeated",
                          [&] {
                            m23.permute({1, 1});
                          },
                          {"permute", "[1, 1]"}),
      bad<nc::IndexError>("flatten order",
                          [&] {
                            nc::zeros({2, 3, 4}).flatten(2, 1);
                          },
                          {"flatten", "start_dim"}),
      bad<nc::IndexError>("flatten dim", [&] { m23.flatten(0, 2); }, {"flatten", "dim 2"}),
      bad<nc::IndexError>("squeeze dim", [&] { m23.squeeze(2); }, {"squeeze", "dim 2"}),
      bad<nc::IndexError>("unsqueeze dim", [&] { m23.unsqueeze(4); }, {"unsqueeze", "dim 4"}),
      bad<nc::IndexError>("narrow dim", [&] { m23.narrow(2, 0, 1); }, {"narrow", "dim 2"}),
      bad<nc::IndexError>("narrow range", [&] { v3.narrow(0, 2, 2); }, {"narrow", "start 2", "length 2", "size 3"}),
      bad<nc::IndexError>("narrow start before the beginning", [&] { v3.narrow(0, -4, 1); }, {"narrow", "-4"}),
      bad<nc::IndexError>("narrow of 0-dim", [&] { nc::full({}, 1.0).narrow(0, 0, 1); }, {"narrow", "0-dim"}),
      bad<nc::IndexError>("slice dim", [&] { m23.slice(2, 0, 1); }, {"slice", "dim 2"}),
      bad<nc::IndexError>("slice of 0-dim", [&] { nc::full({}, 1.0).slice(0, 0, 1); }, {"slice", "0-dim"}),
      bad<nc::IndexError>("select dim", [&] { m23.select(2, 0); }, {"select", "dim 2"}),
      bad<nc::IndexError>("select index", [&] { v3.select(0, 3); }, {"select", "index 3", "size 3"}),
      bad<nc::IndexError>("select negative index", [&] { v3.select(0, -4); }, {"select", "index -4", "size 3"}),
      bad<nc::IndexError>("select of 0-dim", [&] { nc::full({}, 1.0).select(0, 0); }, {"select", "0-dim"}),
      bad<nc::IndexError>("cat dim",
                          [&] {
                            nc::cat({m23, m23}, 2);
                          },
                          {"cat", "dim 2"}),
      bad<nc::IndexError>("stack dim",
                          [&] {
                            nc::stack({m23, m23}, 4);
                          },
                          {"stack", "dim 4"}),
      bad<nc::IndexError>("split dim", [&] { nc::split(m23, 1, 2); }, {"split", "dim 2"}),
      bad<nc::IndexError>("index_select dim", [&] { nc::index_select(m23, 2, i64({0}, {1})); },
                          {"index_select", "dim 2"}),
      bad<nc::IndexError>("index_select index",
                          [&] {
                            nc::index_select(nc::zeros({3, 2}), 0, i64({0, 3}, {2}));
                          },
                          {"index_select", "index 3", "size 3"}),
      bad<nc::IndexError>("index_select negative index",
                          [&] {
                            nc::index_select(nc::zeros({3, 2}), 0, i64({-1}, {1}));
                          },
                          {"index_select", "index -1", "size 3"}),
      bad<nc::IndexError>("gather negative index",
                          [&] {
                            nc::gather(nc::zeros({3, 2}), 1, i64({0, -1, 1}, {3, 1}));
                          },
                          {"gather", "index -1", "dim 1 of size 2"}),
      bad<nc::IndexError>("scatter_add negative index",
                          [&] { nc::scatter_add(nc::zeros({3}), 0, i64({-1}, {1}), nc::ones({1})); },
                          {"scatter_add", "index -1", "size 3"}),
      bad<nc::IndexError>("index_select i32 index",
                          [&] { nc::index_select(m23, 1, nc::from_vector<int32_t>({3}, {1})); },
                          {"index_select", "index 3", "size 3"}),
      bad<nc::IndexError>("gather dim",
                          [&] {
                            nc::gather(m23, 2, i64({0, 0}, {1, 2}));
                          },
                          {"gather", "dim 2"}),
      bad<nc::IndexError>("gather index",
                          [&] {
                            nc::gather(nc::zeros({2, 2}), 1, i64({0, 2, 0, 0}, {2, 2}));
                          },
                          {"gather", "index 2", "size 2"}),
      bad<nc::IndexError>("scatter_add dim", [&] { nc::scatter_add(v3, 1, i64({0}, {1}), nc::ones({1})); },
                          {"scatter_add", "dim 1"}),
      bad<nc::IndexError>("scatter_add index",
                          [&] {
                            nc::scatter_add(v3, 0, i64({1, 5}, {2}), nc::ones({2}));
                          },
                          {"scatter_add", "index 5", "size 3"}),
      bad<nc::IndexError>("one_hot class too large",
                          [&] {
                            nc::one_hot(i64({0, 3}, {2}), 3);
                          },
                          {"one_hot", "3", "3 classes"}),
      bad<nc::IndexError>("one_hot negative class",
                          [&] {
                            nc::one_hot(i64({0, -1}, {2}));
                          },
                          {"one_hot", "-1"}),
      bad<nc::IndexError>("one_hot with 0 classes", [&] { nc::one_hot(i64({0}, {1}), 0); },
                          {"one_hot", "0", "0 classes"}),
      bad<nc::IndexError>("softmax dim", [&] { nc::softmax(m23, 2); }, {"softmax", "dim 2", "2 dims"}),
      bad<nc::IndexError>("log_softmax of 0-dim, dim 1", [&] { nc::log_softmax(nc::full({}, 1.0), 1); },
                          {"log_softmax", "dim 1", "0 dims"}),
      bad<nc::IndexError>("index_select from an empty dim",
                          [&] {
                            nc::index_select(nc::zeros({0, 2}), 0, i64({0}, {1}));
                          },
                          {"index_select", "dim 0", "size 0"}),
      bad<nc::IndexError>("unsqueeze negative dim", [&] { m23.unsqueeze(-4); }, {"unsqueeze", "dim -4"}),
      bad<nc::IndexError>("squeeze of 0-dim", [&] { nc::full({}, 1.0).squeeze(1); }, {"squeeze", "dim 1"}),
      bad<nc::IndexError>("narrow negative length", [&] { v3.narrow(0, 0, -1); }, {"narrow", "length -1", "size 3"}),
      bad<nc::IndexError>("select lowest index", [&] { v3.select(0, std::numeric_limits<int64_t>::min()); },
                          {"select", "index -9223372036854775808"}),
      bad<nc::IndexError>("gather lowest index",
                          [&] { nc::gather(v3, 0, i64({std::numeric_limits<int64_t>::min()}, {1})); },
                          {"gather", "index -9223372036854775808", "size 3"}),
  });
}

TEST(Errors, DTypeErrors) {
  const Tensor ints = nc::zeros({2, 2}, DType::I32);
  const Tensor bools = nc::zeros({2}, DType::Bool);
  run_table({
      bad<nc::DTypeError>("stack dtypes",
                          [] {
                            nc::stack({nc::zeros({2}), nc::zeros({2}, DType::F64)});
                          },
                          {"stack", "tensor 1", "f64 [2]"}),
      bad<nc::DTypeError>("mean of int", [&] { nc::mean(ints); }, {"mean", "i32"}),
      bad<nc::DTypeError>("var of int", [&] { nc::var(nc::zeros({2}, DType::I64)); }, {"var", "i64"}),
      bad<nc::DTypeError>("norm of int", [&] { nc::norm(ints); }, {"norm", "i32"}),
      bad<nc::DTypeError>("matmul of int", [&] { nc::matmul(ints, ints); }, {"matmul", "floating", "i32"}),
      bad<nc::DTypeError>("matmul of mixed dtypes",
                          [&] {
                            nc::matmul(nc::zeros({2, 2}), nc::zeros({2, 2}, DType::F64));
                          },
                          {"matmul", "f32", "f64"}),
      bad<nc::DTypeError>("where with a non-bool cond",
                          [&] { nc::where(nc::zeros({2}), nc::zeros({2}), nc::ones({2})); }, {"where", "cond", "f32"}),
      bad<nc::DTypeError>("masked_fill with a non-bool mask",
                          [&] { nc::masked_fill(nc::zeros({2}), nc::zeros({2}, DType::I64), 1); },
                          {"masked_fill", "mask", "i64"}),
      bad<nc::DTypeError>("sub on bool", [&] { nc::sub(bools, bools); }, {"sub", "bool"}),
      bad<nc::DTypeError>("bool - true", [&] { bools - true; }, {"sub", "bool"}),
      bad<nc::DTypeError>("neg on bool", [&] { -bools; }, {"neg", "bool"}),
      bad<nc::DTypeError>("scatter_add src dtype",
                          [&] { nc::scatter_add(nc::zeros({3}), 0, i64({0}, {1}), nc::ones({1}, DType::F64)); },
                          {"scatter_add", "src", "f64", "f32"}),
      bad<nc::DTypeError>("index_select float index", [&] { nc::index_select(nc::zeros({3}), 0, nc::zeros({1})); },
                          {"index_select", "index", "f32"}),
      bad<nc::DTypeError>("gather float index", [&] { nc::gather(nc::zeros({3}), 0, nc::zeros({1})); },
                          {"gather", "index", "f32"}),
      bad<nc::DTypeError>("scatter_add float index",
                          [&] { nc::scatter_add(nc::zeros({3}), 0, nc::zeros({1}), nc::ones({1})); },
                          {"scatter_add", "index", "f32"}),
      bad<nc::DTypeError>("one_hot float index", [&] { nc::one_hot(nc::zeros({2})); }, {"one_hot", "index", "f32"}),
      bad<nc::DTypeError>("cat dtypes",
                          [&] {
                            nc::cat({nc::zeros({2}), nc::zeros({2}, DType::F64)});
                          },
                          {"cat", "f64", "f32"}),
      bad<nc::DTypeError>("data<T> with the wrong T", [&] { nc::zeros({2}).data<double>(); },
                          {"Tensor::data", "f64", "f32"}),
      bad<nc::DTypeError>("data<T> with an integer T", [&] { ints.data<int64_t>(); }, {"Tensor::data", "i64", "i32"}),
      bad<nc::DTypeError>("rand int", [&] { nc::rand({2}, DType::I32); }, {"rand", "i32"}),
      bad<nc::DTypeError>("randn int", [&] { nc::randn({2}, DType::U8); }, {"randn", "u8"}),
      bad<nc::DTypeError>("randint bool", [&] { nc::randint(0, 2, {2}, DType::Bool); }, {"randint", "bool"}),
      bad<nc::DTypeError>("dtype_from_name", [&] { nc::dtype_from_name("float32"); }, {"dtype_from_name", "float32"}),
      bad<nc::DTypeError>("softmax of int", [&] { nc::softmax(ints, 0); }, {"softmax", "floating", "i32"}),
      bad<nc::DTypeError>("log_softmax of bool", [&] { nc::log_softmax(bools, 0); },
                          {"log_softmax", "floating", "bool"}),
      bad<nc::DTypeError>("mean of bool", [&] { nc::mean(bools); }, {"mean", "bool"}),
      bad<nc::DTypeError>("matmul of bool", [&] { nc::matmul(bools, bools); }, {"matmul", "floating", "bool"}),
      bad<nc::DTypeError>("abs of bool", [&] { nc::abs(bools); }, {"abs", "bool"}),
      bad<nc::DTypeError>("relu of bool", [&] { nc::relu(bools); }, {"relu", "bool"}),
      bad<nc::DTypeError>("pow on bool", [&] { nc::pow(bools, bools); }, {"pow", "bool"}),
      bad<nc::DTypeError>("pow(bool, true)", [&] { nc::pow(bools, true); }, {"pow", "bool"}),
      bad<nc::DTypeError>("max of bool", [&] { nc::max(bools); }, {"max", "bool"}),
      bad<nc::DTypeError>("max of bool along a dim", [&] { nc::max(bools, 0); }, {"max", "bool"}),
      bad<nc::DTypeError>("argmax of bool", [&] { nc::argmax(bools); }, {"argmax", "bool"}),
      bad<nc::DTypeError>("argmin of bool", [&] { nc::argmin(bools, 0); }, {"argmin", "bool"}),
      bad<nc::DTypeError>("scatter_add into bool",
                          [&] { nc::scatter_add(bools, 0, i64({0}, {1}), nc::zeros({1}, DType::Bool)); },
                          {"scatter_add", "x", "bool"}),
      bad<nc::DTypeError>("scatter_add into u8",
                          [&] {
                            nc::scatter_add(nc::zeros({2}, DType::U8), 0, i64({0}, {1}), nc::zeros({1}, DType::U8));
                          },
                          {"scatter_add", "x", "u8"}),
      bad<nc::DTypeError>("one_hot bool index", [&] { nc::one_hot(bools); }, {"one_hot", "index", "bool"}),
  });
}

TEST(Errors, ValueErrors) {
  const Tensor x = nc::zeros({3});
  const Tensor undefined;
  const Tensor cond = nc::full({}, true);
  run_table({
      bad<nc::ValueError>("arange step 0", [&] { nc::arange(0, 5, 0); }, {"arange", "step"}),
      bad<nc::ValueError>("arange step away from end", [&] { nc::arange(0, 5, -1); }, {"arange", "step -1"}),
      bad<nc::ValueError>("arange infinite end", [&] { nc::arange(0.0, INFINITY); }, {"arange", "finite"}),
      bad<nc::ValueError>("linspace negative steps", [&] { nc::linspace(0, 1, -1); }, {"linspace", "steps", "-1"}),
      bad<nc::ValueError>("linspace NaN", [&] { nc::linspace(NAN, 1, 3); }, {"linspace", "finite"}),
      bad<nc::ValueError>("eye negative", [&] { nc::eye(-2); }, {"eye", "-2"}),
      bad<nc::ValueError>("randint low >= high", [&] { nc::randint(3, 3, {2}); }, {"randint", "low (3)", "high (3)"}),
      bad<nc::ValueError>("clamp NaN min", [&] { nc::clamp(x, NAN, 1); }, {"clamp", "min", "NaN"}),
      bad<nc::ValueError>("clamp NaN max", [&] { nc::clamp(x, std::nullopt, NAN); }, {"clamp", "max", "NaN"}),
      bad<nc::ValueError>("clamp without bounds", [&] { nc::clamp(x, std::nullopt, std::nullopt); },
                          {"clamp", "min", "max"}),
      bad<nc::ValueError>("pow NaN exponent", [&] { nc::pow(x, NAN); }, {"pow", "exponent", "NaN"}),
      bad<nc::ValueError>("norm p = 0", [&] { nc::norm(x, 0); }, {"norm", "p", "0"}),
      bad<nc::ValueError>("norm p < 0", [&] { nc::norm(x, -1); }, {"norm", "p", "-1"}),
      bad<nc::ValueError>("slice step 0", [&] { x.slice(0, 0, 3, 0); }, {"slice", "step", "0"}),
      bad<nc::ValueError>("split size 0", [&] { nc::split(x, 0); }, {"split", "split_size", "0"}),
      bad<nc::ValueError>("split negative size",
                          [&] {
                            nc::split(x, std::vector<int64_t>{4, -1});
                          },
                          {"split", "negative", "[4, -1]"}),
      bad<nc::ValueError>("cat of nothing", [&] { nc::cat({}); }, {"cat", "at least one"}),
      bad<nc::ValueError>("stack of nothing", [&] { nc::stack({}); }, {"stack", "at least one"}),
      bad<nc::ValueError>("one_hot of empty without num_classes", [&] { nc::one_hot(nc::zeros({0}, DType::I64)); },
                          {"one_hot", "num_classes"}),
      // Undefined tensor arguments, named by the op and the argument.
      bad<nc::ValueError>("neg(undefined)", [&] { nc::neg(undefined); }, {"neg", "'x'"}),
      bad<nc::ValueError>("exp(undefined)", [&] { nc::exp(undefined); }, {"exp", "'x'"}),
      bad<nc::ValueError>("sign(undefined)", [&] { nc::sign(undefined); }, {"sign", "'x'"}),
      bad<nc::ValueError>("gelu(undefined)", [&] { nc::gelu(undefined); }, {"gelu", "'x'"}),
      bad<nc::ValueError>("clamp(undefined)", [&] { nc::clamp(undefined, 0, 1); }, {"clamp", "'x'"}),
      bad<nc::ValueError>("pow(undefined, s)", [&] { nc::pow(undefined, 2); }, {"pow", "'x'"}),
      bad<nc::ValueError>("add(undefined, t)", [&] { nc::add(undefined, x); }, {"add", "'a'"}),
      bad<nc::ValueError>("add(t, undefined)", [&] { nc::add(x, undefined); }, {"add", "'b'"}),
      bad<nc::ValueError>("pow(t, undefined)", [&] { nc::pow(x, undefined); }, {"pow", "'b'"}),
      bad<nc::ValueError>("undefined + s", [&] { undefined + 1; }, {"add", "'a'"}),
      bad<nc::ValueError>("s - undefined", [&] { 1 - undefined; }, {"sub", "'b'"}),
      bad<nc::ValueError>("s / undefined", [&] { 1 / undefined; }, {"div", "'b'"}),
      bad<nc::ValueError>("lt(undefined, s)", [&] { nc::lt(undefined, 1); }, {"lt", "'a'"}),
      bad<nc::ValueError>("where(undefined, ...)", [&] { nc::where(undefined, x, x); }, {"where", "'cond'"}),
      bad<nc::ValueError>("where(c, undefined, t)", [&] { nc::where(cond, undefined, x); }, {"where", "'a'"}),
      bad<nc::ValueError>("where(c, t, undefined)", [&] { nc::where(cond, x, undefined); }, {"where", "'b'"}),
      bad<nc::ValueError>("where(c, undefined, s)", [&] { nc::where(cond, undefined, 1.0); }, {"where", "'a'"}),
      bad<nc::ValueError>("where(c, s, undefined)", [&] { nc::where(cond, 1.0, undefined); }, {"where", "'b'"}),
      bad<nc::ValueError>("sum(undefined)", [&] { nc::sum(undefined); }, {"sum", "'x'"}),
      bad<nc::ValueError>("mean(undefined)", [&] { nc::mean(undefined); }, {"mean", "'x'"}),
      bad<nc::ValueError>("var(undefined)", [&] { nc::var(undefined); }, {"var", "'x'"}),
      bad<nc::ValueError>("prod(undefined)", [&] { nc::prod(undefined); }, {"prod", "'x'"}),
      bad<nc::ValueError>("norm(undefined)", [&] { nc::norm(undefined); }, {"norm", "'x'"}),
      bad<nc::ValueError>("all(undefined)", [&] { nc::all(undefined); }, {"all", "'x'"}),
      bad<nc::ValueError>("any(undefined)", [&] { nc::any(undefined); }, {"any", "'x'"}),
      bad<nc::ValueError>("max(undefined)", [&] { nc::max(undefined); }, {"max", "'x'"}),
      bad<nc::ValueError>("min(undefined, dim)", [&] { nc::min(undefined, 0); }, {"min", "'x'"}),
      bad<nc::ValueError>("argmax(undefined)", [&] { nc::argmax(undefined); }, {"argmax", "'x'"}),
      bad<nc::ValueError>("argmin(undefined, dim)", [&] { nc::argmin(undefined, 0); }, {"argmin", "'x'"}),
      bad<nc::ValueError>("matmul(undefined, t)", [&] { nc::matmul(undefined, x); }, {"matmul", "'a'"}),
      bad<nc::ValueError>("matmul(t, undefined)", [&] { nc::matmul(x, undefined); }, {"matmul", "'b'"}),
      bad<nc::ValueError>("cat with an undefined tensor",
                          [&] {
                            nc::cat({x, undefined});
                          },
                          {"cat", "'tensors'"}),
      bad<nc::ValueError>("stack with an undefined tensor",
                          [&] {
                            nc::stack({x, undefined});
                          },
                          {"stack", "'tensors'"}),
      bad<nc::ValueError>("split(undefined)", [&] { nc::split(undefined, 1); }, {"split", "'x'"}),
      bad<nc::ValueError>("index_select(undefined, ...)", [&] { nc::index_select(undefined, 0, i64({0}, {1})); },
                          {"index_select", "'x'"}),
      bad<nc::ValueError>("index_select undefined index", [&] { nc::index_select(x, 0, undefined); },
                          {"index_select", "'index'"}),
      bad<nc::ValueError>("gather undefined index", [&] { nc::gather(x, 0, undefined); }, {"gather", "'index'"}),
      bad<nc::ValueError>("scatter_add undefined src", [&] { nc::scatter_add(x, 0, i64({0}, {1}), undefined); },
                          {"scatter_add", "'src'"}),
      bad<nc::ValueError>("one_hot(undefined)", [&] { nc::one_hot(undefined); }, {"one_hot", "'index'"}),
      bad<nc::ValueError>("masked_fill undefined mask", [&] { nc::masked_fill(x, undefined, 1); },
                          {"masked_fill", "'mask'"}),
      bad<nc::ValueError>("copy_ from undefined", [&] { nc::zeros({2}).copy_(undefined); }, {"copy_", "'src'"}),
      bad<nc::ValueError>("gather(undefined, ...)", [&] { nc::gather(undefined, 0, i64({0}, {1})); },
                          {"gather", "'x'"}),
      bad<nc::ValueError>("softmax(undefined)", [&] { nc::softmax(undefined, 0); }, {"softmax", "'x'"}),
      bad<nc::ValueError>("log_softmax(undefined)", [&] { nc::log_softmax(undefined, 0); }, {"log_softmax", "'x'"}),
      // Non-finite and out-of-range scalars.
      bad<nc::ValueError>("arange NaN step", [&] { nc::arange(0.0, 1.0, NAN); }, {"arange", "finite", "nan"}),
      bad<nc::ValueError>("linspace infinite end", [&] { nc::linspace(0, INFINITY, 3); },
                          {"linspace", "finite", "inf"}),
      bad<nc::ValueError>("norm NaN p", [&] { nc::norm(x, NAN); }, {"norm", "p", "nan"}),
      bad<nc::ValueError>("slice negative step", [&] { x.slice(0, 0, 3, -1); }, {"slice", "step", "-1"}),
      bad<nc::ValueError>("pow of an int tensor to a negative int", [&] { nc::pow(nc::zeros({2}, DType::I32), -1); },
                          {"pow", "i32", "-1"}),
      bad<nc::ValueError>("masked_fill of an int tensor with 1.5",
                          [&] {
                            nc::masked_fill(nc::zeros({2}, DType::I32), flags({true, false}, {2}), 1.5);
                          },
                          {"masked_fill", "value 1.5", "i32"}),
      bad<nc::ValueError>("masked_fill of an int tensor with NaN",
                          [&] {
                            nc::masked_fill(nc::zeros({2}, DType::I64), flags({true, false}, {2}), NAN);
                          },
                          {"masked_fill", "value nan", "i64"}),
  });

  // The remaining element-wise ops name their undefined operand the same way.
  using Unary = Tensor (*)(const Tensor&);
  using Binary = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<std::pair<std::string, Unary>> unary_ops = {
      {"abs", &nc::abs}, {"log", &nc::log},   {"sqrt", &nc::sqrt},       {"rsqrt", &nc::rsqrt}, {"sin", &nc::sin},
      {"cos", &nc::cos}, {"tanh", &nc::tanh}, {"sigmoid", &nc::sigmoid}, {"relu", &nc::relu},
  };
  const std::vector<std::pair<std::string, Binary>> binary_ops = {
      {"sub", &nc::sub}, {"mul", &nc::mul}, {"div", &nc::div}, {"maximum", &nc::maximum}, {"minimum", &nc::minimum},
      {"eq", &nc::eq},   {"ne", &nc::ne},   {"le", &nc::le},   {"gt", &nc::gt},           {"ge", &nc::ge},
  };
  std::vector<BadCall> table;
  for (const auto& [name, op] : unary_ops) {
    table.push_back(bad<nc::ValueError>(name + "(undefined)", [&, op = op] { op(undefined); }, {name + ":", "'x'"}));
  }
  for (const auto& [name, op] : binary_ops) {
    table.push_back(
        bad<nc::ValueError>(name + "(undefined, t)", [&, op = op] { op(undefined, x); }, {name + ":", "'a'"}));
    table.push_back(
        bad<nc::ValueError>(name + "(t, undefined)", [&, op = op] { op(x, undefined); }, {name + ":", "'b'"}));
  }
  run_table(table);
}

TEST(Errors, UndefinedTensorMethods) {
  // Methods of an undefined handle have no op to name; they throw the base Error.
  const Tensor undefined;
  run_table({
      bad<nc::Error>("shape", [&] { undefined.shape(); }, {"undefined tensor"}),
      bad<nc::Error>("view", [&] { undefined.view({1}); }, {"undefined tensor"}),
      bad<nc::Error>("clone", [&] { undefined.clone(); }, {"undefined tensor"}),
      bad<nc::Error>("item", [&] { undefined.item(); }, {"undefined tensor"}),
      bad<nc::Error>("result_type", [&] { nc::result_type(undefined, 1); }, {"undefined tensor"}),
  });
}

TEST(Errors, DeviceErrors) {
  run_table({
      bad<nc::DeviceError>("bad device string", [] { nc::Device("gpu:0"); }, {"Device", "gpu:0"}),
      bad<nc::DeviceError>("pinned memory for a GPU",
                           [] { nc::empty({2}, nc::TensorOptions(nc::Device::cuda(0)).with_pinned()); },
                           {"empty", "pinned", "cuda:0"}),
      bad<nc::DeviceError>("device string without an index", [] { nc::Device("cuda:"); }, {"Device", "'cuda:'"}),
      bad<nc::DeviceError>("negative device index", [] { nc::Device("cuda:-1"); }, {"Device", "cuda:-1"}),
      bad<nc::DeviceError>("upper-case device name", [] { nc::Device("CPU"); }, {"Device", "CPU"}),
      bad<nc::DeviceError>("DataLoader on a negative GPU index",
                           [] {
                             nc::data::DataLoaderOptions options = loader_options();
                             options.device = nc::Device::cuda(-1);
                             nc::data::DataLoader loader(images(4), options);
                           },
                           {"DataLoader", "device cuda:-1"}),
  });
  if (nc::cuda_is_available()) GTEST_SKIP() << "the rest needs a machine without a visible GPU";
  run_table({
      bad<nc::DeviceError>("zeros on a missing GPU", [] { nc::zeros({2}, nc::Device::cuda(0)); }, {"allocate"}),
      bad<nc::DeviceError>("to a missing GPU", [] { nc::ones({2}).to(nc::Device::cuda(0)); }, {"allocate"}),
      bad<nc::DeviceError>("pin_memory without CUDA", [] { nc::ones({2}).pin_memory(); }, {"pin_memory"}),
      bad<nc::DeviceError>("DataLoader on a missing GPU",
                           [] {
                             nc::data::DataLoaderOptions options = loader_options();
                             options.device = nc::Device::cuda(0);
                             nc::data::DataLoader loader(images(4), options);
                           },
                           {"DataLoader", "device cuda:0", "does not exist"}),
  });
#ifndef NORMCORE_HAS_CUDA
  // A CPU-only build keeps the CUDA runtime API: queries throw, empty_cache does nothing.
  nc::cuda::empty_cache();
  size_t free_bytes = 0, total_bytes = 0;
  run_table({
      bad<nc::DeviceError>("memory_stats", [] { nc::cuda::memory_stats(); }, {"cuda::memory_stats", "without CUDA"}),
      bad<nc::DeviceError>("reset_peak_memory_stats", [] { nc::cuda::reset_peak_memory_stats(); },
                           {"cuda::reset_peak_memory_stats"}),
      bad<nc::DeviceError>("mem_get_info", [&] { nc::cuda::mem_get_info(0, &free_bytes, &total_bytes); },
                           {"cuda::mem_get_info"}),
      bad<nc::DeviceError>("current_device", [] { nc::cuda::current_device(); }, {"cuda::current_device"}),
      bad<nc::DeviceError>("set_device", [] { nc::cuda::set_device(0); }, {"cuda::set_device"}),
      bad<nc::DeviceError>("synchronize", [] { nc::cuda::synchronize(); }, {"cuda::synchronize"}),
      bad<nc::DeviceError>("current_stream", [] { nc::cuda::current_stream(0); }, {"cuda::current_stream"}),
      bad<nc::DeviceError>("set_current_stream", [] { nc::cuda::set_current_stream(0, nullptr); },
                           {"cuda::set_current_stream"}),
      bad<nc::DeviceError>("create_stream", [] { nc::cuda::create_stream(); }, {"cuda::create_stream"}),
      bad<nc::DeviceError>("destroy_stream", [] { nc::cuda::destroy_stream(nullptr); }, {"cuda::destroy_stream"}),
      bad<nc::DeviceError>("StreamGuard", [] { nc::cuda::StreamGuard guard(0, nullptr); }, {"cuda::StreamGuard"}),
  });
#endif
}

TEST(Errors, AutogradErrors) {
  const auto doubled = [](const std::vector<Tensor>& inputs) { return nc::mul(inputs[0], 2.0); };
  run_table({
      bad<nc::DTypeError>("requires_grad_ on an int tensor", [] { nc::zeros({2}, DType::I64).requires_grad_(); },
                          {"requires_grad_", "floating", "i64"}),
      bad<nc::ValueError>("requires_grad_ on a non-leaf", [] { nc::mul(leaf({2}), 2.0).requires_grad_(false); },
                          {"requires_grad_", "leaf", "'mul'"}),
      bad<nc::ShapeError>("set_grad of another shape", [] { nc::zeros({2}).set_grad(nc::zeros({3})); },
                          {"set_grad", "f32 [3]", "f32 [2]"}),
      bad<nc::DTypeError>("set_grad of another dtype", [] { nc::zeros({2}).set_grad(nc::zeros({2}, DType::F64)); },
                          {"set_grad", "f64 [2]", "f32 [2]"}),
      bad<nc::ValueError>("clamp with min above max", [] { nc::clamp(nc::zeros({2}), 3, 1); },
                          {"clamp", "min 3", "max 1"}),
      bad<nc::ValueError>("copy_ into a tensor that requires grad", [] { leaf({2}).copy_(nc::ones({2})); },
                          {"copy_", "requires grad", "f32 [2]"}),
      bad<nc::ValueError>("fill_ of a tensor that requires grad", [] { leaf({2}).fill_(1); },
                          {"fill_", "requires grad", "f32 [2]"}),
      bad<nc::ValueError>("backward of a tensor without grad", [] { nc::zeros({1}).backward(); },
                          {"backward", "f32 [1]", "does not require grad"}),
      bad<nc::ShapeError>("backward without grad for several elements", [] { nc::mul(leaf({2}), 2.0).backward(); },
                          {"backward", "grad", "[2]"}),
      bad<nc::ShapeError>("backward with a grad of another shape",
                          [] { nc::mul(leaf({2}), 2.0).backward(nc::ones({3})); }, {"backward", "grad", "[3]", "[2]"}),
      bad<nc::Error>("backward twice through a freed graph",
                     [] {
                       Tensor y = nc::sum(nc::mul(leaf({2}), leaf({2})));
                       y.backward();
                       y.backward();
                     },
                     {"backward", "'sum'", "retain_graph"}),
      bad<nc::ValueError>("gradcheck eps 0",
                          [&] { nc::gradcheck(doubled, {nc::zeros({2}, DType::F64).requires_grad_()}, {0.0}); },
                          {"gradcheck", "eps", "0"}),
      bad<nc::DTypeError>("gradcheck f32 input", [&] { nc::gradcheck(doubled, {leaf({2})}); },
                          {"gradcheck", "input 0", "f32", "f64"}),
      bad<nc::ValueError>("gradcheck with nothing requiring grad",
                          [&] { nc::gradcheck(doubled, {nc::zeros({2}, DType::F64)}); },
                          {"gradcheck", "output", "requires grad"}),
      bad<nc::ValueError>("anomaly mode: an infinity produced",
                          [] {
                            nc::autograd::AnomalyModeGuard anomaly;
                            nc::log(leaf({2}));
                          },
                          {"anomaly mode", "'log'", "from finite inputs"}),
      bad<nc::ValueError>("anomaly mode: a NaN received",
                          [] {
                            nc::autograd::AnomalyModeGuard anomaly;
                            Tensor x = nc::full({2}, NAN);
                            x.requires_grad_();
                            nc::exp(x);
                          },
                          {"anomaly mode", "'exp'", "input 0"}),
      bad<nc::ValueError>("anomaly mode: an infinity in a gradient",
                          [] {
                            nc::autograd::AnomalyModeGuard anomaly;
                            nc::sum(nc::sqrt(leaf({2}))).backward();
                          },
                          {"anomaly mode", "backward of 'sqrt'", "input 0"}),
  });
}

TEST(Errors, NormErrors) {
  const Tensor undefined;
  const Tensor x23 = nc::zeros({2, 3});
  const Tensor x243 = nc::zeros({2, 4, 3});
  const Tensor ints = nc::zeros({2, 3}, DType::I64);
  run_table({
      bad<nc::ValueError>("layer_norm(undefined)", [&] { nc::layer_norm(undefined, {3}, undefined, undefined); },
                          {"layer_norm", "'x'"}),
      bad<nc::DTypeError>("layer_norm of int", [&] { nc::layer_norm(ints, {3}, undefined, undefined); },
                          {"layer_norm", "x", "floating", "i64"}),
      bad<nc::ValueError>("layer_norm eps 0", [&] { nc::layer_norm(x23, {3}, undefined, undefined, 0); },
                          {"layer_norm", "eps", "0"}),
      bad<nc::ValueError>("layer_norm NaN eps", [&] { nc::layer_norm(x23, {3}, undefined, undefined, NAN); },
                          {"layer_norm", "eps", "nan"}),
      bad<nc::ShapeError>("layer_norm empty normalized_shape", [&] { nc::layer_norm(x23, {}, undefined, undefined); },
                          {"layer_norm", "normalized_shape", "[]", "[2, 3]"}),
      bad<nc::ShapeError>("layer_norm normalized_shape off the trailing dims",
                          [&] { nc::layer_norm(x23, {4}, undefined, undefined); },
                          {"layer_norm", "normalized_shape [4]", "[2, 3]"}),
      bad<nc::ShapeError>("layer_norm normalized_shape longer than x",
                          [&] {
                            nc::layer_norm(x23, {1, 2, 3}, undefined, undefined);
                          },
                          {"layer_norm", "normalized_shape [1, 2, 3]", "[2, 3]"}),
      bad<nc::ShapeError>("layer_norm weight shape", [&] { nc::layer_norm(x23, {3}, nc::ones({2}), undefined); },
                          {"layer_norm", "weight", "[3]", "f32 [2]"}),
      bad<nc::DTypeError>("layer_norm bias dtype",
                          [&] { nc::layer_norm(x23, {3}, undefined, nc::ones({3}, DType::F64)); },
                          {"layer_norm", "bias", "f64 [3]", "f32 [2, 3]"}),
      bad<nc::ValueError>("rms_norm(undefined)", [&] { nc::rms_norm(undefined, {3}, undefined); }, {"rms_norm", "'x'"}),
      bad<nc::DTypeError>("rms_norm of int", [&] { nc::rms_norm(ints, {3}, undefined); },
                          {"rms_norm", "x", "floating", "i64"}),
      bad<nc::ValueError>("rms_norm eps 0", [&] { nc::rms_norm(x23, {3}, undefined, 0); }, {"rms_norm", "eps", "0"}),
      bad<nc::ShapeError>("rms_norm normalized_shape off the trailing dims", [&] { nc::rms_norm(x23, {2}, undefined); },
                          {"rms_norm", "normalized_shape [2]", "[2, 3]"}),
      bad<nc::ShapeError>("rms_norm weight shape",
                          [&] {
                            nc::rms_norm(x23, {3}, nc::ones({3, 1}));
                          },
                          {"rms_norm", "weight", "[3]", "f32 [3, 1]"}),
      bad<nc::DTypeError>("rms_norm weight dtype", [&] { nc::rms_norm(x23, {3}, nc::ones({3}, DType::F16)); },
                          {"rms_norm", "weight", "f16 [3]", "f32 [2, 3]"}),
      bad<nc::ValueError>("group_norm(undefined)", [&] { nc::group_norm(undefined, 1, undefined, undefined); },
                          {"group_norm", "'x'"}),
      bad<nc::DTypeError>("group_norm of int",
                          [&] {
                            nc::group_norm(nc::zeros({2, 4}, DType::I32), 2, undefined, undefined);
                          },
                          {"group_norm", "x", "floating", "i32"}),
      bad<nc::ShapeError>("group_norm of 1-D", [&] { nc::group_norm(nc::zeros({4}), 1, undefined, undefined); },
                          {"group_norm", "x", "[N, C, *]", "[4]"}),
      bad<nc::ValueError>("group_norm 0 groups", [&] { nc::group_norm(x243, 0, undefined, undefined); },
                          {"group_norm", "num_groups", "0"}),
      bad<nc::ShapeError>("group_norm C not divisible", [&] { nc::group_norm(x243, 3, undefined, undefined); },
                          {"group_norm", "C = 4", "num_groups = 3", "[2, 4, 3]"}),
      bad<nc::ValueError>("group_norm of one value per group",
                          [&] {
                            nc::group_norm(nc::ones({1, 4}), 4, undefined, undefined);
                          },
                          {"group_norm", "more than 1 value per group", "[1, 4]", "4 groups"}),
      bad<nc::ShapeError>("group_norm weight shape", [&] { nc::group_norm(x243, 2, nc::ones({3}), undefined); },
                          {"group_norm", "weight", "[4]", "f32 [3]"}),
      bad<nc::DTypeError>("group_norm bias dtype",
                          [&] { nc::group_norm(x243, 2, undefined, nc::ones({4}, DType::F16)); },
                          {"group_norm", "bias", "f16 [4]", "f32 [2, 4, 3]"}),
      bad<nc::ValueError>("group_norm negative eps", [&] { nc::group_norm(x243, 2, undefined, undefined, -1); },
                          {"group_norm", "eps", "-1"}),
      bad<nc::ValueError>("l1_norm(undefined)", [&] { nc::l1_norm(undefined); }, {"l1_norm", "'x'"}),
      bad<nc::DTypeError>("l1_norm of int", [&] { nc::l1_norm(ints); }, {"l1_norm", "x", "floating", "i64"}),
      bad<nc::IndexError>("l1_norm dim", [&] { nc::l1_norm(x23, 2); }, {"l1_norm", "dim 2", "2 dims"}),
      bad<nc::ValueError>("l1_norm eps 0", [&] { nc::l1_norm(x23, 1, 0); }, {"l1_norm", "eps", "0"}),
      bad<nc::ValueError>("frobenius_norm(undefined)", [&] { nc::frobenius_norm(undefined); },
                          {"frobenius_norm", "'x'"}),
      bad<nc::DTypeError>("frobenius_norm of int", [&] { nc::frobenius_norm(ints); },
                          {"frobenius_norm", "x", "floating", "i64"}),
      bad<nc::ValueError>("frobenius_norm NaN eps", [&] { nc::frobenius_norm(x23, NAN); },
                          {"frobenius_norm", "eps", "nan"}),
      bad<nc::ValueError>("batch_norm(undefined)",
                          [&] { nc::batch_norm(undefined, undefined, undefined, undefined, undefined, true); },
                          {"batch_norm", "'x'"}),
      bad<nc::DTypeError>("batch_norm of int",
                          [&] { nc::batch_norm(ints, undefined, undefined, undefined, undefined, true); },
                          {"batch_norm", "x", "floating", "i64"}),
      bad<nc::ShapeError>("batch_norm of 1-D",
                          [&] { nc::batch_norm(nc::zeros({4}), undefined, undefined, undefined, undefined, true); },
                          {"batch_norm", "x", "[N, C, *]", "[4]"}),
      bad<nc::ValueError>("batch_norm eps 0",
                          [&] { nc::batch_norm(x243, undefined, undefined, undefined, undefined, true, 0.1, 0); },
                          {"batch_norm", "eps", "0"}),
      bad<nc::ShapeError>("batch_norm weight shape",
                          [&] { nc::batch_norm(x243, undefined, undefined, nc::ones({3}), undefined, true); },
                          {"batch_norm", "weight", "[4]", "f32 [3]", "f32 [2, 4, 3]"}),
      bad<nc::ShapeError>("batch_norm running_mean shape",
                          [&] { nc::batch_norm(x243, nc::zeros({2}), nc::ones({4}), undefined, undefined, false); },
                          {"batch_norm", "running_mean", "[4]", "f32 [2]"}),
      bad<nc::DTypeError>("batch_norm running_var dtype",
                          [&] {
                            nc::batch_norm(x243, nc::zeros({4}), nc::ones({4}, DType::F64), undefined, undefined, true);
                          },
                          {"batch_norm", "running_var", "f64 [4]", "f32 [2, 4, 3]"}),
      bad<nc::ValueError>("batch_norm evaluation without running_mean",
                          [&] { nc::batch_norm(x243, undefined, nc::ones({4}), undefined, undefined, false); },
                          {"batch_norm", "running_mean", "training = false"}),
      bad<nc::ValueError>("batch_norm evaluation without running_var",
                          [&] { nc::batch_norm(x243, nc::zeros({4}), undefined, undefined, undefined, false); },
                          {"batch_norm", "running_var", "training = false"}),
      bad<nc::ValueError>("batch_norm one value per channel in training",
                          [&] {
                            nc::batch_norm(nc::zeros({1, 4, 1}), undefined, undefined, undefined, undefined, true);
                          },
                          {"batch_norm", "more than 1 value per channel", "[1, 4, 1]"}),
  });
}

TEST(Errors, AttentionErrors) {
  const Tensor undefined;
  const Tensor q = nc::zeros({1, 2, 3, 4}), k = nc::zeros({1, 2, 5, 4}), v = nc::zeros({1, 2, 5, 6});
  auto sdpa = [](const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.5) {
    nc::scaled_dot_product_attention(q, k, v, false, scale);
  };
  run_table({
      bad<nc::ValueError>("sdpa(undefined k)", [&] { sdpa(q, undefined, v); }, {"scaled_dot_product_attention", "'k'"}),
      bad<nc::ShapeError>("sdpa 3-D q",
                          [&] {
                            sdpa(nc::zeros({2, 3, 4}), k, v);
                          },
                          {"scaled_dot_product_attention", "q", "4-D", "[2, 3, 4]"}),
      bad<nc::ShapeError>("sdpa heads of v",
                          [&] {
                            sdpa(q, k, nc::zeros({1, 3, 5, 6}));
                          },
                          {"scaled_dot_product_attention", "k and v must have the same head count", "[1, 3, 5, 6]"}),
      bad<nc::ShapeError>("sdpa heads of k and v without enable_gqa",
                          [&] {
                            sdpa(q, nc::zeros({1, 1, 5, 4}), nc::zeros({1, 1, 5, 6}));
                          },
                          {"scaled_dot_product_attention", "q's head count 2", "[1, 1, 5, 4]", "enable_gqa"}),
      bad<nc::ShapeError>("sdpa head dim of k",
                          [&] {
                            sdpa(q, nc::zeros({1, 2, 5, 3}), v);
                          },
                          {"scaled_dot_product_attention", "head dim D", "[1, 2, 3, 4]", "[1, 2, 5, 3]"}),
      bad<nc::ShapeError>("sdpa key count of v",
                          [&] {
                            sdpa(q, k, nc::zeros({1, 2, 4, 6}));
                          },
                          {"scaled_dot_product_attention", "key count S", "[1, 2, 5, 4]", "[1, 2, 4, 6]"}),
      bad<nc::ShapeError>("sdpa D = 0",
                          [&] {
                            sdpa(nc::zeros({1, 2, 3, 0}), nc::zeros({1, 2, 5, 0}), v);
                          },
                          {"scaled_dot_product_attention", "at least 1"}),
      bad<nc::DTypeError>("sdpa of int", [&] { sdpa(q.to(DType::I32), k, v); },
                          {"scaled_dot_product_attention", "q", "floating", "i32"}),
      bad<nc::DTypeError>("sdpa v dtype", [&] { sdpa(q, k, v.to(DType::BF16)); },
                          {"scaled_dot_product_attention", "v", "bf16", "f32 [1, 2, 3, 4]"}),
      bad<nc::ValueError>("sdpa NaN scale", [&] { sdpa(q, k, v, NAN); }, {"scaled_dot_product_attention", "scale"}),
  });
  if (!nc::cuda_is_available()) return;
  const nc::Device gpu = nc::Device::cuda();
  run_table({
      bad<nc::DeviceError>("sdpa k on another device", [&] { sdpa(q, k.to(gpu), v); },
                           {"scaled_dot_product_attention", "cuda:0", "cpu"}),
      bad<nc::ShapeError>(
          "sdpa head dim over the CUDA limit",
          [&] {
            sdpa(nc::zeros({1, 1, 2, 264}, gpu), nc::zeros({1, 1, 2, 264}, gpu), nc::zeros({1, 1, 2, 264}, gpu));
          },
          {"scaled_dot_product_attention", "head dims up to 256", "D = 264"}),
  });
}

TEST(Errors, FusedOpErrors) {
  // x [2, 3], weight [4, 3] -> OUT = 4; bias [1, 4, 1, 1]; two groups.
  const Tensor undefined;
  const Tensor x = nc::zeros({2, 3});
  const Tensor weight = nc::zeros({4, 3});
  const Tensor bias = nc::zeros({1, 4, 1, 1});
  const auto fused = [&](const Tensor& x_, const Tensor& weight_, const Tensor& linear_bias, const Tensor& gn_weight,
                         const Tensor& gn_bias, const Tensor& bias_, int64_t groups, double eps = 1e-5) {
    nc::gemm_group_norm_min_bias(x_, weight_, linear_bias, gn_weight, gn_bias, bias_, groups, eps);
  };
  const std::string op = "gemm_group_norm_min_bias:";
  run_table({
      bad<nc::ValueError>("x undefined", [&] { fused(undefined, weight, undefined, undefined, undefined, bias, 2); },
                          {op, "'x'"}),
      bad<nc::DTypeError>("x int", [&] { fused(x.to(DType::I64), weight, undefined, undefined, undefined, bias, 2); },
                          {op, "x", "floating", "i64"}),
      bad<nc::ShapeError>("x 3-D",
                          [&] {
                            fused(nc::zeros({2, 4, 3}), weight, undefined, undefined, undefined, bias, 2);
                          },
                          {op, "x", "[B, IN]", "[2, 4, 3]"}),
      bad<nc::ValueError>("weight undefined", [&] { fused(x, undefined, undefined, undefined, undefined, bias, 2); },
                          {op, "'weight'"}),
      bad<nc::ShapeError>("weight IN",
                          [&] {
                            fused(x, nc::zeros({4, 5}), undefined, undefined, undefined, bias, 2);
                          },
                          {op, "weight", "[OUT, 3]", "[4, 5]"}),
      bad<nc::ShapeError>("weight 1-D", [&] { fused(x, nc::zeros({3}), undefined, undefined, undefined, bias, 2); },
                          {op, "weight", "[OUT, 3]", "f32 [3]"}),
      bad<nc::DTypeError>("weight dtype",
                          [&] { fused(x, weight.to(DType::F64), undefined, undefined, undefined, bias, 2); },
                          {op, "weight", "f64 [4, 3]", "f32 [2, 3]"}),
      bad<nc::ShapeError>("OUT 0",
                          [&] {
                            fused(x, nc::zeros({0, 3}), undefined, undefined, undefined, nc::zeros({1, 0, 1, 1}), 2);
                          },
                          {op, "OUT", "[0, 3]"}),
      bad<nc::ValueError>("0 groups", [&] { fused(x, weight, undefined, undefined, undefined, bias, 0); },
                          {op, "num_groups", "0"}),
      bad<nc::ShapeError>("OUT not divisible", [&] { fused(x, weight, undefined, undefined, undefined, bias, 3); },
                          {op, "OUT = 4", "num_groups = 3"}),
      bad<nc::ValueError>("eps 0", [&] { fused(x, weight, undefined, undefined, undefined, bias, 2, 0.0); },
                          {op, "eps", "0"}),
      bad<nc::ValueError>("one value per group",
                          [&] {
                            fused(nc::ones({1, 3}), nc::ones({4, 3}), undefined, undefined, undefined, bias, 4);
                          },
                          {op, "more than 1 value per group", "B = 1", "OUT = 4", "4 groups"}),
      bad<nc::ValueError>("NaN eps", [&] { fused(x, weight, undefined, undefined, undefined, bias, 2, NAN); },
                          {op, "eps", "nan"}),
      bad<nc::ShapeError>("linear_bias shape", [&] { fused(x, weight, nc::zeros({3}), undefined, undefined, bias, 2); },
                          {op, "linear_bias", "[4]", "f32 [3]"}),
      bad<nc::DTypeError>("gn_weight dtype",
                          [&] { fused(x, weight, undefined, nc::zeros({4}, DType::F64), undefined, bias, 2); },
                          {op, "gn_weight", "f64 [4]", "f32 [2, 3]"}),
      bad<nc::ShapeError>("gn_bias shape",
                          [&] {
                            fused(x, weight, undefined, undefined, nc::zeros({1, 4}), bias, 2);
                          },
                          {op, "gn_bias", "[4]", "[1, 4]"}),
      bad<nc::ValueError>("bias undefined", [&] { fused(x, weight, undefined, undefined, undefined, undefined, 2); },
                          {op, "'bias'"}),
      bad<nc::ShapeError>("bias shape", [&] { fused(x, weight, undefined, undefined, undefined, nc::zeros({4}), 2); },
                          {op, "bias", "[1, 4, 1, 1]", "f32 [4]"}),
  });
}

TEST(Errors, LossErrors) {
  namespace nn = nc::nn;
  const Tensor undefined;
  const Tensor logits = nc::zeros({2, 3});
  const Tensor target = i64({0, 1}, {2});
  const Tensor ints = nc::zeros({2, 3}, DType::I64);
  run_table({
      bad<nc::ValueError>("cross_entropy undefined logits", [&] { nc::cross_entropy(undefined, target); },
                          {"cross_entropy", "'logits'"}),
      bad<nc::ValueError>("cross_entropy undefined target", [&] { nc::cross_entropy(logits, undefined); },
                          {"cross_entropy", "'target'"}),
      bad<nc::DTypeError>("cross_entropy int logits", [&] { nc::cross_entropy(ints, target); },
                          {"cross_entropy", "logits", "floating", "i64 [2, 3]"}),
      bad<nc::DTypeError>("cross_entropy float target", [&] { nc::cross_entropy(logits, nc::zeros({2})); },
                          {"cross_entropy", "target", "i64", "f32 [2]"}),
      bad<nc::DTypeError>("cross_entropy i32 target", [&] { nc::cross_entropy(logits, nc::zeros({2}, DType::I32)); },
                          {"cross_entropy", "target", "i32 [2]"}),
      bad<nc::ShapeError>("cross_entropy 0-dim logits", [&] { nc::cross_entropy(nc::full({}, 1.0), i64_scalar(0)); },
                          {"cross_entropy", "logits", "f32 []"}),
      bad<nc::ShapeError>("cross_entropy target shape",
                          [&] {
                            nc::cross_entropy(logits, i64({0, 1, 2}, {3}));
                          },
                          {"cross_entropy", "target", "[3]", "[2, 3]", "[2]"}),
      bad<nc::IndexError>("cross_entropy class too large",
                          [&] {
                            nc::cross_entropy(logits, i64({0, 3}, {2}));
                          },
                          {"cross_entropy", "target value 3", "3 classes"}),
      bad<nc::IndexError>("cross_entropy negative class",
                          [&] {
                            nc::cross_entropy(logits, i64({-1, 0}, {2}));
                          },
                          {"cross_entropy", "target value -1", "3 classes"}),
      bad<nc::ValueError>("cross_entropy label_smoothing 1.5",
                          [&] { nc::cross_entropy(logits, target, nc::Reduction::Mean, 1.5); },
                          {"cross_entropy", "label_smoothing", "1.5"}),
      bad<nc::ValueError>("cross_entropy NaN label_smoothing",
                          [&] { nc::cross_entropy(logits, target, nc::Reduction::Mean, NAN); },
                          {"cross_entropy", "label_smoothing", "nan"}),
      bad<nc::ValueError>("nll_loss undefined log_probs", [&] { nc::nll_loss(undefined, target); },
                          {"nll_loss", "'log_probs'"}),
      bad<nc::DTypeError>("nll_loss int log_probs", [&] { nc::nll_loss(ints, target); },
                          {"nll_loss", "log_probs", "floating", "i64"}),
      bad<nc::DTypeError>("nll_loss float target", [&] { nc::nll_loss(logits, nc::zeros({2})); },
                          {"nll_loss", "target", "f32 [2]"}),
      bad<nc::ShapeError>("nll_loss per-position target shape",
                          [&] {
                            nc::nll_loss(nc::zeros({2, 3, 4, 5}), nc::zeros({2, 4, 6}, DType::I64));
                          },
                          {"nll_loss", "target", "[2, 4, 6]", "[2, 4, 5]"}),
      bad<nc::IndexError>("nll_loss class too large",
                          [&] {
                            nc::nll_loss(logits, i64({3, 0}, {2}));
                          },
                          {"nll_loss", "target value 3", "3 classes"}),
      bad<nc::ValueError>("mse_loss undefined target", [&] { nc::mse_loss(logits, undefined); },
                          {"mse_loss", "'target'"}),
      bad<nc::ShapeError>("mse_loss shapes", [&] { nc::mse_loss(logits, nc::zeros({3})); },
                          {"mse_loss", "input", "[2, 3]", "target", "[3]"}),
      bad<nc::DTypeError>("mse_loss int input", [&] { nc::mse_loss(ints, logits); }, {"mse_loss", "input", "i64"}),
      bad<nc::DTypeError>("mse_loss int target", [&] { nc::mse_loss(logits, ints); }, {"mse_loss", "target", "i64"}),
      bad<nc::ValueError>("l1_loss undefined input", [&] { nc::l1_loss(undefined, logits); }, {"l1_loss", "'input'"}),
      bad<nc::ShapeError>("l1_loss shapes",
                          [&] {
                            nc::l1_loss(logits, nc::zeros({2, 1}));
                          },
                          {"l1_loss", "input", "[2, 3]", "target", "[2, 1]"}),
      bad<nc::DTypeError>("l1_loss int target", [&] { nc::l1_loss(logits, ints); }, {"l1_loss", "target", "i64"}),
      bad<nc::ValueError>("binary_cross_entropy_with_logits undefined logits",
                          [&] { nc::binary_cross_entropy_with_logits(undefined, logits); },
                          {"binary_cross_entropy_with_logits", "'logits'"}),
      bad<nc::ShapeError>("binary_cross_entropy_with_logits shapes",
                          [&] {
                            nc::binary_cross_entropy_with_logits(logits, nc::zeros({3, 2}));
                          },
                          {"binary_cross_entropy_with_logits", "logits", "[2, 3]", "target", "[3, 2]"}),
      bad<nc::DTypeError>("binary_cross_entropy_with_logits int logits",
                          [&] { nc::binary_cross_entropy_with_logits(ints, logits); },
                          {"binary_cross_entropy_with_logits", "logits", "i64"}),
      bad<nc::DTypeError>("binary_cross_entropy_with_logits bool target",
                          [&] {
                            nc::binary_cross_entropy_with_logits(logits, nc::zeros({2, 3}, DType::Bool));
                          },
                          {"binary_cross_entropy_with_logits", "target", "bool"}),
  });
}

TEST(Errors, LayerErrors) {
  namespace nn = nc::nn;
  const Tensor undefined;
  const Tensor x23 = nc::zeros({2, 3});
  run_table({
      bad<nc::ValueError>("Linear negative in_features", [] { nn::Linear(-1, 2); }, {"Linear", "in_features", "-1"}),
      bad<nc::ValueError>("Linear negative out_features", [] { nn::Linear(2, -3); }, {"Linear", "out_features", "-3"}),
      bad<nc::ValueError>("Linear(undefined)", [&] { nn::Linear(3, 2)(undefined); }, {"Linear", "input", "undefined"}),
      bad<nc::ShapeError>("Linear input size", [&] { nn::Linear(4, 2)(x23); },
                          {"Linear", "in_features = 4", "f32 [2, 3]", "f32 [2, 4]"}),
      bad<nc::ShapeError>("Linear 0-dim input", [&] { nn::Linear(4, 2)(nc::full({}, 1.0)); },
                          {"Linear", "in_features = 4", "f32 []"}),
      bad<nc::DTypeError>("Linear input dtype", [&] { nn::Linear(3, 2)(x23.to(DType::F64)); },
                          {"Linear", "input", "f64 [2, 3]", "weight", "f32 [2, 3]"}),
      bad<nc::DTypeError>("ReLU of bool", [&] { nn::ReLU()(nc::zeros({2}, DType::Bool)); }, {"relu", "bool"}),
      bad<nc::ValueError>("GELU(undefined)", [&] { nn::GELU()(undefined); }, {"gelu", "'x'"}),
      bad<nc::ValueError>("Tanh(undefined)", [&] { nn::Tanh()(undefined); }, {"tanh", "'x'"}),
      bad<nc::ValueError>("Sigmoid(undefined)", [&] { nn::Sigmoid()(undefined); }, {"sigmoid", "'x'"}),
      bad<nc::ValueError>("Dropout p above 1", [] { nn::Dropout(1.5); }, {"Dropout", "p", "1.5"}),
      bad<nc::ValueError>("Dropout NaN p", [] { nn::Dropout(NAN); }, {"Dropout", "p", "nan"}),
      bad<nc::ValueError>("dropout negative p", [&] { nc::dropout(x23, -0.1, true); }, {"dropout", "p", "-0.1"}),
      bad<nc::ValueError>("dropout(undefined)", [&] { nc::dropout(undefined, 0.5, true); },
                          {"dropout", "x", "undefined"}),
      bad<nc::DTypeError>("dropout of int, even in evaluation",
                          [&] { nc::dropout(nc::zeros({2}, DType::I32), 0.5, false); }, {"dropout", "x", "i32"}),
      bad<nc::DTypeError>("Dropout of int", [&] { nn::Dropout(0.5)(nc::zeros({2}, DType::I32)); },
                          {"dropout", "x", "i32"}),
      bad<nc::ValueError>("Flatten(undefined)", [&] { nn::Flatten()(undefined); }, {"Flatten", "input", "undefined"}),
      bad<nc::IndexError>("Flatten of 1-D from dim 1", [&] { nn::Flatten()(nc::zeros({3})); }, {"flatten", "dim 1"}),
      bad<nc::IndexError>("Flatten start after end",
                          [&] {
                            nn::Flatten(2, 1)(nc::zeros({2, 3, 4}));
                          },
                          {"flatten", "start_dim 2", "end_dim 1"}),
      bad<nc::ValueError>("Sequential of a null module",
                          [] {
                            nn::Sequential({std::make_shared<nn::ReLU>(), nullptr});
                          },
                          {"Sequential::push_back", "module 1", "null"}),
      bad<nc::ValueError>("Sequential::push_back(nullptr)", [] { nn::Sequential().push_back(nullptr); },
                          {"Sequential::push_back", "module 0", "null"}),
      bad<nc::IndexError>("Sequential index", [] { nn::Sequential({std::make_shared<nn::ReLU>()})[1]; },
                          {"Sequential", "index 1", "1 modules"}),
      bad<nc::ValueError>("Embedding negative num_embeddings", [] { nn::Embedding(-1, 2); },
                          {"Embedding", "num_embeddings", "-1"}),
      bad<nc::ValueError>("Embedding negative embedding_dim", [] { nn::Embedding(2, -2); },
                          {"Embedding", "embedding_dim", "-2"}),
      bad<nc::ValueError>("Embedding(undefined)", [&] { nn::Embedding(3, 2)(undefined); },
                          {"embedding", "index", "undefined"}),
      bad<nc::DTypeError>("Embedding float index", [&] { nn::Embedding(3, 2)(nc::zeros({2})); },
                          {"embedding", "index", "f32 [2]"}),
      bad<nc::DTypeError>("Embedding u8 index", [&] { nn::Embedding(3, 2)(nc::zeros({1}, DType::U8)); },
                          {"embedding", "index", "u8 [1]"}),
      bad<nc::IndexError>("Embedding index too large",
                          [&] {
                            nn::Embedding(3, 2)(i64({0, 3}, {2}));
                          },
                          {"embedding", "index 3", "3 embeddings"}),
      bad<nc::IndexError>("Embedding negative index",
                          [&] {
                            nn::Embedding(3, 2)(i64({-1, 0}, {2}));
                          },
                          {"embedding", "index -1", "3 embeddings"}),
      bad<nc::IndexError>("Embedding i32 index too large",
                          [&] { nn::Embedding(3, 2)(nc::from_vector<int32_t>({5}, {1})); },
                          {"embedding", "index 5", "3 embeddings"}),
      bad<nc::ValueError>("LayerNorm negative size",
                          [] {
                            nn::LayerNorm({2, -1});
                          },
                          {"LayerNorm", "normalized_shape", "[2, -1]"}),
      // LayerNorm, GroupNorm (past its channel check), L1Norm and FrobeniusNorm forward to the
      // functional op, which names itself.
      bad<nc::ShapeError>("LayerNorm input shape", [&] { nn::LayerNorm({4})(x23); },
                          {"layer_norm", "normalized_shape [4]", "[2, 3]"}),
      bad<nc::DTypeError>("LayerNorm input dtype", [&] { nn::LayerNorm({3})(x23.to(DType::F64)); },
                          {"layer_norm", "weight", "f32 [3]", "f64 [2, 3]"}),
      bad<nc::ValueError>("LayerNorm eps 0", [] { nn::LayerNorm({3}, 0.0); }, {"LayerNorm", "eps", "0"}),
      bad<nc::ValueError>("GroupNorm NaN eps", [] { nn::GroupNorm(1, 2, NAN); }, {"GroupNorm", "eps", "nan"}),
      bad<nc::ValueError>("GroupNorm 0 groups", [] { nn::GroupNorm(0, 4); }, {"GroupNorm", "num_groups", "0"}),
      bad<nc::ValueError>("GroupNorm channels not divisible", [] { nn::GroupNorm(3, 4); },
                          {"GroupNorm", "num_channels = 4", "num_groups = 3"}),
      bad<nc::ValueError>("GroupNorm negative channels", [] { nn::GroupNorm(2, -2); },
                          {"GroupNorm", "num_channels = -2"}),
      bad<nc::ShapeError>("GroupNorm input channels", [&] { nn::GroupNorm(2, 4)(x23); },
                          {"GroupNorm", "num_channels = 4", "f32 [2, 3]"}),
      bad<nc::ShapeError>("GroupNorm 1-D input", [&] { nn::GroupNorm(2, 4)(nc::zeros({4})); },
                          {"GroupNorm", "num_channels = 4", "f32 [4]"}),
      bad<nc::DTypeError>("GroupNorm input dtype",
                          [&] {
                            nn::GroupNorm(2, 4)(nc::zeros({2, 4}, DType::F64));
                          },
                          {"group_norm", "weight", "f32 [4]", "f64 [2, 4]"}),
      bad<nc::IndexError>("L1Norm dim", [&] { nn::L1Norm(5)(x23); }, {"l1_norm", "dim 5", "2 dims"}),
      bad<nc::ValueError>("L1Norm negative eps", [] { nn::L1Norm(1, -1); }, {"L1Norm", "eps", "-1"}),
      bad<nc::ValueError>("FrobeniusNorm infinite eps", [] { nn::FrobeniusNorm{INFINITY}; },
                          {"FrobeniusNorm", "eps", "inf"}),
      bad<nc::DTypeError>("FrobeniusNorm of int", [&] { nn::FrobeniusNorm()(nc::zeros({2}, DType::I32)); },
                          {"frobenius_norm", "x", "i32"}),
  });
}

TEST(Errors, ModuleErrors) {
  namespace nn = nc::nn;
  const Tensor undefined;
  run_table({
      bad<nc::Error>("Module without a forward", [] { nn::Module()(nc::zeros({2})); }, {"Module::forward"}),
      bad<nc::ValueError>("register_parameter empty name", [] { nn::Module().register_parameter("", nc::zeros({2})); },
                          {"register_parameter", "name", "empty"}),
      bad<nc::ValueError>("register_parameter dotted name",
                          [] { nn::Module().register_parameter("a.b", nc::zeros({2})); },
                          {"register_parameter", "\"a.b\"", "'.'"}),
      bad<nc::ValueError>("register_parameter(undefined)", [&] { nn::Module().register_parameter("w", undefined); },
                          {"register_parameter", "\"w\"", "undefined"}),
      bad<nc::DTypeError>("register_parameter of int",
                          [] { nn::Module().register_parameter("w", nc::zeros({2}, DType::I32)); },
                          {"register_parameter", "\"w\"", "floating", "i32"}),
      bad<nc::ValueError>("register_parameter of a non-leaf",
                          [] { nn::Module().register_parameter("w", nc::mul(leaf({2}), 2.0)); },
                          {"register_parameter", "\"w\"", "'mul'", "leaves"}),
      bad<nc::ValueError>("register_buffer taken name",
                          [] {
                            nn::Module m;
                            m.register_parameter("w", nc::zeros({2}));
                            m.register_buffer("w", nc::zeros({2}));
                          },
                          {"register_buffer", "\"w\"", "already used"}),
      bad<nc::ValueError>("register_buffer empty name", [] { nn::Module().register_buffer("", nc::zeros({2})); },
                          {"register_buffer", "name", "empty"}),
      bad<nc::ValueError>("register_buffer(undefined)", [&] { nn::Module().register_buffer("b", undefined); },
                          {"register_buffer", "\"b\"", "undefined"}),
      bad<nc::ValueError>("register_module null",
                          [] { nn::Module().register_module("c", std::shared_ptr<nn::Module>()); },
                          {"register_module", "\"c\"", "null"}),
      bad<nc::ValueError>("register_module of itself",
                          [] {
                            auto m = std::make_shared<nn::Module>();
                            m->register_module("me", m);
                          },
                          {"register_module", "own child", "\"me\""}),
      bad<nc::ValueError>("register_module taken name",
                          [] {
                            nn::Module m;
                            m.register_module("c", std::make_shared<nn::ReLU>());
                            m.register_module("c", std::make_shared<nn::ReLU>());
                          },
                          {"register_module", "\"c\"", "already used"}),
      bad<nc::DTypeError>("Module::to int", [] { nn::Linear(2, 2).to(DType::I32); }, {"Module::to", "dtype", "i32"}),
      bad<nc::ShapeError>("load_state_dict shape",
                          [] {
                            nn::Linear(3, 2).load_state_dict({{"weight", nc::zeros({2, 4})}, {"bias", nc::zeros({2})}});
                          },
                          {"load_state_dict", "weight", "[2, 4]", "[2, 3]"}),
      bad<nc::ShapeError>("load_state_dict shape, not strict",
                          [] {
                            nn::Linear(3, 2).load_state_dict({{"bias", nc::zeros({3})}}, false);
                          },
                          {"load_state_dict", "bias", "[3]", "[2]"}),
      bad<nc::ValueError>("load_state_dict missing key",
                          [] {
                            nn::Linear(3, 2).load_state_dict({{"weight", nc::zeros({2, 3})}});
                          },
                          {"load_state_dict", "missing keys", "\"bias\""}),
      bad<nc::ValueError>("load_state_dict unexpected key",
                          [] {
                            nn::Linear(3, 2).load_state_dict(
                                {{"weight", nc::zeros({2, 3})}, {"bias", nc::zeros({2})}, {"extra", nc::zeros({1})}});
                          },
                          {"load_state_dict", "unexpected keys", "\"extra\""}),
      bad<nc::ValueError>("load_state_dict undefined entry",
                          [&] {
                            nn::Linear(3, 2).load_state_dict({{"weight", undefined}});
                          },
                          {"load_state_dict", "\"weight\"", "undefined"}),
      bad<nc::ValueError>("load_state_dict repeated key",
                          [] {
                            nn::Linear(3, 2).load_state_dict({{"bias", nc::zeros({2})}, {"bias", nc::zeros({2})}});
                          },
                          {"load_state_dict", "\"bias\"", "more than once"}),
  });
}

TEST(Errors, OptimizerErrors) {
  namespace optim = nc::optim;
  const Tensor undefined;
  // Hyperparameters: {lr, momentum, dampening, weight_decay, nesterov} and {lr, beta1, beta2, eps, weight_decay}.
  const auto sgd = [](optim::SGDOptions options) { optim::SGD(std::vector<Tensor>{leaf({2})}, options); };
  const auto adam = [](optim::AdamOptions options) { optim::Adam(std::vector<Tensor>{leaf({2})}, options); };
  const auto load_sgd = [](const optim::StateDict& state) {
    optim::SGD(std::vector<Tensor>{leaf({2})}, {0.1, 0.9}).load_state_dict(state);
  };
  const auto load_adam = [](const optim::StateDict& state) { optim::Adam({leaf({2})}).load_state_dict(state); };
  run_table({
      bad<nc::DTypeError>("state_dtype of int", [] { optim::state_dtype(DType::I32); }, {"state_dtype", "i32"}),
      bad<nc::ValueError>("SGD without parameters", [] { optim::SGD({}, {0.1}); }, {"SGD", "empty parameter list"}),
      bad<nc::ValueError>("AdamW without parameters", [] { optim::AdamW({}); }, {"AdamW", "empty parameter list"}),
      bad<nc::ValueError>("SGD undefined parameter", [&] { optim::SGD({undefined}, {0.1}); },
                          {"SGD", "parameter 0", "undefined"}),
      bad<nc::DTypeError>("SGD int parameter", [] { optim::SGD({nc::zeros({2}, DType::I32)}, {0.1}); },
                          {"SGD", "parameter 0", "floating", "i32"}),
      bad<nc::DTypeError>("Adam int parameter", [] { optim::Adam({nc::zeros({2}, DType::I64)}); },
                          {"Adam", "parameter 0", "floating", "i64"}),
      bad<nc::ValueError>("SGD non-contiguous parameter",
                          [] {
                            optim::SGD({nc::zeros({2, 3}).t()}, {0.1});
                          },
                          {"SGD", "parameter 0", "[3, 2]", "contiguous"}),
      bad<nc::ValueError>("SGD repeated parameter",
                          [] {
                            Tensor p = leaf({2});
                            optim::SGD({p, p}, {0.1});
                          },
                          {"SGD", "parameter 1", "parameter 0"}),
      bad<nc::ValueError>("SGD negative lr", [&] { sgd({-1}); }, {"SGD", "lr", "-1"}),
      bad<nc::ValueError>("SGD NaN lr", [&] { sgd({NAN}); }, {"SGD", "lr", "nan"}),
      bad<nc::ValueError>("SGD negative momentum",
                          [&] {
                            sgd({0.1, -0.5});
                          },
                          {"SGD", "momentum", "-0.5"}),
      bad<nc::ValueError>("SGD infinite momentum",
                          [&] {
                            sgd({0.1, INFINITY});
                          },
                          {"SGD", "momentum", "inf"}),
      bad<nc::ValueError>("SGD dampening above 1",
                          [&] {
                            sgd({0.1, 0.9, 2});
                          },
                          {"SGD", "dampening", "2"}),
      bad<nc::ValueError>("SGD NaN dampening",
                          [&] {
                            sgd({0.1, 0.9, NAN});
                          },
                          {"SGD", "dampening", "nan"}),
      bad<nc::ValueError>("SGD negative weight_decay",
                          [&] {
                            sgd({0.1, 0, 0, -1});
                          },
                          {"SGD", "weight_decay", "-1"}),
      bad<nc::ValueError>("SGD NaN weight_decay",
                          [&] {
                            sgd({0.1, 0, 0, NAN});
                          },
                          {"SGD", "weight_decay", "nan"}),
      bad<nc::ValueError>("SGD nesterov without momentum",
                          [&] {
                            sgd({0.1, 0, 0, 0, true});
                          },
                          {"SGD", "momentum", "nesterov", "0"}),
      bad<nc::ValueError>("SGD nesterov with dampening",
                          [&] {
                            sgd({0.1, 0.9, 0.5, 0, true});
                          },
                          {"SGD", "dampening", "nesterov", "0.5"}),
      bad<nc::ValueError>("set_lr negative", [] { optim::SGD({leaf({2})}, {0.1}).set_lr(-1); }, {"SGD", "lr", "-1"}),
      bad<nc::ValueError>("set_lr NaN", [] { optim::Adam({leaf({2})}).set_lr(NAN); }, {"Adam", "lr", "nan"}),
      bad<nc::ValueError>("SGD infinite lr", [] { optim::SGD({leaf({2})}, {INFINITY}); }, {"SGD", "lr", "inf"}),
      bad<nc::ValueError>("Adam negative lr", [&] { adam({-1}); }, {"Adam", "lr", "-1"}),
      bad<nc::ValueError>("Adam beta1 1",
                          [&] {
                            adam({1e-3, 1.0});
                          },
                          {"Adam", "beta1", "1"}),
      bad<nc::ValueError>("Adam negative beta2",
                          [&] {
                            adam({1e-3, 0.9, -0.1});
                          },
                          {"Adam", "beta2", "-0.1"}),
      bad<nc::ValueError>("Adam NaN beta2",
                          [&] {
                            adam({1e-3, 0.9, NAN});
                          },
                          {"Adam", "beta2", "nan"}),
      bad<nc::ValueError>("Adam eps 0",
                          [&] {
                            adam({1e-3, 0.9, 0.999, 0});
                          },
                          {"Adam", "eps", "0"}),
      bad<nc::ValueError>("Adam infinite eps",
                          [&] {
                            adam({1e-3, 0.9, 0.999, INFINITY});
                          },
                          {"Adam", "eps", "inf"}),
      bad<nc::ValueError>("Adam NaN weight_decay",
                          [&] {
                            adam({1e-3, 0.9, 0.999, 1e-8, NAN});
                          },
                          {"Adam", "weight_decay", "nan"}),
      bad<nc::ValueError>("AdamW beta1 1",
                          [] {
                            optim::AdamW({leaf({2})}, {1e-3, 1.0});
                          },
                          {"AdamW", "beta1", "1"}),
      // load_state_dict: names, then values, checked before anything changes.
      bad<nc::ValueError>("SGD state entry twice",
                          [&] {
                            optim::StateDict state = sgd_state();
                            state.push_back(state[0]);
                            load_sgd(state);
                          },
                          {"SGD.load_state_dict", "'param_groups.lr'", "twice"}),
      bad<nc::ValueError>("SGD state undefined entry",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.momentum", undefined)); },
                          {"SGD.load_state_dict", "'param_groups.momentum'", "undefined"}),
      bad<nc::ValueError>("SGD state unknown hyperparameter",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.beta1", f64_scalar(0.9))); },
                          {"SGD.load_state_dict", "unknown hyperparameter", "'param_groups.beta1'"}),
      bad<nc::ValueError>("SGD state unknown entry", [&] { load_sgd(with_entry(sgd_state(), "foo", f64_scalar(1))); },
                          {"SGD.load_state_dict", "unknown entry", "'foo'"}),
      bad<nc::ValueError>("SGD state malformed entry",
                          [&] { load_sgd(with_entry(sgd_state(), "state.x.momentum_buffer", nc::zeros({2}))); },
                          {"SGD.load_state_dict", "malformed entry", "'state.x.momentum_buffer'"}),
      bad<nc::ValueError>("SGD state parameter index",
                          [&] { load_sgd(with_entry(sgd_state(), "state.3.momentum_buffer", nc::zeros({2}))); },
                          {"SGD.load_state_dict", "'state.3.momentum_buffer'", "parameter 3"}),
      bad<nc::ValueError>("SGD state unknown state",
                          [&] { load_sgd(with_entry(sgd_state(), "state.0.exp_avg", nc::zeros({2}))); },
                          {"SGD.load_state_dict", "unknown state", "'state.0.exp_avg'"}),
      bad<nc::ValueError>("SGD state missing hyperparameter",
                          [&] { load_sgd(without_entry(sgd_state(), "param_groups.dampening")); },
                          {"SGD.load_state_dict", "missing entry", "'param_groups.dampening'"}),
      bad<nc::ShapeError>("SGD state buffer shape",
                          [&] { load_sgd(with_entry(sgd_state(), "state.0.momentum_buffer", nc::zeros({3}))); },
                          {"SGD.load_state_dict", "'state.0.momentum_buffer'", "[3]", "[2]"}),
      bad<nc::DTypeError>("SGD state buffer dtype",
                          [&] {
                            load_sgd(with_entry(sgd_state(), "state.0.momentum_buffer", nc::zeros({2}, DType::F64)));
                          },
                          {"SGD.load_state_dict", "'state.0.momentum_buffer'", "f64", "f32"}),
      bad<nc::ShapeError>("SGD state hyperparameter of two values",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.lr", nc::zeros({2}, DType::F64))); },
                          {"SGD.load_state_dict", "'param_groups.lr'", "one value", "[2]"}),
      bad<nc::DTypeError>("SGD state int hyperparameter",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.lr", i64_scalar(1))); },
                          {"SGD.load_state_dict", "'param_groups.lr'", "floating", "i64"}),
      bad<nc::ValueError>("SGD state negative lr",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.lr", f64_scalar(-1))); },
                          {"SGD", "lr", "-1"}),
      bad<nc::ValueError>("SGD state nesterov 0.5",
                          [&] { load_sgd(with_entry(sgd_state(), "param_groups.nesterov", f64_scalar(0.5))); },
                          {"SGD", "nesterov", "0 or 1", "0.5"}),
      bad<nc::ValueError>("Adam state with part of a parameter's state",
                          [&] { load_adam(without_entry(adam_state(), "state.0.exp_avg")); },
                          {"Adam.load_state_dict", "parameter 0", "'state.0.exp_avg'"}),
      bad<nc::ValueError>("Adam state negative step",
                          [&] { load_adam(with_entry(adam_state(), "state.0.step", i64_scalar(-1))); },
                          {"Adam.load_state_dict", "'state.0.step'", "-1"}),
      bad<nc::DTypeError>("Adam state float step",
                          [&] { load_adam(with_entry(adam_state(), "state.0.step", f64_scalar(1))); },
                          {"Adam.load_state_dict", "'state.0.step'", "integer", "f64"}),
      bad<nc::ShapeError>("Adam state step of two values",
                          [&] { load_adam(with_entry(adam_state(), "state.0.step", nc::zeros({2}, DType::I64))); },
                          {"Adam.load_state_dict", "'state.0.step'", "one value", "[2]"}),
      bad<nc::ValueError>("Adam state decoupled 2",
                          [&] { load_adam(with_entry(adam_state(), "param_groups.decoupled", f64_scalar(2))); },
                          {"Adam", "decoupled", "0 or 1", "2"}),
      bad<nc::ValueError>("Adam state NaN beta1",
                          [&] { load_adam(with_entry(adam_state(), "param_groups.beta1", f64_scalar(NAN))); },
                          {"Adam", "beta1", "nan"}),
      bad<nc::ValueError>("Adam state into AdamW", [&] { optim::AdamW({leaf({2})}).load_state_dict(adam_state()); },
                          {"AdamW", "decoupled = 0", "Adam"}),
      bad<nc::ValueError>("SGD state into Adam", [&] { load_adam(sgd_state()); },
                          {"Adam.load_state_dict", "unknown hyperparameter", "'param_groups.momentum'"}),
  });
}

TEST(Errors, ScheduleAndClippingErrors) {
  namespace optim = nc::optim;
  const Tensor undefined;
  // Each call builds its own optimizer, which the schedule writes into.
  const auto step_lr = [](int64_t step_size, double gamma) {
    optim::SGD sgd({leaf({2})}, {0.1});
    optim::StepLR schedule(sgd, step_size, gamma);
  };
  const auto cosine_lr = [](int64_t warmup_steps, int64_t total_steps, double min_lr) {
    optim::SGD sgd({leaf({2})}, {0.1});
    optim::CosineLR schedule(sgd, warmup_steps, total_steps, min_lr);
  };
  const auto load_step_lr = [](const optim::StateDict& state) {
    optim::SGD sgd({leaf({2})}, {0.1});
    optim::StepLR(sgd, 2).load_state_dict(state);
  };
  const optim::StateDict good = {{"schedule.step", i64_scalar(2)}, {"schedule.base_lr", f64_scalar(0.1)}};
  run_table({
      bad<nc::ValueError>("StepLR step_size 0", [&] { step_lr(0, 0.1); }, {"StepLR", "step_size", "0"}),
      bad<nc::ValueError>("StepLR negative gamma", [&] { step_lr(1, -1); }, {"StepLR", "gamma", "-1"}),
      bad<nc::ValueError>("StepLR infinite gamma", [&] { step_lr(1, INFINITY); }, {"StepLR", "gamma", "inf"}),
      bad<nc::ValueError>("StepLR NaN gamma", [&] { step_lr(1, NAN); }, {"StepLR", "gamma", "nan"}),
      bad<nc::ValueError>("CosineLR negative warmup_steps", [&] { cosine_lr(-1, 10, 0); },
                          {"CosineLR", "warmup_steps", "-1"}),
      bad<nc::ValueError>("CosineLR total_steps not after warmup_steps", [&] { cosine_lr(5, 5, 0); },
                          {"CosineLR", "total_steps", "warmup_steps", "5"}),
      bad<nc::ValueError>("CosineLR negative min_lr", [&] { cosine_lr(0, 10, -1); }, {"CosineLR", "min_lr", "-1"}),
      bad<nc::ValueError>("CosineLR NaN min_lr", [&] { cosine_lr(0, 10, NAN); }, {"CosineLR", "min_lr", "nan"}),
      bad<nc::ValueError>("schedule state unknown entry",
                          [&] { load_step_lr(with_entry(good, "schedule.gamma", f64_scalar(1))); },
                          {"StepLR.load_state_dict", "unknown entry", "'schedule.gamma'"}),
      bad<nc::ValueError>("schedule state missing entry",
                          [&] { load_step_lr(without_entry(good, "schedule.base_lr")); },
                          {"StepLR.load_state_dict", "missing entry", "'schedule.base_lr'"}),
      bad<nc::ValueError>("schedule state undefined entry",
                          [&] { load_step_lr(with_entry(good, "schedule.step", undefined)); },
                          {"StepLR.load_state_dict", "'schedule.step'", "undefined"}),
      bad<nc::ValueError>("schedule state entry twice",
                          [&] {
                            optim::StateDict state = good;
                            state.push_back(state[0]);
                            load_step_lr(state);
                          },
                          {"StepLR.load_state_dict", "'schedule.step'", "twice"}),
      bad<nc::ValueError>("schedule state negative step",
                          [&] { load_step_lr(with_entry(good, "schedule.step", i64_scalar(-2))); },
                          {"StepLR.load_state_dict", "'schedule.step'", "-2"}),
      bad<nc::ShapeError>("schedule state step of two values",
                          [&] { load_step_lr(with_entry(good, "schedule.step", nc::zeros({2}, DType::I64))); },
                          {"StepLR.load_state_dict", "'schedule.step'", "one value", "[2]"}),
      bad<nc::DTypeError>("schedule state int base_lr",
                          [&] { load_step_lr(with_entry(good, "schedule.base_lr", i64_scalar(1))); },
                          {"StepLR.load_state_dict", "'schedule.base_lr'", "floating", "i64"}),
      bad<nc::ValueError>("schedule state negative base_lr",
                          [&] { load_step_lr(with_entry(good, "schedule.base_lr", f64_scalar(-0.1))); },
                          {"StepLR", "base_lr", "-0.1"}),
      bad<nc::ValueError>("schedule state NaN base_lr",
                          [&] { load_step_lr(with_entry(good, "schedule.base_lr", f64_scalar(NAN))); },
                          {"StepLR", "base_lr", "nan"}),
      bad<nc::ValueError>("clip_grad_norm norm_type 0", [] { optim::clip_grad_norm({leaf({2})}, 1.0, 0); },
                          {"clip_grad_norm", "norm_type", "0"}),
      bad<nc::ValueError>("clip_grad_norm NaN norm_type", [] { optim::clip_grad_norm({leaf({2})}, 1.0, NAN); },
                          {"clip_grad_norm", "norm_type", "nan"}),
      bad<nc::ValueError>("clip_grad_norm negative max_norm", [] { optim::clip_grad_norm({leaf({2})}, -1.0); },
                          {"clip_grad_norm", "max_norm", "-1"}),
      bad<nc::ValueError>("clip_grad_norm NaN max_norm", [] { optim::clip_grad_norm({leaf({2})}, NAN); },
                          {"clip_grad_norm", "max_norm", "nan"}),
      bad<nc::ValueError>("clip_grad_norm undefined parameter",
                          [&] {
                            optim::clip_grad_norm({leaf({2}), undefined}, 1.0);
                          },
                          {"clip_grad_norm", "parameter 1", "undefined"}),
      bad<nc::DTypeError>("clip_grad_norm int gradient",
                          [] {
                            Tensor p = nc::zeros({2}, DType::I32);
                            p.set_grad(nc::ones({2}, DType::I32));
                            optim::clip_grad_norm({p}, 1.0);
                          },
                          {"clip_grad_norm", "grad of parameter 0", "i32"}),
  });
}

TEST(Errors, DataErrors) {
  namespace data = nc::data;
  const Tensor undefined;
  const auto loader = [](data::TensorDataset dataset, data::DataLoaderOptions options) {
    data::DataLoader(std::move(dataset), std::move(options));
  };
  const auto with = [](const std::function<void(data::DataLoaderOptions&)>& change) {
    data::DataLoaderOptions options = loader_options();
    change(options);
    return options;
  };
  ScratchDir dir;
  const std::string text = dir.write("text.txt", "not an IDX file");
  run_table({
      bad<nc::ValueError>("TensorDataset undefined inputs",
                          [&] { data::TensorDataset(undefined, nc::zeros({4}, DType::I64)); },
                          {"TensorDataset", "inputs", "undefined"}),
      bad<nc::ValueError>("TensorDataset undefined targets",
                          [&] {
                            data::TensorDataset(nc::zeros({4, 2, 2}, DType::U8), undefined);
                          },
                          {"TensorDataset", "targets", "undefined"}),
      bad<nc::ValueError>("TensorDataset 0-dim inputs",
                          [&] { data::TensorDataset(nc::zeros({}), nc::zeros({1}, DType::I64)); },
                          {"TensorDataset", "inputs", "sample dimension", "f32 []"}),
      bad<nc::ShapeError>("TensorDataset counts differ", [&] { images(4, DType::U8, 3); },
                          {"TensorDataset", "4 inputs but 3 targets", "u8 [4, 2, 2]", "i64 [3]"}),
      bad<nc::IndexError>("TensorDataset::get past the end", [&] { images(4).get(4); },
                          {"TensorDataset::get", "index 4", "[0, 4)"}),
      bad<nc::ValueError>("TextWindows context 0", [&] { data::TextWindows("abc", 0); },
                          {"TextWindows", "context", "0"}),
      bad<nc::ValueError>("TextWindows stream too short", [&] { data::TextWindows("abc", 3); },
                          {"TextWindows", "3 bytes", "no window of 4"}),
      bad<nc::IndexError>("TextWindows::get past the end", [&] { data::TextWindows("abcd", 2).get(2); },
                          {"TextWindows::get", "index 2", "[0, 2)"}),
      bad<nc::ValueError>("DataLoader empty dataset", [&] { loader(images(0), loader_options()); },
                          {"DataLoader", "empty", "size() is 0"}),
      bad<nc::ValueError>("DataLoader null dataset",
                          [&] { data::DataLoader(std::shared_ptr<const data::Dataset>(), loader_options()); },
                          {"DataLoader", "null"}),
      bad<nc::ValueError>("DataLoader batch_size 0", [&] { loader(images(4), loader_options(0)); },
                          {"DataLoader", "batch_size", "0"}),
      bad<nc::ValueError>("DataLoader negative workers",
                          [&] { loader(images(4), with([](auto& o) { o.workers = -1; })); },
                          {"DataLoader", "workers", "-1"}),
      bad<nc::ValueError>("DataLoader empty transform",
                          [&] { loader(images(4), with([](auto& o) { o.transforms = {data::Transform()}; })); },
                          {"DataLoader", "transform 0", "empty"}),
      bad<nc::ValueError>("normalize NaN mean", [&] { data::transforms::normalize({NAN}, {1}); },
                          {"normalize", "mean", "nan"}),
      bad<nc::ValueError>("normalize stddev 0", [&] { data::transforms::normalize({0}, {0}); },
                          {"normalize", "stddev", "0"}),
      bad<nc::ValueError>("normalize infinite stddev", [&] { data::transforms::normalize({0}, {INFINITY}); },
                          {"normalize", "stddev", "inf"}),
      bad<nc::ValueError>("normalize counts differ",
                          [&] {
                            data::transforms::normalize({0, 0}, {1});
                          },
                          {"normalize", "2 and 1"}),
      bad<nc::ValueError>("random_crop 0 wide", [&] { data::transforms::random_crop(2, 0); }, {"random_crop", "2 x 0"}),
      bad<nc::ValueError>("random_crop negative padding", [&] { data::transforms::random_crop(2, 2, -1); },
                          {"random_crop", "padding", "-1"}),
      bad<nc::ValueError>("random_horizontal_flip p 1.5", [&] { data::transforms::random_horizontal_flip(1.5); },
                          {"random_horizontal_flip", "p", "1.5"}),
      bad<nc::ValueError>("SampleRandom empty range", [&] { data::SampleRandom(0, 0, 0).integer(3, 3); },
                          {"SampleRandom::integer", "[3, 3)"}),
      bad<nc::ShapeError>("collate of unlike shapes",
                          [&] {
                            data::collate({{nc::zeros({2}), nc::zeros({})}, {nc::zeros({3}), nc::zeros({})}});
                          },
                          {"collate", "sample 1's input", "f32 [3]", "f32 [2]"}),
      bad<nc::DTypeError>(
          "collate of unlike dtypes",
          [&] {
            data::collate({{nc::zeros({2}), nc::zeros({})}, {nc::zeros({2}), nc::zeros({}, DType::I64)}});
          },
          {"collate", "sample 1's target", "i64 []", "f32 []"}),
      bad<nc::ValueError>("collate of no samples", [&] { data::collate({}); }, {"collate", "no samples"}),
      bad<nc::ValueError>("DataLoader drop_last leaves nothing",
                          [&] {
                            loader(images(4), with([](auto& o) {
                                     o.batch_size = 8;
                                     o.drop_last = true;
                                   }));
                          },
                          {"DataLoader", "drop_last", "4 samples", "batch_size 8"}),
      bad<nc::ValueError>("DataLoader::begin_epoch first_batch past the end",
                          [] { data::DataLoader(images(4), loader_options()).begin_epoch(0, 3); },
                          {"DataLoader::begin_epoch", "first_batch 3", "[0, 2]"}),
      bad<nc::ValueError>("DataLoader::begin_epoch 2^32",
                          [] { data::DataLoader(images(4), loader_options()).begin_epoch(uint64_t(1) << 32); },
                          {"DataLoader::begin_epoch", "epoch 4294967296"}),
      bad<nc::ValueError>("DataLoader::next before begin_epoch",
                          [] {
                            data::Batch batch;
                            data::DataLoader(images(4), loader_options()).next(batch);
                          },
                          {"DataLoader::next", "begin_epoch"}),
      bad<nc::IOError>("read_idx missing file", [&] { data::read_idx(dir.path("missing.idx")); },
                       {"read_idx", dir.path("missing.idx"), "cannot open"}),
      bad<nc::IOError>("read_idx of a directory", [&] { data::read_idx(dir.path()); },
                       {"read_idx", "not a regular file"}),
      bad<nc::IOError>("read_idx of text", [&] { data::read_idx(text); }, {"read_idx", text, "neither gzip nor IDX"}),
  });
}

TEST(Errors, ModelErrors) {
  namespace models = nc::models;
  ScratchDir dir;
  const std::string text = dir.write("text.txt", "not an image");
  const std::string small = dir.write("small.pgm", std::string("P5\n2 2\n255\n") + std::string(4, '\0'));
  const std::string plain = dir.path("plain.safetensors");
  nc::safetensors::save(plain, {{"a", nc::zeros({2})}});
  const std::string checkpoint = dir.path("mlp.safetensors");
  models::save_checkpoint(checkpoint, "mlp", *models::make_classifier("mlp"), 1, {}, {}, {});
  const std::string zero_std = dir.path("zero_std.safetensors");
  models::save_checkpoint(zero_std, "mlp", *models::make_classifier("mlp"), 1, {}, {}, {{"std", "0"}});
  run_table({
      bad<nc::ValueError>("make_classifier unknown name", [] { models::make_classifier("resnet"); },
                          {"make_classifier", "'resnet'", "mlp"}),
      bad<nc::IOError>("load_checkpoint of a plain safetensors file", [&] { models::load_checkpoint(plain); },
                       {"load_checkpoint", plain, "'format'"}),
      bad<nc::IOError>("read_image missing file", [&] { models::read_image(dir.path("missing.pgm")); },
                       {"read_image", "cannot open", dir.path("missing.pgm")}),
      bad<nc::IOError>("read_image of text", [&] { models::read_image(text); }, {"read_image", text, "PGM"}),
      bad<nc::IOError>("read_image of a 2x2 image", [&] { models::read_image(small); },
                       {"read_image", small, "2x2", "28x28"}),
      bad<nc::ValueError>("Classifier::predict undefined image",
                          [&] { models::Classifier(checkpoint).predict(Tensor()); },
                          {"Classifier::predict", "'image'", "undefined"}),
      bad<nc::ShapeError>("Classifier::predict image size",
                          [&] {
                            models::Classifier(checkpoint).predict(nc::zeros({27, 28}));
                          },
                          {"Classifier::predict", "28x28", "f32 [27, 28]"}),
      bad<nc::IOError>("Classifier with option.std 0",
                       [&] {
                         models::Classifier(zero_std).predict(nc::zeros({28, 28}));
                       },
                       {"Classifier", "option.std", "0"}),
  });
}

TEST(Errors, SafetensorsErrors) {
  namespace st = nc::safetensors;
  const Tensor undefined;
  ScratchDir dir;
  const std::string target = dir.path("out.safetensors");
  const std::string short_file = dir.write("short.bin", "abc");
  const std::string plain = dir.path("plain.safetensors");
  st::save(plain, {{"a", nc::zeros({2})}});
  const std::vector<uint8_t> long_header = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
  const std::vector<uint8_t> not_json = {8, 0, 0, 0, 0, 0, 0, 0, 'n', 'o', 't', ' ', 'j', 's', 'o', 'n'};
  run_table({
      bad<nc::ValueError>("save undefined tensor",
                          [&] {
                            st::save(target, {{"a", undefined}});
                          },
                          {"safetensors::save", "tensor 0", "\"a\"", "undefined"}),
      bad<nc::ValueError>("save reserved name",
                          [&] {
                            st::save(target, {{"__metadata__", nc::zeros({1})}});
                          },
                          {"safetensors::save", "reserved name", "__metadata__"}),
      bad<nc::ValueError>("save repeated name",
                          [&] {
                            st::save(target, {{"a", nc::zeros({1})}, {"a", nc::zeros({1})}});
                          },
                          {"safetensors::save", "duplicate", "\"a\""}),
      bad<nc::ValueError>("save a name that is not UTF-8",
                          [&] {
                            st::save(target, {{"\xff\xfe", nc::zeros({1})}});
                          },
                          {"safetensors::save", "UTF-8"}),
      bad<nc::ValueError>("save metadata that is not UTF-8",
                          [&] {
                            st::save(target, {{"a", nc::zeros({1})}}, {{"k", "\xff"}});
                          },
                          {"safetensors::save", "UTF-8"}),
      bad<nc::IOError>("save into a missing directory",
                       [&] {
                         st::save(dir.path("missing/out.safetensors"), {{"a", nc::zeros({1})}});
                       },
                       {"safetensors", dir.path("missing/out.safetensors"), "cannot create"}),
      bad<nc::IOError>("load missing file", [&] { st::load(dir.path("missing.safetensors")); },
                       {"safetensors", dir.path("missing.safetensors"), "cannot open"}),
      bad<nc::IOError>("load a directory", [&] { st::load(dir.path()); }, {"safetensors", "not a regular file"}),
      bad<nc::IOError>("load a 3-byte file", [&] { st::load(short_file); },
                       {"safetensors", short_file, "shorter than 8 bytes"}),
      bad<nc::ValueError>("load_bytes null data", [] { st::load_bytes(nullptr, 5); },
                          {"safetensors::load_bytes", "null", "5"}),
      bad<nc::IOError>("load_bytes 3 bytes",
                       [] {
                         const uint8_t bytes[3] = {};
                         st::load_bytes(bytes, 3);
                       },
                       {"safetensors", "<memory>", "shorter than 8 bytes"}),
      bad<nc::IOError>("load_bytes header past the end",
                       [&] { st::load_bytes(long_header.data(), long_header.size()); },
                       {"safetensors", "<memory>", "header length 100"}),
      bad<nc::IOError>("load_bytes header not JSON", [&] { st::load_bytes(not_json.data(), not_json.size()); },
                       {"safetensors", "<memory>", "JSON"}),
      bad<nc::IOError>("File::at missing name", [&] { st::load(plain).at("b"); }, {"safetensors", plain, "\"b\""}),
      bad<nc::IOError>("conformance::run_dir of a missing directory",
                       [&] { nc::conformance::run_dir(dir.path("missing"), nc::Device::cpu()); },
                       {"conformance", dir.path("missing")}),
  });
}

// Tensors on two devices, and the CUDA runtime API with bad device indices; needs a GPU.
TEST(Errors, CudaDeviceErrors) {
  namespace nn = nc::nn;
  if (!nc::cuda_is_available()) GTEST_SKIP() << "needs a CUDA device";
  const nc::Device gpu = nc::Device::cuda(0);
  const Tensor cpu2 = nc::zeros({2});
  const Tensor gpu2 = nc::zeros({2}, gpu);
  const Tensor cpu23 = nc::zeros({2, 3});
  const Tensor gpu23 = nc::zeros({2, 3}, gpu);
  const Tensor undefined;
  run_table({
      bad<nc::DeviceError>("add", [&] { nc::add(cpu2, gpu2); }, {"add", "'a'", "cpu", "'b'", "cuda:0"}),
      bad<nc::DeviceError>("mul", [&] { gpu2* cpu2; }, {"mul", "'a'", "cuda:0", "'b'", "cpu"}),
      bad<nc::DeviceError>("where",
                           [&] {
                             nc::where(flags({true, false}, {2}), gpu2, gpu2);
                           },
                           {"where", "'cond'", "cpu", "'a'", "cuda:0"}),
      bad<nc::DeviceError>("matmul",
                           [&] {
                             nc::matmul(cpu23, nc::zeros({3, 2}, gpu));
                           },
                           {"matmul", "'a'", "cpu", "'b'", "cuda:0"}),
      bad<nc::DeviceError>("cat",
                           [&] {
                             nc::cat({cpu2, gpu2});
                           },
                           {"cat", "cpu", "cuda:0"}),
      bad<nc::DeviceError>("index_select", [&] { nc::index_select(gpu23, 0, i64({0}, {1})); },
                           {"index_select", "'x'", "cuda:0", "'index'", "cpu"}),
      bad<nc::DeviceError>("gather", [&] { nc::gather(gpu2, 0, i64({0}, {1})); }, {"gather", "'x'", "'index'"}),
      bad<nc::DeviceError>("scatter_add src", [&] { nc::scatter_add(cpu2, 0, i64({0}, {1}), nc::ones({1}, gpu)); },
                           {"scatter_add", "'x'", "'src'", "cuda:0"}),
      bad<nc::DeviceError>("masked_fill mask",
                           [&] {
                             nc::masked_fill(gpu2, flags({true, false}, {2}), 1);
                           },
                           {"masked_fill", "'x'", "'mask'"}),
      bad<nc::DeviceError>("layer_norm weight", [&] { nc::layer_norm(gpu23, {3}, nc::ones({3}), undefined); },
                           {"layer_norm", "'x'", "cuda:0", "'weight'", "cpu"}),
      bad<nc::DeviceError>("group_norm bias",
                           [&] {
                             nc::group_norm(gpu23.view({2, 3, 1}), 3, undefined, nc::zeros({3}));
                           },
                           {"group_norm", "'x'", "'bias'"}),
      bad<nc::DeviceError>(
          "gemm_group_norm_min_bias bias",
          [&] {
            const Tensor weight = nc::zeros({4, 3}, gpu);
            nc::gemm_group_norm_min_bias(gpu23, weight, undefined, undefined, undefined, nc::zeros({1, 4, 1, 1}), 2);
          },
          {"gemm_group_norm_min_bias", "'x'", "'bias'", "cpu"}),
      bad<nc::DeviceError>("cross_entropy target",
                           [&] {
                             nc::cross_entropy(gpu23, i64({0, 1}, {2}));
                           },
                           {"cross_entropy", "'logits'", "cuda:0", "'target'", "cpu"}),
      bad<nc::DeviceError>("mse_loss target", [&] { nc::mse_loss(cpu2, gpu2); }, {"mse_loss", "'input'", "'target'"}),
      bad<nc::DeviceError>("Linear input", [&] { nn::Linear(3, 2)(gpu23); },
                           {"Linear", "input", "cuda:0", "weight", "cpu"}),
      bad<nc::DeviceError>("Embedding index",
                           [&] { nn::Embedding(3, 2)(nc::zeros({2}, nc::TensorOptions(DType::I64, gpu))); },
                           {"embedding", "index", "cuda:0", "weight", "cpu"}),
      bad<nc::DeviceError>("backward grad", [&] { nc::mul(leaf({2}), 2.0).backward(gpu2); },
                           {"backward", "'tensor'", "cpu", "'grad'", "cuda:0"}),
      bad<nc::DeviceError>("pin_memory of a GPU tensor", [&] { gpu2.pin_memory(); }, {"pin_memory", "cuda:0", "cpu"}),
      bad<nc::DeviceError>("zeros on a GPU past the last",
                           [&] { nc::zeros({2}, nc::Device::cuda(nc::cuda_device_count())); },
                           {"allocate", "does not exist"}),
      bad<nc::DeviceError>("DataLoader on a GPU past the last",
                           [&] {
                             nc::data::DataLoaderOptions options = loader_options();
                             options.device = nc::Device::cuda(nc::cuda_device_count());
                             nc::data::DataLoader loader(images(4), options);
                           },
                           {"DataLoader", "does not exist"}),
      bad<nc::DeviceError>("cuda::set_device past the last", [] { nc::cuda::set_device(nc::cuda_device_count()); },
                           {"cuda::set_device", "device index", "out of range"}),
      bad<nc::DeviceError>("cuda::current_stream of a negative device", [] { nc::cuda::current_stream(-1); },
                           {"cuda::current_stream", "device index -1"}),
      bad<nc::DeviceError>("cuda::memory_stats past the last", [] { nc::cuda::memory_stats(nc::cuda_device_count()); },
                           {"cuda::memory_stats", "device index"}),
      bad<nc::DeviceError>("cuda::mem_get_info of a negative device",
                           [] {
                             size_t free_bytes = 0, total_bytes = 0;
                             nc::cuda::mem_get_info(-1, &free_bytes, &total_bytes);
                           },
                           {"cuda::mem_get_info", "device index -1"}),
      bad<nc::ValueError>("cuda::destroy_stream of normcore's own stream",
                          [] { nc::cuda::destroy_stream(nc::cuda::current_stream(0)); },
                          {"cuda::destroy_stream", "own stream", "device 0"}),
  });
}

TEST(Errors, CheckMacroAndHierarchy) {
  // NC_CHECK takes the bare error type name and formats its message with operator<<, shapes as [a, b].
  try {
    NC_CHECK(1 + 1 == 3, ValueError, "my_op: argument 'x' has shape ", nc::Shape{2, 3}, " and p ", 0.5);
    ADD_FAILURE() << "NC_CHECK did not throw";
  } catch (const nc::ValueError& e) {
    EXPECT_STREQ(e.what(), "my_op: argument 'x' has shape [2, 3] and p 0.5");
  }
  EXPECT_NO_THROW(NC_CHECK(true, ValueError, "never"));
  EXPECT_EQ(nc::detail::cat_str("a", 1, nc::Shape{}, 'c'), "a1[]c");
  // Every error type is a normcore::Error and a std::runtime_error.
  EXPECT_THROW(throw nc::ShapeError("s"), nc::Error);
  EXPECT_THROW(throw nc::DTypeError("d"), nc::Error);
  EXPECT_THROW(throw nc::DeviceError("d"), nc::Error);
  EXPECT_THROW(throw nc::IndexError("i"), nc::Error);
  EXPECT_THROW(throw nc::ValueError("v"), nc::Error);
  EXPECT_THROW(throw nc::IOError("io"), nc::Error);
  EXPECT_THROW(throw nc::OutOfMemoryError("oom"), nc::Error);
  EXPECT_THROW(throw nc::CudaError("cuda"), nc::Error);
  EXPECT_THROW(throw nc::Error("e"), std::runtime_error);
}

// Sizes whose arithmetic would overflow int64 (or whose bytes would not fit) are rejected
// before anything is allocated or computed; what is valid still works.
TEST(Errors, SizesThatWouldOverflow) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  run_table({
      bad<nc::ShapeError>("zeros of 2^62 elements", [] { nc::zeros({int64_t{1} << 62}); },
                          {"empty", "[4611686018427387904]", "too many elements"}),
      bad<nc::ShapeError>("zeros with a 0 beside huge sizes",
                          [&] {
                            nc::zeros({kMax, 0, 2});
                          },
                          {"empty", "too many elements"}),
      bad<nc::ShapeError>("linspace of int64-max steps", [&] { nc::linspace(0, 1, kMax); }, {"too many elements"}),
      bad<nc::ShapeError>("view whose sizes multiply past int64",
                          [&] {
                            nc::zeros({4}).view({kMax, 2});
                          },
                          {"view", "invalid for a tensor of 4 elements"}),
      bad<nc::ShapeError>("expand past int64 elements",
                          [] {
                            nc::zeros({1, 1}).expand({int64_t{1} << 40, int64_t{1} << 40});
                          },
                          {"expand", "too many elements"}),
      bad<nc::ShapeError>("split sizes summing past int64",
                          [&] {
                            nc::split(nc::zeros({3}), {kMax, kMax, 2});
                          },
                          {"split", "sum to more than", "3"}),
      bad<nc::ShapeError>("arange over the whole int64 range", [&] { nc::arange(kMin, kMax); },
                          {"arange", "too many elements"}),
      bad<nc::ShapeError>("arange with a count past int64", [] { nc::arange(0.0, 1e300, 1e-300); },
                          {"arange", "too many elements"}),
      bad<nc::IndexError>("one_hot of class int64-max", [&] { nc::one_hot(i64({kMax}, {1})); },
                          {"one_hot", "class index 9223372036854775807", "too large"}),
      bad<nc::ValueError>("randint past u8", [] { nc::randint(0, 300, {4}, nc::TensorOptions(DType::U8)); },
                          {"randint", "[0, 300)", "u8", "0 to 255"}),
      bad<nc::ValueError>("randint past i32",
                          [] { nc::randint(0, int64_t{1} << 40, {2}, nc::TensorOptions(DType::I32)); },
                          {"randint", "i32"}),
  });
  // A slice with a huge step takes the first element; the full int64 range draws.
  EXPECT_EQ(nc::arange(0, 3).slice(0, 0, kMax, kMax).to_vector<int64_t>(), (std::vector<int64_t>{0}));
  const Tensor wide = nc::randint(kMin, kMax, {64});
  EXPECT_EQ(wide.shape(), (nc::Shape{64}));
  EXPECT_GT(nc::max(wide).item<int64_t>(), 0);  // 64 draws over all of int64: both signs, surely
  EXPECT_LT(nc::min(wide).item<int64_t>(), 0);
  const Tensor bytes = nc::randint(0, 256, {1000}, nc::TensorOptions(DType::U8));
  EXPECT_EQ(nc::max(bytes.to(DType::I64)).item<int64_t>(), 255);
}

// evaluate() indexes its confusion matrix by label and prediction: labels outside the
// classes and models with another number of scores are errors, not out-of-bounds writes.
TEST(Errors, EvaluateChecksLabelsAndScores) {
  namespace models = nc::models;
  auto model = models::make_classifier("mlp");
  const Tensor images = nc::zeros({3, 28, 28}, DType::U8);
  run_table({
      bad<nc::IndexError>(
          "label past the classes",
          [&] {
            models::evaluate(*model, nc::data::TensorDataset(images, i64({0, 12, 1}, {3})), nc::Device::cpu());
          },
          {"evaluate", "label 12", "sample 1", "0 to 9"}),
      bad<nc::IndexError>(
          "negative label",
          [&] {
            models::evaluate(*model, nc::data::TensorDataset(images, i64({-1, 0, 1}, {3})), nc::Device::cpu());
          },
          {"evaluate", "label -1", "sample 0"}),
      bad<nc::ShapeError>(
          "a model with 3 scores",
          [&] {
            nc::nn::Sequential three({std::make_shared<nc::nn::Flatten>(), std::make_shared<nc::nn::Linear>(784, 3)});
            models::evaluate(three, nc::data::TensorDataset(images, i64({0, 1, 2}, {3})), nc::Device::cpu());
          },
          {"evaluate", "[3, 3]", "expected 10 scores"}),
  });
  const models::Evaluation e =
      models::evaluate(*model, nc::data::TensorDataset(images, i64({0, 9, 4}, {3})), nc::Device::cpu());
  int64_t counted = 0;
  for (const auto& row : e.confusion)
    for (int64_t c : row) counted += c;
  EXPECT_EQ(counted, 3);
}

// Values written into integer tensors must convert without overflow (NaN into an int is
// undefined behaviour in C++, and PyTorch rejects it too); fractions truncate.
TEST(Errors, ValuesThatDoNotFitAnIntegerDType) {
  run_table({
      bad<nc::ValueError>("full NaN into i32", [] { nc::full({2}, NAN, nc::TensorOptions(DType::I32)); },
                          {"full", "value nan", "i32"}),
      bad<nc::ValueError>("full 300 into u8", [] { nc::full({2}, 300, nc::TensorOptions(DType::U8)); },
                          {"full", "value 300", "u8"}),
      bad<nc::ValueError>("full -256 into u8", [] { nc::full({2}, -256, nc::TensorOptions(DType::U8)); },
                          {"full", "value -256", "u8"}),
      bad<nc::ValueError>("full -0.5 into u8", [] { nc::full({2}, -0.5, nc::TensorOptions(DType::U8)); },
                          {"full", "value -0.5", "u8"}),
      bad<nc::ValueError>("fill_ infinity into i64", [] { nc::zeros({2}, DType::I64).fill_(INFINITY); },
                          {"fill_", "value inf", "i64"}),
      bad<nc::ValueError>("fill_ 2^31 into i32", [] { nc::zeros({2}, DType::I32).fill_(int64_t{1} << 31); },
                          {"fill_", "value 2147483648", "i32"}),
      bad<nc::ValueError>("masked_fill 256 into u8",
                          [] {
                            nc::masked_fill(nc::zeros({2}, DType::U8), flags({true, false}, {2}), 256);
                          },
                          {"masked_fill", "value 256", "u8"}),
      bad<nc::ValueError>("arange past u8", [] { nc::arange(250, 260, 1, nc::TensorOptions(DType::U8)); },
                          {"arange", "last value 259", "u8"}),
      bad<nc::ValueError>("arange from below u8", [] { nc::arange(-1, 5, 1, nc::TensorOptions(DType::U8)); },
                          {"arange", "start -1", "u8"}),
  });
  EXPECT_EQ(nc::full({2}, 2.9, nc::TensorOptions(DType::I32)).to_vector<int32_t>(), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(nc::full({1}, 255, nc::TensorOptions(DType::U8)).to_vector<uint8_t>(), (std::vector<uint8_t>{255}));
  EXPECT_EQ(nc::arange(250, 256, 5, nc::TensorOptions(DType::U8)).to_vector<uint8_t>(),
            (std::vector<uint8_t>{250, 255}));
  EXPECT_EQ(nc::full({1}, -2147483648LL, nc::TensorOptions(DType::I32)).to_vector<int32_t>(),
            (std::vector<int32_t>{-2147483647 - 1}));
}

TEST(Errors, PoolErrors) {
  const Tensor undefined;
  const Tensor x = nc::zeros({1, 1, 4, 4});
  run_table({
      bad<nc::ValueError>("max_pool2d(undefined)", [&] { nc::max_pool2d(undefined, 2); }, {"max_pool2d", "'x'"}),
      bad<nc::DTypeError>("max_pool2d of int",
                          [&] {
                            nc::max_pool2d(nc::zeros({1, 1, 4, 4}, DType::I64), 2);
                          },
                          {"max_pool2d", "x", "floating", "i64"}),
      bad<nc::ShapeError>("max_pool2d of 2-D",
                          [&] {
                            nc::max_pool2d(nc::zeros({4, 4}), 2);
                          },
                          {"max_pool2d", "x", "[N, C, H, W] or [C, H, W]", "[4, 4]"}),
      bad<nc::ShapeError>("max_pool2d of 5-D",
                          [&] {
                            nc::max_pool2d(nc::zeros({1, 1, 1, 4, 4}), 2);
                          },
                          {"max_pool2d", "x", "[N, C, H, W] or [C, H, W]", "[1, 1, 1, 4, 4]"}),
      bad<nc::ShapeError>("max_pool2d W of 0",
                          [&] {
                            nc::max_pool2d(nc::zeros({1, 1, 4, 0}), 2);
                          },
                          {"max_pool2d", "H and W", "[1, 1, 4, 0]"}),
      bad<nc::ShapeError>("max_pool2d C of 0",
                          [&] {
                            nc::max_pool2d(nc::zeros({1, 0, 4, 4}), 2);
                          },
                          {"max_pool2d", "channel count C", "[1, 0, 4, 4]"}),
      bad<nc::ShapeError>("avg_pool2d C of 0",
                          [&] {
                            nc::avg_pool2d(nc::zeros({0, 4, 4}), 2);
                          },
                          {"avg_pool2d", "channel count C", "[0, 4, 4]"}),
      bad<nc::ValueError>("max_pool2d kernel_size 0",
                          [&] {
                            nc::max_pool2d(x, {0, 2});
                          },
                          {"max_pool2d", "kernel_size", ">= 1", "(0, 2)"}),
      bad<nc::ValueError>("max_pool2d stride 0",
                          [&] {
                            nc::max_pool2d(x, 2, {0, 1});
                          },
                          {"max_pool2d", "stride", ">= 1", "(0, 1)"}),
      bad<nc::ValueError>("max_pool2d negative stride", [&] { nc::max_pool2d(x, 2, -1); },
                          {"max_pool2d", "stride", "(-1, -1)"}),
      bad<nc::ValueError>("max_pool2d negative padding",
                          [&] {
                            nc::max_pool2d(x, 2, 1, {-1, 0});
                          },
                          {"max_pool2d", "padding", ">= 0", "(-1, 0)"}),
      bad<nc::ValueError>("max_pool2d dilation 0",
                          [&] {
                            nc::max_pool2d(x, 2, 1, 0, {1, 0});
                          },
                          {"max_pool2d", "dilation", ">= 1", "(1, 0)"}),
      bad<nc::ValueError>("max_pool2d padding over half the kernel",
                          [&] {
                            nc::max_pool2d(x, 3, 1, {1, 2});
                          },
                          {"max_pool2d", "padding (1, 2)", "half of kernel_size (3, 3)"}),
      bad<nc::ValueError>("max_pool2d padding over half the kernel, dilated", [&] { nc::max_pool2d(x, 2, 1, 2, 3); },
                          {"max_pool2d", "padding (2, 2)", "(2, 2)"}),
      bad<nc::ValueError>("max_pool2d dilated kernel past 2^59", [&] { nc::max_pool2d(x, 2, 1, 0, int64_t{1} << 60); },
                          {"max_pool2d", "kernel_size (2, 2)", "dilation", "2^59"}),
      bad<nc::ShapeError>("max_pool2d output below 1", [&] { nc::max_pool2d(x, 5); },
                          {"max_pool2d", "output", "0 x 0", "f32 [1, 1, 4, 4]", "kernel_size (5, 5)"}),
      bad<nc::ShapeError>("max_pool2d output below 1, dilated",
                          [&] {
                            nc::max_pool2d(x, 2, 1, 0, {1, 4});
                          },
                          {"max_pool2d", "output", "3 x 0", "dilation (1, 4)"}),
      bad<nc::ValueError>("avg_pool2d(undefined)", [&] { nc::avg_pool2d(undefined, 2); }, {"avg_pool2d", "'x'"}),
      bad<nc::DTypeError>("avg_pool2d of bool",
                          [&] {
                            nc::avg_pool2d(nc::zeros({1, 4, 4}, DType::Bool), 2);
                          },
                          {"avg_pool2d", "x", "floating", "bool"}),
      bad<nc::ShapeError>("avg_pool2d of 1-D", [&] { nc::avg_pool2d(nc::zeros({4}), 2); },
                          {"avg_pool2d", "x", "[N, C, H, W] or [C, H, W]", "[4]"}),
      bad<nc::ShapeError>("avg_pool2d H of 0",
                          [&] {
                            nc::avg_pool2d(nc::zeros({3, 0, 4}), 2);
                          },
                          {"avg_pool2d", "H and W", "[3, 0, 4]"}),
      bad<nc::ValueError>("avg_pool2d kernel_size negative",
                          [&] {
                            nc::avg_pool2d(x, {2, -2});
                          },
                          {"avg_pool2d", "kernel_size", "(2, -2)"}),
      bad<nc::ValueError>("avg_pool2d stride 0",
                          [&] {
                            nc::avg_pool2d(x, 2, {1, 0});
                          },
                          {"avg_pool2d", "stride", "(1, 0)"}),
      bad<nc::ValueError>("avg_pool2d negative padding", [&] { nc::avg_pool2d(x, 2, 1, -1); },
                          {"avg_pool2d", "padding", "(-1, -1)"}),
      bad<nc::ValueError>("avg_pool2d padding over half the kernel",
                          [&] {
                            nc::avg_pool2d(x, 2, 1, {0, 2});
                          },
                          {"avg_pool2d", "padding (0, 2)", "half of kernel_size (2, 2)"}),
      bad<nc::ShapeError>("avg_pool2d output below 1",
                          [&] {
                            nc::avg_pool2d(x, {5, 1});
                          },
                          {"avg_pool2d", "output", "0 x 4", "f32 [1, 1, 4, 4]"}),
      bad<nc::ValueError>("adaptive_avg_pool2d(undefined)", [&] { nc::adaptive_avg_pool2d(undefined, 2); },
                          {"adaptive_avg_pool2d", "'x'"}),
      bad<nc::DTypeError>("adaptive_avg_pool2d of int",
                          [&] {
                            nc::adaptive_avg_pool2d(nc::zeros({1, 4, 4}, DType::I32), 2);
                          },
                          {"adaptive_avg_pool2d", "x", "floating", "i32"}),
      bad<nc::ShapeError>("adaptive_avg_pool2d of 2-D",
                          [&] {
                            nc::adaptive_avg_pool2d(nc::zeros({4, 4}), 2);
                          },
                          {"adaptive_avg_pool2d", "[N, C, H, W] or [C, H, W]", "[4, 4]"}),
      bad<nc::ShapeError>("adaptive_avg_pool2d H of 0",
                          [&] {
                            nc::adaptive_avg_pool2d(nc::zeros({1, 1, 0, 4}), 2);
                          },
                          {"adaptive_avg_pool2d", "H and W", "[1, 1, 0, 4]"}),
      bad<nc::ValueError>("adaptive_avg_pool2d output_size 0",
                          [&] {
                            nc::adaptive_avg_pool2d(x, {0, 3});
                          },
                          {"adaptive_avg_pool2d", "output_size", ">= 1", "(0, 3)"}),
      bad<nc::ValueError>("MaxPool2d kernel_size 0", [] { nc::nn::MaxPool2d layer(0); },
                          {"MaxPool2d", "kernel_size", "(0, 0)"}),
      bad<nc::ValueError>("MaxPool2d stride 0",
                          [] {
                            nc::nn::MaxPool2d layer(2, {2, 0});
                          },
                          {"MaxPool2d", "stride", "(2, 0)"}),
      bad<nc::ValueError>("MaxPool2d padding over half the kernel", [] { nc::nn::MaxPool2d layer(3, 1, 2); },
                          {"MaxPool2d", "padding (2, 2)", "half of kernel_size (3, 3)"}),
      bad<nc::ValueError>("MaxPool2d dilation 0", [] { nc::nn::MaxPool2d layer(2, 1, 0, 0); },
                          {"MaxPool2d", "dilation", "(0, 0)"}),
      bad<nc::ValueError>("MaxPool2d forward(undefined)", [&] { nc::nn::MaxPool2d(2).forward(undefined); },
                          {"MaxPool2d", "undefined"}),
      bad<nc::ShapeError>("MaxPool2d forward of 2-D",
                          [&] {
                            nc::nn::MaxPool2d(2).forward(nc::zeros({4, 4}));
                          },
                          {"max_pool2d", "[4, 4]"}),
      bad<nc::ValueError>("AvgPool2d negative padding", [] { nc::nn::AvgPool2d layer(2, nc::Size2(), -1); },
                          {"AvgPool2d", "padding", "(-1, -1)"}),
      bad<nc::ValueError>("AvgPool2d stride negative", [] { nc::nn::AvgPool2d layer(2, -2); },
                          {"AvgPool2d", "stride", "(-2, -2)"}),
      bad<nc::ValueError>("AvgPool2d forward(undefined)", [&] { nc::nn::AvgPool2d(2).forward(undefined); },
                          {"AvgPool2d", "undefined"}),
      bad<nc::ValueError>("AdaptiveAvgPool2d output_size 0",
                          [] {
                            nc::nn::AdaptiveAvgPool2d layer({2, 0});
                          },
                          {"AdaptiveAvgPool2d", "output_size", "(2, 0)"}),
      bad<nc::ValueError>("AdaptiveAvgPool2d forward(undefined)",
                          [&] { nc::nn::AdaptiveAvgPool2d(2).forward(undefined); }, {"AdaptiveAvgPool2d", "undefined"}),
  });
}
