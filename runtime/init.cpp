#include "runtime/init.hpp"

#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/proto.hpp"
#include "runtime/security.hpp"
#include "runtime/sys.hpp"
#include "runtime/unix_socket.hpp"

namespace dsec {

bool init_resets_oom_score_adj = false;
int init_oom_score_fd = -1;
int init_devpts_fd = -1;

namespace {

struct running {
  pid_t pid;
  bool trusted; // started by the trusted helper: signals go through it
  uint64_t id;
};

// Most commands running at once in one sandbox; more are refused with EAGAIN.
constexpr size_t max_running = 4096;
// Most argv + envp entries of one command.
constexpr size_t max_strings = proto::max_exec_strings + 2;
// The most a message on init's sockets may be; a longer command line comes in
// a memfd (proto::exec_data_fd), read into buf after the header.
constexpr size_t max_message = proto::max_exec_message + 64;

// init's memory is static on purpose: it is a fork of the zygote, so touching the
// zygote's heap (a std::vector, malloc) costs copy-on-write faults in every
// sandbox, and zeroing a 128 KiB buffer costs 33 page faults. Static .bss pages
// are faulted in only as far as a message actually reaches (a long command
// line's megabytes only in a sandbox that ran one).
alignas(16) char buf[sizeof(proto::exec) + proto::max_exec_data + 64];
char* argv_buf[max_strings];
char* envp_buf[max_strings];
gid_t groups_buf[proto::max_groups]; // the command's supplementary groups (exec.ngroups)
running cmds[max_running];
// The stack of the trusted helper's clone children (CLONE_VM, like vfork, but
// CLONE_PARENT needs clone). Touched only in the helper.
alignas(64) char helper_stack[64 * 1024];

struct init_state {
  int ctl;
  int helper = -1; // the trusted helper's socket, or -1
  size_t ncmds = 0;
};

// Newer than Debian 12's headers (Linux 6.9): pidfd_send_signal to the process
// group the pidfd's process leads.
constexpr unsigned pidfd_signal_process_group = 1U << 2;

void send_or_exit(int ctl, const void* msg, size_t len) {
  if (unix_socket::send(ctl, msg, len, nullptr, 0) < 0)
    ::_exit(0); // dsec is gone: leaving tears the sandbox down
}

// The trusted helper's: the sandbox's end of the trusted channel, and an O_PATH
// descriptor of the pristine root. -1 in init.
int helper_channel = -1;
int helper_pristine = -1;

// What a command gets besides its stdio: for a trusted one, the trusted channel
// (at proto::trusted_channel_fd) and, for a pristine one, the root to enter.
struct exec_extras {
  int channel = -1;
  int root = -1;
  bool trusted = false; // drop the helper's CAP_SYS_CHROOT before execve
};

// When init could not be lowered (no CAP_SYS_RESOURCE; init_oom_score_fd
// set), its children are raised instead: init's own oom_score_adj goes to 500
// for the fork, which the child inherits, and back to 0 after (0 is the floor
// then, so init may go back down). 500 counts as half the memory limit more
// than init in the memory cgroup's choice, and makes the host's OOM killer,
// too, take sandbox commands before the host's own processes. (The child could
// not do it itself: it cannot open its own /proc files, being not dumpable.)
struct raised_oom_score {
  raised_oom_score() {
    if (init_oom_score_fd >= 0)
      (void) !::write(init_oom_score_fd, "500", 3);
  }
  ~raised_oom_score() {
    if (init_oom_score_fd >= 0)
      (void) !::write(init_oom_score_fd, "0", 1);
  }
  raised_oom_score(const raised_oom_score&) = delete;
  raised_oom_score& operator=(const raised_oom_score&) = delete;
};

// Shared with the vfork child, which writes here before it _exits.
struct vfork_result {
  volatile int err;
  volatile uint32_t stage;
};

// Runs in the vfork child: only async-signal-safe calls, no allocation.
[[noreturn]] void exec_child(const proto::exec& m, const char* cwd, char* const* argv,
                             char* const* envp, const int* fds, const exec_extras& x,
                             vfork_result* out) {
  auto fail = [&](proto::exec_stage st) {
    out->err = errno;
    out->stage = static_cast<uint32_t>(st);
    ::_exit(127);
  };
  sigset_t all;
  sigemptyset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  // Every signal at its default action: an ignored one survives execve, and
  // the zygote inherits dsecd's (a daemon started in the background of a
  // script ignores SIGINT and SIGQUIT), which would make ^C on a terminal,
  // or a trainer's SIGINT, do nothing. (The vfork child has its own copy of
  // the handlers: init's are not touched.)
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP)
      (void) ::sigaction(sig, &dfl, nullptr);
  // Its own session and process group: no controlling terminal (so TIOCSTI on
  // a terminal passed in from the host fails), and signals reach the whole job.
  ::setsid();
  // The OOM killer's usual candidate again (init keeps -999 from the
  // zygote); without CAP_SYS_RESOURCE the command got 500 from init's fork
  // instead (raised_oom_score below).
  if (init_resets_oom_score_adj) {
    if (int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); fd >= 0) {
      (void) !::write(fd, "0", 1);
      ::close(fd);
    }
  }
  // A pristine command's root: entered with the helper's CAP_SYS_CHROOT, through
  // its descriptor (the pristine root is reachable by no path of the sandbox).
  if (x.root >= 0 && (::fchdir(x.root) < 0 || ::chroot(".") < 0))
    fail(proto::exec_stage::root);
  // Move the descriptors into place (stdio, then the trusted channel at 3)
  // without clobbering one another: first all above the targets.
  const int src[4] = {fds[0], fds[1], fds[2], x.channel};
  int n = x.channel >= 0 ? 4 : 3;
  int tmp[4];
  for (int i = 0; i < n; ++i) {
    tmp[i] = ::fcntl(src[i], F_DUPFD_CLOEXEC, 10);
    if (tmp[i] < 0)
      fail(proto::exec_stage::fork);
  }
  for (int i = 0; i < n; ++i)
    if (::dup2(tmp[i], i) < 0) // the copy at i is not close-on-exec
      fail(proto::exec_stage::fork);
  static_assert(proto::trusted_channel_fd == 3);
  sys::close_range(static_cast<unsigned>(n), ~0U, 0);
  // A terminal's command: the slave (now at 0, 1 and 2) becomes the
  // controlling terminal of the session setsid() made above; its process
  // group is the terminal's foreground group (^C reaches it, a shell's job
  // control works).
  if ((m.flags & proto::exec_pty) && ::ioctl(0, TIOCSCTTY, 0) < 0)
    fail(proto::exec_stage::fork);
  // The helper keeps CAP_SYS_CHROOT for the line above; its commands do not.
  if (x.trusted && security::drop_capabilities() < 0)
    fail(proto::exec_stage::fork);
  if (::chdir(cwd) < 0)
    fail(proto::exec_stage::chdir);
  if (m.flags & proto::exec_set_ids) {
    if (::setgroups(m.ngroups, groups_buf) < 0 || ::setresgid(m.gid, m.gid, m.gid) < 0
        || ::setresuid(m.uid, m.uid, m.uid) < 0)
      fail(proto::exec_stage::set_ids);
  }
  const char* file = argv[0];
  if (std::strchr(file, '/')) {
    ::execve(file, argv, envp);
    fail(proto::exec_stage::execve);
  }
  // Search the command's own PATH, not init's.
  const char* path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (char* const* e = envp; *e; ++e)
    if (std::strncmp(*e, "PATH=", 5) == 0)
      path = *e + 5;
  size_t flen = std::strlen(file);
  int first_err = ENOENT;
  char candidate[PATH_MAX];
  for (const char* p = path;; ) {
    const char* end = std::strchr(p, ':');
    size_t dlen = end ? static_cast<size_t>(end - p) : std::strlen(p);
    if (dlen + 1 + flen + 1 <= sizeof candidate) {
      size_t k = 0;
      if (dlen == 0)
        candidate[k++] = '.';
      std::memcpy(candidate + k, p, dlen);
      k += dlen;
      candidate[k++] = '/';
      std::memcpy(candidate + k, file, flen + 1);
      ::execve(candidate, argv, envp);
      if (errno == EACCES)
        first_err = EACCES;
      else if (errno != ENOENT && errno != ENOTDIR)
        fail(proto::exec_stage::execve);
    }
    if (!end)
      break;
    p = end + 1;
  }
  errno = first_err;
  fail(proto::exec_stage::execve);
  __builtin_unreachable();
}

// Reads `len` bytes at the start of `fd` into `to`. False on a short file.
bool read_all(int fd, char* to, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = ::pread(fd, to + off, len - off, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Splits the exec message in buf (len bytes, nfds descriptors attached) into
// `m`, `cwd`, argv_buf and envp_buf; a long command line's strings are read
// from its memfd (the last descriptor) into buf after the header. False if it
// is malformed: dsec built it, so that is a bug, but neither init nor the
// helper may crash on it.
bool parse_exec(size_t len, const int* fds, size_t nfds, proto::exec& m, const char*& cwd) {
  std::memcpy(&m, buf, sizeof m);
  const char* data = buf + sizeof m;
  size_t data_len = len - sizeof m;
  bool pty = (m.flags & proto::exec_pty) != 0;
  bool in_file = (m.flags & proto::exec_data_fd) != 0;
  bool ok = nfds == (pty ? 0U : 3U) + (in_file ? 1U : 0U) && m.argc >= 1
            && uint64_t{m.argc} + m.envc <= proto::max_exec_strings;
  if (ok && in_file) {
    // The header alone; the strings are in the sealed memfd dsec attached
    // last. pread: the trusted helper reads the same file again.
    ok = data_len == 0 && m.data_len <= proto::max_exec_data
         && read_all(fds[nfds - 1], buf + sizeof m, m.data_len);
    data_len = m.data_len;
  }
  // The supplementary gids follow the strings (with exec_set_ids only).
  size_t group_bytes = size_t{m.ngroups} * sizeof(uint32_t);
  ok = ok && m.ngroups <= proto::max_groups
       && (m.ngroups == 0 || (m.flags & proto::exec_set_ids) != 0) && m.data_len == data_len
       && data_len > group_bytes;
  if (ok) {
    data_len -= group_bytes;
    for (uint32_t i = 0; i < m.ngroups; ++i) {
      uint32_t g;
      std::memcpy(&g, data + data_len + i * sizeof g, sizeof g);
      groups_buf[i] = static_cast<gid_t>(g);
    }
  }
  ok = ok && data[data_len - 1] == '\0';
  // Split the strings: cwd, argv..., env...
  cwd = data;
  size_t nargv = 0, nenvp = 0;
  if (ok) {
    size_t want = 1 + m.argc + m.envc, got = 0;
    const char* p = data;
    const char* end = data + data_len;
    while (p < end && got < want) {
      if (got >= 1 && got < 1 + m.argc)
        argv_buf[nargv++] = const_cast<char*>(p);
      else if (got >= 1 + m.argc)
        envp_buf[nenvp++] = const_cast<char*>(p);
      ++got;
      p += std::strlen(p) + 1;
    }
    ok = got == want && p == end;
  }
  if (ok) {
    argv_buf[nargv] = nullptr;
    envp_buf[nenvp] = nullptr;
  }
  return ok;
}

// Hands a trusted command to the helper and waits for its answer, as the vfork
// below waits for the exec: the command cannot be reaped before it is recorded,
// because SIGCHLD is only read in the main loop.
void start_trusted(init_state& s, const proto::exec& m, size_t len, const int* fds,
                   size_t nfds) {
  proto::exec_failed fail;
  fail.id = m.id;
  fail.stage = static_cast<uint32_t>(proto::exec_stage::fork);
  if (s.helper < 0) {
    fail.err = EPERM; // not a Chronus sandbox: dsec refuses this before sending it
    send_or_exit(s.ctl, &fail, sizeof fail);
    return;
  }
  if (unix_socket::send(s.helper, buf, len, fds, nfds) < 0) {
    fail.err = errno;
    send_or_exit(s.ctl, &fail, sizeof fail);
    return;
  }
  alignas(8) char reply[64];
  ssize_t n = unix_socket::recv(s.helper, reply, sizeof reply, nullptr, 0, nullptr);
  proto::header h{};
  if (n >= static_cast<ssize_t>(sizeof h))
    std::memcpy(&h, reply, sizeof h);
  bool ours = h.magic == proto::magic;
  if (ours && h.kind == proto::type::started && n == static_cast<ssize_t>(sizeof(proto::started))) {
    proto::started st;
    std::memcpy(&st, reply, sizeof st);
    if (st.id == m.id && st.pid > 0) {
      cmds[s.ncmds++] = {st.pid, true, m.id};
      send_or_exit(s.ctl, &st, sizeof st);
      return;
    }
  } else if (ours && h.kind == proto::type::exec_failed
             && n == static_cast<ssize_t>(sizeof(proto::exec_failed))) {
    proto::exec_failed f;
    std::memcpy(&f, reply, sizeof f);
    if (f.id == m.id) {
      // The child that failed is ours (CLONE_PARENT): reap it now, as the
      // untrusted path does, unless the pid is a command we know.
      bool known = false;
      for (size_t i = 0; i < s.ncmds && !known; ++i)
        known = cmds[i].pid == f.pid;
      if (f.pid > 0 && !known) {
        int st;
        sys::retry([&] { return ::waitpid(f.pid, &st, 0); });
      }
      f.pid = 0;
      send_or_exit(s.ctl, &f, sizeof f);
      return;
    }
  }
  // The helper is gone (EPIPE) or answered nonsense (EPROTO).
  fail.err = n == 0 ? EPIPE : n < 0 ? errno : EPROTO;
  send_or_exit(s.ctl, &fail, sizeof fail);
}

// A pseudo-terminal for command `m` (proto::exec_pty): its master, opened
// from the sandbox's devpts through init_devpts_fd (never a path of the
// sandbox; O_NONBLOCK, so not even a stranger file could make init wait), and
// in `slave` its peer (TIOCGPTPEER: no path either), both close-on-exec.
// Returns -errno on failure.
int open_pty(const proto::exec& m, int& slave) {
  if (init_devpts_fd < 0)
    return -ENOTTY;
  int master = ::openat(init_devpts_fd, "ptmx",
                        O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (master < 0)
    return -errno;
  struct stat st;
  int unlock = 0;
  winsize ws{};
  ws.ws_row = m.rows;
  ws.ws_col = m.cols;
  int err = 0;
  if (::fstat(master, &st) < 0)
    err = errno;
  else if (!S_ISCHR(st.st_mode))
    err = ENOTTY;
  else if (::ioctl(master, TIOCSPTLCK, &unlock) < 0 || ::ioctl(master, TIOCSWINSZ, &ws) < 0)
    err = errno;
  if (err == 0) {
    slave = ::ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (slave < 0)
      err = errno;
  }
  if (err != 0) {
    ::close(master);
    return -err;
  }
  // The command's own terminal, as login(1) would make it: owned by the user
  // it runs as (devpts made it init's, the sandbox's root).
  if (m.flags & proto::exec_set_ids)
    (void) !::fchown(slave, m.uid, static_cast<gid_t>(-1));
  return master;
}

// Parses one exec message and starts the command. Malformed messages are
// answered with exec_failed(EPROTO).
void handle_exec(init_state& s, size_t len, const int* fds, size_t nfds) {
  proto::exec m;
  const char* cwd = nullptr;
  bool ok = parse_exec(len, fds, nfds, m, cwd);
  proto::exec_failed fail;
  fail.id = m.id;
  if (!ok) {
    fail.stage = static_cast<uint32_t>(proto::exec_stage::fork);
    fail.err = EPROTO;
    send_or_exit(s.ctl, &fail, sizeof fail);
    return;
  }
  if (s.ncmds == max_running) {
    fail.stage = static_cast<uint32_t>(proto::exec_stage::fork);
    fail.err = EAGAIN;
    send_or_exit(s.ctl, &fail, sizeof fail);
    return;
  }
  if ((m.flags & proto::exec_pty) && (m.flags & proto::exec_trusted)) {
    // A terminal of the sandbox's devpts is open to the agent (root in the
    // sandbox): a trusted command's I/O must not go through one. dsec
    // refuses this before sending it.
    fail.stage = static_cast<uint32_t>(proto::exec_stage::fork);
    fail.err = EPERM;
    send_or_exit(s.ctl, &fail, sizeof fail);
    return;
  }
  if (m.flags & proto::exec_trusted) {
    start_trusted(s, m, len, fds, nfds);
    return;
  }
  if (m.flags & proto::exec_pristine) {
    fail.stage = static_cast<uint32_t>(proto::exec_stage::fork);
    fail.err = EPERM; // only trusted commands run in the pristine root
    send_or_exit(s.ctl, &fail, sizeof fail);
    return;
  }
  int master = -1, slave = -1;
  int pty_fds[3];
  if (m.flags & proto::exec_pty) {
    master = open_pty(m, slave);
    if (master < 0) {
      fail.stage = static_cast<uint32_t>(proto::exec_stage::fork);
      fail.err = -master;
      send_or_exit(s.ctl, &fail, sizeof fail);
      return;
    }
    pty_fds[0] = pty_fds[1] = pty_fds[2] = slave;
  }
  const int* const cmd_fds = master >= 0 ? pty_fds : fds;
  vfork_result r{0, 0};
  pid_t pid;
  {
    raised_oom_score raised;
    pid = ::vfork();
    if (pid == 0)
      exec_child(m, cwd, argv_buf, envp_buf, cmd_fds, exec_extras{}, &r);
  }
  if (slave >= 0)
    ::close(slave); // the command holds it: its last close ends the master's stream
  if (pid < 0 || r.err != 0) {
    int err = pid < 0 ? errno : r.err;
    if (pid > 0) {
      int st;
      sys::retry([&] { return ::waitpid(pid, &st, 0); });
    }
    if (master >= 0)
      ::close(master);
    fail.stage = pid < 0 ? static_cast<uint32_t>(proto::exec_stage::fork) : r.stage;
    fail.err = err;
    send_or_exit(s.ctl, &fail, sizeof fail);
    return;
  }
  cmds[s.ncmds++] = {pid, false, m.id};
  proto::started st;
  st.id = m.id;
  st.pid = pid;
  if (master >= 0) {
    // The master goes to dsec; init keeps nothing of the terminal.
    if (unix_socket::send(s.ctl, &st, sizeof st, &master, 1) < 0)
      ::_exit(0);
    ::close(master);
    return;
  }
  send_or_exit(s.ctl, &st, sizeof st);
}

void handle_signal(init_state& s, const proto::signal& m) {
  for (size_t i = 0; i < s.ncmds; ++i)
    if (cmds[i].id == m.id) {
      if (cmds[i].trusted) {
        // Landlock keeps init (in the agent's domain) from signalling it: the
        // helper does, through a pidfd, which cannot name a recycled pid.
        int pidfd = sys::pidfd_open(cmds[i].pid, 0);
        if (pidfd >= 0) {
          (void) unix_socket::send(s.helper, &m, sizeof m, &pidfd, 1);
          ::close(pidfd);
        }
        return;
      }
      if (::kill(-cmds[i].pid, m.sig) < 0)
        ::kill(cmds[i].pid, m.sig);
      return;
    }
}

void reap(init_state& s) {
  for (;;) {
    int st;
    pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid <= 0)
      return;
    for (size_t i = 0; i < s.ncmds; ++i)
      if (cmds[i].pid == pid) {
        proto::exited e;
        e.id = cmds[i].id;
        e.status = st;
        cmds[i] = cmds[--s.ncmds];
        send_or_exit(s.ctl, &e, sizeof e);
        break;
      }
  }
}

// ---- the trusted helper ------------------------------------------------------

struct trusted_start {
  const proto::exec* m;
  const char* cwd;
  const int* fds;
  exec_extras x;
  vfork_result* out;
};

int trusted_child(void* arg) {
  auto* a = static_cast<trusted_start*>(arg);
  exec_child(*a->m, a->cwd, argv_buf, envp_buf, a->fds, a->x, a->out);
}

void helper_reply(int sock, const void* msg, size_t len) {
  if (unix_socket::send(sock, msg, len, nullptr, 0) < 0)
    ::_exit(0); // init is gone
}

// Starts one trusted command, like init's vfork but with CLONE_PARENT: its
// parent is init, which reaps it. Answers started or exec_failed.
void helper_exec(int sock, size_t len, const int* fds, size_t nfds) {
  proto::exec m;
  const char* cwd = nullptr;
  bool ok = parse_exec(len, fds, nfds, m, cwd);
  proto::exec_failed fail;
  fail.id = m.id;
  fail.stage = static_cast<uint32_t>(proto::exec_stage::fork);
  if (!ok) {
    fail.err = EPROTO;
    helper_reply(sock, &fail, sizeof fail);
    return;
  }
  if (m.flags & proto::exec_pty) {
    fail.err = EPERM; // init never forwards one (no terminal for trusted commands)
    helper_reply(sock, &fail, sizeof fail);
    return;
  }
  if ((m.flags & proto::exec_pristine) && helper_pristine < 0) {
    fail.err = EPERM; // dsec sends pristine commands only to Chronus sandboxes
    helper_reply(sock, &fail, sizeof fail);
    return;
  }
  exec_extras x;
  x.channel = helper_channel;
  x.root = (m.flags & proto::exec_pristine) ? helper_pristine : -1;
  x.trusted = true;
  vfork_result r{0, 0};
  trusted_start a{&m, cwd, fds, x, &r};
  // The seccomp filter answers clone3 with ENOSYS; glibc's clone() is clone(2).
  pid_t pid = ::clone(trusted_child, helper_stack + sizeof helper_stack,
                      CLONE_PARENT | CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
  if (pid < 0) {
    fail.err = errno;
  } else if (r.err != 0) {
    fail.stage = r.stage;
    fail.err = r.err;
    fail.pid = pid;
  } else {
    proto::started st;
    st.id = m.id;
    st.pid = pid;
    helper_reply(sock, &st, sizeof st);
    return;
  }
  helper_reply(sock, &fail, sizeof fail);
}

// Signals a trusted command's process group (or, if it left it, the command).
void helper_signal(int pidfd, int sig) {
  if (::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, pidfd_signal_process_group) < 0)
    (void) sys::pidfd_send_signal(pidfd, sig);
}

[[noreturn]] void helper_main(int sock) {
  for (;;) {
    int fds[unix_socket::max_fds];
    size_t nfds = 0;
    ssize_t n = unix_socket::recv(sock, buf, max_message, fds, unix_socket::max_fds, &nfds);
    if (n == 0 || (n < 0 && errno != EMSGSIZE))
      ::_exit(0); // init is gone
    proto::header h{};
    if (n >= static_cast<ssize_t>(sizeof h))
      std::memcpy(&h, buf, sizeof h);
    if (h.magic == proto::magic && h.kind == proto::type::signal
        && n == static_cast<ssize_t>(sizeof(proto::signal))) {
      proto::signal m;
      std::memcpy(&m, buf, sizeof m);
      if (nfds == 1)
        helper_signal(fds[0], m.sig);
    } else if (n < 0 || (h.magic == proto::magic && h.kind == proto::type::exec)) {
      // init waits for an answer to every exec, even one that did not arrive whole.
      if (n >= static_cast<ssize_t>(sizeof(proto::exec))) {
        helper_exec(sock, static_cast<size_t>(n), fds, nfds);
      } else {
        proto::exec_failed fail;
        fail.err = EPROTO;
        helper_reply(sock, &fail, sizeof fail);
      }
    }
    for (size_t i = 0; i < nfds; ++i)
      ::close(fds[i]);
  }
}

} // namespace

int start_trusted_helper(int ctl, char* argv_begin, size_t argv_len, int channel,
                         int pristine) {
  int sv[2];
  if (unix_socket::pair(sv) < 0)
    return -errno;
  pid_t init = ::getpid();
  pid_t pid;
  {
    raised_oom_score raised; // the helper and its trusted commands at 500 too
    pid = ::fork();
  }
  if (pid < 0) {
    int err = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    return -err;
  }
  if (pid == 0) {
    ::close(ctl);
    ::close(sv[0]);
    if (init_oom_score_fd >= 0)
      ::close(init_oom_score_fd);
    if (init_devpts_fd >= 0)
      ::close(init_devpts_fd); // trusted commands get no terminal
    init_devpts_fd = -1;
    helper_channel = channel;
    helper_pristine = pristine;
    // It dies with init: init is pid 1 of the sandbox's pid namespace, so its
    // end kills every process in it. (A PR_SET_PDEATHSIG would not do: init
    // is about to enter the nested domain, which may not signal this one.)
    // Its socket also reads EOF then, and a helper that outlived init would
    // exit.
    if (::getppid() != init)
      ::_exit(0);
    // Inherited from init, and kept: the agent cannot read it in any case
    // (another Landlock domain), nor can the trusted commands it starts.
    ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (argv_len > 0) {
      std::memset(argv_begin, 0, argv_len);
      std::strncpy(argv_begin, "dsec-trusted", argv_len - 1);
    }
    ::prctl(PR_SET_NAME, "dsec-trusted", 0, 0, 0);
    helper_main(sv[1]);
  }
  ::close(sv[1]);
  // Init holds neither: the agent's commands are its children.
  ::close(channel);
  ::close(pristine);
  return sv[0];
}

void init_main(int ctl, int helper) {
  init_state s;
  s.ctl = ctl;
  s.helper = helper;
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  int sfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0)
    ::_exit(1);
  pollfd pf[2] = {{ctl, POLLIN, 0}, {sfd, POLLIN, 0}};
  for (;;) {
    if (::poll(pf, 2, -1) < 0) {
      if (errno == EINTR)
        continue;
      ::_exit(1);
    }
    if (pf[1].revents) {
      signalfd_siginfo si;
      while (::read(sfd, &si, sizeof si) > 0) {
      }
      reap(s);
    }
    if (pf[0].revents) {
      int fds[unix_socket::max_fds];
      size_t nfds = 0;
      ssize_t n = unix_socket::recv(ctl, buf, max_message, fds, unix_socket::max_fds, &nfds);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EMSGSIZE))
        ::_exit(0);
      if (n >= static_cast<ssize_t>(sizeof(proto::header))) {
        proto::header h;
        std::memcpy(&h, buf, sizeof h);
        if (h.magic == proto::magic && h.kind == proto::type::exec
            && n >= static_cast<ssize_t>(sizeof(proto::exec))) {
          handle_exec(s, static_cast<size_t>(n), fds, nfds);
        } else if (h.magic == proto::magic && h.kind == proto::type::signal
                   && n == static_cast<ssize_t>(sizeof(proto::signal))) {
          proto::signal m;
          std::memcpy(&m, buf, sizeof m);
          handle_signal(s, m);
        }
      }
      for (size_t i = 0; i < nfds; ++i)
        ::close(fds[i]);
    }
  }
}

} // namespace dsec
