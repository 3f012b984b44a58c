// Bad calls to tensor ops (shapes, indices, dtypes, values, devices, autograd, sizes that
// would overflow), one row each: the call, the normcore::Error subtype it must throw, and
// the substrings its message must contain (the op's name and the argument, shape, dtype or
// value at fault), following the contract in error.h: "<op>: <argument> <what is wrong>".
// test_layer_errors.cpp and test_training_errors.cpp hold the other tables.
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
#include "tests/ops/errors_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using namespace errors_test;

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
