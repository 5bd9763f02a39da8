#include "runtime/userns.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "runtime/sys.hpp"

namespace dsec {

namespace {

expected<void> write_file(const char* path, const char* text) {
  unique_fd fd{::open(path, O_WRONLY | O_CLOEXEC)};
  if (!fd)
    return sys_error("open", path);
  auto len = std::strlen(text);
  if (::write(fd.get(), text, len) != static_cast<ssize_t>(len))
    return sys_error("write", path);
  return {};
}

} // namespace

expected<unique_fd> make_userns(const id_range& ids) {
  int ready[2], done[2];
  if (::pipe2(ready, O_CLOEXEC) < 0)
    return sys_error("pipe2");
  unique_fd ready_r{ready[0]}, ready_w{ready[1]};
  if (::pipe2(done, O_CLOEXEC) < 0)
    return sys_error("pipe2");
  unique_fd done_r{done[0]}, done_w{done[1]};
  pid_t pid = ::fork();
  if (pid < 0)
    return sys_error("fork for the user namespace");
  if (pid == 0) {
    // Async-signal-safe only: the parent may be multithreaded.
    ::close(ready[0]);
    ::close(done[1]); // else the read below never sees EOF
    char c = ::unshare(CLONE_NEWUSER) == 0 ? 'y' : 'n';
    (void) !::write(ready[1], &c, 1);
    (void) !::read(done[0], &c, 1);
    ::_exit(0);
  }
  ready_w.reset();
  done_r.reset();
  auto reap = [&] {
    done_w.reset();
    int st;
    sys::retry([&] { return ::waitpid(pid, &st, 0); });
  };
  char c = 'n';
  if (sys::retry([&] { return ::read(ready_r.get(), &c, 1); }) != 1 || c != 'y') {
    reap();
    return make_error(errc::unsupported,
                      "cannot create a user namespace (unshare(CLONE_NEWUSER) failed; "
                      "check user.max_user_namespaces)");
  }
  char path[64], map[64];
  std::snprintf(map, sizeof map, "0 %u %u\n", ids.base, ids.count);
  expected<void> ok;
  std::snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
  ok = write_file(path, map);
  if (ok) {
    std::snprintf(path, sizeof path, "/proc/%d/gid_map", pid);
    ok = write_file(path, map);
  }
  unique_fd ns;
  if (ok) {
    std::snprintf(path, sizeof path, "/proc/%d/ns/user", pid);
    ns.reset(::open(path, O_RDONLY | O_CLOEXEC));
    if (!ns)
      ok = sys_error("open", path);
  }
  reap();
  if (!ok)
    return std::move(ok).error_value();
  return ns;
}

} // namespace dsec
