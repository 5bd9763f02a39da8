// Thin wrappers over system calls that glibc 2.36 does not wrap (the new mount API,
// pidfds, clone3) and a retry-on-EINTR helper. Errors keep errno and the path.
#pragma once

#include <fcntl.h>
#include <linux/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string_view>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

namespace dsec::sys {

/// Calls f() until it does not fail with EINTR.
template <class F>
auto retry(F&& f) {
  auto r = f();
  while (r == -1 && errno == EINTR)
    r = f();
  return r;
}

inline int fsopen(const char* fs, unsigned flags) {
  return static_cast<int>(::syscall(SYS_fsopen, fs, flags));
}
inline int fsconfig(int fd, unsigned cmd, const char* key, const void* value,
                    int aux) {
  return static_cast<int>(::syscall(SYS_fsconfig, fd, cmd, key, value, aux));
}
inline int fsmount(int fd, unsigned flags, unsigned attrs) {
  return static_cast<int>(::syscall(SYS_fsmount, fd, flags, attrs));
}
inline int move_mount(int from_fd, const char* from, int to_fd, const char* to,
                      unsigned flags) {
  return static_cast<int>(
    ::syscall(SYS_move_mount, from_fd, from, to_fd, to, flags));
}
inline int open_tree(int dfd, const char* path, unsigned flags) {
  return static_cast<int>(::syscall(SYS_open_tree, dfd, path, flags));
}
inline int mount_setattr(int dfd, const char* path, unsigned flags,
                         struct mount_attr* attr) {
  return static_cast<int>(
    ::syscall(SYS_mount_setattr, dfd, path, flags, attr, sizeof(*attr)));
}
inline int pidfd_open(pid_t pid, unsigned flags) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, flags));
}
inline int pidfd_send_signal(int pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}
inline int close_range(unsigned first, unsigned last, unsigned flags) {
  return static_cast<int>(::syscall(SYS_close_range, first, last, flags));
}

/// Reads the kernel's messages for a filesystem context (fsopen fd), e.g.
/// "erofs: cannot find valid erofs superblock", so an error can say why.
/// One of dsec's own programs (the zygote, the Chronus client): `$env_var` when
/// set (it must be executable), else `name` beside this program, in ../tools/
/// (a build tree) or ../libexec/dsec/, else the installed one in
/// DSEC_LIBEXECDIR. errc::not_found names where it looked and `env_var`.
expected<std::string> find_program(const char* env_var, const char* name,
                                   std::string_view what);

std::string fs_context_log(int fs_fd);

/// Runs a fsconfig/fsmount sequence step and turns a failure into an error that
/// carries the kernel's own explanation from the context log.
error fs_error(int fs_fd, std::string_view what, std::string_view path);

} // namespace dsec::sys
