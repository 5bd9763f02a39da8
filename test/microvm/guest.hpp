// The microVM suites' guest: tools/microvm-guest run once per test executable
// (at registration, so that a machine that cannot have one skips), cached in
// the build tree ($DSEC_MICROVM_CACHE) by its inputs' digests.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "test/support/process.hpp"

namespace dsec::test {

/// The directory with vmlinux and initrd.cpio; empty when qemu or the guest
/// cannot be had (the reason is printed).
inline const std::string& microvm_guest_dir() {
  static const std::string dir = [] {
    const char* script = std::getenv("DSEC_MICROVM_SCRIPT");
    const char* agent = std::getenv("DSEC_GUEST_AGENT");
    const char* cache = std::getenv("DSEC_MICROVM_CACHE");
    if (!script || !agent || !cache) {
      std::fprintf(stderr, "[microvm] DSEC_MICROVM_SCRIPT, DSEC_GUEST_AGENT or DSEC_MICROVM_CACHE unset\n");
      return std::string();
    }
    if (::access("/usr/bin/qemu-system-x86_64", X_OK) != 0) {
      std::fprintf(stderr, "[microvm] no /usr/bin/qemu-system-x86_64 (tools/setup installs it)\n");
      return std::string();
    }
    spawn_options so;
    so.kill_after = std::chrono::seconds(600);
    auto r = run_process({script, "--guest", agent, "--cache", cache}, so);
    if (r.status != 0) {
      std::fprintf(stderr, "[microvm] tools/microvm-guest failed: %s\n", r.describe().c_str());
      return std::string();
    }
    auto out = r.out;
    while (!out.empty() && out.back() == '\n')
      out.pop_back();
    return out;
  }();
  return dir;
}

inline bool have_microvm_guest() { return !microvm_guest_dir().empty(); }

} // namespace dsec::test
