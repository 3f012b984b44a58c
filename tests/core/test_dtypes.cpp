// DTypes, 16-bit floats and devices on the CPU: dtype tables and promotion, Half/BFloat16
// conversions bit by bit, device parsing and the errors of devices that are not there.
// Expected values are written out by hand (or follow from IEEE 754 bit layouts).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "normcore/normcore.h"
#include "tests/test_support.h"

namespace nc = normcore;
using nc::DType;
using nc::Tensor;
using normcore_test::kAllDTypes;

namespace {

float bits_float(uint32_t bits) { return nc::bits_to_float(bits); }

}  // namespace

// ---------------------------------------------------------------- dtypes
TEST(DType, SizesNamesAndKinds) {
  struct Row {
    DType dtype;
    size_t size;
    const char* name;
    bool floating;
  };
  const Row rows[] = {
      {DType::F32, 4, "f32", true},   {DType::F64, 8, "f64", true},    {DType::F16, 2, "f16", true},
      {DType::BF16, 2, "bf16", true}, {DType::I32, 4, "i32", false},   {DType::I64, 8, "i64", false},
      {DType::U8, 1, "u8", false},    {DType::Bool, 1, "bool", false},
  };
  ASSERT_EQ(std::size(rows), static_cast<size_t>(nc::kNumDTypes));
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(nc::dtype_size(r.dtype), r.size);
    EXPECT_STREQ(nc::dtype_name(r.dtype), r.name);
    EXPECT_EQ(nc::dtype_from_name(r.name), r.dtype);
    EXPECT_EQ(nc::is_floating(r.dtype), r.floating);
    std::ostringstream s;
    s << r.dtype;
    EXPECT_EQ(s.str(), r.name);
  }
  EXPECT_THROW(nc::dtype_from_name("float32"), nc::DTypeError);
  EXPECT_THROW(nc::dtype_from_name(""), nc::DTypeError);
}

TEST(DType, HostTypesMapToDTypes) {
  static_assert(nc::dtype_of<float>::value == DType::F32);
  static_assert(nc::dtype_of<double>::value == DType::F64);
  static_assert(nc::dtype_of<nc::Half>::value == DType::F16);
  static_assert(nc::dtype_of<nc::BFloat16>::value == DType::BF16);
  static_assert(nc::dtype_of<int32_t>::value == DType::I32);
  static_assert(nc::dtype_of<int64_t>::value == DType::I64);
  static_assert(nc::dtype_of<uint8_t>::value == DType::U8);
  static_assert(nc::dtype_of<bool>::value == DType::Bool);
  static_assert(sizeof(nc::Half) == 2 && sizeof(nc::BFloat16) == 2);
  SUCCEED();
}

TEST(DType, PromotionTable) {
  // Rows and columns in kAllDTypes order: f32 f64 f16 bf16 i32 i64 u8 bool.
  using D = DType;
  const DType table[8][8] = {
      /* f32  */ {D::F32, D::F64, D::F32, D::F32, D::F32, D::F32, D::F32, D::F32},
      /* f64  */ {D::F64, D::F64, D::F64, D::F64, D::F64, D::F64, D::F64, D::F64},
      /* f16  */ {D::F32, D::F64, D::F16, D::F32, D::F16, D::F16, D::F16, D::F16},
      /* bf16 */ {D::F32, D::F64, D::F32, D::BF16, D::BF16, D::BF16, D::BF16, D::BF16},
      /* i32  */ {D::F32, D::F64, D::F16, D::BF16, D::I32, D::I64, D::I32, D::I32},
      /* i64  */ {D::F32, D::F64, D::F16, D::BF16, D::I64, D::I64, D::I64, D::I64},
      /* u8   */ {D::F32, D::F64, D::F16, D::BF16, D::I32, D::I64, D::U8, D::U8},
      /* bool */ {D::F32, D::F64, D::F16, D::BF16, D::I32, D::I64, D::U8, D::Bool},
  };
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) {
      SCOPED_TRACE(std::string(nc::dtype_name(kAllDTypes[i])) + " + " + nc::dtype_name(kAllDTypes[j]));
      EXPECT_EQ(nc::promote_types(kAllDTypes[i], kAllDTypes[j]), table[i][j]);
    }
}

// ---------------------------------------------------------------- Half / BFloat16
TEST(Half, EveryNonNaNBitPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    uint16_t bits = static_cast<uint16_t>(b);
    float f = nc::half_bits_to_float(bits);
    bool is_nan = (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      continue;
    }
    ASSERT_EQ(nc::float_to_half_bits(f), bits) << std::hex << b;
    ASSERT_EQ(nc::Half(static_cast<float>(nc::Half::from_bits(bits))).bits, bits) << std::hex << b;
  }
}

TEST(Half, BitsToFloat) {
  struct Row {
    uint16_t bits;
    float value;
  };
  const Row rows[] = {
      {0x3c00, 1.0f},
      {0xc000, -2.0f},
      {0x7bff, 65504.0f},
      {0x0001, std::ldexp(1.0f, -24)},
      {0x03ff, std::ldexp(1023.0f, -24)},
      {0x0400, std::ldexp(1.0f, -14)},
      {0x3555, 0.333251953125f},
      {0x7c00, INFINITY},
      {0xfc00, -INFINITY},
      {0x0000, 0.0f},
  };
  for (const Row& r : rows) EXPECT_EQ(nc::half_bits_to_float(r.bits), r.value) << std::hex << r.bits;
  float neg_zero = nc::half_bits_to_float(0x8000);
  EXPECT_EQ(neg_zero, 0.0f);
  EXPECT_TRUE(std::signbit(neg_zero));
  EXPECT_TRUE(std::isnan(nc::half_bits_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(nc::half_bits_to_float(0x7c01)));
}

TEST(Half, FloatToBitsRoundsToNearestEven) {
  struct Row {
    const char* what;
    float value;
    uint16_t bits;
  };
  const float two_m11 = std::ldexp(1.0f, -11), two_m25 = std::ldexp(1.0f, -25);
  const Row rows[] = {
      {"one", 1.0f, 0x3c00},
      {"minus two", -2.0f, 0xc000},
      {"exact next after one", 1.0f + 2 * two_m11, 0x3c01},
      {"tie below goes to even (down)", 1.0f + two_m11, 0x3c00},
      {"tie above odd goes to even (up)", 1.0f + 3 * two_m11, 0x3c02},
      {"just above a tie rounds up", 1.0f + two_m11 + std::ldexp(1.0f, -20), 0x3c01},
      {"negative tie", -(1.0f + two_m11), 0xbc00},
      {"tie at 2048 (spacing 2)", 2049.0f, 0x6800},
      {"tie at 2051 goes to 2052", 2051.0f, 0x6802},
      {"largest finite", 65504.0f, 0x7bff},
      {"below the overflow tie", 65519.99609375f, 0x7bff},
      {"overflow tie goes to inf", 65520.0f, 0x7c00},
      {"overflow", 1e6f, 0x7c00},
      {"negative overflow", -1e6f, 0xfc00},
      {"float max", std::numeric_limits<float>::max(), 0x7c00},
      {"inf", INFINITY, 0x7c00},
      {"-inf", -INFINITY, 0xfc00},
      {"zero", 0.0f, 0x0000},
      {"negative zero", -0.0f, 0x8000},
      {"smallest subnormal", std::ldexp(1.0f, -24), 0x0001},
      {"negative smallest subnormal", -std::ldexp(1.0f, -24), 0x8001},
      {"half the smallest subnormal ties to zero", two_m25, 0x0000},
      {"just above half the smallest subnormal", two_m25 + std::ldexp(1.0f, -35), 0x0001},
      {"subnormal tie 1.5 goes to 2", 3 * two_m25, 0x0002},
      {"subnormal tie 2.5 goes to 2", 5 * two_m25, 0x0002},
      {"largest subnormal", std::ldexp(1023.0f, -24), 0x03ff},
      {"subnormal rounding into the smallest normal", std::ldexp(1.0f, -14) - two_m25, 0x0400},
      {"smallest normal", std::ldexp(1.0f, -14), 0x0400},
      {"far below the subnormals", 1e-10f, 0x0000},
      {"negative, far below the subnormals", -1e-10f, 0x8000},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    EXPECT_EQ(nc::float_to_half_bits(r.value), r.bits);
    EXPECT_EQ(nc::Half(r.value).bits, r.bits);
  }
}

TEST(Half, NaNStaysNaN) {
  const float nans[] = {NAN, -NAN, bits_float(0x7f800001u), bits_float(0xffc00000u)};
  for (float f : nans) {
    uint16_t h = nc::float_to_half_bits(f);
    EXPECT_EQ(h & 0x7c00u, 0x7c00u);
    EXPECT_NE(h & 0x03ffu, 0u);
    EXPECT_TRUE(std::isnan(static_cast<float>(nc::Half(f))));
  }
}

TEST(BFloat16, EveryNonNaNBitPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    uint16_t bits = static_cast<uint16_t>(b);
    float f = nc::bf16_bits_to_float(bits);
    EXPECT_EQ(nc::float_to_bits(f), b << 16);
    bool is_nan = (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      continue;
    }
    ASSERT_EQ(nc::float_to_bf16_bits(f), bits) << std::hex << b;
    ASSERT_EQ(nc::BFloat16(static_cast<float>(nc::BFloat16::from_bits(bits))).bits, bits) << std::hex << b;
  }
}

TEST(BFloat16, FloatToBitsRoundsToNearestEven) {
  struct Row {
    const char* what;
    float value;
    uint16_t bits;
  };
  const float two_m8 = std::ldexp(1.0f, -8);
  const Row rows[] = {
      {"one", 1.0f, 0x3f80},
      {"tie below goes to even (down)", 1.0f + two_m8, 0x3f80},
      {"tie above odd goes to even (up)", 1.0f + 3 * two_m8, 0x3f82},
      {"just above a tie rounds up", 1.0f + two_m8 + std::ldexp(1.0f, -20), 0x3f81},
      {"negative", -2.5f, 0xc020},
      {"largest finite", bits_float(0x7f7f0000u), 0x7f7f},
      {"float max rounds to inf", std::numeric_limits<float>::max(), 0x7f80},
      {"negative float max rounds to -inf", -std::numeric_limits<float>::max(), 0xff80},
      {"inf", INFINITY, 0x7f80},
      {"-inf", -INFINITY, 0xff80},
      {"negative zero", -0.0f, 0x8000},
      {"subnormal, exact", bits_float(0x00010000u), 0x0001},
      {"subnormal tie goes to even (up)", bits_float(0x00018000u), 0x0002},
      {"subnormal tie goes to even (down)", bits_float(0x00008000u), 0x0000},
      {"smallest float subnormal", bits_float(0x00000001u), 0x0000},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    EXPECT_EQ(nc::float_to_bf16_bits(r.value), r.bits);
    EXPECT_EQ(nc::BFloat16(r.value).bits, r.bits);
  }
  EXPECT_EQ(nc::bf16_bits_to_float(0x3f80), 1.0f);
}

TEST(BFloat16, NaNStaysNaN) {
  // A signalling NaN whose payload sits in the low 16 bits must not truncate to inf.
  const float nans[] = {NAN, bits_float(0x7f800001u), bits_float(0xff800001u)};
  for (float f : nans) {
    uint16_t b = nc::float_to_bf16_bits(f);
    EXPECT_EQ(b & 0x7f80u, 0x7f80u) << std::hex << b;
    EXPECT_NE(b & 0x007fu, 0u) << std::hex << b;
  }
  EXPECT_EQ(nc::float_to_bf16_bits(bits_float(0xff800001u)) & 0x8000u, 0x8000u);
}

// ---------------------------------------------------------------- devices
TEST(Device, ParsesSpecs) {
  struct Row {
    const char* spec;
    nc::DeviceType type;
    int index;
    const char* str;
  };
  const Row rows[] = {
      {"cpu", nc::DeviceType::CPU, 0, "cpu"},           {"cuda", nc::DeviceType::CUDA, 0, "cuda:0"},
      {"cuda:0", nc::DeviceType::CUDA, 0, "cuda:0"},    {"cuda:1", nc::DeviceType::CUDA, 1, "cuda:1"},
      {"cuda:12", nc::DeviceType::CUDA, 12, "cuda:12"},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.spec);
    nc::Device d(r.spec);
    EXPECT_EQ(d.type, r.type);
    EXPECT_EQ(d.index, r.index);
    EXPECT_EQ(d.str(), r.str);
    std::ostringstream s;
    s << d;
    EXPECT_EQ(s.str(), r.str);
    EXPECT_EQ(d.is_cpu(), r.type == nc::DeviceType::CPU);
    EXPECT_EQ(d.is_cuda(), r.type == nc::DeviceType::CUDA);
  }
  EXPECT_EQ(nc::Device("cpu"), nc::Device::cpu());
  EXPECT_EQ(nc::Device("cuda:1"), nc::Device::cuda(1));
  EXPECT_NE(nc::Device::cuda(0), nc::Device::cuda(1));
  EXPECT_NE(nc::Device::cpu(), nc::Device::cuda(0));
  EXPECT_EQ(nc::Device(), nc::Device::cpu());
  EXPECT_EQ(nc::Device::cuda(), nc::Device(nc::DeviceType::CUDA, 0));
}

TEST(Device, RejectsBadSpecs) {
  const char* bad[] = {"",        "gpu",    "CPU",  "Cuda",  "cuda:",      "cuda:-1", "cuda:x",
                       "cuda:1a", "cuda 1", " cpu", "cpu:0", "cuda:12345", "cuda::1"};
  for (const char* spec : bad) {
    SCOPED_TRACE(spec);
    try {
      nc::Device d(spec);
      ADD_FAILURE() << "parsed as " << d;
    } catch (const nc::DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("Device"), std::string::npos) << e.what();
    }
  }
}

TEST(Device, AvailabilityIsConsistent) {
  int count = nc::cuda_device_count();
  EXPECT_GE(count, 0);
  EXPECT_EQ(nc::cuda_is_available(), count > 0);
  EXPECT_EQ(nc::best_device(), count > 0 ? nc::Device::cuda(0) : nc::Device::cpu());
}

TEST(Device, MissingCudaDeviceThrowsDeviceError) {
  if (nc::cuda_device_count() > 7) GTEST_SKIP() << "this machine has a cuda:7";
  const nc::Device missing = nc::Device::cuda(7);
  Tensor x = nc::ones({2});
  const std::function<void()> calls[] = {
      [&] { nc::zeros({2}, missing); },
      [&] { nc::empty({2}, missing); },
      [&] { nc::full({2}, 1.5, nc::TensorOptions(DType::F64, missing)); },
      [&] { nc::rand({2}, missing); },
      [&] { x.to(missing); },
      [&] {
        nc::from_vector<float>({1, 2}, {2}, missing);
      },
  };
  for (size_t i = 0; i < std::size(calls); ++i) {
    SCOPED_TRACE(i);
    EXPECT_THROW(calls[i](), nc::DeviceError);
  }
}

TEST(Device, PinnedMemoryNeedsCuda) {
  if (nc::cuda_is_available()) {
    Tensor p = nc::ones({3}).pin_memory();
    EXPECT_TRUE(p.is_pinned());
    EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{1, 1, 1}));
    EXPECT_TRUE(nc::empty({2}, nc::TensorOptions().with_pinned()).is_pinned());
  } else {
    EXPECT_THROW(nc::ones({3}).pin_memory(), nc::DeviceError);
    EXPECT_THROW(nc::empty({2}, nc::TensorOptions().with_pinned()), nc::DeviceError);
  }
  EXPECT_FALSE(nc::ones({3}).is_pinned());
  EXPECT_THROW(nc::empty({2}, nc::TensorOptions(nc::Device::cuda(0)).with_pinned()), nc::DeviceError);
}
