// Shared by the fuzz targets: what counts as a finding, and a private file per process for
// readers that take a path.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "normcore/error.h"
#include "normcore/tensor.h"

namespace normcore_fuzz {

// Runs f; a normcore::Error is the expected way to reject input, any other exception is a
// finding and aborts (libFuzzer then keeps the input).
template <class F>
void expect_only_normcore_errors(F&& f) {
  try {
    f();
  } catch (const normcore::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finding: an exception that is not a normcore::Error: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "finding: an exception that is not a std::exception\n");
    std::abort();
  }
}

// A property of the input's result that must hold; when it does not, a finding.
inline void require(bool holds, const char* property) {
  if (holds) return;
  std::fprintf(stderr, "finding: %s\n", property);
  std::abort();
}

// Reads every byte of t, so that a tensor over memory it does not own shows up under
// AddressSanitizer.
inline void touch(const normcore::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  const normcore::Tensor c = t.contiguous();
  const auto* bytes = static_cast<const volatile uint8_t*>(c.data_ptr());
  uint8_t sum = 0;
  for (size_t i = 0; i < c.nbytes(); ++i) sum = static_cast<uint8_t>(sum + bytes[i]);
  (void)sum;
}

// Writes data to a file only this process uses (under $TMPDIR or /tmp) and returns its path.
inline std::string write_private_file(const char* what, const uint8_t* data, size_t size) {
  const char* dir = std::getenv("TMPDIR");
  const std::string path =
      std::string(dir && *dir ? dir : "/tmp") + "/normcore_fuzz_" + what + "_" + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::abort();
  }
  if (size > 0 && std::fwrite(data, 1, size, f) != size) {
    std::perror(path.c_str());
    std::abort();
  }
  std::fclose(f);
  return path;
}

}  // namespace normcore_fuzz
