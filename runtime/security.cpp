#include "runtime/security.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dsec::security {

namespace {

const std::vector<const char*> denied = {
  // mounting and namespaces
  "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig",
  "fsmount", "fspick", "mount_setattr", "unshare", "setns",
  // the kernel itself
  "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
  "bpf", "perf_event_open", "reboot", "swapon", "swapoff", "acct", "iopl", "ioperm",
  "syslog", "lookup_dcookie", "quotactl", "quotactl_fd", "nfsservctl", "uselib",
  "sysfs", "_sysctl", "vhangup",
  // keyrings are not namespaced
  "keyctl", "add_key", "request_key",
  // clocks are not namespaced
  "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
  // file handles bypass the mount namespace; userfaultfd and io_uring are large
  // attack surfaces agents do not need
  "open_by_handle_at", "name_to_handle_at", "userfaultfd", "io_uring_setup",
  "io_uring_enter", "io_uring_register",
};

} // namespace

const std::vector<const char*>& denied_syscalls() {
  return denied;
}

expected<seccomp_program> build_seccomp_filter() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx)
    return make_error(errc::system_error, "seccomp_init failed");
  struct ctx_guard {
    scmp_filter_ctx c;
    ~ctx_guard() { seccomp_release(c); }
  } guard{ctx};
  auto fail = [](const char* what, int rc) {
    return make_error(errc::system_error, std::string{"building the seccomp filter: "}
                                            + what + ": " + std::strerror(-rc));
  };
  // Other ABIs reach the kernel with other syscall numbers: kill them outright
  // rather than let them around the deny list.
  if (int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS); rc < 0)
    return fail("bad-arch action", rc);
  // A binary tree over the syscall numbers instead of a linear chain: the
  // kernel emulates the filter for every syscall number when it is installed
  // (to cache the always-allowed ones), so a short path per syscall makes
  // installing it, once per sandbox, several times cheaper.
  if (int rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2); rc < 0)
    return fail("optimize attribute", rc);
  // We set no_new_privs ourselves, in the right order.
  if (int rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0); rc < 0)
    return fail("nnp attribute", rc);
  for (const char* name : denied) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR)
      continue; // not on this architecture
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0); rc < 0)
      return fail(name, rc);
  }
  // clone3 passes its flags in memory a filter cannot read: say it does not
  // exist, and libc falls back to clone(2), whose flags we can check.
  if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0); rc < 0)
    return fail("clone3", rc);
  for (unsigned long flag : {CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
                             CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP}) {
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                  SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
        rc < 0)
      return fail("clone", rc);
  }
  // Socket families: only those a network namespace scopes, and that a "no
  // network" sandbox (an empty namespace of its own) therefore cannot use to
  // leave the machine or reach the host: unix, IPv4, IPv6 and netlink. Every
  // other family answers as if the kernel had none: AF_VSOCK above all (it
  // reaches the hypervisor and its services from any namespace), and the
  // rarely needed, often buggy rest (AF_ALG, AF_PACKET, AF_XDP, AF_TIPC,
  // AF_RDS, AF_BLUETOOTH...). The family is an int; a0 is compared as 64
  // bits, so garbage in the high bits lands in the ">= 17" rule.
  for (int nr : {SCMP_SYS(socket), SCMP_SYS(socketpair)}) {
    auto deny = [&](scmp_compare op, scmp_datum_t v) {
      return seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), nr, 1, SCMP_A0(op, v));
    };
    static_assert(AF_UNIX == 1 && AF_INET == 2 && AF_INET6 == 10 && AF_NETLINK == 16);
    int rc = deny(SCMP_CMP_GE, AF_NETLINK + 1);
    for (scmp_datum_t f = 0; rc == 0 && f < AF_NETLINK; ++f)
      if (f != AF_UNIX && f != AF_INET && f != AF_INET6)
        rc = deny(SCMP_CMP_EQ, f);
    if (rc < 0)
      return fail("socket families", rc);
  }
  // Injecting input into a terminal handed in from the host (CVE-2017-5226).
  for (unsigned long req : {static_cast<unsigned long>(TIOCSTI),
                            static_cast<unsigned long>(TIOCLINUX)}) {
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                                  SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, req));
        rc < 0)
      return fail("ioctl", rc);
  }
  // Export the BPF through a pipe-like memfd.
  int fd = static_cast<int>(::syscall(SYS_memfd_create, "dsec-seccomp", MFD_CLOEXEC));
  if (fd < 0)
    return sys_error("memfd_create for the seccomp filter");
  struct fd_guard {
    int fd;
    ~fd_guard() { ::close(fd); }
  } fguard{fd};
  if (int rc = seccomp_export_bpf(ctx, fd); rc < 0)
    return fail("export", rc);
  off_t len = ::lseek(fd, 0, SEEK_END);
  if (len <= 0 || len % static_cast<off_t>(sizeof(sock_filter)) != 0)
    return make_error(errc::system_error, "building the seccomp filter: bad export size");
  seccomp_program p;
  p.code.resize(static_cast<size_t>(len) / sizeof(sock_filter));
  if (::pread(fd, p.code.data(), static_cast<size_t>(len), 0) != len)
    return sys_error("reading the seccomp filter");
  return p;
}

} // namespace dsec::security
