#include "runtime/userns.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/sys.hpp"

namespace dsec {

namespace {

constexpr size_t helper_stack_size = 64 * 1024;

expected<void> write_file(const char* path, const char* text) {
  unique_fd fd{::open(path, O_WRONLY | O_CLOEXEC)};
  if (!fd)
    return sys_error("open", path);
  auto len = std::strlen(text);
  if (::write(fd.get(), text, len) != static_cast<ssize_t>(len))
    return sys_error("write", path);
  return {};
}

struct helper_args {
  int commands; // read end
  int answers;  // write end
};

// Runs in the helper: created directly in the new user namespace, sharing our
// memory (CLONE_VM: no page tables to copy), so only raw system calls here.
int helper_main(void* p) {
  auto* a = static_cast<helper_args*>(p);
  int commands = a->commands, answers = a->answers; // `a` lives on the caller's stack
  // Our copy of the caller's descriptor table holds everything it had open
  // (other helpers' pipes, zygote sockets, mounts): keep only our two pipes, so
  // that we never delay anyone else's EOF or release.
  unsigned lo = static_cast<unsigned>(commands < answers ? commands : answers);
  unsigned hi = static_cast<unsigned>(commands < answers ? answers : commands);
  if (lo > 0)
    sys::close_range(0, lo - 1, 0);
  if (hi > lo + 1)
    sys::close_range(lo + 1, hi - 1, 0);
  sys::close_range(hi + 1, ~0U, 0);
  char c = 'y';
  (void) !::write(answers, &c, 1);
  while (::read(commands, &c, 1) == 1 && c != 'q') {
    if (c == 'n') {
      c = ::unshare(CLONE_NEWNET) == 0 ? 'n' : 'e';
      (void) !::write(answers, &c, 1);
    }
  }
  return 0; // 'q' or EOF: the caller is done with us
}

} // namespace

expected<userns_helper> userns_helper::start(const id_range& ids) {
  int cmd[2], ans[2];
  if (::pipe2(cmd, O_CLOEXEC) < 0)
    return sys_error("pipe2");
  unique_fd cmd_r{cmd[0]}, cmd_w{cmd[1]};
  if (::pipe2(ans, O_CLOEXEC) < 0)
    return sys_error("pipe2");
  unique_fd ans_r{ans[0]}, ans_w{ans[1]};
  userns_helper h;
  h.stack_ = ::mmap(nullptr, helper_stack_size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (h.stack_ == MAP_FAILED) {
    h.stack_ = nullptr;
    return sys_error("mmap of the user namespace helper's stack");
  }
  helper_args args{cmd[0], ans[1]};
  // The helper gets a copy of our descriptor table (no CLONE_FILES) and closes
  // all of it but its two pipe ends.
  h.pid_ = ::clone(helper_main, static_cast<char*>(h.stack_) + helper_stack_size,
                   CLONE_VM | CLONE_NEWUSER | SIGCHLD, &args);
  if (h.pid_ < 0)
    return make_error(errc::unsupported,
                      std::string{"cannot create a user namespace: "} + std::strerror(errno)
                        + " (check user.max_user_namespaces)");
  h.to_helper_ = std::move(cmd_w);
  h.from_helper_ = std::move(ans_r);
  cmd_r.reset();
  ans_w.reset();
  char c = 0;
  if (sys::retry([&] { return ::read(h.from_helper_.get(), &c, 1); }) != 1 || c != 'y')
    return make_error(errc::system_error, "the user namespace helper did not start");
  char path[64], map[64];
  std::snprintf(map, sizeof map, "%u %u %u\n", ids.inside, ids.base, ids.count);
  std::snprintf(path, sizeof path, "/proc/%d/uid_map", h.pid_);
  DSEC_TRY_VOID(write_file(path, map));
  std::snprintf(path, sizeof path, "/proc/%d/gid_map", h.pid_);
  DSEC_TRY_VOID(write_file(path, map));
  std::snprintf(path, sizeof path, "/proc/%d/ns/user", h.pid_);
  h.userns_.reset(::open(path, O_RDONLY | O_CLOEXEC));
  if (!h.userns_)
    return sys_error("open", path);
  return h;
}

expected<void> userns_helper::request_netns() {
  char c = 'n';
  if (sys::retry([&] { return ::write(to_helper_.get(), &c, 1); }) != 1)
    return sys_error("asking the user namespace helper for a network namespace");
  return {};
}

expected<unique_fd> userns_helper::take_netns() {
  char c = 0;
  if (sys::retry([&] { return ::read(from_helper_.get(), &c, 1); }) != 1)
    return make_error(errc::system_error, "the user namespace helper is gone");
  if (c != 'n')
    return make_error(errc::system_error,
                      "cannot create a network namespace (unshare(CLONE_NEWNET) failed)");
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/ns/net", pid_);
  unique_fd fd{::open(path, O_RDONLY | O_CLOEXEC)};
  if (!fd)
    return sys_error("open", path);
  return fd;
}

userns_helper::userns_helper(userns_helper&& other) noexcept
  : pid_(std::exchange(other.pid_, -1)),
    to_helper_(std::move(other.to_helper_)),
    from_helper_(std::move(other.from_helper_)),
    userns_(std::move(other.userns_)),
    stack_(std::exchange(other.stack_, nullptr)) {
}

void userns_helper::stop() noexcept {
  if (to_helper_) {
    char q = 'q';
    (void) !::write(to_helper_.get(), &q, 1);
    to_helper_.reset();
  }
  if (pid_ > 0) {
    int st;
    sys::retry([&] { return ::waitpid(pid_, &st, 0); });
    pid_ = -1;
  }
  if (stack_) {
    ::munmap(stack_, helper_stack_size);
    stack_ = nullptr;
  }
}

userns_helper::~userns_helper() {
  stop();
}

expected<unique_fd> make_userns(const id_range& ids) {
  DSEC_TRY(h, userns_helper::start(ids));
  return h.take_userns();
}

} // namespace dsec
