#include "runtime/sys.hpp"

#include <cstring>
#include <string>

namespace dsec::sys {

std::string fs_context_log(int fs_fd) {
  std::string out;
  char buf[512];
  for (;;) {
    auto n = ::read(fs_fd, buf, sizeof(buf) - 1);
    if (n <= 0)
      break;
    // Each message is "e <text>", "w <text>" or "i <text>".
    std::string_view line(buf, static_cast<size_t>(n));
    if (line.size() > 2 && line[1] == ' ')
      line.remove_prefix(2);
    if (!out.empty())
      out += "; ";
    out += line;
  }
  return out;
}

error fs_error(int fs_fd, std::string_view what, std::string_view path) {
  int err = errno;
  auto e = sys_error(what, path, err);
  auto log = fs_fd >= 0 ? fs_context_log(fs_fd) : std::string{};
  if (!log.empty()) {
    e.message += " (kernel: ";
    e.message += log;
    e.message += ')';
  }
  return e;
}

} // namespace dsec::sys
