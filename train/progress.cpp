// The progress line of a training run (normcore/train.h: Progress): a bar redrawn in place
// on a terminal, a line every tenth of the way in a log.
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "normcore/train.h"

namespace normcore {
namespace train {

Progress::Progress(std::string label, int64_t total, std::string unit, int64_t first)
    : label_(std::move(label)), unit_(std::move(unit)), total_(std::max<int64_t>(total, 1)),
      printed_tenths_(first * 10 / total_), tty_(isatty(STDOUT_FILENO)), start_(std::chrono::steady_clock::now()) {}

void Progress::update(int64_t done, int64_t amount, double loss) {
  const double seconds = elapsed();
  const double rate = seconds > 0 ? static_cast<double>(amount) / seconds : 0;
  if (tty_) {
    const int width = 30;
    const int filled = static_cast<int>(width * done / total_);
    std::printf("\r%s [%s%s] %lld/%lld loss %.4f %.0f %s/s ", label_.c_str(), std::string(filled, '=').c_str(),
                std::string(width - filled, ' ').c_str(), static_cast<long long>(done), static_cast<long long>(total_),
                loss, rate, unit_.c_str());
    std::fflush(stdout);
  } else if (done == total_ || done * 10 / total_ > printed_tenths_) {
    printed_tenths_ = done * 10 / total_;
    std::printf("%s step %lld/%lld loss %.4f %.0f %s/s\n", label_.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), loss, rate, unit_.c_str());
    std::fflush(stdout);
  }
}

void Progress::finish() {
  if (tty_) std::printf("\n");
}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace train
}  // namespace normcore
