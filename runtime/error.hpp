// dsec::errc, dsec::error and dsec::expected<T>: how everything in dsec fails.
//
// runtime/ never includes CAF, so it carries its own small expected<T>. The codes
// are the project's one error enum; actors/ registers it with CAF and converts an
// error into caf::error without losing the code.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace dsec {

/// The project's error codes, grouped by what the caller should do about them.
enum class errc : uint8_t {
  // 1..19: the request is wrong. Fix it; retrying it unchanged fails again.
  invalid_argument = 1, ///< malformed input: a name, a size, a flag
  not_found = 2,        ///< an unknown layer, sandbox or file
  already_exists = 3,   ///< the name is taken (layer versions are immutable)
  wrong_kind = 4,       ///< e.g. a tool layer given where a base layer belongs
  in_use = 5,           ///< refused while something still uses it
  malformed = 6,        ///< bytes that do not parse as the expected message (a wire frame)
  too_large = 7,        ///< over a size limit (a frame, a message)
  unauthenticated = 8,  ///< a missing or wrong credential (e.g. a Chronus token)
  unauthorized = 9,     ///< an internal verb without the daemon's or cluster's key
  closed = 10,          ///< it was closed (a session, a sandbox): make a new one
  paused = 11,          ///< the sandbox is paused (`dsec pause`): resume it first
  // 20..39: the request is fine but cannot be served now. Back off and retry.
  overloaded = 20,      ///< out of slots, pids, memory or another capacity
  // 40..59: something failed while serving the request. Report it.
  system_error = 40,    ///< a system call failed (see error::sys_errno)
  tool_failed = 41,     ///< an external tool (mkfs.erofs, tar) failed
  timeout = 42,         ///< a deadline passed
  sandbox_failed = 43,  ///< the sandbox broke its contract with dsec
  // 60..79: the other side went away. Reconnect.
  disconnected = 60,
  lost = 61,            ///< the node running it was lost (a sandbox, with its state)
  // 80..99: not available on this machine or build. Fall back.
  unsupported = 80,
};

/// A stable lower-case name of the code, e.g. "not_found".
const char* to_string(errc code) noexcept;

/// What failed, where, and why. `step` names the creation step (or the verb),
/// `path` the file or object that failed, `sys_errno` the errno if any.
struct error {
  errc code = errc::system_error;
  std::string message;   ///< a sentence for a human, naming the bad input
  std::string step;      ///< e.g. "mount_layers", "attach_root"
  std::string path;      ///< e.g. "/var/lib/dsec/blobs/sha256/ab..."
  int sys_errno = 0;

  /// "step 'attach_root' failed on /mnt: Operation not permitted" style text.
  [[nodiscard]] std::string to_string() const;

  /// Adds the step name if none was set yet; returns *this for chaining.
  error& in_step(std::string_view s) &;
  error&& in_step(std::string_view s) &&;
};

/// Makes an error from a code and message.
[[nodiscard]] error make_error(errc code, std::string message);

/// Makes a system_error from errno: "WHAT PATH: strerror(errno)".
[[nodiscard]] error sys_error(std::string_view what, std::string_view path = {},
                              int err = -1);

/// A value or an error. Small on purpose: runtime/ cannot use caf::expected.
template <class T>
class [[nodiscard]] expected {
public:
  expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  expected(error err) : v_(std::in_place_index<1>, std::move(err)) {}

  explicit operator bool() const noexcept { return v_.index() == 0; }
  bool has_value() const noexcept { return v_.index() == 0; }

  T& value() & { check(); return std::get<0>(v_); }
  const T& value() const& { check(); return std::get<0>(v_); }
  T&& value() && { check(); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  error& error_value() & { return std::get<1>(v_); }
  const error& error_value() const& { return std::get<1>(v_); }
  error&& error_value() && { return std::get<1>(std::move(v_)); }

private:
  void check() const {
    if (v_.index() != 0)
      std::abort(); // a bug: value() on an error
  }
  std::variant<T, error> v_;
};

template <>
class [[nodiscard]] expected<void> {
public:
  expected() = default;
  expected(error err) : err_(std::move(err)), ok_(false) {}

  explicit operator bool() const noexcept { return ok_; }
  bool has_value() const noexcept { return ok_; }
  error& error_value() & { return err_; }
  const error& error_value() const& { return err_; }
  error&& error_value() && { return std::move(err_); }

private:
  error err_;
  bool ok_ = true;
};

/// Propagates an error from an expected<T> expression out of the current function.
#define DSEC_TRY(var, expr)                                                    \
  auto var##_result = (expr);                                                  \
  if (!var##_result)                                                           \
    return std::move(var##_result).error_value();                              \
  auto var = std::move(*var##_result)

#define DSEC_TRY_VOID(expr)                                                    \
  do {                                                                         \
    auto dsec_try_result_ = (expr);                                            \
    if (!dsec_try_result_)                                                     \
      return std::move(dsec_try_result_).error_value();                        \
  } while (false)

} // namespace dsec
