#include "runtime/error.hpp"

#include <cerrno>
#include <cstring>

namespace dsec {

const char* to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::not_found: return "not_found";
    case errc::already_exists: return "already_exists";
    case errc::wrong_kind: return "wrong_kind";
    case errc::in_use: return "in_use";
    case errc::malformed: return "malformed";
    case errc::too_large: return "too_large";
    case errc::unauthenticated: return "unauthenticated";
    case errc::unauthorized: return "unauthorized";
    case errc::closed: return "closed";
    case errc::paused: return "paused";
    case errc::overloaded: return "overloaded";
    case errc::system_error: return "system_error";
    case errc::tool_failed: return "tool_failed";
    case errc::timeout: return "timeout";
    case errc::sandbox_failed: return "sandbox_failed";
    case errc::disconnected: return "disconnected";
    case errc::lost: return "lost";
    case errc::unsupported: return "unsupported";
  }
  return "unknown";
}

std::string error::to_string() const {
  std::string out;
  if (!step.empty()) {
    out += "step '";
    out += step;
    out += "' failed: ";
  }
  out += message.empty() ? dsec::to_string(code) : message;
  // sys_error() already puts path and errno text into the message; only add
  // them when the message does not mention them.
  if (!path.empty() && out.find(path) == std::string::npos) {
    out += " (";
    out += path;
    out += ")";
  }
  if (sys_errno != 0) {
    const char* text = std::strerror(sys_errno);
    if (out.find(text) == std::string::npos) {
      out += ": ";
      out += text;
    }
  }
  return out;
}

error& error::in_step(std::string_view s) & {
  if (step.empty())
    step = s;
  return *this;
}

error&& error::in_step(std::string_view s) && {
  if (step.empty())
    step = s;
  return std::move(*this);
}

error make_error(errc code, std::string message) {
  error e;
  e.code = code;
  e.message = std::move(message);
  return e;
}

error sys_error(std::string_view what, std::string_view path, int err) {
  if (err < 0)
    err = errno;
  error e;
  e.code = err == ENOENT ? errc::not_found : errc::system_error;
  e.sys_errno = err;
  e.path = path;
  e.message = what;
  if (!path.empty()) {
    e.message += ' ';
    e.message += path;
  }
  e.message += ": ";
  e.message += std::strerror(err);
  return e;
}

} // namespace dsec
