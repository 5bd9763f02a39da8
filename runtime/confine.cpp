// Applying the sandbox's confinement inside the sandbox (see security.hpp). No
// libseccomp here: this runs in the zygote's sandbox inits.
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "runtime/security.hpp"

namespace dsec::security {

namespace {

// Landlock definitions newer than Debian 12's kernel headers (ABI 6, Linux 6.12).
struct landlock_ruleset_attr_v6 {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;
  uint64_t scoped;
};
constexpr uint32_t landlock_create_ruleset_version = 1U << 0;
constexpr uint64_t landlock_scope_abstract_unix_socket = 1ULL << 0;
constexpr uint64_t landlock_scope_signal = 1ULL << 1;

} // namespace

int install_seccomp(const sock_filter* code, size_t len) {
  sock_fprog prog{};
  prog.len = static_cast<unsigned short>(len);
  prog.filter = const_cast<sock_filter*>(code);
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
    return -errno;
  return 0;
}

int install_seccomp(const seccomp_program& p) {
  return install_seccomp(p.code.data(), p.code.size());
}

uint32_t landlock_abi() {
  long v = ::syscall(SYS_landlock_create_ruleset, nullptr, 0,
                     landlock_create_ruleset_version);
  return v > 0 ? static_cast<uint32_t>(v) : 0;
}

int restrict_landlock(uint32_t abi) {
  if (abi < 6)
    return 0;
  landlock_ruleset_attr_v6 attr{};
  attr.scoped = landlock_scope_abstract_unix_socket | landlock_scope_signal;
  int fd = static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));
  if (fd < 0)
    return -errno;
  int rc = static_cast<int>(::syscall(SYS_landlock_restrict_self, fd, 0));
  int err = errno;
  ::close(fd);
  return rc < 0 ? -err : 0;
}

const std::vector<int>& kept_capabilities() {
  static const std::vector<int> caps = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER,
                                        CAP_FSETID, CAP_KILL,         CAP_SETGID,
                                        CAP_SETUID, CAP_SETPCAP,      CAP_NET_BIND_SERVICE};
  return caps;
}

namespace {

uint64_t kept_mask() {
  uint64_t keep = 0;
  for (int c : kept_capabilities())
    keep |= 1ULL << c;
  return keep;
}

} // namespace

int limit_bounding_set() {
  uint64_t keep = kept_mask();
  for (int c = 0; c < 64; ++c) {
    if (keep & (1ULL << c))
      continue;
    if (::prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
      if (errno == EINVAL)
        break; // past the last capability this kernel knows
      return -errno;
    }
  }
  return 0;
}

int drop_capabilities(uint64_t extra) {
  uint64_t keep = kept_mask() | extra;
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
    return -errno;
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  data[0].effective = data[0].permitted = static_cast<uint32_t>(keep);
  data[1].effective = data[1].permitted = static_cast<uint32_t>(keep >> 32);
  if (::syscall(SYS_capset, &hdr, data) < 0)
    return -errno;
  return 0;
}

} // namespace dsec::security
