#include "runtime/spawner.hpp"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "runtime/proto.hpp"
#include "runtime/sys.hpp"
#include "runtime/unix_socket.hpp"

namespace dsec {

expected<std::string> spawner::find_binary() {
  return sys::find_program("DSEC_SPAWNER", "dsec-spawner", "dsec-spawner");
}

expected<std::unique_ptr<spawner>> spawner::start(const options& opts) {
  std::string binary = opts.binary;
  if (binary.empty()) {
    DSEC_TRY(found, find_binary());
    binary = std::move(found);
  }
  DSEC_TRY(helper, userns_helper::start(opts.ids));
  // The first pooled network namespace is made by the helper, on the other
  // CPU, while the zygote starts (~0.36 ms off the first sandbox's path).
  bool helper_netns = opts.netns_prewarm > 0 && helper.request_netns().has_value();
  auto userns = helper.take_userns();
  int sv[2];
  if (unix_socket::pair(sv) < 0)
    return sys_error("socketpair for the zygote");
  unique_fd mine{sv[0]}, theirs{sv[1]};
  std::unique_ptr<spawner> s{new spawner};
  s->ids_ = opts.ids;
  s->binary_ = binary;
  char host_pid[16];
  std::snprintf(host_pid, sizeof host_pid, "%d", ::getpid());
  // The zygote is exec'd, not just forked: a fresh, small address space makes its
  // clones cheap, and it must not share anything with this (threaded) process.
  char prewarm[16];
  std::snprintf(prewarm, sizeof prewarm, "%u", opts.netns_prewarm - (helper_netns ? 1 : 0));
  const char* argv[] = {binary.c_str(), "--zygote", host_pid, "--netns-prewarm", prewarm,
                        nullptr};
  const char* envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", nullptr};
  int sock_fd = theirs.get(), ns_fd = userns.get();
  pid_t pid = ::fork();
  if (pid < 0)
    return sys_error("fork for the zygote");
  if (pid == 0) {
    // Async-signal-safe only. Put the two descriptors at 3 and 4.
    int a = ::fcntl(sock_fd, F_DUPFD, 10), b = ::fcntl(ns_fd, F_DUPFD, 10);
    if (a < 0 || b < 0 || ::dup2(a, 3) < 0 || ::dup2(b, 4) < 0)
      ::_exit(126);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], const_cast<char**>(argv), const_cast<char**>(envp));
    ::_exit(127);
  }
  s->pid_ = pid;
  theirs.reset();
  s->sock_ = std::move(mine);
  s->userns_ = std::move(userns);
  if (helper_netns)
    s->helper_.emplace(std::move(helper));
  return s;
}

expected<void> spawner::ready() {
  if (hello_)
    return {};
  if (start_error_)
    return *start_error_;
  proto::hello h;
  auto n = sys::retry([&] { return ::recv(sock_.get(), &h, sizeof h, 0); });
  if (n != static_cast<ssize_t>(sizeof h) || h.h.magic != proto::magic
      || h.h.kind != proto::type::hello) {
    // The zygote died before saying anything: report how.
    int st = 0;
    sys::retry([&] { return ::waitpid(pid_, &st, 0); });
    pid_ = -1;
    std::string how = WIFEXITED(st) ? "exited with status " + std::to_string(WEXITSTATUS(st))
                                    : "was killed by signal " + std::to_string(WTERMSIG(st));
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
      how += " (cannot execute " + binary_ + ")";
    start_error_ = make_error(errc::system_error, "the sandbox spawner " + binary_ + " " + how);
    start_error_->step = "start_spawner";
    return *start_error_;
  }
  if (h.err != 0) {
    start_error_ = sys_error(std::string{"the sandbox spawner could not start: step '"} + h.step
                               + "' failed on",
                             h.path, h.err);
    start_error_->step = "start_spawner";
    return *start_error_; // ~spawner reaps it
  }
  landlock_abi_ = h.landlock_abi;
  hello_ = true;
  if (helper_) {
    // Hand the helper's network namespace to the zygote's pool. If that fails
    // the zygote makes its own when it needs one.
    if (auto ns = helper_->take_netns()) {
      proto::give_netns m;
      int fd = ns->get();
      (void) unix_socket::send(sock_.get(), &m, sizeof m, &fd, 1);
    }
    helper_.reset();
  }
  return {};
}

expected<spawner::spawned> spawner::spawn(int overlay, int ctl,
                                          std::span<const int> cgroup_fds,
                                          const std::string& hostname, bool net,
                                          const chronus_fds* chronus,
                                          std::span<const prepared_mount> mounts, int netns) {
  struct {
    proto::spawn req;
    char paths[proto::max_mount_paths];
  } msg;
  auto& req = msg.req;
  req.flags = (net ? proto::spawn_net : 0) | (chronus ? proto::spawn_chronus : 0)
              | (net && netns >= 0 ? proto::spawn_netns : 0);
  if (hostname.size() >= sizeof req.hostname)
    return make_error(errc::invalid_argument,
                      "hostname '" + hostname + "' is longer than 63 characters");
  std::memcpy(req.hostname, hostname.data(), hostname.size());
  int fds[unix_socket::max_fds];
  size_t before_mounts = 2 + cgroup_fds.size() + (chronus ? size_t{proto::chronus_fd::count} : 0);
  size_t nsend = before_mounts + mounts.size() + (req.flags & proto::spawn_netns ? 1 : 0);
  static_assert(max_host_mounts <= proto::max_spawn_mounts);
  if (mounts.size() > proto::max_spawn_mounts)
    return make_error(errc::invalid_argument,
                      "more than " + std::to_string(proto::max_spawn_mounts) + " host mounts");
  if (nsend > unix_socket::max_fds)
    return make_error(errc::invalid_argument, "too many cgroups");
  fds[0] = overlay;
  fds[1] = ctl;
  for (size_t i = 0; i < cgroup_fds.size(); ++i)
    fds[2 + i] = cgroup_fds[i];
  req.cgroup_fds = static_cast<uint32_t>(cgroup_fds.size());
  if (chronus) {
    int* at = fds + 2 + cgroup_fds.size();
    at[proto::chronus_fd::pristine_root] = chronus->pristine_root;
    at[proto::chronus_fd::pristine_tmp] = chronus->pristine_tmp;
    at[proto::chronus_fd::channel] = chronus->channel;
    for (size_t i = 0; i < proto::chronus_fd::count; ++i)
      if (at[i] < 0)
        return make_error(errc::invalid_argument, "a Chronus sandbox is missing a descriptor");
  }
  for (size_t i = 0; i < mounts.size(); ++i) {
    const auto& t = mounts[i].target;
    if (t.empty() || t.front() != '/' || t.find('\0') != std::string::npos
        || req.paths_len + t.size() + 1 > sizeof msg.paths)
      return make_error(errc::invalid_argument, "host mount target '" + t + "' cannot be sent");
    std::memcpy(msg.paths + req.paths_len, t.c_str(), t.size() + 1);
    req.paths_len += static_cast<uint32_t>(t.size() + 1);
    if (mounts[i].directory)
      req.mount_dirs |= 1u << i;
    fds[before_mounts + i] = mounts[i].tree.get();
  }
  req.host_mounts = static_cast<uint32_t>(mounts.size());
  if (req.flags & proto::spawn_netns)
    fds[nsend - 1] = netns;
  std::lock_guard<std::mutex> guard{mu_};
  DSEC_TRY_VOID(ready());
  if (unix_socket::send(sock_.get(), &msg, sizeof req + req.paths_len, fds, nsend) < 0)
    return make_error(errc::disconnected,
                      std::string{"the sandbox spawner is gone: "} + std::strerror(errno));
  proto::spawn_reply reply;
  int pidfd = -1;
  size_t nfds = 0;
  auto n = unix_socket::recv(sock_.get(), &reply, sizeof reply, &pidfd, 1, &nfds);
  if (n <= 0)
    return make_error(errc::disconnected, "the sandbox spawner is gone");
  spawned out;
  out.pidfd.reset(nfds == 1 ? pidfd : -1);
  if (n != static_cast<ssize_t>(sizeof reply) || reply.h.kind != proto::type::spawn_reply)
    return make_error(errc::system_error, "the sandbox spawner answered garbage");
  if (reply.err != 0) {
    auto e = sys_error("clone of the sandbox init", "", reply.err);
    if (reply.err == EAGAIN || reply.err == ENOMEM || reply.err == ENOSPC)
      e.code = errc::overloaded;
    return e;
  }
  if (!out.pidfd)
    return make_error(errc::system_error, "the sandbox spawner sent no pidfd");
  out.pid = reply.pid;
  return out;
}

expected<unique_fd> spawner::make_netns() {
  std::lock_guard<std::mutex> guard{mu_};
  DSEC_TRY_VOID(ready());
  proto::make_netns m;
  if (unix_socket::send(sock_.get(), &m, sizeof m, nullptr, 0) < 0)
    return make_error(errc::disconnected,
                      std::string{"the sandbox spawner is gone: "} + std::strerror(errno));
  proto::netns_made reply;
  int fd = -1;
  size_t nfds = 0;
  auto n = unix_socket::recv(sock_.get(), &reply, sizeof reply, &fd, 1, &nfds);
  if (n <= 0)
    return make_error(errc::disconnected, "the sandbox spawner is gone");
  unique_fd out{nfds == 1 ? fd : -1};
  if (n != static_cast<ssize_t>(sizeof reply) || reply.h.kind != proto::type::netns_made)
    return make_error(errc::system_error, "the sandbox spawner answered garbage");
  if (reply.err != 0)
    return sys_error("the sandbox spawner making a network namespace: unshare(CLONE_NEWNET)", "",
                     reply.err);
  if (!out)
    return make_error(errc::system_error, "the sandbox spawner sent no network namespace");
  return out;
}

spawner::~spawner() {
  sock_.reset();
  if (pid_ > 0) {
    int st;
    sys::retry([&] { return ::waitpid(pid_, &st, 0); });
  }
}

} // namespace dsec
