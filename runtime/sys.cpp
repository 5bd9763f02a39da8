#include "runtime/sys.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

// meson sets it for the host's build; seccomp_gen (a build-machine tool) has none.
#ifndef DSEC_LIBEXECDIR
#define DSEC_LIBEXECDIR "/usr/local/libexec/dsec"
#endif

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

namespace {

bool executable(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

} // namespace

expected<std::string> find_program(const char* env_var, const char* name,
                                   std::string_view what) {
  if (const char* env = std::getenv(env_var); env && *env) {
    if (!executable(env))
      return make_error(errc::not_found, std::string{env_var} + "=" + env
                                           + " is not an executable file");
    return std::string{env};
  }
  char self[PATH_MAX];
  auto n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    std::string dir{self};
    dir.resize(dir.rfind('/'));
    for (const auto& candidate : {dir + "/" + name, dir + "/../tools/" + name,
                                  dir + "/../libexec/dsec/" + name})
      if (executable(candidate))
        return candidate;
  }
  std::string installed = std::string{DSEC_LIBEXECDIR "/"} + name;
  if (executable(installed))
    return installed;
  return make_error(errc::not_found, "cannot find " + std::string{what}
                                       + " (looked beside the dsec binary and in "
                                       DSEC_LIBEXECDIR "; set " + env_var + " to its path)");
}

} // namespace dsec::sys
