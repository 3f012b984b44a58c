// The op a thread is running, for errors raised far below the op's own checks: a CUDA call
// or launch that fails inside `add` reports `add: CUDA error ...`. The outermost scope wins,
// so `add` converting its operands with `to` still reports `add`, and a backward step
// reports the op it differentiates (`mul backward`).
//
// A front end opens its scope once and uses it as its name: `const OpScope op("add");`
// then `check_defined(op, "a", a)` and `NC_CHECK(..., op, ": ...")`.
#pragma once

#include <ostream>
#include <string>

namespace normcore {
namespace detail {

inline thread_local const char* current_op_name = nullptr;
inline thread_local const char* current_op_suffix = nullptr;

class OpScope {
 public:
  // op and suffix must outlive the scope (string literals, or names the caller keeps).
  explicit OpScope(const char* op, const char* suffix = nullptr) noexcept
      : name_(op), active_(current_op_name == nullptr) {
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

  // This scope's own op (not the outermost one): what its front end's errors name.
  const char* name() const { return name_; }
  operator const char*() const { return name_; }

 private:
  const char* name_;
  bool active_;
};

inline std::ostream& operator<<(std::ostream& os, const OpScope& op) { return os << op.name(); }

// "add", "mul backward", "AdamW.step"; empty outside every scope.
inline std::string current_op() {
  if (current_op_name == nullptr) return {};
  std::string name = current_op_name;
  if (current_op_suffix != nullptr) name += current_op_suffix;
  return name;
}

}  // namespace detail
}  // namespace normcore
