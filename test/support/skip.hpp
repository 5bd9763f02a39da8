// Test cases that cannot run on this machine are reported as skipped, never
// as passed. doctest 2.4 has no skip from inside a running test case, but its
// decorators are evaluated when a test case registers, at program start: so
//
//   TEST_CASE("..." * skip_unless(landlock_scoping(), "needs Landlock ABI 6")) {...}
//
// decides at run time, on this machine, before main; doctest then counts the
// case in its "N skipped" (and tools/test in its closing line), and the reason
// is printed once on stderr. Header-only: the unit tests (which do not link
// test/support) use it too. The conditions only read /proc and /dev; they make
// nothing.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/cgroup.hpp"
#include "runtime/security.hpp"

namespace dsec::test {

/// doctest::skip(!run), saying why on stderr when it skips.
inline doctest::skip skip_unless(bool run, const char* why) {
  if (!run)
    std::fprintf(stderr, "[skip] %s\n", why);
  return doctest::skip(!run);
}

/// Landlock ABI 6 (Linux 6.12): scoped signals and abstract sockets, which
/// Chronus sandboxes need.
inline bool landlock_scoping() {
  return security::landlock_abi() >= 6;
}

namespace detail {
inline std::string slurp_proc(const char* path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
} // namespace detail

/// The cgroup version that serves a controller for this process (from
/// /proc/self/cgroup and mountinfo alone; v2 needs its cgroup.controllers).
inline cgroup_version cgroup_version_of(cgroup_controller c) {
  auto self = detail::slurp_proc("/proc/self/cgroup");
  auto mi = detail::slurp_proc("/proc/self/mountinfo");
  auto layout = cgroup_layout::parse(self, mi, {});
  if (!layout)
    return cgroup_version::absent;
  if (!layout->v2_dir.empty()) {
    auto ctl = detail::slurp_proc((layout->v2_dir + "/cgroup.controllers").c_str());
    if (auto full = cgroup_layout::parse(self, mi, ctl))
      return full->preferred(c);
  }
  return layout->preferred(c);
}

/// This process has capability `cap` (e.g. CAP_SYS_RESOURCE) in its effective
/// set, as /proc/self/status says.
inline bool has_capability(int cap) {
  auto status = detail::slurp_proc("/proc/self/status");
  auto p = status.find("CapEff:");
  if (p == std::string::npos)
    return false;
  unsigned long long eff = std::strtoull(status.c_str() + p + 7, nullptr, 16);
  return (eff >> cap) & 1;
}

/// The kernel can mount an EROFS image through a loop device (`mount -o loop`).
inline bool loop_erofs_mounts() {
  auto fs = detail::slurp_proc("/proc/filesystems");
  return ::access("/dev/loop-control", R_OK | W_OK) == 0
         && fs.find("\terofs\n") != std::string::npos;
}

} // namespace dsec::test
