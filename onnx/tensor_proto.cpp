// ONNX TensorProto -> normcore tensors (onnx/proto.h): the element types normcore has, the
// data from raw_data (little-endian bytes) or the typed fields, every size checked against
// the dims before anything is allocated.
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "onnx/proto.h"

namespace normcore {
namespace onnx {

DType dtype_of(int elem_type, const std::string& where) {
  using TP = ::onnx::TensorProto;
  switch (elem_type) {
    case TP::FLOAT: return DType::F32;
    case TP::DOUBLE: return DType::F64;
    case TP::FLOAT16: return DType::F16;
    case TP::BFLOAT16: return DType::BF16;
    case TP::INT32: return DType::I32;
    case TP::INT64: return DType::I64;
    case TP::UINT8: return DType::U8;
    case TP::BOOL: return DType::Bool;
    default: break;
  }
  throw DTypeError(detail::cat_str(where, ": element type ", ::onnx::TensorProto_DataType_Name(elem_type), " (",
                                   elem_type,
                                   ") is not one normcore has (float, double, float16, bfloat16, int32, int64, "
                                   "uint8, bool)"));
}

int elem_type_of(DType dtype) {
  using TP = ::onnx::TensorProto;
  switch (dtype) {
    case DType::F32: return TP::FLOAT;
    case DType::F64: return TP::DOUBLE;
    case DType::F16: return TP::FLOAT16;
    case DType::BF16: return TP::BFLOAT16;
    case DType::I32: return TP::INT32;
    case DType::I64: return TP::INT64;
    case DType::U8: return TP::UINT8;
    case DType::Bool: return TP::BOOL;
  }
  return TP::UNDEFINED;
}

Tensor from_proto(const ::onnx::TensorProto& t, const std::string& where) {
  const DType dtype = dtype_of(t.data_type(), where);
  NC_CHECK(t.data_location() != ::onnx::TensorProto::EXTERNAL, ValueError, where,
           ": data in an external file is not read (only data inside the model)");
  Shape shape;
  int64_t numel = 1;
  for (int64_t d : t.dims()) {
    NC_CHECK(d >= 0, IOError, where, ": dims hold ", d, " (negative)");
    NC_CHECK(d == 0 || numel <= std::numeric_limits<int64_t>::max() / d, IOError, where, ": dims overflow 64 bits");
    numel *= d;
    shape.push_back(d);
  }
  const size_t elem = dtype_size(dtype);
  const auto expect_count = [&](int64_t count, const char* field) {
    NC_CHECK(count == numel, IOError, where, ": ", field, " holds ", count, " values but the dims ", shape_str(shape),
             " call for ", numel);
  };
  if (t.has_raw_data()) {
    const std::string& raw = t.raw_data();
    NC_CHECK(numel <= static_cast<int64_t>(raw.size() / elem) && raw.size() == static_cast<size_t>(numel) * elem,
             IOError, where, ": raw_data holds ", raw.size(), " bytes but the dims ", shape_str(shape), " call for ",
             numel, " values of ", elem, " bytes");
    Tensor out = empty(shape, dtype);
    if (numel) std::memcpy(out.data_ptr(), raw.data(), raw.size());
    return out;
  }
  // The typed field's count is checked against the dims before anything is allocated.
  switch (dtype) {
    case DType::F32: expect_count(t.float_data_size(), "float_data"); break;
    case DType::F64: expect_count(t.double_data_size(), "double_data"); break;
    case DType::I64: expect_count(t.int64_data_size(), "int64_data"); break;
    default: expect_count(t.int32_data_size(), "int32_data");
  }
  Tensor out = empty(shape, dtype);
  switch (dtype) {
    case DType::F32:
      if (numel) std::memcpy(out.data_ptr(), t.float_data().data(), sizeof(float) * numel);
      break;
    case DType::F64:
      if (numel) std::memcpy(out.data_ptr(), t.double_data().data(), sizeof(double) * numel);
      break;
    case DType::I64:
      if (numel) std::memcpy(out.data_ptr(), t.int64_data().data(), sizeof(int64_t) * numel);
      break;
    default: {
      // int32_data: int32 values, and the bits of float16, bfloat16, uint8 and bool ones.
      auto* bytes = static_cast<unsigned char*>(out.data_ptr());
      for (int64_t i = 0; i < numel; ++i) {
        const int32_t v = t.int32_data(static_cast<int>(i));
        if (elem == 4) std::memcpy(bytes + 4 * i, &v, 4);
        else if (elem == 2) {
          const uint16_t bits = static_cast<uint16_t>(v);
          std::memcpy(bytes + 2 * i, &bits, 2);
        } else {
          bytes[i] = static_cast<unsigned char>(dtype == DType::Bool ? v != 0 : v);
        }
      }
    }
  }
  return out;
}

Tensor read_tensor_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  NC_CHECK(in, IOError, path, ": cannot open");
  std::stringstream bytes;
  bytes << in.rdbuf();
  ::onnx::TensorProto t;
  NC_CHECK(t.ParseFromString(bytes.str()), IOError, path, ": not an ONNX TensorProto");
  return from_proto(t, path);
}

}  // namespace onnx
}  // namespace normcore
