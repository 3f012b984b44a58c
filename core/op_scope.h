// The op a thread is running, for errors raised far below the op's own checks: a CUDA call
// or launch that fails inside `add` reports `add: CUDA error ...`. The outermost scope wins,
// so `add` converting its operands with `to` still reports `add`, and a backward step
// reports the op it differentiates (`mul backward`).
#pragma once

#include <string>

namespace normcore {
namespace detail {

inline thread_local const char* current_op_name = nullptr;
inline thread_local const char* current_op_suffix = nullptr;

class OpScope {
 public:
  // op and suffix must outlive the scope (string literals, or names the caller keeps).
  explicit OpScope(const char* op, const char* suffix = nullptr) noexcept
      : active_(current_op_name == nullptr) {
    if (!active_) return;
    current_op_name = op;
    current_op_suffix = suffix;
  }
  ~OpScope() {
    if (!active_) return;
    current_op_name = nullptr;
    current_op_suffix = nullptr;
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  bool active_;
};

// "add", "mul backward", "AdamW.step"; empty outside every scope.
inline std::string current_op() {
  if (current_op_name == nullptr) return {};
  std::string name = current_op_name;
  if (current_op_suffix != nullptr) name += current_op_suffix;
  return name;
}

}  // namespace detail
}  // namespace normcore
