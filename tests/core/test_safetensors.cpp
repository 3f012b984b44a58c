// safetensors: exact round trips for every dtype and layout, the conformance cases read
// against values taken from the files with Python's struct module, and one malformed file
// per defect (each must throw IOError with a reason-specific message).
// test_safetensors_save.cpp holds the saves to disk.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "normcore/safetensors.h"
#include "normcore/tensor.h"
#include "tests/core/safetensors_support.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace st = normcore::safetensors;
namespace fs = std::filesystem;

using namespace safetensors_test;

namespace {

// ---- round trips ----

struct RoundTripCase {
  const char* name;
  nc::Tensor tensor;
  std::vector<uint8_t> expected;  // row-major bytes after the round trip
  nc::Shape shape;
};

template <class T>
RoundTripCase exact_case(const char* name, std::initializer_list<T> values, const nc::Shape& shape) {
  return {name, make(values, shape), bytes_of(values), shape};
}

std::vector<RoundTripCase> round_trip_cases() {
  const float f32_inf = std::numeric_limits<float>::infinity();
  const double f64_inf = std::numeric_limits<double>::infinity();
  using H = nc::Half;
  using B = nc::BFloat16;
  return {
      exact_case<float>("f32",
                        {0.0f, -0.0f, 1.5f, -2.25f, f32_inf, -f32_inf, std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()},
                        {3, 3}),
      exact_case<double>("f64",
                         {0.0, -0.0, 0.1, -1e300, f64_inf, -f64_inf, std::numeric_limits<double>::quiet_NaN(),
                          std::numeric_limits<double>::denorm_min()},
                         {2, 4}),
      // +-0, 1, +-inf, a NaN with a payload, the smallest subnormal, the largest finite value.
      exact_case<H>("f16",
                    {H::from_bits(0x0000), H::from_bits(0x8000), H::from_bits(0x3c00), H::from_bits(0x7c00),
                     H::from_bits(0xfc00), H::from_bits(0x7e01), H::from_bits(0x0001), H::from_bits(0x7bff)},
                    {8}),
      exact_case<B>("bf16",
                    {B::from_bits(0x0000), B::from_bits(0x8000), B::from_bits(0x3f80), B::from_bits(0x7f80),
                     B::from_bits(0xff80), B::from_bits(0x7fc1), B::from_bits(0x0001), B::from_bits(0x7f7f)},
                    {2, 2, 2}),
      exact_case<int32_t>("i32",
                          {std::numeric_limits<int32_t>::min(), -1, 0, 1, std::numeric_limits<int32_t>::max(), 7}, {6}),
      exact_case<int64_t>(
          "i64", {std::numeric_limits<int64_t>::min(), -1, 0, 1, std::numeric_limits<int64_t>::max(), int64_t(1) << 40},
          {3, 2}),
      exact_case<uint8_t>("u8", {0, 1, 127, 128, 254, 255}, {2, 3}),
      exact_case<bool>("bool", {true, false, false, true, true, false}, {6, 1}),
      exact_case<float>("scalar", {3.5f}, {}),
      exact_case<int64_t>("scalar_i64", {-9}, {}),
      exact_case<float>("empty", {}, {0}),
      exact_case<int64_t>("empty_inner", {}, {2, 0, 3}),
      // Non-contiguous inputs are written in the row-major order of their logical shape.
      {"transposed", make<float>({1, 2, 3, 4, 5, 6}, {2, 3}).t(), bytes_of<float>({1, 4, 2, 5, 3, 6}), {3, 2}},
      {"strided_slice",
       make<int32_t>({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4}).slice(1, 1, 4, 2),
       bytes_of<int32_t>({1, 3, 5, 7}),
       {2, 2}},
      {"expanded", make<uint8_t>({7, 8, 9}, {3}).expand({2, 3}), bytes_of<uint8_t>({7, 8, 9, 7, 8, 9}), {2, 3}},
      {"offset_view", make<double>({1, 2, 3, 4, 5, 6}, {3, 2}).select(0, 2), bytes_of<double>({5, 6}), {2}},
  };
}

TEST(SafetensorsRoundTrip, EveryDTypeAndLayoutIsExact) {
  const auto cases = round_trip_cases();
  st::TensorList tensors;
  for (const auto& c : cases) tensors.emplace_back(c.name, c.tensor);

  const auto bytes = st::save_bytes(tensors);
  const st::File file = st::load_bytes(bytes.data(), bytes.size());
  ASSERT_EQ(file.tensors.size(), cases.size());
  EXPECT_TRUE(file.metadata.empty());
  EXPECT_EQ(file.source, "<memory>");
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const auto& [name, tensor] = file.tensors[i];
    EXPECT_EQ(name, cases[i].name);  // save order is file order
    EXPECT_EQ(tensor.dtype(), cases[i].tensor.dtype());
    EXPECT_EQ(tensor.shape(), cases[i].shape);
    EXPECT_TRUE(tensor.is_contiguous());
    EXPECT_EQ(tensor.device(), nc::Device::cpu());
    EXPECT_EQ(bytes_of(tensor), cases[i].expected);
  }
}

TEST(SafetensorsRoundTrip, OrderIsKeptAndNamesLookUp) {
  const st::TensorList tensors = {
      {"z", make<float>({1}, {1})}, {"a", make<float>({2}, {1})}, {"m", make<float>({3}, {1})}};
  const auto bytes = st::save_bytes(tensors);
  const st::File file = st::load_bytes(bytes.data(), bytes.size());
  EXPECT_EQ(layout(file), "z:F32[1] a:F32[1] m:F32[1]");
  EXPECT_TRUE(file.contains("a"));
  EXPECT_FALSE(file.contains("b"));
  EXPECT_EQ(bytes_of(file.at("m")), bytes_of<float>({3}));
  try {
    file.at("weight");
    FAIL() << "expected IOError";
  } catch (const nc::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor named \"weight\""), std::string::npos) << e.what();
  }
}

TEST(SafetensorsRoundTrip, MetadataIsKept) {
  const std::map<std::string, std::string> metadata = {
      {"op", "layer_norm"}, {"escapes", "a\"b\\c\nd\te"}, {"unicode", "\xc2\xb5 \xe2\x9c\x93"}, {"empty", ""}};
  const auto bytes = st::save_bytes({{"x", make<float>({1, 2}, {2})}}, metadata);
  const st::File file = st::load_bytes(bytes.data(), bytes.size());
  EXPECT_EQ(file.metadata, metadata);
  EXPECT_EQ(layout(file), "x:F32[2]");
}

TEST(SafetensorsRoundTrip, NoTensors) {
  const auto bytes = st::save_bytes({}, {{"k", "v"}});
  const st::File file = st::load_bytes(bytes.data(), bytes.size());
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_EQ(file.metadata.at("k"), "v");
}

// The header is compact JSON with __metadata__ first, padded with spaces to 8 bytes.
TEST(SafetensorsRoundTrip, HeaderBytesAreDeterministic) {
  const auto bytes =
      st::save_bytes({{"w", make<int32_t>({5, -1}, {2})}, {"e", make<uint8_t>({}, {0, 2})}}, {{"b", "2"}, {"a", "1"}});
  const std::string json = R"({"__metadata__":{"a":"1","b":"2"},"w":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                           R"("e":{"dtype":"U8","shape":[0,2],"data_offsets":[8,8]}})";
  const size_t padded = (json.size() + 7) / 8 * 8;
  ASSERT_EQ(bytes.size(), 8 + padded + 8);
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | bytes[i];
  EXPECT_EQ(header_length, padded);
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(padded));
  EXPECT_EQ(header, json + std::string(padded - json.size(), ' '));
  const std::vector<uint8_t> data(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(padded), bytes.end());
  EXPECT_EQ(data, bytes_of<int32_t>({5, -1}));
}

TEST(SafetensorsRoundTrip, SaveRejectsBadInput) {
  const nc::Tensor x = make<float>({1}, {1});
  EXPECT_THROW(st::save_bytes({{"x", x}, {"x", x}}), nc::ValueError);
  EXPECT_THROW(st::save_bytes({{"__metadata__", x}}), nc::ValueError);
  EXPECT_THROW(st::save_bytes({{"x", nc::Tensor()}}), nc::ValueError);
  EXPECT_THROW(st::save_bytes({{"bad\xff", x}}), nc::ValueError);
}

std::vector<uint8_t> with_header(const std::string& header, size_t data_bytes);

TEST(SafetensorsRoundTrip, Cuda) {
  if (!nc::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const nc::Tensor host = make<nc::BFloat16>({nc::BFloat16::from_bits(0x3f80), nc::BFloat16::from_bits(0x7fc1),
                                              nc::BFloat16::from_bits(0x8001), nc::BFloat16::from_bits(0xc000),
                                              nc::BFloat16::from_bits(0x0000), nc::BFloat16::from_bits(0x7f80)},
                                             {2, 3});
  const nc::Tensor device = host.to(nc::Device::cuda());
  const auto bytes =
      st::save_bytes({{"t", device.t()}, {"e", nc::empty({0, 4}, nc::TensorOptions(nc::Device::cuda()))}});
  const st::File file = st::load_bytes(bytes.data(), bytes.size(), nc::Device::cuda());
  EXPECT_EQ(layout(file), "t:BF16[3,2] e:F32[0,4]");
  EXPECT_EQ(file.at("t").device(), nc::Device::cuda());
  EXPECT_EQ(file.at("e").device(), nc::Device::cuda());
  EXPECT_EQ(bytes_of(file.at("t")), bytes_of(host.t()));
  // A bool byte that is neither 0 nor 1 is refused on the way to the GPU too, named.
  auto bad = with_header(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", 0);
  bad.insert(bad.end(), {1, 0, 2});
  try {
    st::load_bytes(bad.data(), bad.size(), nc::Device::cuda());
    ADD_FAILURE() << "expected an IOError";
  } catch (const nc::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("invalid BOOL byte 2 at element 2"), std::string::npos) << e.what();
  }
}

// ---- conformance cases ----

struct ExpectedValue {
  const char* tensor;
  int64_t index;  // row-major element index
  uint32_t bits;  // F32 bits, or BF16 bits in the low half
};

struct ConformanceCase {
  const char* file;
  const char* op;
  const char* dtype;
  const char* layout;
  std::vector<ExpectedValue> values;
};

// Layouts and values read from the files with Python's json and struct modules.
const std::vector<ConformanceCase> kConformanceCases = {
    {"cross_entropy_mean",
     "cross_entropy",
     "F32",
     "x:F32[6,10] target:I64[6] grad_out:F32[] out:F32[] grad.x:F32[6,10]",
     {{"x", 0, 0x3e0d1732}, {"x", 59, 0xbf18ac60}, {"grad.x", 30, 0xba395320}}},
    {"cross_entropy_smoothing",
     "cross_entropy",
     "F32",
     "x:F32[8,5] target:I64[8] grad_out:F32[] out:F32[] grad.x:F32[8,5]",
     {{"x", 0, 0x3fd1b1ca}, {"x", 39, 0xc0be97a9}, {"grad.x", 20, 0x3c17fd41}}},
    {"embedding_basic",
     "embedding",
     "F32",
     "weight:F32[20,8] indices:I64[3,5] grad_out:F32[3,5,8] out:F32[3,5,8] grad.weight:F32[20,8]",
     {{"weight", 0, 0x3f83f8ad}, {"weight", 159, 0xbfab98ba}, {"grad.weight", 80, 0xbf4a3672}}},
    {"frobenius_norm_1d",
     "frobenius_norm",
     "F32",
     "x:F32[7] grad_out:F32[7] out:F32[7] grad.x:F32[7]",
     {{"x", 0, 0x3f4a628f}, {"x", 5, 0x3f1fc9a6}, {"grad.x", 6, 0x3ecfde74}}},
    {"frobenius_norm_3d",
     "frobenius_norm",
     "F32",
     "x:F32[3,4,5] grad_out:F32[3,4,5] out:F32[3,4,5] grad.x:F32[3,4,5]",
     {{"x", 0, 0x3f9ddfc7}, {"x", 5, 0xbeb3b536}, {"grad.x", 59, 0xbc7f3cc0}}},
    {"gemm_group_norm_min_bias",
     "gemm_group_norm_min_bias",
     "F32",
     "x:F32[8,16] linear.weight:F32[32,16] linear.bias:F32[32] group_norm.weight:F32[32] "
     "group_norm.bias:F32[32] bias:F32[1,32,1,1] grad_out:F32[1,32,8,1] out:F32[1,32,8,1] grad.x:F32[8,16] "
     "grad.linear.weight:F32[32,16] grad.linear.bias:F32[32] grad.group_norm.weight:F32[32] "
     "grad.group_norm.bias:F32[32] grad.bias:F32[1,32,1,1]",
     {{"x", 0, 0x3f0b080d}, {"x", 5, 0xbfa7e443}, {"grad.bias", 31, 0xbed33ec6}}},
    {"group_norm_2d_no_affine",
     "group_norm",
     "F32",
     "x:F32[3,4] grad_out:F32[3,4] out:F32[3,4] grad.x:F32[3,4]",
     {{"x", 0, 0xbf6c63b1}, {"x", 5, 0xbf873dc3}, {"grad.x", 11, 0xbc727f39}}},
    {"group_norm_3d",
     "group_norm",
     "F32",
     "x:F32[2,8,9] weight:F32[8] bias:F32[8] grad_out:F32[2,8,9] out:F32[2,8,9] grad.x:F32[2,8,9] "
     "grad.weight:F32[8] grad.bias:F32[8]",
     {{"x", 0, 0x3e0f51f7}, {"x", 5, 0x3d8a7cae}, {"grad.bias", 7, 0x40c25e34}}},
    {"group_norm_4d",
     "group_norm",
     "F32",
     "x:F32[2,6,5,7] weight:F32[6] bias:F32[6] grad_out:F32[2,6,5,7] out:F32[2,6,5,7] grad.x:F32[2,6,5,7] "
     "grad.weight:F32[6] grad.bias:F32[6]",
     {{"x", 0, 0xbf943f75}, {"x", 5, 0xbfc8b801}, {"grad.bias", 5, 0xc0997eef}}},
    {"group_norm_bf16",
     "group_norm",
     "BF16",
     "x:BF16[2,32,8,8] weight:BF16[32] bias:BF16[32] grad_out:BF16[2,32,8,8] out:BF16[2,32,8,8] "
     "grad.x:BF16[2,32,8,8] grad.weight:BF16[32] grad.bias:BF16[32]",
     {{"x", 0, 0xbe2b}, {"x", 5, 0x4009}, {"grad.bias", 31, 0xc1c4}}},
    {"l1_norm_3d",
     "l1_norm",
     "F32",
     "x:F32[2,3,5] grad_out:F32[2,3,5] out:F32[2,3,5] grad.x:F32[2,3,5]",
     {{"x", 0, 0xbebfa0c6}, {"x", 5, 0x3f71dc4d}, {"grad.x", 29, 0x3f4a8048}}},
    {"l1_norm_rows",
     "l1_norm",
     "F32",
     "x:F32[4,33] grad_out:F32[4,33] out:F32[4,33] grad.x:F32[4,33]",
     {{"x", 0, 0xbf2dd882}, {"x", 5, 0xc023707a}, {"grad.x", 131, 0x3f8fde1e}}},
    {"layer_norm_bf16",
     "layer_norm",
     "BF16",
     "x:BF16[64,256] weight:BF16[256] bias:BF16[256] grad_out:BF16[64,256] out:BF16[64,256] "
     "grad.x:BF16[64,256] grad.weight:BF16[256] grad.bias:BF16[256]",
     {{"x", 0, 0x3e8f}, {"x", 5, 0xbf0e}, {"grad.bias", 255, 0xc0a3}}},
    {"layer_norm_long_row",
     "layer_norm",
     "F32",
     "x:F32[2,4,64,64] weight:F32[4,64,64] bias:F32[4,64,64] grad_out:F32[2,4,64,64] out:F32[2,4,64,64] "
     "grad.x:F32[2,4,64,64] grad.weight:F32[4,64,64] grad.bias:F32[4,64,64]",
     {{"x", 0, 0xbfcef7bd}, {"x", 5, 0x3f5c8528}, {"grad.bias", 16383, 0x3f858a20}}},
    {"layer_norm_multidim",
     "layer_norm",
     "F32",
     "x:F32[3,8,16] weight:F32[8,16] bias:F32[8,16] grad_out:F32[3,8,16] out:F32[3,8,16] grad.x:F32[3,8,16] "
     "grad.weight:F32[8,16] grad.bias:F32[8,16]",
     {{"x", 0, 0x3f6314d3}, {"x", 5, 0x3fa1fb8c}, {"grad.bias", 127, 0x3e580250}}},
    {"layer_norm_no_affine",
     "layer_norm",
     "F32",
     "x:F32[5,33] grad_out:F32[5,33] out:F32[5,33] grad.x:F32[5,33]",
     {{"x", 0, 0x3d87b747}, {"x", 5, 0x3fee0c32}, {"grad.x", 164, 0xbe8b498e}}},
    {"layer_norm_rows",
     "layer_norm",
     "F32",
     "x:F32[4,8,16] weight:F32[16] bias:F32[16] grad_out:F32[4,8,16] out:F32[4,8,16] grad.x:F32[4,8,16] "
     "grad.weight:F32[16] grad.bias:F32[16]",
     {{"x", 0, 0xbe9f6158}, {"x", 5, 0xbeb86983}, {"grad.bias", 15, 0xbfe636e8}}},
    {"linear",
     "linear",
     "F32",
     "x:F32[5,7] weight:F32[3,7] bias:F32[3] grad_out:F32[5,3] out:F32[5,3] grad.x:F32[5,7] "
     "grad.weight:F32[3,7] grad.bias:F32[3]",
     {{"x", 0, 0xc007216e}, {"x", 5, 0x4036fee1}, {"grad.bias", 2, 0xbfa5a60e}}},
    {"adaptive_avg_pool2d_1x1",
     "adaptive_avg_pool2d",
     "F32",
     "x:F32[2,5,7,7] grad_out:F32[2,5,1,1] out:F32[2,5,1,1] grad.x:F32[2,5,7,7]",
     {{"x", 0, 0x3ec2e9e3}, {"x", 246, 0x3e7f91fa}, {"grad.x", 489, 0x3cb92e34}}},
    {"avg_pool2d_2x2",
     "avg_pool2d",
     "F32",
     "x:F32[2,3,6,6] grad_out:F32[2,3,3,3] out:F32[2,3,3,3] grad.x:F32[2,3,6,6]",
     {{"x", 0, 0xbdf46025}, {"x", 109, 0xbe8abde8}, {"grad.x", 215, 0x3e9407ee}}},
    {"batch_norm_eval",
     "batch_norm",
     "F32",
     "x:F32[4,3,5,5] weight:F32[3] bias:F32[3] running_mean:F32[3] running_var:F32[3] grad_out:F32[4,3,5,5] out:F32[4,3,5,5] grad.x:F32[4,3,5,5] grad.weight:F32[3] grad.bias:F32[3]",
     {{"x", 0, 0xbf99c17a}, {"x", 151, 0x3f0f3ec5}, {"grad.bias", 2, 0x4045d2af}}},
    {"batch_norm_train",
     "batch_norm",
     "F32",
     "x:F32[4,3,5,5] weight:F32[3] bias:F32[3] running_mean:F32[3] running_var:F32[3] grad_out:F32[4,3,5,5] out:F32[4,3,5,5] grad.x:F32[4,3,5,5] grad.weight:F32[3] grad.bias:F32[3] after.running_mean:F32[3] after.running_var:F32[3]",
     {{"x", 0, 0x4078a507}, {"x", 151, 0x3fdf1db2}, {"after.running_var", 2, 0x3f7bb1f7}}},
    {"conv2d_basic",
     "conv2d",
     "F32",
     "x:F32[2,3,8,8] weight:F32[4,3,3,3] bias:F32[4] grad_out:F32[2,4,8,8] out:F32[2,4,8,8] grad.x:F32[2,3,8,8] grad.weight:F32[4,3,3,3] grad.bias:F32[4]",
     {{"x", 0, 0x3f32930b}, {"x", 193, 0x3fab6300}, {"grad.bias", 3, 0x40db36dc}}},
    {"conv2d_bf16",
     "conv2d",
     "BF16",
     "x:BF16[2,8,8,8] weight:BF16[8,8,3,3] bias:BF16[8] grad_out:BF16[2,8,8,8] out:BF16[2,8,8,8] grad.x:BF16[2,8,8,8] grad.weight:BF16[8,8,3,3] grad.bias:BF16[8]",
     {{"x", 0, 0x00003e60}, {"x", 513, 0x0000bea8}, {"grad.bias", 7, 0x0000408d}}},
    {"conv2d_groups",
     "conv2d",
     "F32",
     "x:F32[2,4,6,6] weight:F32[6,2,3,3] bias:F32[6] grad_out:F32[2,6,6,6] out:F32[2,6,6,6] grad.x:F32[2,4,6,6] grad.weight:F32[6,2,3,3] grad.bias:F32[6]",
     {{"x", 0, 0x3e719c12}, {"x", 145, 0x3ed9b2a4}, {"grad.bias", 5, 0x410c4792}}},
    {"conv2d_stride2_no_bias",
     "conv2d",
     "F32",
     "x:F32[1,4,9,9] weight:F32[6,4,3,3] grad_out:F32[1,6,4,4] out:F32[1,6,4,4] grad.x:F32[1,4,9,9] grad.weight:F32[6,4,3,3]",
     {{"x", 0, 0x3f7d0187}, {"x", 163, 0x3e075114}, {"grad.weight", 215, 0xbf528bb9}}},
    {"gelu_none",
     "gelu",
     "F32",
     "x:F32[4,33] grad_out:F32[4,33] out:F32[4,33] grad.x:F32[4,33]",
     {{"x", 0, 0x3e4dbd43}, {"x", 67, 0x3fb20d71}, {"grad.x", 131, 0xbf407f17}}},
    {"gelu_tanh",
     "gelu",
     "F32",
     "x:F32[4,33] grad_out:F32[4,33] out:F32[4,33] grad.x:F32[4,33]",
     {{"x", 0, 0x3f00164f}, {"x", 67, 0x3fa8874e}, {"grad.x", 131, 0x3d8706cf}}},
    {"log_softmax_dim0",
     "log_softmax",
     "F32",
     "x:F32[7,3] grad_out:F32[7,3] out:F32[7,3] grad.x:F32[7,3]",
     {{"x", 0, 0xbe28ad25}, {"x", 11, 0x40d540f6}, {"grad.x", 20, 0xbf8944a4}}},
    {"max_pool2d_2x2",
     "max_pool2d",
     "F32",
     "x:F32[2,3,8,8] grad_out:F32[2,3,4,4] out:F32[2,3,4,4] grad.x:F32[2,3,8,8]",
     {{"x", 0, 0xc02acd1a}, {"x", 193, 0x3dfe5e6c}, {"grad.x", 383, 0x00000000}}},
    {"max_pool2d_3x3_s2_p1",
     "max_pool2d",
     "F32",
     "x:F32[1,2,7,7] grad_out:F32[1,2,4,4] out:F32[1,2,4,4] grad.x:F32[1,2,7,7]",
     {{"x", 0, 0xbf3109cd}, {"x", 50, 0x3ed2c5de}, {"grad.x", 97, 0x00000000}}},
    {"rms_norm_bf16",
     "rms_norm",
     "BF16",
     "x:BF16[4,16,256] weight:BF16[256] grad_out:BF16[4,16,256] out:BF16[4,16,256] grad.x:BF16[4,16,256] "
     "grad.weight:BF16[256]",
     {}},
    {"rms_norm_rows",
     "rms_norm",
     "F32",
     "x:F32[8,64] weight:F32[64] grad_out:F32[8,64] out:F32[8,64] grad.x:F32[8,64] grad.weight:F32[64]",
     {{"x", 0, 0x4030beff}, {"x", 511, 0xbfa6f7a9}, {"grad.x", 256, 0x3de4627e}}},
    {"sdpa_basic",
     "scaled_dot_product_attention",
     "F32",
     "q:F32[2,2,8,16] k:F32[2,2,8,16] v:F32[2,2,8,16] grad_out:F32[2,2,8,16] out:F32[2,2,8,16] "
     "grad.q:F32[2,2,8,16] grad.k:F32[2,2,8,16] grad.v:F32[2,2,8,16]",
     {{"q", 0, 0xbfa90ba9}, {"q", 511, 0x3f8d2829}, {"grad.q", 256, 0x3e97ffd1}}},
    {"sdpa_causal",
     "scaled_dot_product_attention",
     "F32",
     "q:F32[1,4,16,32] k:F32[1,4,16,32] v:F32[1,4,16,32] grad_out:F32[1,4,16,32] out:F32[1,4,16,32] "
     "grad.q:F32[1,4,16,32] grad.k:F32[1,4,16,32] grad.v:F32[1,4,16,32]",
     {{"q", 0, 0x3f81b5b9}, {"q", 2047, 0x401189a0}, {"grad.q", 1200, 0xbec332f2}}},
    {"sdpa_causal_bf16",
     "scaled_dot_product_attention",
     "BF16",
     "q:BF16[2,2,64,64] k:BF16[2,2,64,64] v:BF16[2,2,64,64] grad_out:BF16[2,2,64,64] out:BF16[2,2,64,64] "
     "grad.q:BF16[2,2,64,64] grad.k:BF16[2,2,64,64] grad.v:BF16[2,2,64,64]",
     {}},
    {"softmax_last",
     "softmax",
     "F32",
     "x:F32[5,17] grad_out:F32[5,17] out:F32[5,17] grad.x:F32[5,17]",
     {{"x", 0, 0x3fcb116c}, {"x", 43, 0xbfc888cb}, {"grad.x", 84, 0x3d3a3568}}},
};

uint32_t element_bits(const nc::Tensor& t, int64_t index) {
  const nc::Tensor host = t.to(nc::Device::cpu()).contiguous();
  const uint8_t* data = static_cast<const uint8_t*>(host.data_ptr()) + index * host.element_size();
  uint32_t bits = 0;
  std::memcpy(&bits, data, host.element_size());  // little-endian host
  return bits;
}

TEST(SafetensorsConformance, EveryCaseReads) {
  const fs::path dir = fs::path(NORMCORE_TEST_DATA_DIR) / "conformance";
  std::set<std::string> on_disk;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") on_disk.insert(entry.path().stem().string());
  std::set<std::string> listed;
  for (const auto& c : kConformanceCases) listed.insert(c.file);
  EXPECT_EQ(on_disk, listed) << "every case file needs a row here";

  for (const auto& c : kConformanceCases) {
    SCOPED_TRACE(c.file);
    const std::string path = (dir / (std::string(c.file) + ".safetensors")).string();
    const st::File file = st::load(path);
    EXPECT_EQ(file.source, path);
    EXPECT_EQ(layout(file), c.layout);
    EXPECT_EQ(file.metadata.at("op"), c.op);
    EXPECT_EQ(file.metadata.at("dtype"), c.dtype);
    for (const char* key : {"attrs", "rtol", "atol", "grad_rtol", "grad_atol"})
      EXPECT_TRUE(file.metadata.count(key)) << key;
    for (const auto& v : c.values)
      EXPECT_EQ(element_bits(file.at(v.tensor), v.index), v.bits) << v.tensor << "[" << v.index << "]";

    // Saving what was read and reading it back changes nothing.
    const auto bytes = st::save_bytes(file.tensors, file.metadata);
    const st::File again = st::load_bytes(bytes.data(), bytes.size());
    EXPECT_EQ(layout(again), c.layout);
    EXPECT_EQ(again.metadata, file.metadata);
    for (size_t i = 0; i < file.tensors.size(); ++i)
      EXPECT_EQ(bytes_of(again.tensors[i].second), bytes_of(file.tensors[i].second)) << file.tensors[i].first;
  }
}

// ---- malformed files ----

// A valid file: two tensors tiling 19 data bytes, and metadata.
const std::string kValidHeader = R"({"__metadata__":{"k":"v"},)"
                                 R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                                 R"("b":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}})";
constexpr size_t kValidDataBytes = 19;

std::vector<uint8_t> with_header(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> bytes;
  bytes.reserve(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i)));
  for (char c : header) bytes.push_back(static_cast<uint8_t>(c));
  for (size_t i = 0; i < data_bytes; ++i) bytes.push_back(static_cast<uint8_t>(i % 2));
  return bytes;
}

// The valid header with one substring replaced.
std::string edited(const std::string& from, const std::string& to) {
  std::string header = kValidHeader;
  const size_t at = header.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? header : header.replace(at, from.size(), to);
}

void set_length_prefix(std::vector<uint8_t>& bytes, uint64_t length) {
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(length >> (8 * i));
}

struct MalformedCase {
  const char* name;
  std::function<std::vector<uint8_t>()> make_bytes;
  const char* reason;  // must appear in the error message
};

std::vector<MalformedCase> malformed_cases() {
  const auto header_only = [](std::string header, size_t data_bytes = kValidDataBytes) {
    return [=] { return with_header(header, data_bytes); };
  };
  const auto valid_then = [](std::function<void(std::vector<uint8_t>&)> edit) {
    return [=] {
      auto bytes = with_header(kValidHeader, kValidDataBytes);
      edit(bytes);
      return bytes;
    };
  };
  const std::string a_entry = R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  return {
      {"empty_file", [] { return std::vector<uint8_t>(); }, "shorter than 8 bytes"},
      {"shorter_than_prefix", valid_then([](auto& b) { b.resize(5); }), "shorter than 8 bytes"},
      {"truncated_header", valid_then([](auto& b) { b.resize(40); }), "exceeds"},
      {"truncated_data", valid_then([](auto& b) { b.pop_back(); }), "beyond the data area"},
      {"header_length_past_end", valid_then([](auto& b) { set_length_prefix(b, b.size()); }), "exceeds"},
      {"huge_header_length", valid_then([](auto& b) { set_length_prefix(b, uint64_t(1) << 62); }), "too large"},
      {"zero_header_length", valid_then([](auto& b) { set_length_prefix(b, 0); }), "not well-formed JSON"},
      {"bad_json", header_only(R"({"a":{"dtype":"F32",)"), "not well-formed JSON"},
      {"invalid_utf8", header_only(edited("\"v\"", "\"\xc3\x28\"")), "not well-formed JSON"},
      {"trailing_garbage_in_header", header_only(kValidHeader + "x"), "not well-formed JSON"},
      {"json_array", header_only("[1, 2]", 0), "not an object"},
      {"json_string", header_only("\"safetensors\"", 0), "not an object"},
      {"entry_not_object", header_only(edited(a_entry, R"("a":[0,16])"), 3), "not an object"},
      {"missing_dtype", header_only(edited(R"("dtype":"F32",)", "")), "missing \"dtype\""},
      {"missing_shape", header_only(edited(R"("shape":[2,2],)", "")), "missing \"shape\""},
      {"missing_offsets", header_only(edited(R"(,"data_offsets":[0,16])", "")), "missing \"data_offsets\""},
      {"extra_key", header_only(edited(R"("dtype":"F32")", R"("dtype":"F32","x":1)")), "unexpected key \"x\""},
      {"dtype_not_string", header_only(edited(R"("F32")", "4")), "\"dtype\" is a JSON number"},
      {"unknown_dtype", header_only(edited(R"("F32")", R"("Q7")")), "unsupported dtype \"Q7\""},
      {"unsupported_dtype", header_only(edited(R"("U8")", R"("I8")")), "tensor \"b\": unsupported dtype \"I8\""},
      {"float8_dtype", header_only(edited(R"("U8")", R"("F8_E4M3")")), "unsupported dtype \"F8_E4M3\""},
      {"shape_not_array", header_only(edited("[2,2]", "4")), "\"shape\" is a JSON number"},
      {"negative_shape", header_only(edited("[2,2]", "[-2,-2]")), "is negative"},
      {"fractional_shape", header_only(edited("[2,2]", "[2.0,2]")), "not an integer"},
      {"string_shape", header_only(edited("[2,2]", R"([2,"2"])")), "not an integer"},
      {"overflowing_shape", header_only(edited("[2,2]", "[1099511627776,1099511627776]")), "overflows"},
      {"overflow_before_zero", header_only(edited("[2,2]", "[4294967296,4294967296,4294967296,0]")), "overflows"},
      {"count_above_int64", header_only(edited(R"("U8","shape":[3])", R"("U8","shape":[4294967296,2147483648])")),
       "overflows the element count"},
      {"overflowing_bytes", header_only(edited("[2,2]", "[4611686018427387904]")), "overflows the byte count"},
      {"dim_above_int64", header_only(edited("[2,2]", "[18446744073709551615]")), "overflows"},
      {"offsets_not_pair", header_only(edited("[0,16]", "[0,8,16]")), "not an array [begin, end]"},
      {"negative_offset", header_only(edited("[0,16]", "[-1,16]")), "is negative"},
      {"offsets_out_of_order", header_only(edited("[0,16]", "[16,0]")), "out of order"},
      {"offsets_out_of_range", header_only(edited("[16,19]", "[100,103]")), "beyond the data area"},
      {"overlapping_offsets", header_only(edited("[16,19]", "[15,18]")), "overlap"},
      {"empty_inside_other",
       header_only(edited(R"("U8","shape":[3],"data_offsets":[16,19])", R"("U8","shape":[0],"data_offsets":[8,8])"),
                   16),
       "overlap"},
      {"hole_between", header_only(edited("[16,19]", "[17,20]"), 20), "hole"},
      {"not_starting_at_zero",
       header_only(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[1,17]},)"
                   R"("b":{"dtype":"U8","shape":[3],"data_offsets":[17,20]}})",
                   20),
       "hole"},
      {"trailing_data", header_only(kValidHeader, kValidDataBytes + 8), "trailing 8 bytes"},
      {"size_mismatch", header_only(edited("[2,2]", "[2,3]")), "size mismatch"},
      {"metadata_not_object", header_only(edited(R"({"k":"v"})", R"("v")")), "\"__metadata__\" is a JSON string"},
      {"metadata_number_value", header_only(edited(R"("v")", "1")), "value for \"k\" is a JSON number"},
      {"metadata_object_value", header_only(edited(R"("v")", R"({"x":"y"})")), "not a string"},
      {"duplicate_tensor", header_only(edited(a_entry, a_entry + "," + a_entry)), "duplicate key \"a\""},
      {"duplicate_entry_key", header_only(edited(R"("dtype":"F32")", R"("dtype":"F32","dtype":"F32")")),
       "duplicate key \"dtype\""},
      {"invalid_bool",
       [] {
         auto bytes = with_header(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", 0);
         bytes.insert(bytes.end(), {1, 0, 2});
         return bytes;
       },
       "invalid BOOL byte 2"},
  };
}

TEST(SafetensorsMalformed, ValidBaseFileLoads) {
  const auto bytes = with_header(kValidHeader, kValidDataBytes);
  const st::File file = st::load_bytes(bytes.data(), bytes.size());
  EXPECT_EQ(layout(file), "a:F32[2,2] b:U8[3]");
  EXPECT_EQ(file.metadata.at("k"), "v");
}

class SafetensorsMalformedFiles : public SafetensorsFiles {};

TEST_F(SafetensorsMalformedFiles, EachDefectIsAnIOError) {
  for (const auto& c : malformed_cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> bytes = c.make_bytes();
    expect_io_error([&] { st::load_bytes(bytes.data(), bytes.size()); }, "<memory>", c.reason);
    const std::string path = (dir_ / (std::string(c.name) + ".safetensors")).string();
    write_all(path, bytes);
    expect_io_error([&] { st::load(path); }, path, c.reason);
  }
}

TEST_F(SafetensorsMalformedFiles, MissingFileOrDirectory) {
  const std::string missing = (dir_ / "missing.safetensors").string();
  expect_io_error([&] { st::load(missing); }, missing, "cannot open");
  expect_io_error([&] { st::load(dir_.string()); }, dir_.string(), "not a regular file");
}

}  // namespace
