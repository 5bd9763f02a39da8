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

namespace {

struct helper_args {
  int ready_w;
  int done_r;
};

// Runs in the helper: created directly in the new user namespace, sharing our
// memory (CLONE_VM: no page tables to copy), so only raw system calls here.
int helper_main(void* p) {
  auto* a = static_cast<helper_args*>(p);
  char c = 'y';
  (void) !::write(a->ready_w, &c, 1);
  (void) !::read(a->done_r, &c, 1); // EOF: the parent is done with us
  return 0;
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
  // The helper runs on this stack until we reap it below (one per thread, in
  // case two threads make namespaces at once).
  alignas(16) static thread_local char stack[16 * 1024];
  helper_args args{ready[1], done[0]};
  pid_t pid = ::clone(helper_main, stack + sizeof stack,
                      CLONE_VM | CLONE_NEWUSER | SIGCHLD, &args);
  if (pid < 0)
    return make_error(errc::unsupported,
                      std::string{"cannot create a user namespace: "} + std::strerror(errno)
                        + " (check user.max_user_namespaces)");
  auto reap = [&] {
    // Wake the helper with a byte: it has its own copy of done_w (no
    // CLONE_FILES), so closing ours would not give it EOF.
    char c = 'x';
    (void) !::write(done_w.get(), &c, 1);
    int st;
    sys::retry([&] { return ::waitpid(pid, &st, 0); });
  };
  char c = 'n';
  if (sys::retry([&] { return ::read(ready_r.get(), &c, 1); }) != 1 || c != 'y') {
    reap();
    return make_error(errc::system_error, "the user namespace helper did not start");
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
