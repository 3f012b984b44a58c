// Tensor basics on the CPU: handles, factories, views (geometry, shared storage, values),
// printing, and the seeded random factories (dtypes, 16-bit floats and devices:
// test_dtypes.cpp; copies and element access: test_copies.cpp). Expected values are written out by
// hand; nothing here needs a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "normcore/normcore.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;

namespace {

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

std::string printed(const Tensor& t) {
  std::ostringstream s;
  s << t;
  return s.str();
}

// Mean and (population) standard deviation of a tensor's elements, in double.
std::pair<double, double> mean_std(const Tensor& t) {
  std::vector<double> v = values(t);
  double sum = 0;
  for (double x : v) sum += x;
  double mean = sum / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / static_cast<double>(v.size()))};
}

}  // namespace

// ---------------------------------------------------------------- tensor handles
TEST(Tensor, GeometryAccessors) {
  Tensor x = nc::zeros({2, 3, 4}, DType::F64);
  EXPECT_TRUE(x.defined());
  EXPECT_EQ(x.dim(), 3);
  EXPECT_EQ(x.shape(), (nc::Shape{2, 3, 4}));
  EXPECT_EQ(x.strides(), (nc::Shape{12, 4, 1}));
  EXPECT_EQ(x.size(0), 2);
  EXPECT_EQ(x.size(-1), 4);
  EXPECT_EQ(x.stride(1), 4);
  EXPECT_EQ(x.stride(-3), 12);
  EXPECT_EQ(x.numel(), 24);
  EXPECT_EQ(x.element_size(), 8u);
  EXPECT_EQ(x.nbytes(), 192u);
  EXPECT_EQ(x.offset(), 0);
  EXPECT_EQ(x.dtype(), DType::F64);
  EXPECT_EQ(x.device(), nc::Device::cpu());
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_EQ(x.data_ptr(), x.storage()->data);
  EXPECT_GE(x.storage()->nbytes, 192u);
  EXPECT_THROW(x.size(3), nc::IndexError);
  EXPECT_THROW(x.stride(-4), nc::IndexError);

  Tensor scalar = nc::full({}, 1.0);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.is_contiguous());

  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_THROW(undefined.shape(), nc::Error);
  EXPECT_EQ(nc::describe(undefined), "undefined");
  EXPECT_EQ(nc::describe(nc::zeros({2, 3})), "f32 [2, 3] cpu");
  EXPECT_EQ(nc::shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(nc::shape_str({}), "[]");
}

TEST(Tensor, HandlesShareTheImpl) {
  Tensor x = nc::zeros({2});
  Tensor y = x;
  EXPECT_TRUE(y.is_same(x));
  EXPECT_EQ(y.impl_ptr(), x.impl_ptr());
  EXPECT_EQ(&y.impl(), &x.impl());
  EXPECT_FALSE(x.clone().is_same(x));
  y.fill_(3);
  EXPECT_EQ(values(x), (std::vector<double>{3, 3}));
}

TEST(Tensor, BuiltFromAnImplOverRawStorage) {
  nc::Storage storage = nc::allocate_storage(6 * sizeof(int32_t), nc::Device::cpu());
  ASSERT_NE(storage->data, nullptr);
  EXPECT_EQ(storage->nbytes, 6 * sizeof(int32_t));
  EXPECT_EQ(storage->device, nc::Device::cpu());
  EXPECT_FALSE(storage->pinned);
  int32_t* raw = static_cast<int32_t*>(storage->data);
  for (int i = 0; i < 6; ++i) raw[i] = 10 * i;

  auto impl = std::make_shared<nc::TensorImpl>();
  impl->storage = storage;
  impl->shape = {2, 2};
  impl->strides = {3, 1};
  impl->offset = 1;
  impl->dtype = DType::I32;
  Tensor t(impl);
  EXPECT_EQ(t.impl_ptr(), impl);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.data<int32_t>(), raw + 1);
  EXPECT_EQ(values(t), (std::vector<double>{10, 20, 40, 50}));
}

TEST(Tensor, TypedDataPointer) {
  Tensor x = nc::from_vector<int64_t>({5, 6, 7}, {3});
  EXPECT_EQ(x.data<int64_t>()[2], 7);
  EXPECT_EQ(x.narrow(0, 1, 2).data<int64_t>()[0], 6);
  EXPECT_THROW(x.data<int32_t>(), nc::DTypeError);
  EXPECT_THROW(x.data<double>(), nc::DTypeError);
  EXPECT_EQ(nc::ones({2}, DType::F16).data<nc::Half>()[1].bits, 0x3c00);
  EXPECT_EQ(nc::ones({2}, DType::BF16).data<nc::BFloat16>()[0].bits, 0x3f80);
}

// ---------------------------------------------------------------- factories
TEST(Factories, DefaultDTypesShapesAndValues) {
  struct Row {
    const char* name;
    std::function<Tensor()> make;
    DType dtype;
    nc::Shape shape;
    std::vector<double> expected;  // empty: only shape and dtype are checked
  };
  const Tensor i32 = nc::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Row rows[] = {
      {"empty",
       [] {
         return nc::empty({2, 3});
       },
       DType::F32,
       {2, 3},
       {}},
      {"empty i64", [] { return nc::empty({4}, DType::I64); }, DType::I64, {4}, {}},
      {"zeros",
       [] {
         return nc::zeros({2, 2});
       },
       DType::F32,
       {2, 2},
       {0, 0, 0, 0}},
      {"zeros u8", [] { return nc::zeros({3}, DType::U8); }, DType::U8, {3}, {0, 0, 0}},
      {"zeros 0-dim", [] { return nc::zeros({}); }, DType::F32, {}, {0}},
      {"zeros empty",
       [] {
         return nc::zeros({0, 3});
       },
       DType::F32,
       {0, 3},
       {}},
      {"ones", [] { return nc::ones({3}); }, DType::F32, {3}, {1, 1, 1}},
      {"ones bool", [] { return nc::ones({2}, DType::Bool); }, DType::Bool, {2}, {1, 1}},
      {"ones bf16", [] { return nc::ones({2}, DType::BF16); }, DType::BF16, {2}, {1, 1}},
      {"full int", [] { return nc::full({2}, 7); }, DType::I64, {2}, {7, 7}},
      {"full float", [] { return nc::full({2}, 2.5); }, DType::F32, {2}, {2.5, 2.5}},
      {"full bool", [] { return nc::full({2}, true); }, DType::Bool, {2}, {1, 1}},
      {"full f16", [] { return nc::full({1}, 0.1, DType::F16); }, DType::F16, {1}, {0.0999755859375}},
      {"full i32 from float truncates", [] { return nc::full({1}, -2.7, DType::I32); }, DType::I32, {1}, {-2}},
      {"empty_like", [&] { return nc::empty_like(i32); }, DType::I32, {2, 3}, {}},
      {"zeros_like", [&] { return nc::zeros_like(i32); }, DType::I32, {2, 3}, {0, 0, 0, 0, 0, 0}},
      {"ones_like", [&] { return nc::ones_like(i32); }, DType::I32, {2, 3}, {1, 1, 1, 1, 1, 1}},
      {"arange end", [] { return nc::arange(5); }, DType::I64, {5}, {0, 1, 2, 3, 4}},
      {"arange start end", [] { return nc::arange(2, 5); }, DType::I64, {3}, {2, 3, 4}},
      {"arange int step", [] { return nc::arange(0, 10, 3); }, DType::I64, {4}, {0, 3, 6, 9}},
      {"arange negative step", [] { return nc::arange(5, 0, -2); }, DType::I64, {3}, {5, 3, 1}},
      {"arange negative int end", [] { return nc::arange(-3, -7, -1); }, DType::I64, {4}, {-3, -4, -5, -6}},
      {"arange float step", [] { return nc::arange(1, 2.5, 0.5); }, DType::F32, {3}, {1, 1.5, 2}},
      {"arange float end", [] { return nc::arange(2.5); }, DType::F32, {3}, {0, 1, 2}},
      {"arange float negative step", [] { return nc::arange(1.0, -0.5, -0.5); }, DType::F32, {3}, {1, 0.5, 0}},
      {"arange empty", [] { return nc::arange(3, 3); }, DType::I64, {0}, {}},
      {"arange f64", [] { return nc::arange(0, 3, 1, DType::F64); }, DType::F64, {3}, {0, 1, 2}},
      {"arange i32 from float", [] { return nc::arange(0.0, 2.0, 0.5, DType::I32); }, DType::I32, {4}, {0, 0, 1, 1}},
      {"linspace", [] { return nc::linspace(0, 1, 5); }, DType::F32, {5}, {0, 0.25, 0.5, 0.75, 1}},
      {"linspace descending f64", [] { return nc::linspace(2, -1, 4, DType::F64); }, DType::F64, {4}, {2, 1, 0, -1}},
      {"linspace 0 steps", [] { return nc::linspace(0, 1, 0); }, DType::F32, {0}, {}},
      {"linspace 1 step", [] { return nc::linspace(3, 7, 1); }, DType::F32, {1}, {3}},
      {"linspace 2 steps", [] { return nc::linspace(3, 7, 2); }, DType::F32, {2}, {3, 7}},
      {"eye", [] { return nc::eye(2); }, DType::F32, {2, 2}, {1, 0, 0, 1}},
      {"eye n x m", [] { return nc::eye(2, 3); }, DType::F32, {2, 3}, {1, 0, 0, 0, 1, 0}},
      {"eye tall", [] { return nc::eye(3, 2, DType::I64); }, DType::I64, {3, 2}, {1, 0, 0, 1, 0, 0}},
      {"eye 0", [] { return nc::eye(0); }, DType::F32, {0, 0}, {}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    Tensor t = r.make();
    EXPECT_EQ(t.dtype(), r.dtype);
    EXPECT_EQ(t.shape(), r.shape);
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.device(), nc::Device::cpu());
    if (!r.expected.empty()) {
      EXPECT_EQ(values(t), r.expected);
    }
  }
}

TEST(Factories, OptionsFallBackToTheFactoryDefault) {
  EXPECT_EQ(nc::TensorOptions().dtype_or(DType::F64), DType::F64);
  EXPECT_EQ(nc::TensorOptions(DType::I32).dtype_or(DType::F64), DType::I32);
  const nc::TensorOptions both(DType::U8, nc::Device::cuda(1));
  EXPECT_EQ(both.dtype_or(DType::F32), DType::U8);
  EXPECT_EQ(both.device, nc::Device::cuda(1));
  EXPECT_FALSE(both.pinned);
  EXPECT_EQ(nc::TensorOptions(nc::Device::cuda(2)).device, nc::Device::cuda(2));
  EXPECT_FALSE(nc::TensorOptions(nc::Device::cuda(2)).dtype.has_value());
  EXPECT_TRUE(nc::TensorOptions().with_pinned().pinned);
  EXPECT_FALSE(nc::TensorOptions().with_pinned(false).pinned);
}

TEST(Factories, LinspaceEndsAreExact) {
  // The symmetric formula must land on both ends even when the step is inexact.
  Tensor t = nc::linspace(0.1, 0.7, 7, DType::F64);
  std::vector<double> v = values(t);
  ASSERT_EQ(v.size(), 7u);
  EXPECT_EQ(v.front(), 0.1);
  EXPECT_EQ(v.back(), 0.7);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], 0.1 + 0.1 * static_cast<double>(i), 1e-15);
}

TEST(Factories, BadArguments) {
  EXPECT_THROW(nc::arange(0, 5, 0), nc::ValueError);
  EXPECT_THROW(nc::arange(0, 5, -1), nc::ValueError);
  EXPECT_THROW(nc::arange(5, 0, 1), nc::ValueError);
  EXPECT_THROW(nc::arange(0.0, INFINITY, 1), nc::ValueError);
  EXPECT_THROW(nc::linspace(0, 1, -1), nc::ValueError);
  EXPECT_THROW(nc::linspace(0, NAN, 3), nc::ValueError);
  EXPECT_THROW(nc::eye(-1), nc::ValueError);
  EXPECT_THROW(nc::zeros({2, -3}), nc::ShapeError);
  EXPECT_THROW(nc::from_vector<float>({1, 2, 3}, {2, 2}), nc::ShapeError);
  EXPECT_THROW(nc::from_vector<int64_t>({}, {1}), nc::ShapeError);
}

// ---------------------------------------------------------------- views
namespace {

// [[0, 1, 2], [3, 4, 5]] as i64.
Tensor base23() { return nc::arange(6).view({2, 3}); }

}  // namespace

TEST(Views, GeometryAndValues) {
  struct Row {
    const char* name;
    std::function<Tensor(const Tensor&)> make;  // applied to arange(24) viewed as [2, 3, 4]
    nc::Shape shape;
    nc::Shape strides;
    int64_t offset;
    std::vector<double> expected;  // empty: not checked
  };
  const Row rows[] = {
      {"view -1 last",
       [](const Tensor& x) {
         return x.view({4, -1});
       },
       {4, 6},
       {6, 1},
       0,
       {}},
      {"view -1 first",
       [](const Tensor& x) {
         return x.view({-1, 8});
       },
       {3, 8},
       {8, 1},
       0,
       {}},
      {"view flat", [](const Tensor& x) { return x.view({24}); }, {24}, {1}, 0, {}},
      {"view of a transposed tensor splitting a dim",
       [](const Tensor& x) {
         return x.transpose(1, 2).view({2, 2, 2, 3});
       },
       {2, 2, 2, 3},
       {12, 2, 1, 4},
       0,
       {}},
      {"reshape without copy",
       [](const Tensor& x) {
         return x.reshape({6, 4});
       },
       {6, 4},
       {4, 1},
       0,
       {}},
      {"flatten all", [](const Tensor& x) { return x.flatten(); }, {24}, {1}, 0, {}},
      {"flatten from 1", [](const Tensor& x) { return x.flatten(1); }, {2, 12}, {12, 1}, 0, {}},
      {"flatten 0..1", [](const Tensor& x) { return x.flatten(0, 1); }, {6, 4}, {4, 1}, 0, {}},
      {"flatten -2..-1", [](const Tensor& x) { return x.flatten(-2, -1); }, {2, 12}, {12, 1}, 0, {}},
      {"permute",
       [](const Tensor& x) {
         return x.permute({2, 0, 1});
       },
       {4, 2, 3},
       {1, 12, 4},
       0,
       {0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}},
      {"permute negative dims",
       [](const Tensor& x) {
         return x.permute({-1, -3, -2});
       },
       {4, 2, 3},
       {1, 12, 4},
       0,
       {}},
      {"transpose 0 2",
       [](const Tensor& x) { return x.transpose(0, 2); },
       {4, 3, 2},
       {1, 4, 12},
       0,
       {0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23}},
      {"narrow",
       [](const Tensor& x) { return x.narrow(2, 1, 2); },
       {2, 3, 2},
       {12, 4, 1},
       1,
       {1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}},
      {"narrow negative start",
       [](const Tensor& x) { return x.narrow(1, -1, 1); },
       {2, 1, 4},
       {12, 4, 1},
       8,
       {8, 9, 10, 11, 20, 21, 22, 23}},
      {"narrow to empty", [](const Tensor& x) { return x.narrow(0, 2, 0); }, {0, 3, 4}, {12, 4, 1}, 24, {}},
      {"slice with step",
       [](const Tensor& x) { return x.slice(2, 1, 4, 2); },
       {2, 3, 2},
       {12, 4, 2},
       1,
       {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}},
      {"slice negative indices",
       [](const Tensor& x) { return x.slice(-1, -3, -1); },
       {2, 3, 2},
       {12, 4, 1},
       1,
       {1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}},
      {"select", [](const Tensor& x) { return x.select(1, 2); }, {2, 4}, {12, 1}, 8, {8, 9, 10, 11, 20, 21, 22, 23}},
      {"select negative", [](const Tensor& x) { return x.select(-1, -1); }, {2, 3}, {12, 4}, 3, {3, 7, 11, 15, 19, 23}},
      {"unsqueeze front", [](const Tensor& x) { return x.unsqueeze(0); }, {1, 2, 3, 4}, {24, 12, 4, 1}, 0, {}},
      {"unsqueeze middle", [](const Tensor& x) { return x.unsqueeze(1); }, {2, 1, 3, 4}, {12, 12, 4, 1}, 0, {}},
      {"unsqueeze end", [](const Tensor& x) { return x.unsqueeze(-1); }, {2, 3, 4, 1}, {12, 4, 1, 1}, 0, {}},
      {"squeeze of unsqueeze", [](const Tensor& x) { return x.unsqueeze(1).squeeze(1); }, {2, 3, 4}, {12, 4, 1}, 0, {}},
      {"squeeze a non-1 dim is a no-op", [](const Tensor& x) { return x.squeeze(0); }, {2, 3, 4}, {12, 4, 1}, 0, {}},
      {"squeeze all",
       [](const Tensor& x) { return x.narrow(0, 1, 1).narrow(2, 0, 1).squeeze(); },
       {3},
       {4},
       12,
       {12, 16, 20}},
      {"expand new dim",
       [](const Tensor& x) {
         return x.select(2, 0).expand({5, 2, 3});
       },
       {5, 2, 3},
       {0, 12, 4},
       0,
       {}},
      {"expand size-1 dims",
       [](const Tensor& x) {
         return x.narrow(1, 0, 1).expand({2, 3, -1});
       },
       {2, 3, 4},
       {12, 0, 1},
       0,
       {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15}},
  };
  const Tensor x = nc::arange(24).view({2, 3, 4});
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    Tensor v = r.make(x);
    EXPECT_EQ(v.shape(), r.shape);
    EXPECT_EQ(v.strides(), r.strides);
    EXPECT_EQ(v.offset(), r.offset);
    EXPECT_EQ(v.storage(), x.storage()) << "a view must share its base's storage";
    EXPECT_EQ(v.dtype(), DType::I64);
    if (!r.expected.empty()) {
      EXPECT_EQ(values(v), r.expected);
    }
  }
}

TEST(Views, SmallMatrixViews) {
  const Tensor x = base23();
  EXPECT_EQ(values(x.t()), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(x.t().strides(), (nc::Shape{1, 3}));
  EXPECT_FALSE(x.t().is_contiguous());
  EXPECT_EQ(values(x.t().t()), values(x));
  Tensor v = nc::arange(4);
  EXPECT_TRUE(v.t().is_same(v)) << "t() of a 1-D tensor is the tensor itself";
  EXPECT_EQ(values(x.slice(1, 0, 3, 2)), (std::vector<double>{0, 2, 3, 5}));
  EXPECT_EQ(values(x.select(0, 1)), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(values(x.select(1, -1)), (std::vector<double>{2, 5}));
  EXPECT_EQ(x.select(0, 0).select(0, 2).dim(), 0);
  EXPECT_EQ(x.select(0, 0).select(0, 2).item<int64_t>(), 2);
}

TEST(Views, SliceClampsLikePython) {
  const Tensor a = nc::arange(10);
  struct Row {
    int64_t start, end, step;
    std::vector<double> expected;
  };
  const Row rows[] = {
      {1, 8, 3, {1, 4, 7}}, {-4, -1, 1, {6, 7, 8}}, {-100, 100, 4, {0, 4, 8}}, {5, 2, 1, {}},
      {8, 100, 1, {8, 9}},  {0, 10, 20, {0}},       {10, 12, 1, {}},           {-1, 10, 1, {9}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(std::to_string(r.start) + ":" + std::to_string(r.end) + ":" + std::to_string(r.step));
    Tensor s = a.slice(0, r.start, r.end, r.step);
    EXPECT_EQ(s.numel(), static_cast<int64_t>(r.expected.size()));
    EXPECT_EQ(values(s), r.expected);
  }
}

TEST(Views, ViewOfNonContiguousThrowsAndReshapeCopies) {
  const Tensor x = nc::arange(24).view({2, 3, 4});
  const Tensor xt = x.transpose(1, 2);
  EXPECT_THROW(xt.view({-1}), nc::ShapeError);
  EXPECT_THROW(xt.view({8, 3}), nc::ShapeError);
  Tensor r = xt.reshape({8, 3});
  EXPECT_NE(r.storage(), x.storage()) << "reshape must copy when no view exists";
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(values(r), values(xt));
  EXPECT_EQ(values(r.select(0, 1)), (std::vector<double>{1, 5, 9}));

  Tensor flat = xt.flatten();
  EXPECT_NE(flat.storage(), x.storage());
  EXPECT_EQ(values(flat), values(xt));
  EXPECT_EQ(nc::full({}, 4.0).flatten().shape(), (nc::Shape{1}));
  EXPECT_EQ(nc::zeros({0, 3}).view({3, 0}).shape(), (nc::Shape{3, 0}));
  // With no elements a -1 could be any size, so it is refused (as PyTorch does).
  EXPECT_THROW(nc::zeros({0, 3}).view({3, 0, -1}), nc::ShapeError);
}

TEST(Views, WritesThroughViewsReachTheBase) {
  Tensor y = base23().clone();
  y.select(0, 1).fill_(9);
  EXPECT_EQ(values(y), (std::vector<double>{0, 1, 2, 9, 9, 9}));
  y.t().select(0, 0).copy_(nc::from_vector<int64_t>({7, 8}, {2}));
  EXPECT_EQ(values(y), (std::vector<double>{7, 1, 2, 8, 9, 9}));
  y.narrow(1, 1, 2).zero_();
  EXPECT_EQ(values(y), (std::vector<double>{7, 0, 0, 8, 0, 0}));
  y.view({6}).slice(0, 1, 6, 2).fill_(-1);
  EXPECT_EQ(values(y), (std::vector<double>{7, -1, 0, -1, 0, -1}));
  y.permute({1, 0}).unsqueeze(0).select(0, 0).select(0, 2).fill_(5);
  EXPECT_EQ(values(y), (std::vector<double>{7, -1, 5, -1, 0, 5}));

  // And base writes show through expanded views.
  Tensor c = nc::from_vector<float>({1, 2}, {2, 1});
  Tensor e = c.expand({2, 3});
  c.select(0, 1).fill_(4);
  EXPECT_EQ(values(e), (std::vector<double>{1, 1, 1, 4, 4, 4}));
}

// ---------------------------------------------------------------- printing
TEST(Printing, MatchesPyTorchLayout) {
  struct Row {
    const char* name;
    std::function<Tensor()> make;
    const char* expected;
  };
  const Row rows[] = {
      {"small f32",
       [] {
         return nc::from_vector<float>({1.5f, 2.25f, -3.0f, 4.0f}, {2, 2});
       },
       "tensor([[ 1.5000,  2.2500],\n"
       "        [-3.0000,  4.0000]], shape=[2, 2], dtype=f32, device=cpu)"},
      {"integral floats",
       [] {
         return nc::from_vector<float>({1, -2, 30}, {3});
       },
       "tensor([ 1., -2., 30.], shape=[3], dtype=f32, device=cpu)"},
      {"scientific",
       [] {
         return nc::from_vector<double>({1e-5, 0.5}, {2});
       },
       "tensor([1.0000e-05, 5.0000e-01], shape=[2], dtype=f64, device=cpu)"},
      {"integral floats with a wide range",
       [] {
         return nc::from_vector<float>({1, 2000}, {2});
       },
       "tensor([1.0000e+00, 2.0000e+03], shape=[2], dtype=f32, device=cpu)"},
      {"non-finite values do not widen the columns",
       [] {
         return nc::from_vector<float>({1, NAN, -INFINITY}, {3});
       },
       "tensor([1., nan, -inf], shape=[3], dtype=f32, device=cpu)"},
      {"fixed with nan",
       [] {
         return nc::from_vector<float>({1.5f, NAN}, {2});
       },
       "tensor([1.5000,    nan], shape=[2], dtype=f32, device=cpu)"},
      {"int",
       [] {
         return nc::from_vector<int64_t>({1, -20, 300}, {3});
       },
       "tensor([  1, -20, 300], shape=[3], dtype=i64, device=cpu)"},
      {"u8 matrix",
       [] {
         return nc::from_vector<uint8_t>({1, 2, 30, 4}, {2, 2});
       },
       "tensor([[ 1,  2],\n"
       "        [30,  4]], shape=[2, 2], dtype=u8, device=cpu)"},
      {"bool",
       [] {
         return nc::from_vector<bool>({true, false}, {2});
       },
       "tensor([ True, False], shape=[2], dtype=bool, device=cpu)"},
      {"0-dim", [] { return nc::full({}, 2.5); }, "tensor(2.5000, shape=[], dtype=f32, device=cpu)"},
      {"0-dim int", [] { return nc::full({}, -4, DType::I32); }, "tensor(-4, shape=[], dtype=i32, device=cpu)"},
      {"empty", [] { return nc::zeros({0}); }, "tensor([], shape=[0], dtype=f32, device=cpu)"},
      {"3-D",
       [] {
         return nc::arange(8).view({2, 2, 2});
       },
       "tensor([[[0, 1],\n"
       "         [2, 3]],\n"
       "\n"
       "        [[4, 5],\n"
       "         [6, 7]]], shape=[2, 2, 2], dtype=i64, device=cpu)"},
      {"transposed view prints logical order",
       [] {
         return nc::arange(6).view({2, 3}).t();
       },
       "tensor([[0, 3],\n"
       "        [1, 4],\n"
       "        [2, 5]], shape=[3, 2], dtype=i64, device=cpu)"},
      {"large 1-D is summarized", [] { return nc::arange(2000); },
       "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], shape=[2000], dtype=i64, device=cpu)"},
      {"large f32 is summarized", [] { return nc::linspace(1, 2, 1001); },
       "tensor([1.0000, 1.0010, 1.0020,  ..., 1.9980, 1.9990, 2.0000], shape=[1001], dtype=f32, device=cpu)"},
      {"large 2-D is summarized",
       [] {
         return nc::arange(1200).view({40, 30});
       },
       "tensor([[   0,    1,    2,  ...,   27,   28,   29],\n"
       "        [  30,   31,   32,  ...,   57,   58,   59],\n"
       "        [  60,   61,   62,  ...,   87,   88,   89],\n"
       "        ...,\n"
       "        [1110, 1111, 1112,  ..., 1137, 1138, 1139],\n"
       "        [1140, 1141, 1142,  ..., 1167, 1168, 1169],\n"
       "        [1170, 1171, 1172,  ..., 1197, 1198, 1199]], shape=[40, 30], dtype=i64, device=cpu)"},
      {"undefined", [] { return Tensor(); }, "tensor(undefined)"},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(printed(r.make()), r.expected);
  }
}

// ---------------------------------------------------------------- random
TEST(Random, GeneratorCounters) {
  nc::Generator g(11);
  EXPECT_EQ(g.seed(), 11u);
  EXPECT_EQ(g.advance(5), 0u);
  EXPECT_EQ(g.advance(3), 5u);
  g.manual_seed(12);
  EXPECT_EQ(g.seed(), 12u);
  EXPECT_EQ(g.advance(1), 0u);
}

TEST(Random, SameSeedSameNumbers) {
  struct Row {
    const char* name;
    std::function<Tensor(nc::Generator*)> draw;
  };
  const Row rows[] = {
      {"rand", [](nc::Generator* g) { return nc::rand({1000}, {}, g); }},
      {"rand f64", [](nc::Generator* g) { return nc::rand({1000}, DType::F64, g); }},
      {"randn", [](nc::Generator* g) { return nc::randn({1000}, {}, g); }},
      {"randn bf16", [](nc::Generator* g) { return nc::randn({1000}, DType::BF16, g); }},
      {"randint", [](nc::Generator* g) { return nc::randint(0, 1000000, {1000}, {}, g); }},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    nc::Generator a(7), b(7), c(8);
    std::vector<double> first = values(r.draw(&a));
    EXPECT_EQ(values(r.draw(&b)), first);
    EXPECT_NE(values(r.draw(&c)), first) << "a different seed must give different numbers";
    EXPECT_NE(values(r.draw(&a)), first) << "the next call must continue the stream";
  }
  // Element i of a call draws from counter offset + i: two calls equal one long one.
  nc::Generator split_gen(3), whole_gen(3);
  std::vector<double> parts = values(nc::rand({10}, {}, &split_gen));
  std::vector<double> rest = values(nc::rand({6}, {}, &split_gen));
  parts.insert(parts.end(), rest.begin(), rest.end());
  EXPECT_EQ(values(nc::rand({16}, {}, &whole_gen)), parts);
}

TEST(Random, DefaultGeneratorFollowsManualSeed) {
  nc::manual_seed(42);
  EXPECT_EQ(nc::default_generator().seed(), 42u);
  std::vector<double> first = values(nc::rand({100}));
  std::vector<double> second = values(nc::randn({100}));
  nc::manual_seed(42);
  EXPECT_EQ(values(nc::rand({100})), first);
  EXPECT_EQ(values(nc::randn({100})), second);
  nc::Generator explicit_gen(42);
  EXPECT_EQ(values(nc::rand({100}, {}, &explicit_gen)), first);
  nc::manual_seed(43);
  EXPECT_NE(values(nc::rand({100})), first);
}

TEST(Random, Distributions) {
  struct Row {
    const char* name;
    std::function<Tensor(nc::Generator*)> draw;
    DType dtype;
    double low, high;  // every value in [low, high)
    double mean, stddev, tol;
  };
  const double uniform_std = std::sqrt(1.0 / 12.0);
  const Row rows[] = {
      {"rand", [](nc::Generator* g) { return nc::rand({100000}, {}, g); }, DType::F32, 0, 1, 0.5, uniform_std, 0.01},
      {"rand f64", [](nc::Generator* g) { return nc::rand({100000}, DType::F64, g); }, DType::F64, 0, 1, 0.5,
       uniform_std, 0.01},
      {"rand f16", [](nc::Generator* g) { return nc::rand({100000}, DType::F16, g); }, DType::F16, 0, 1, 0.5,
       uniform_std, 0.01},
      {"rand bf16", [](nc::Generator* g) { return nc::rand({100000}, DType::BF16, g); }, DType::BF16, 0, 1, 0.5,
       uniform_std, 0.01},
      {"randn", [](nc::Generator* g) { return nc::randn({100000}, {}, g); }, DType::F32, -10, 10, 0, 1, 0.02},
      {"randn f64", [](nc::Generator* g) { return nc::randn({100000}, DType::F64, g); }, DType::F64, -10, 10, 0, 1,
       0.02},
      {"randn f16", [](nc::Generator* g) { return nc::randn({100000}, DType::F16, g); }, DType::F16, -10, 10, 0, 1,
       0.02},
      {"randn bf16", [](nc::Generator* g) { return nc::randn({100000}, DType::BF16, g); }, DType::BF16, -10, 10, 0, 1,
       0.02},
      {"randint", [](nc::Generator* g) { return nc::randint(-3, 5, {100000}, {}, g); }, DType::I64, -3, 5, 0.5,
       std::sqrt((64.0 - 1) / 12.0), 0.02},
      {"randint i32", [](nc::Generator* g) { return nc::randint(10, 12, {100000}, DType::I32, g); }, DType::I32, 10, 12,
       10.5, 0.5, 0.01},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    nc::Generator g(1234);
    Tensor t = r.draw(&g);
    EXPECT_EQ(t.dtype(), r.dtype);
    EXPECT_EQ(t.shape(), (nc::Shape{100000}));
    std::vector<double> v = values(t);
    double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    EXPECT_GE(lo, r.low);
    EXPECT_LT(hi, r.high);
    auto [mean, stddev] = mean_std(t);
    EXPECT_NEAR(mean, r.mean, r.tol);
    EXPECT_NEAR(stddev, r.stddev, r.tol);
  }
  // Small integer ranges hit every value.
  nc::Generator g(5);
  std::vector<double> v = values(nc::randint(-3, 5, {1000}, {}, &g));
  EXPECT_EQ(std::set<double>(v.begin(), v.end()), (std::set<double>{-3, -2, -1, 0, 1, 2, 3, 4}));
}

TEST(Random, EmptyAndErrors) {
  EXPECT_EQ(nc::rand({0, 3}).shape(), (nc::Shape{0, 3}));
  EXPECT_EQ(nc::randn({0}).numel(), 0);
  EXPECT_EQ(nc::randint(0, 2, {0}).dtype(), DType::I64);
  EXPECT_THROW(nc::rand({2}, DType::I32), nc::DTypeError);
  EXPECT_THROW(nc::rand({2}, DType::Bool), nc::DTypeError);
  EXPECT_THROW(nc::randn({2}, DType::I64), nc::DTypeError);
  EXPECT_THROW(nc::randint(3, 3, {2}), nc::ValueError);
  EXPECT_THROW(nc::randint(5, 1, {2}), nc::ValueError);
  EXPECT_THROW(nc::randint(0, 2, {2}, DType::Bool), nc::DTypeError);
}
