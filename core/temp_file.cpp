// TempFile: write next to the target, flush, rename over it (see temp_file.h), and the
// clean-up of the temporary files that killed writers left.
#include "core/temp_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "normcore/error.h"

namespace normcore {
namespace detail {
namespace {

std::string errno_text() { return std::strerror(errno); }

// The prefix of the temporary files that writes to target create: ".<name>.tmp.", then the
// writer's process id and a counter.
std::string temporary_prefix(const std::filesystem::path& target) { return "." + target.filename().string() + ".tmp."; }

// A process killed inside a write leaves its temporary file. Removes those of target's
// that belong to a process that no longer exists and have not been written for a while
// (a process id seen from another pid namespace or machine sharing the directory may look
// dead while it still writes). Best effort: what cannot be read or removed stays.
constexpr auto kStaleTemporaryAge = std::chrono::minutes(10);

void remove_stale_temporaries(const std::filesystem::path& dir, const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  const std::string prefix = temporary_prefix(target);
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos) continue;
    if (!std::all_of(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(dot),
                     [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    const long long pid = std::strtoll(rest.substr(0, dot).c_str(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || pid > std::numeric_limits<pid_t>::max()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to see
    std::error_code time_ec;
    const auto written = fs::last_write_time(it->path(), time_ec);
    if (time_ec || fs::file_time_type::clock::now() - written < kStaleTemporaryAge) continue;
    std::error_code remove_ec;
    fs::remove(it->path(), remove_ec);
  }
}

}  // namespace

template <class... Args>
void TempFile::fail(const Args&... args) const {
  throw IOError(cat_str(op_, ": ", target_, ": ", args...));
}

TempFile::TempFile(std::string op, std::string target) : op_(std::move(op)), target_(std::move(target)) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path path(target_);
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  dir_ = dir.string();
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    path_ = (dir / (temporary_prefix(path) + std::to_string(::getpid()) + "." + std::to_string(counter++))).string();
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) fail("cannot create a temporary file in ", dir_, " (", errno_text(), ")");
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(path_.c_str());
}

void TempFile::write(const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd_, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("cannot write ", path_, " (", errno_text(), ")");
    }
    bytes += written;
    size -= static_cast<size_t>(written);
  }
}

void TempFile::commit() {
  if (::fsync(fd_) != 0) fail("cannot flush ", path_, " to disk (", errno_text(), ")");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close ", path_, " (", errno_text(), ")");
  if (::rename(path_.c_str(), target_.c_str()) != 0) fail("cannot rename ", path_, " over it (", errno_text(), ")");
  committed_ = true;
  remove_stale_temporaries(dir_, target_);
  // Makes the rename itself durable. Some file systems cannot sync a directory; the new
  // file is already in place then, so that is not an error.
  const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace detail
}  // namespace normcore
