// Error types thrown by normcore, and the check macro every public entry point uses.
// Contract: a public op validates its arguments before touching memory and throws one
// of these with a message of the form "<op>: <argument> <what is wrong> (<shapes/dtypes>)".
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Shapes that do not fit the op (broadcasting, matmul inner sizes, view sizes).
class ShapeError : public Error {
  using Error::Error;
};
// A dtype the op does not support, or mismatched dtypes where they must agree.
class DTypeError : public Error {
  using Error::Error;
};
// Tensors on different devices, an unknown device, or CUDA asked for where there is none.
class DeviceError : public Error {
  using Error::Error;
};
// A dim or an index outside its range.
class IndexError : public Error {
  using Error::Error;
};
// A bad value that is neither shape, dtype, device nor index (negative step, NaN bound).
class ValueError : public Error {
  using Error::Error;
};
// Files: missing, truncated, malformed.
class IOError : public Error {
  using Error::Error;
};
// An allocation that cannot be satisfied even after the cache was freed.
class OutOfMemoryError : public Error {
  using Error::Error;
};
// A failed CUDA, cuBLAS or cuDNN call (with the expression, file and line).
class CudaError : public Error {
  using Error::Error;
};
// Work that a CUDA graph capture cannot record: a read of device values on the host, a
// copy from host memory, an optimizer without state, a changing learning rate.
class CaptureError : public Error {
  using Error::Error;
};
// Several processes that cannot work together: a peer that cannot be reached or went away,
// a timeout, a failed collective (the message names the operation and the rank).
class DistributedError : public Error {
  using Error::Error;
};

namespace detail {

inline void append(std::ostringstream& s, const std::vector<int64_t>& v) {
  s << '[';
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << ']';
}
template <class T>
void append(std::ostringstream& s, const T& v) {
  s << v;
}

// Concatenates the arguments with operator<<; shapes print as [2, 3].
template <class... Args>
std::string cat_str(const Args&... args) {
  std::ostringstream s;
  (append(s, args), ...);
  return s.str();
}

}  // namespace detail
}  // namespace normcore

// Throws ErrorType with the concatenated message when cond is false.
#define NC_CHECK(cond, ErrorType, ...)                                                  \
  do {                                                                                  \
    if (!(cond)) throw ::normcore::ErrorType(::normcore::detail::cat_str(__VA_ARGS__)); \
  } while (0)

#pragma GCC visibility pop
