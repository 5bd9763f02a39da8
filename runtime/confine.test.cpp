// Tests of runtime/confine's Landlock scoping, as a Chronus sandbox nests it:
// a process in the sandbox's domain ("trusted") and processes in a domain
// nested in it ("agent"). Everything runs in forked children that confine
// themselves like a sandbox's init (no_new_privs, the kept capabilities only),
// so this test process stays unconfined. Without the capabilities the sandbox
// drops the test would prove less: CAP_SYS_ADMIN, for one, lets a process read
// /proc/PID/environ across domains.
#include "runtime/security.hpp"
#include "test/support/skip.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

using namespace dsec;

namespace {

// What the caller can do to `pid`: one errno per attempt (0: it worked).
struct attempts {
  int ptrace = -1;
  int signal = -1;
  int environ = -1;
  int getfd = -1;
};

attempts try_all(pid_t pid) {
  attempts a;
  a.ptrace = ::ptrace(PTRACE_SEIZE, pid, 0, 0) == 0 ? 0 : errno;
  if (a.ptrace == 0) {
    // Detaching needs a stopped tracee.
    ::ptrace(PTRACE_INTERRUPT, pid, 0, 0);
    ::waitpid(pid, nullptr, __WALL);
    ::ptrace(PTRACE_DETACH, pid, 0, 0);
  }
  a.signal = ::kill(pid, 0) == 0 ? 0 : errno;
  std::string path = "/proc/" + std::to_string(pid) + "/environ";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  a.environ = fd >= 0 ? 0 : errno;
  if (fd >= 0)
    ::close(fd);
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  int got = pidfd < 0 ? -1 : static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, 0, 0));
  a.getfd = got >= 0 ? 0 : errno;
  if (got >= 0)
    ::close(got);
  if (pidfd >= 0)
    ::close(pidfd);
  return a;
}

// A child that waits until every write end of `hold` is closed (signals are
// no use: once the caller is in the nested domain it cannot signal it).
pid_t sleeper(int hold_read, int hold_write) {
  pid_t p = ::fork();
  if (p == 0) {
    ::close(hold_write);
    char c;
    while (::read(hold_read, &c, 1) > 0) {
    }
    ::_exit(0);
  }
  return p;
}

struct report {
  int setup = 0; // errno of a failed setup step
  attempts agent_on_trusted, agent_on_agent, trusted_on_agent;
};

[[noreturn]] void send_report(int out, const report& r) {
  (void) !::write(out, &r, sizeof r);
  ::_exit(0);
}

// In a forked child: confine itself like a sandbox's init, fork a "trusted"
// sleeper and a "trusted" prober in that domain, enter the nested domain and
// fork an "agent" sleeper; then try everything on both sleepers from the
// nested domain, and have the prober try everything on the agent's. Writes a
// report to `out`.
[[noreturn]] void run_child(int out, int hold_read, int hold_write, uint32_t abi) {
  report r;
  int ask[2], answer[2];
  if (::pipe(ask) < 0 || ::pipe(answer) < 0)
    r.setup = errno;
  else if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
    r.setup = errno;
  else if (int rc = security::drop_capabilities(); rc < 0)
    r.setup = -rc;
  else if (int rc2 = security::restrict_landlock(abi); rc2 < 0)
    r.setup = -rc2;
  if (r.setup != 0)
    send_report(out, r);
  pid_t trusted = sleeper(hold_read, hold_write);
  pid_t prober = ::fork();
  if (prober == 0) {
    ::close(ask[1]); // so that a failure of the parent ends the wait below
    ::close(answer[0]);
    pid_t agent = 0;
    attempts a;
    if (::read(ask[0], &agent, sizeof agent) == static_cast<ssize_t>(sizeof agent))
      a = try_all(agent);
    (void) !::write(answer[1], &a, sizeof a);
    ::_exit(0);
  }
  ::close(ask[0]);
  ::close(answer[1]);
  if (int rc = security::restrict_landlock(abi); rc < 0) {
    r.setup = -rc;
    send_report(out, r);
  }
  pid_t agent = sleeper(hold_read, hold_write);
  r.agent_on_trusted = try_all(trusted);
  r.agent_on_agent = try_all(agent);
  (void) !::write(ask[1], &agent, sizeof agent);
  if (::read(answer[0], &r.trusted_on_agent, sizeof r.trusted_on_agent)
      != static_cast<ssize_t>(sizeof r.trusted_on_agent))
    r.setup = EPIPE;
  ::waitpid(prober, nullptr, 0);
  // Both sleepers end when the test closes its end of `hold`.
  send_report(out, r);
}

} // namespace

TEST_CASE("nested Landlock domains: the inner one cannot reach the outer, the outer reaches in"
          * dsec::test::skip_unless(dsec::test::landlock_scoping(),
                                    "nested Landlock domains: no Landlock ABI 6 (scoping)")) {
  uint32_t abi = security::landlock_abi();
  int pipe_fds[2], hold[2];
  REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(hold, O_CLOEXEC) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    run_child(pipe_fds[1], hold[0], hold[1], abi);
  }
  ::close(pipe_fds[1]);
  ::close(hold[0]);
  report r;
  auto n = ::read(pipe_fds[0], &r, sizeof r);
  ::close(pipe_fds[0]);
  ::close(hold[1]); // the sleepers end
  ::waitpid(child, nullptr, 0);
  REQUIRE(n == static_cast<ssize_t>(sizeof r));
  REQUIRE(r.setup == 0);
  CHECK(r.agent_on_trusted.ptrace == EPERM);
  CHECK(r.agent_on_trusted.signal == EPERM);
  CHECK(r.agent_on_trusted.environ == EACCES);
  CHECK(r.agent_on_trusted.getfd == EPERM);
  CHECK(r.agent_on_agent.ptrace == 0);
  CHECK(r.agent_on_agent.signal == 0);
  CHECK(r.agent_on_agent.environ == 0);
  CHECK(r.agent_on_agent.getfd == 0);
  CHECK(r.trusted_on_agent.ptrace == 0);
  CHECK(r.trusted_on_agent.signal == 0);
  CHECK(r.trusted_on_agent.environ == 0);
  CHECK(r.trusted_on_agent.getfd == 0);
}
