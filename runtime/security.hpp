// What a sandbox may not do: its seccomp filter, its Landlock scope and the
// capabilities it keeps. The filter is defined in security.cpp (with
// libseccomp) and compiled at build time (seccomp_gen.cpp); confine.cpp applies
// all of it in each sandbox's init with a few system calls and no allocation.
#pragma once

#include <linux/filter.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/error.hpp"

namespace dsec::security {

/// A compiled seccomp BPF program.
struct seccomp_program {
  std::vector<sock_filter> code;
};

/// The filter, in the spirit of Docker's default profile, as a deny list over an
/// allowed default: no mounting, no new namespaces (unshare, setns, clone with
/// CLONE_NEW*; clone3 answers ENOSYS so libc falls back to clone), no kernel
/// modules, kexec, bpf, perf_event_open, keyrings, io_uring, clock or swap
/// changes, reboot, open_by_handle_at, userfaultfd, TIOCSTI/TIOCLINUX terminal
/// injection; sockets of any family but unix, IPv4, IPv6 and netlink (the ones
/// a network namespace scopes: AF_VSOCK is not) answer EAFNOSUPPORT; syscalls of other ABIs (i386, x32) kill the process. ptrace,
/// process_vm_* and kcmp stay: gdb and strace work on the sandbox's own
/// processes (the pid namespace is the boundary).
expected<seccomp_program> build_seccomp_filter();

/// The syscall names the filter denies (for tests and docs).
const std::vector<const char*>& denied_syscalls();

/// Installs the program on the calling thread. Needs no_new_privs. 0 or -errno.
int install_seccomp(const seccomp_program& p);
int install_seccomp(const sock_filter* code, size_t len);

/// The highest Landlock ABI this kernel offers, 0 if none.
uint32_t landlock_abi();

/// Puts the caller in a new Landlock domain that scopes abstract unix sockets
/// and signals (ABI >= 6): processes in the sandbox cannot connect to abstract
/// sockets or signal processes outside it, including other sandboxes sharing
/// the same network namespace. 0 or -errno; a no-op returning 0 if abi < 6.
int restrict_landlock(uint32_t abi);

/// Capabilities the sandbox root keeps, relative to its own user namespace
/// (it has none on the host): chown, dac_override, fowner, fsetid, kill,
/// setgid, setuid, setpcap, net_bind_service. Everything else is dropped from
/// the bounding, permitted, effective, inheritable and ambient sets.
const std::vector<int>& kept_capabilities();

/// Removes every capability not kept from the bounding set, the limit of what
/// any later execve can gain. It does not touch the caller's current
/// capabilities, so the zygote does it once and every sandbox inherits it.
/// 0 or -errno.
int limit_bounding_set();

/// Drops every capability not kept from the permitted, effective, inheritable
/// and ambient sets of the caller (one capset), except those in `extra` (a mask
/// of 1 << CAP_X; a Chronus sandbox's init keeps CAP_SYS_CHROOT for its trusted
/// helper until it has forked it). Only async-signal-safe calls. 0 or -errno.
int drop_capabilities(uint64_t extra = 0);

} // namespace dsec::security
