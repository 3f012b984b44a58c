// Replacing a file atomically: the writers of the library's file formats (safetensors, token
// shards) write to a temporary file next to the target, flush it to disk and rename it over
// the target, so the target holds either its old content or the complete new file.
#pragma once

#include <cstddef>
#include <string>

namespace normcore {
namespace detail {

// A file created next to the target (".<name>.tmp.<pid>.<counter>") that is removed unless
// commit() renamed it over the target; the guard is what keeps a failed write from leaving
// anything behind. Errors are IOErrors "<op>: <target>: <what failed>".
class TempFile {
 public:
  TempFile(std::string op, std::string target);
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile();

  void write(const void* data, size_t size);
  // Flushes the data to disk, closes the file and renames it over the target. Then removes
  // the temporary files of the target that writers killed earlier left behind (their process
  // gone, not written for 10 minutes).
  void commit();

 private:
  template <class... Args>
  [[noreturn]] void fail(const Args&... args) const;

  std::string op_;
  std::string target_;
  std::string dir_;
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace detail
}  // namespace normcore
