// Scalar: a number passed to an op (fill values, clamp bounds, the other operand of
// x + 2). It keeps integers exact (int64) and floats as double.
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

// The library builds with hidden visibility; what an installed header declares is exported.
#pragma GCC visibility push(default)

namespace normcore {

class Scalar {
 public:
  Scalar() : is_int_(true), i_(0), d_(0) {}
  template <class T, std::enable_if_t<std::is_integral<T>::value, int> = 0>
  Scalar(T v)
      : is_int_(true), is_bool_(std::is_same<T, bool>::value), i_(static_cast<int64_t>(v)), d_(static_cast<double>(v)) {
  }
  template <class T, std::enable_if_t<std::is_floating_point<T>::value, int> = 0>
  Scalar(T v) : is_int_(false), i_(static_cast<int64_t>(0)), d_(static_cast<double>(v)) {}

  bool is_integral() const { return is_int_; }
  bool is_bool() const { return is_bool_; }
  double to_double() const { return d_; }
  int64_t to_int() const { return is_int_ ? i_ : static_cast<int64_t>(d_); }

 private:
  bool is_int_;
  bool is_bool_ = false;
  int64_t i_;
  double d_;
};

inline std::ostream& operator<<(std::ostream& os, const Scalar& s) {
  if (s.is_integral()) return os << s.to_int();
  return os << s.to_double();
}

}  // namespace normcore

#pragma GCC visibility pop
