#include "test/support/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace dsec::test {

namespace {

using clock_type = std::chrono::steady_clock;

[[noreturn]] void die(const char* what) {
  throw std::runtime_error(std::string{what} + ": " + std::strerror(errno));
}

void make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) < 0)
    die("pipe2");
}

// In the child after fork: die with the test, wire up stdio, exec.
[[noreturn]] void exec_child(const std::vector<std::string>& argv, pid_t parent, int in,
                             int out, int err, const std::function<void()>& hook) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent)
    ::_exit(127);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  if (::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0)
    ::_exit(127);
  if (hook)
    hook();
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
  ::_exit(127);
}

int decode(int wstatus) {
  if (WIFEXITED(wstatus))
    return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus))
    return 128 + WTERMSIG(wstatus);
  return -1;
}

bool read_into(int& fd, std::string& into) {
  char buf[65536];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n > 0) {
    into.append(buf, static_cast<size_t>(n));
    return true;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN))
    return true;
  ::close(fd);
  fd = -1;
  return false;
}

} // namespace

std::string proc_result::describe() const {
  return "status " + std::to_string(status) + (safety_killed ? " (killed by the safety net)" : "")
         + (output_left_open ? " (its output stayed open after it exited)" : "")
         + "\n--- stdout ---\n" + out + "--- stderr ---\n" + err + "---";
}

proc_result run_process(const std::vector<std::string>& argv, const spawn_options& opts) {
  ::signal(SIGPIPE, SIG_IGN);
  int in[2], out[2], err[2];
  make_pipe(in);
  make_pipe(out);
  make_pipe(err);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0)
    die("fork");
  if (pid == 0)
    exec_child(argv, parent, in[0], out[1], err[1], opts.in_child);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  int in_fd = in[1], out_fd = out[0], err_fd = err[0];
  ::fcntl(in_fd, F_SETFL, O_NONBLOCK);
  size_t written = 0;
  if (opts.input.empty()) {
    ::close(in_fd);
    in_fd = -1;
  }

  proc_result res;
  auto deadline = clock_type::now() + opts.kill_after;
  bool reaped = false;
  int wstatus = 0;
  std::optional<clock_type::time_point> reaped_at;
  while (out_fd >= 0 || err_fd >= 0 || !reaped) {
    if (!reaped && ::waitpid(pid, &wstatus, WNOHANG) == pid) {
      reaped = true;
      reaped_at = clock_type::now();
    }
    auto now = clock_type::now();
    if (!reaped && !res.safety_killed && now >= deadline) {
      ::kill(pid, SIGKILL);
      res.safety_killed = true;
    }
    // Something else holding the pipes open after the program ended is a leak
    // in itself; do not wait for it forever.
    if (reaped && now - *reaped_at > 30s) {
      res.output_left_open = true;
      break;
    }
    pollfd pf[3];
    nfds_t n = 0;
    if (out_fd >= 0)
      pf[n++] = {out_fd, POLLIN, 0};
    if (err_fd >= 0)
      pf[n++] = {err_fd, POLLIN, 0};
    if (in_fd >= 0)
      pf[n++] = {in_fd, POLLOUT, 0};
    if (n == 0) {
      if (reaped)
        break;
      ::poll(nullptr, 0, 20); // output closed, still running
      continue;
    }
    ::poll(pf, n, 50);
    for (nfds_t i = 0; i < n; ++i) {
      if (!pf[i].revents)
        continue;
      if (pf[i].fd == out_fd)
        read_into(out_fd, res.out);
      else if (pf[i].fd == err_fd)
        read_into(err_fd, res.err);
      else if (pf[i].fd == in_fd) {
        ssize_t w = ::write(in_fd, opts.input.data() + written, opts.input.size() - written);
        if (w > 0)
          written += static_cast<size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == opts.input.size()) {
          ::close(in_fd);
          in_fd = -1;
        }
      }
    }
  }
  for (int fd : {in_fd, out_fd, err_fd})
    if (fd >= 0)
      ::close(fd);
  res.status = decode(wstatus);
  return res;
}

background::background(const std::vector<std::string>& argv) {
  ::signal(SIGPIPE, SIG_IGN);
  int out[2], err[2];
  make_pipe(out);
  make_pipe(err);
  int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null < 0)
    die("open /dev/null");
  pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0)
    die("fork");
  if (pid_ == 0)
    exec_child(argv, parent, null, out[1], err[1], {});
  ::close(null);
  ::close(out[1]);
  ::close(err[1]);
  out_ = out[0];
  err_ = err[0];
}

background::~background() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  for (int fd : {out_, err_})
    if (fd >= 0)
      ::close(fd);
}

bool background::pump(int ms) {
  pollfd pf[2];
  nfds_t n = 0;
  if (out_ >= 0)
    pf[n++] = {out_, POLLIN, 0};
  if (err_ >= 0)
    pf[n++] = {err_, POLLIN, 0};
  if (n == 0)
    return false;
  if (::poll(pf, n, ms) <= 0)
    return true;
  for (nfds_t i = 0; i < n; ++i) {
    if (!pf[i].revents)
      continue;
    if (pf[i].fd == out_)
      read_into(out_, res_.out);
    else
      read_into(err_, res_.err);
  }
  return out_ >= 0 || err_ >= 0;
}

bool background::wait_for_output(const std::string& text, std::chrono::seconds safety) {
  auto deadline = clock_type::now() + safety;
  while (res_.out.find(text) == std::string::npos) {
    if (clock_type::now() >= deadline || !pump(50))
      return res_.out.find(text) != std::string::npos;
  }
  return true;
}

void background::kill(int sig) {
  if (pid_ > 0)
    ::kill(pid_, sig);
}

proc_result background::wait(std::chrono::seconds safety) {
  auto deadline = clock_type::now() + safety;
  int wstatus = 0;
  while (pid_ > 0) {
    pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      break;
    }
    if (clock_type::now() >= deadline && !res_.safety_killed) {
      ::kill(pid_, SIGKILL);
      res_.safety_killed = true;
    }
    if (!pump(50) && pid_ > 0) {
      // Output closed: just wait for the exit.
      ::poll(nullptr, 0, 10);
    }
  }
  // The rest of the output (bounded: nothing should hold the pipes now).
  auto until = clock_type::now() + 30s;
  while ((out_ >= 0 || err_ >= 0) && clock_type::now() < until)
    pump(50);
  res_.status = decode(wstatus);
  return res_;
}

bool pid_exists(pid_t pid) {
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

} // namespace dsec::test
