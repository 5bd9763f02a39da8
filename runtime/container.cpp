#include "runtime/container.hpp"

#include "runtime/pack.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "runtime/mount.hpp"
#include "runtime/pty.hpp"
#include "runtime/security.hpp"
#include "runtime/spawner.hpp"
#include "runtime/sys.hpp"
#include "runtime/unix_socket.hpp"

namespace dsec {

namespace {

using clock_type = std::chrono::steady_clock;

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 clock_type::now().time_since_epoch())
                                 .count());
}

} // namespace

std::string new_sandbox_id() {
  unsigned char b[6];
  if (::getrandom(b, sizeof b, 0) != static_cast<ssize_t>(sizeof b))
    for (auto& x : b)
      x = static_cast<unsigned char>(std::rand());
  static const char hex[] = "0123456789abcdef";
  std::string s(12, '0');
  for (size_t i = 0; i < sizeof b; ++i) {
    s[2 * i] = hex[b[i] >> 4];
    s[2 * i + 1] = hex[b[i] & 15];
  }
  return s;
}

namespace {

const char* signal_name(int sig) {
  const char* d = ::sigabbrev_np(sig);
  return d ? d : "?";
}

} // namespace

namespace {
constexpr const char* default_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
} // namespace

std::vector<std::string> command::default_env() {
  std::vector<std::string> env = {std::string{"PATH="} + default_path, "HOME=/root",
                                  "LANG=C.UTF-8"};
  if (const char* term = std::getenv("TERM"); term && *term)
    env.push_back(std::string{"TERM="} + term);
  return env;
}

std::string exit_status::to_string() const {
  if (signal != 0)
    return std::string{"killed by signal "} + std::to_string(signal) + " (SIG"
           + signal_name(signal) + ")";
  return "exited with status " + std::to_string(code);
}

exit_status exit_status::from_wait_status(int st) {
  exit_status s;
  if (WIFEXITED(st))
    s.code = WEXITSTATUS(st);
  else if (WIFSIGNALED(st))
    s.signal = WTERMSIG(st);
  return s;
}

// ---- creation steps ---------------------------------------------------------

struct container::create_ctx {
  spawner& sp;
  std::span<const int> lowers;
  const container_options& opts;
  const cgroup_root* cgroups;
  container& c;
  upper_layer upper;
  unique_fd overlay;
  unique_fd child_ctl;
  // A Chronus sandbox's, for the zygote (spawner::chronus_fds).
  unique_fd pristine_root, pristine_tmp, child_channel;
};

struct create_steps {
  using ctx = container::create_ctx;

  static expected<void> make_upper(ctx& x) {
    DSEC_TRY(u, dsec::make_upper(x.opts.disk_bytes, x.sp.ids().base));
    x.upper = std::move(u);
    // A sandbox rebuilt from a trajectory log starts with the files its
    // predecessor had (runtime/pack.hpp), before the overlay sees the dir.
    if (!x.opts.seed_pack.empty()) {
      auto r = restore_pack(x.opts.seed_pack, x.opts.seed_blobs, x.upper.upper.get(),
                            x.sp.ids().base);
      if (!r)
        return std::move(r).error_value();
    } else if (!x.opts.seed_manifest.empty()) {
      auto r = restore_manifest(x.opts.seed_manifest, "the pack kept in the trajectory log",
                                x.opts.seed_blobs, x.upper.upper.get(), x.sp.ids().base);
      if (!r)
        return std::move(r).error_value();
    }
    if (!x.opts.resolv_conf.empty()) {
      // Beneath the upper dir only: a seed pack is the sandbox's own content,
      // so neither etc nor resolv.conf may be a symlink we follow.
      int up = x.upper.upper.get();
      uid_t root = x.sp.ids().base;
      if (::mkdirat(up, "etc", 0755) == 0)
        (void) ::fchownat(up, "etc", root, root, AT_SYMLINK_NOFOLLOW);
      else if (errno != EEXIST)
        return sys_error("making /etc for resolv.conf", "etc");
      unique_fd etc{::openat(up, "etc", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
      if (!etc)
        return sys_error("opening /etc for resolv.conf", "etc");
      (void) ::unlinkat(etc.get(), "resolv.conf", 0);
      unique_fd f{::openat(etc.get(), "resolv.conf",
                           O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)};
      if (!f)
        return sys_error("writing", "/etc/resolv.conf");
      const auto& text = x.opts.resolv_conf;
      if (::write(f.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())
          || ::fchown(f.get(), root, root) < 0)
        return sys_error("writing", "/etc/resolv.conf");
    }
    if (x.opts.keep_upper) {
      // The tmpfs's detached mount (its upper/ is the upper dir): while a
      // descriptor holds it, it stays in its anonymous namespace, so
      // snapshots can clone it (one descriptor per sandbox).
      x.c.upper_mnt_.reset(::fcntl(x.upper.mnt.get(), F_DUPFD_CLOEXEC, 0));
      if (!x.c.upper_mnt_)
        return sys_error("keeping a descriptor of the writable layer");
      x.c.uid_base_ = x.sp.ids().base;
    }
    return {};
  }

  // Bound through the overlay (see make_chronus_socket), before the sandbox has it.
  static expected<void> make_chronus(ctx& x) {
    if (!x.opts.chronus)
      return {};
    // Trusted commands rest on Landlock's scoping (ABI 6): without it they
    // would be as open to the agent as its own commands. Refuse, do not weaken.
    if (auto abi = security::landlock_abi(); abi < 6)
      return make_error(errc::unsupported,
                        "a Chronus sandbox needs Landlock ABI 6 or later (Linux 6.12, with "
                        "Landlock enabled) to keep trusted commands out of the agent's reach; "
                        "this kernel offers "
                          + (abi == 0 ? std::string{"no Landlock"} : "ABI " + std::to_string(abi)));
    DSEC_TRY(sock, make_chronus_socket(x.overlay.get(), x.sp.ids().base));
    x.c.chronus_ = std::move(sock);
    // The pristine root is the layers alone; the sandbox mounts its /.dsec
    // (dsec's own files, from the top layer, which must be dsec's system layer)
    // over its own root's too.
    struct stat st{};
    if (::fstatat(x.lowers.front(), ".dsec/bin/chronus", &st, AT_SYMLINK_NOFOLLOW) < 0
        || !S_ISREG(st.st_mode))
      return make_error(errc::not_found,
                        "the top layer has no .dsec/bin/chronus: a Chronus sandbox needs dsec's "
                        "system layer (version 3 or later) on top of its layers");
    DSEC_TRY(view, make_lower_view(x.lowers));
    x.pristine_root = std::move(view);
    DSEC_TRY(tmp, make_scratch_tmpfs(x.opts.disk_bytes, x.sp.ids().base));
    x.pristine_tmp = std::move(tmp);
    // The trusted channel: the node's end stays non-blocking here, the
    // sandbox's goes to the trusted helper.
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
      return sys_error("socketpair for the trusted Chronus channel");
    x.c.channel_.reset(sv[0]);
    x.child_channel.reset(sv[1]);
    if (::fcntl(sv[0], F_SETFL, O_NONBLOCK) < 0)
      return sys_error("making the trusted Chronus channel non-blocking");
    x.c.chronus_enabled_ = true;
    return {};
  }

  static expected<void> make_overlay(ctx& x) {
    DSEC_TRY(o, dsec::make_overlay(x.lowers, x.upper));
    x.overlay = std::move(o);
    // The overlay holds the upper dirs now.
    x.upper = upper_layer{};
    return {};
  }

  static expected<void> make_cgroup(ctx& x) {
    if (!x.opts.lim.any())
      return {};
    if (!x.cgroups)
      return make_error(errc::unsupported, "limits were set but no cgroup root was given");
    DSEC_TRY(cg, x.cgroups->create(x.c.id_, x.opts.lim));
    x.c.cgroup_.emplace(std::move(cg));
    return {};
  }

  static expected<void> spawn(ctx& x) {
    int sv[2];
    if (unix_socket::pair(sv) < 0)
      return sys_error("socketpair for the sandbox control socket");
    x.c.ctl_.reset(sv[0]);
    x.child_ctl.reset(sv[1]);
    std::vector<int> cg_fds;
    if (x.c.cgroup_)
      cg_fds = x.c.cgroup_->join_fds();
    const auto& hostname = x.opts.hostname.empty() ? x.c.id_ : x.opts.hostname;
    spawner::chronus_fds cf;
    if (x.opts.chronus) {
      cf.pristine_root = x.pristine_root.get();
      cf.pristine_tmp = x.pristine_tmp.get();
      cf.channel = x.child_channel.get();
    }
    DSEC_TRY(s, x.sp.spawn(x.overlay.get(), x.child_ctl.get(), cg_fds, hostname, x.opts.net,
                           x.opts.chronus ? &cf : nullptr, x.opts.host_mounts, x.opts.netns));
    x.c.pid_ = s.pid;
    x.c.pidfd_ = std::move(s.pidfd);
    if (x.c.cgroup_)
      x.c.cgroup_->close_join_fds();
    // The sandbox holds its root and its end of the socket now.
    x.overlay.reset();
    x.child_ctl.reset();
    x.pristine_root.reset();
    x.pristine_tmp.reset();
    x.child_channel.reset();
    return {};
  }

};

namespace {

struct host_step {
  const char* name;
  expected<void> (*run)(create_steps::ctx&);
  bool chronus_only = false; // skipped, and not listed in timings(), without it
};

// The host's creation steps, in order. Then init takes its own steps
// (proto::child_step) and reports `ready`: create() waits for that as its last
// step, "wait_ready"; start() returns before it.
constexpr host_step host_steps[] = {
  {"make_upper", &create_steps::make_upper},   {"make_overlay", &create_steps::make_overlay},
  {"make_chronus", &create_steps::make_chronus, true},
  {"make_cgroup", &create_steps::make_cgroup},
  {"spawn", &create_steps::spawn},
};

} // namespace

expected<std::unique_ptr<container>>
container::start(spawner& sp, std::span<const int> lowers, const container_options& opts,
                 const cgroup_root* cgroups) {
  if (lowers.empty())
    return make_error(errc::invalid_argument, "a sandbox needs at least one layer");
  std::unique_ptr<container> c{new container};
  c->id_ = opts.id.empty() ? new_sandbox_id() : opts.id;
  create_ctx x{sp, lowers, opts, cgroups, *c, {}, {}, {}, {}, {}, {}};
  for (const auto& step : host_steps) {
    if (step.chronus_only && !opts.chronus)
      continue;
    auto t0 = now_ns();
    size_t slot = c->ntimings_++;
    c->timings_[slot] = {step.name, 0};
    auto r = step.run(x);
    c->timings_[slot].ns = now_ns() - t0;
    if (!r)
      return std::move(r).error_value().in_step(step.name); // ~container cleans up
  }
  return c;
}

expected<std::unique_ptr<container>>
container::create(spawner& sp, std::span<const int> lowers, const container_options& opts,
                  const cgroup_root* cgroups) {
  DSEC_TRY(c, start(sp, lowers, opts, cgroups));
  auto t0 = now_ns();
  size_t slot = c->ntimings_++;
  c->timings_[slot] = {"wait_ready", 0};
  auto r = c->wait_until_ready();
  c->timings_[slot].ns = now_ns() - t0;
  if (!r)
    return std::move(r).error_value().in_step("wait_ready");
  return c;
}

expected<void> container::wait_until_ready() {
  pollfd pf{ctl_.get(), POLLIN, 0};
  while (!ready_) {
    if (sys::retry([&] { return ::poll(&pf, 1, -1); }) < 0)
      return sys_error("poll on the sandbox control socket");
    DSEC_TRY(ev, next_event());
    if (ev.what != container_event::kind::none && ev.what != container_event::kind::ready)
      return make_error(errc::sandbox_failed, "the sandbox init sent an unexpected message");
  }
  return {};
}

void container::add_timings(const proto::ready& r) {
  // The steps init took: a Chronus sandbox's and host mounts' only where
  // they were.
  for (uint32_t i = 0; i < r.steps && i < static_cast<uint32_t>(proto::child_step::count)
                       && ntimings_ < timings_.size();
       ++i)
    if ((r.taken >> i) & 1u)
      timings_[ntimings_++] = {proto::child_step_name(i), r.step_ns[i]};
}

expected<container_event> container::next_event() {
  container_event ev;
  if (destroyed_ || init_gone_)
    return make_error(errc::sandbox_failed, "sandbox " + id_ + " is gone");
  alignas(8) char buf[256];
  // At most one descriptor comes (a terminal's master with `started`); more,
  // or a truncated message, fails the receive (EMSGSIZE), closing them.
  int fd = -1;
  size_t nfds = 0;
  auto len = unix_socket::recv(ctl_.get(), buf, sizeof buf, &fd, 1, &nfds, MSG_DONTWAIT);
  if (len < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    return ev;
  if (len < 0 && errno == EMSGSIZE)
    return make_error(errc::sandbox_failed, "the sandbox init sent an oversized message");
  if (len <= 0) {
    init_gone_ = true;
    return init_died();
  }
  unique_fd attached{nfds == 1 ? fd : -1}; // closed unless a `started` takes it
  proto::header h;
  if (static_cast<size_t>(len) < sizeof h)
    return make_error(errc::sandbox_failed, "the sandbox init sent a short message");
  std::memcpy(&h, buf, sizeof h);
  auto is = [&](proto::type t, size_t size) {
    return h.magic == proto::magic && h.kind == t && static_cast<size_t>(len) == size;
  };
  if (!ready_) {
    // Before ready, init only reports its setup.
    if (is(proto::type::ready, sizeof(proto::ready))) {
      proto::ready r;
      std::memcpy(&r, buf, sizeof r);
      add_timings(r);
      ready_ = true;
      ev.what = container_event::kind::ready;
      return ev;
    }
    if (is(proto::type::setup_failed, sizeof(proto::setup_failed))) {
      proto::setup_failed f;
      std::memcpy(&f, buf, sizeof f);
      f.path[sizeof f.path - 1] = '\0';
      auto e = sys_error("cannot set up the sandbox at", f.path, f.err);
      e.code = errc::system_error;
      e.step = proto::child_step_name(f.step);
      init_gone_ = true; // it exits now
      return e;
    }
    return make_error(errc::sandbox_failed, "the sandbox init sent an unexpected message");
  }
  if (is(proto::type::started, sizeof(proto::started))) {
    proto::started m;
    std::memcpy(&m, buf, sizeof m);
    ev.what = container_event::kind::started;
    ev.id = m.id;
    if (attached) {
      // Init's word that this is the command's terminal is not enough: only
      // a pty master is kept, made non-blocking here (dsec never waits on it).
      if (!pty::is_master(attached.get()) || ::fcntl(attached.get(), F_SETFL, O_NONBLOCK) < 0)
        return make_error(errc::sandbox_failed, "the sandbox init sent a terminal that is not one");
      ev.pty = std::move(attached);
    }
  } else if (is(proto::type::exited, sizeof(proto::exited))) {
    proto::exited m;
    std::memcpy(&m, buf, sizeof m);
    ev.what = container_event::kind::exited;
    ev.id = m.id;
    ev.status = exit_status::from_wait_status(m.status);
  } else if (is(proto::type::exec_failed, sizeof(proto::exec_failed))) {
    proto::exec_failed m;
    std::memcpy(&m, buf, sizeof m);
    ev.what = container_event::kind::exec_failed;
    ev.id = m.id;
    auto e = make_error(m.err == ENOENT ? errc::not_found : errc::invalid_argument, "");
    e.sys_errno = m.err;
    e.step = proto::exec_stage_name(m.stage);
    ev.failure = std::move(e);
  } else {
    return make_error(errc::sandbox_failed, "the sandbox init sent an unexpected message");
  }
  return ev;
}

error container::init_died() {
  siginfo_t info{};
  if (pidfd_ && sys::retry([&] {
        return ::waitid(P_PIDFD, static_cast<id_t>(pidfd_.get()), &info, WEXITED | WNOHANG);
      }) == 0
      && info.si_pid != 0) {
    pid_ = -1;
    std::string how = info.si_code == CLD_EXITED
                        ? "exited with status " + std::to_string(info.si_status)
                        : std::string{"was killed by signal SIG"} + signal_name(info.si_status);
    if (oom_killed())
      how += " (out of memory: the sandbox reached its memory limit, which its writable "
             "layer's files count against too)";
    return make_error(errc::sandbox_failed, "the sandbox's init " + how);
  }
  // Its control socket closes as it exits, maybe before it can be reaped.
  if (oom_killed())
    return make_error(errc::sandbox_failed,
                      "the sandbox's init was killed: out of memory (the sandbox reached its "
                      "memory limit, which its writable layer's files count against too)");
  return make_error(errc::sandbox_failed, "the sandbox's init closed its control socket");
}

expected<bool> container::pump(std::optional<clock_type::time_point> deadline) {
  pollfd pf[2] = {{ctl_.get(), POLLIN, 0}, {pidfd_.get(), POLLIN, 0}};
  int timeout = -1;
  if (deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline
                                                                      - clock_type::now());
    timeout = left.count() < 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30));
  }
  int n = sys::retry([&] { return ::poll(pf, 2, timeout); });
  if (n < 0)
    return sys_error("poll on the sandbox control socket");
  if (n == 0)
    return false;
  if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR))) {
    // init died with nothing left to read
    init_gone_ = true;
    return init_died();
  }
  DSEC_TRY(ev, next_event());
  for (auto& p : cmds_) {
    if (p.id != ev.id)
      continue;
    switch (ev.what) {
      case container_event::kind::started:
        p.started = true;
        p.pty = std::move(ev.pty);
        break;
      case container_event::kind::exited:
        p.done = true;
        p.status = ev.status;
        break;
      case container_event::kind::exec_failed:
        p.done = true;
        p.failure = std::move(ev.failure);
        break;
      default: break;
    }
  }
  return true;
}

error container::describe_exec_failure(const command& cmd, error e) {
  const auto& prog = cmd.argv.empty() ? std::string{} : cmd.argv[0];
  const char* why = std::strerror(e.sys_errno);
  if (e.step == "execve" && e.sys_errno == E2BIG)
    e.message = "cannot execute '" + prog + "' in the sandbox: " + why
                + " (the kernel's execve limit: each argument or variable at most 128 KiB,"
                  " all of them a quarter of the stack limit, 2 MiB for an 8 MiB stack)";
  else if (e.step == "execve")
    e.message = "cannot execute '" + prog + "' in the sandbox: " + why;
  else if (e.step == "chdir")
    e.message = "cannot change to directory '" + cmd.cwd + "' in the sandbox: " + why;
  else if (e.step == "setuid")
    e.message = "cannot switch to uid " + std::to_string(cmd.uid.value_or(0)) + " gid "
                + std::to_string(cmd.gid.value_or(cmd.uid.value_or(0))) + ": " + why;
  else if (e.sys_errno == EAGAIN)
    e.message = "cannot start '" + prog + "': too many commands running in the sandbox";
  else
    e.message = "cannot start '" + prog + "': " + why;
  return e;
}

expected<uint64_t> container::send_exec(const command& cmd, const stdio& io) {
  if (destroyed_ || init_gone_)
    return make_error(errc::not_found, "sandbox " + id_ + " is destroyed");
  if (cmd.argv.empty() || cmd.argv[0].empty())
    return make_error(errc::invalid_argument, "no command given");
  if (cmd.trusted && !chronus_enabled_)
    return make_error(errc::invalid_argument,
                      "a trusted command needs a sandbox made with Chronus "
                      "(container_options::chronus); sandbox " + id_ + " was not");
  if (cmd.pristine && !cmd.trusted)
    return make_error(errc::invalid_argument,
                      "a pristine command must be a trusted one (--pristine needs --trusted)");
  if (cmd.pty && cmd.trusted)
    return make_error(errc::unsupported,
                      "a terminal (pty) for a trusted command: the sandbox's own processes can "
                      "open its terminals, so a trusted command's input and output never go "
                      "through one");
  if (cmd.pty && (cmd.pty->rows == 0 || cmd.pty->cols == 0))
    return make_error(errc::invalid_argument, "a terminal needs at least 1 row and 1 column");
  // A trusted command: its PATH starts with dsec's own bin dir, and it finds its
  // channel at fd 3. A token or channel the caller passed is not kept.
  const std::vector<std::string>* env = &cmd.env;
  std::vector<std::string> trusted_env;
  if (cmd.trusted) {
    const std::string bin = std::string{proto::dsec_bin_dir} + ":";
    bool path = false;
    for (const auto& e : cmd.env) {
      if (e.starts_with("CHRONUS_FD=") || e.starts_with("DSEC_CHRONUS_TOKEN=")
          || e.starts_with("CHRONUS_SOCKET="))
        continue;
      if (e.starts_with("PATH=")) {
        if (path)
          continue; // the first one counts, as getenv(3) sees it
        path = true;
        trusted_env.push_back(e.compare(5, bin.size(), bin) == 0 ? e : "PATH=" + bin + e.substr(5));
        continue;
      }
      trusted_env.push_back(e);
    }
    if (!path)
      trusted_env.push_back("PATH=" + bin + default_path);
    trusted_env.push_back("CHRONUS_FD=" + std::to_string(proto::trusted_channel_fd));
    env = &trusted_env;
  }
  // Build the message in a reused buffer: header, cwd, argv, env.
  proto::exec m;
  m.id = next_id_++;
  m.argc = static_cast<uint32_t>(cmd.argv.size());
  m.envc = static_cast<uint32_t>(env->size());
  if (cmd.uid || cmd.gid) {
    m.flags |= proto::exec_set_ids;
    m.uid = cmd.uid.value_or(0);
    m.gid = cmd.gid.value_or(cmd.uid.value_or(0));
  }
  if (cmd.trusted)
    m.flags |= proto::exec_trusted;
  if (cmd.pristine)
    m.flags |= proto::exec_pristine;
  if (cmd.pty) {
    m.flags |= proto::exec_pty;
    m.rows = cmd.pty->rows;
    m.cols = cmd.pty->cols;
  }
  size_t need = sizeof m + cmd.cwd.size() + 1;
  for (const auto& s : cmd.argv)
    need += s.size() + 1;
  for (const auto& s : *env)
    need += s.size() + 1;
  if (cmd.groups.size() > proto::max_groups)
    return make_error(errc::invalid_argument,
                      "the user is in " + std::to_string(cmd.groups.size())
                        + " groups; a command takes at most " + std::to_string(proto::max_groups));
  if (m.flags & proto::exec_set_ids) {
    m.ngroups = static_cast<uint32_t>(cmd.groups.size());
    need += cmd.groups.size() * sizeof(uint32_t);
  }
  if (need - sizeof m > proto::max_exec_data
      || cmd.argv.size() + env->size() > proto::max_exec_strings)
    return make_error(errc::invalid_argument,
                      "command line and environment are too long ("
                        + std::to_string(need - sizeof m) + " bytes in "
                        + std::to_string(cmd.argv.size() + env->size())
                        + " strings; dsec takes at most "
                        + std::to_string(proto::max_exec_data) + " bytes in "
                        + std::to_string(proto::max_exec_strings)
                        + " strings, and the kernel's execve limit, 2 MiB for an 8 MiB stack, applies in the sandbox)");
  for (const auto& s : cmd.argv)
    if (s.find('\0') != std::string::npos)
      return make_error(errc::invalid_argument, "an argument contains a NUL byte");
  m.data_len = static_cast<uint32_t>(need - sizeof m);
  // Up to max_exec_message the strings follow the header in the message (the
  // reused buffer msg_); a longer command line goes in a sealed memfd, so
  // that no sandbox keeps megabytes of buffer for one long command.
  bool in_file = need > proto::max_exec_message;
  std::vector<char> long_strings;
  if (in_file) {
    m.flags |= proto::exec_data_fd;
    long_strings.resize(m.data_len);
  } else {
    msg_.resize(need);
  }
  char* p = in_file ? long_strings.data() : msg_.data() + sizeof m;
  auto put = [&](const std::string& s) {
    std::memcpy(p, s.c_str(), s.size() + 1);
    p += s.size() + 1;
  };
  put(cmd.cwd);
  for (const auto& s : cmd.argv)
    put(s);
  for (const auto& s : *env)
    put(s);
  if (m.ngroups > 0) {
    std::memcpy(p, cmd.groups.data(), m.ngroups * sizeof(uint32_t));
    p += m.ngroups * sizeof(uint32_t);
  }
  unique_fd data_fd;
  if (in_file) {
    msg_.resize(sizeof m);
    data_fd.reset(::memfd_create("dsec-exec", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!data_fd)
      return sys_error("memfd_create for a long command line");
    for (size_t off = 0; off < long_strings.size();) {
      ssize_t n = sys::retry([&] {
        return ::pwrite(data_fd.get(), long_strings.data() + off, long_strings.size() - off,
                        static_cast<off_t>(off));
      });
      if (n <= 0)
        return sys_error("writing a long command line to its memfd");
      off += static_cast<size_t>(n);
    }
    // Sealed: nobody, the sandbox included, can change what init reads.
    if (::fcntl(data_fd.get(), F_ADD_SEALS,
                F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
      return sys_error("sealing a long command line's memfd");
    need = sizeof m;
  }
  std::memcpy(msg_.data(), &m, sizeof m);
  unique_fd devnull;
  auto fd_or_null = [&](int fd) {
    if (fd >= 0 || cmd.pty)
      return fd;
    if (!devnull)
      devnull.reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
    return devnull.get();
  };
  int fds[4] = {fd_or_null(io.in), fd_or_null(io.out), fd_or_null(io.err), -1};
  if (!cmd.pty && (fds[0] < 0 || fds[1] < 0 || fds[2] < 0))
    return sys_error("open", "/dev/null");
  // A terminal's command gets the slave from init: nothing attached but the
  // long command line's memfd.
  size_t nfds = cmd.pty ? 0 : 3;
  if (in_file)
    fds[nfds++] = data_fd.get();
  if (unix_socket::send(ctl_.get(), msg_.data(), need, fds, nfds) < 0) {
    if (errno == EPIPE || errno == ECONNRESET) {
      init_gone_ = true;
      return init_died();
    }
    return sys_error("sending a command to the sandbox");
  }
  return m.id;
}

expected<uint64_t> container::exec(const command& cmd, const stdio& io) {
  DSEC_TRY(id, send_exec(cmd, io));
  cmds_.emplace_back().id = id;
  for (;;) {
    auto it = std::find_if(cmds_.begin(), cmds_.end(), [&](const pending& p) { return p.id == id; });
    if (it->failure) {
      auto e = describe_exec_failure(cmd, std::move(*it->failure));
      cmds_.erase(it);
      return e;
    }
    if (it->started || it->done)
      return id;
    DSEC_TRY(more, pump({}));
    (void) more;
  }
}

unique_fd container::take_pty(uint64_t id) {
  for (auto& p : cmds_)
    if (p.id == id)
      return std::move(p.pty);
  return {};
}

expected<exit_status> container::wait(uint64_t id,
                                      std::optional<clock_type::time_point> deadline) {
  for (;;) {
    size_t i = 0;
    for (; i < cmds_.size(); ++i)
      if (cmds_[i].id == id)
        break;
    if (i == cmds_.size())
      return make_error(errc::not_found, "no command " + std::to_string(id) + " in sandbox " + id_);
    if (cmds_[i].done) {
      auto st = cmds_[i].status;
      cmds_.erase(cmds_.begin() + static_cast<ptrdiff_t>(i));
      return st;
    }
    if (init_gone_ || destroyed_)
      return make_error(errc::sandbox_failed, "sandbox " + id_ + " is gone");
    DSEC_TRY(progressed, pump(deadline));
    if (!progressed)
      return make_error(errc::timeout, "the command is still running");
  }
}

expected<void> container::signal(uint64_t id, int sig) {
  if (destroyed_ || init_gone_)
    return make_error(errc::not_found, "sandbox " + id_ + " is destroyed");
  proto::signal m;
  m.id = id;
  m.sig = sig;
  if (unix_socket::send(ctl_.get(), &m, sizeof m, nullptr, 0) < 0)
    return sys_error("signalling a command in the sandbox");
  return {};
}

void container::kill() {
  if (pidfd_ && pid_ > 0)
    sys::pidfd_send_signal(pidfd_.get(), SIGKILL);
}

expected<bool> container::reap() {
  if (destroyed_)
    return true;
  if (pidfd_) {
    siginfo_t info{};
    if (sys::retry([&] {
          return ::waitid(P_PIDFD, static_cast<id_t>(pidfd_.get()), &info, WEXITED | WNOHANG);
        }) < 0) {
      if (errno != ECHILD)
        return sys_error("reaping the sandbox init");
    } else if (info.si_pid == 0) {
      return false; // still running
    }
    pid_ = -1;
    pidfd_.reset();
  }
  destroyed_ = true;
  ctl_.reset();
  chronus_.reset();
  channel_.reset();
  upper_mnt_.reset();
  if (cgroup_)
    DSEC_TRY_VOID(cgroup_->destroy());
  return true;
}

bool container::oom_killed() const {
  return cgroup_ && cgroup_->oom_killed();
}

expected<void> container::destroy() {
  if (destroyed_)
    return {};
  destroyed_ = true;
  expected<void> result;
  if (pidfd_) {
    // SIGKILL to a pid namespace's init kills every process in it; init's exit
    // waits for them, so once it is reaped the sandbox is empty.
    if (pid_ > 0)
      sys::pidfd_send_signal(pidfd_.get(), SIGKILL);
    siginfo_t info{};
    if (sys::retry([&] {
          return ::waitid(P_PIDFD, static_cast<id_t>(pidfd_.get()), &info, WEXITED);
        }) < 0
        && errno != ECHILD)
      result = sys_error("reaping the sandbox init");
    pid_ = -1;
    pidfd_.reset();
  }
  ctl_.reset();
  chronus_.reset();
  channel_.reset();
  upper_mnt_.reset();
  if (cgroup_) {
    auto r = cgroup_->destroy();
    if (!r && result)
      result = std::move(r).error_value();
  }
  return result;
}

container::~container() {
  (void) destroy();
}

} // namespace dsec
