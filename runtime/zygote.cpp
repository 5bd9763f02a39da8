#include "runtime/zygote.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/epoll.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "runtime/init.hpp"
#include "runtime/proc_mask.hpp"
#include "runtime/proto.hpp"
#include "runtime/seccomp_filter.hpp" // generated at build time
#include "runtime/security.hpp"
#include "runtime/sys.hpp"
#include "runtime/unix_socket.hpp"

namespace dsec {

namespace {

constexpr int host_sock = 3;
constexpr int userns_fd = 4;

// Network namespaces for sandboxes without networking: one per sandbox, so that
// ports and abstract unix socket names are private, and recycled when the
// sandbox ends, because making one costs ~0.36 ms and tearing it down more.
// Reuse is safe: nothing in it is ever up, the sandbox cannot configure it
// (no CAP_NET_ADMIN) nor change its sysctls (/proc/sys is read-only), and its
// sockets die with its processes.
struct netns_pool {
  int epoll = -1;            // pidfds of the sandboxes holding a namespace
  std::vector<int> free;     // namespaces ready for the next sandbox
  struct lent {
    int pidfd;
    int netns;
  };
  std::vector<lent> out;     // slot i: what sandbox i holds; pidfd -1 when free
  std::vector<size_t> spare; // free slots of `out`
  size_t max_free = 256;     // more than this idle are closed
};

struct zygote_state {
  char* argv_begin = nullptr; // our argv strings, overwritten in each init
  size_t argv_len = 0;
  int host_pidfd = -1;
  uint32_t landlock_abi = 0;
  uint32_t proc_masks = 0;    // which of proc_masks each sandbox applies
  rlimit nofile{};            // RLIMIT_NOFILE as we got it; sandboxes get it back
  netns_pool pool;
};

uint64_t now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL
         + static_cast<uint64_t>(ts.tv_nsec);
}

void copy_str(char* dst, size_t cap, const char* src) {
  std::strncpy(dst, src, cap - 1);
  dst[cap - 1] = '\0';
}

[[noreturn]] void startup_failed(const char* step, const char* path, int err) {
  proto::hello h;
  h.err = err != 0 ? err : EINVAL;
  copy_str(h.step, sizeof h.step, step);
  copy_str(h.path, sizeof h.path, path);
  (void) unix_socket::send(host_sock, &h, sizeof h, nullptr, 0);
  ::_exit(1);
}

// The zygote's own setup, in order. Each failure names its step.
// Makes a namespace (owned by the sandbox user namespace) and returns its fd.
// We stay in it: we do no networking, and cannot go back to the host's (we
// have no privilege over it any more).
int make_netns() {
  if (::unshare(CLONE_NEWNET) < 0)
    return -1;
  return ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
}

// Takes back the namespaces of sandboxes that ended.
void recycle(netns_pool& p) {
  epoll_event evs[64];
  for (;;) {
    int n = ::epoll_wait(p.epoll, evs, 64, 0);
    if (n <= 0)
      return;
    for (int i = 0; i < n; ++i) {
      size_t slot = evs[i].data.u64;
      auto& l = p.out[slot];
      ::epoll_ctl(p.epoll, EPOLL_CTL_DEL, l.pidfd, nullptr);
      ::close(l.pidfd);
      if (p.free.size() < p.max_free)
        p.free.push_back(l.netns);
      else
        ::close(l.netns);
      l = {-1, -1};
      p.spare.push_back(slot);
    }
    if (n < 64)
      return;
  }
}

void set_up(zygote_state& z, pid_t host, unsigned prewarm) {
  // Die with the dsec process; if it is already gone, do not start.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || ::getppid() != host)
    startup_failed("pdeathsig", "", errno);
  // Only the two descriptors we were given survive.
  sys::close_range(5, ~0U, 0);
  z.host_pidfd = sys::pidfd_open(host, 0);
  if (z.host_pidfd < 0)
    startup_failed("pidfd_open", "", errno);
  z.landlock_abi = security::landlock_abi();
  // A private copy of the host's mounts, so that nothing we do propagates back.
  if (::unshare(CLONE_NEWNS) < 0)
    startup_failed("private_mounts", "unshare(CLONE_NEWNS)", errno);
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0)
    startup_failed("private_mounts", "/", errno);
  // A minimal root: an empty tmpfs with /mnt (where each sandbox's root is
  // attached) and /proc (without a visible proc mount the kernel refuses to
  // mount a sandbox's own proc from inside a user namespace; we also read
  // /proc/self/ns/net from it).
  if (::mount("dsec-zygote", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=64k,mode=0755") < 0)
    startup_failed("minimal_root", "/tmp", errno);
  // /pristine: where a Chronus sandbox's pristine root is attached, beneath its
  // own root once it has entered that (chronus_mounts).
  if (::mkdir("/tmp/mnt", 0755) < 0 || ::mkdir("/tmp/proc", 0555) < 0
      || ::mkdir("/tmp/mask", 0555) < 0 || ::mkdir("/tmp/pristine", 0755) < 0)
    startup_failed("minimal_root", "/tmp/mnt", errno);
  // What every sandbox binds over the /proc files it must not see (/mask).
  if (int rc = prepare_proc_masks("/tmp/mask"); rc < 0)
    startup_failed("minimal_root", "/tmp/mask", -rc);
  if (::mount("proc", "/tmp/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
    startup_failed("minimal_root", "/tmp/proc", errno);
  z.proc_masks = proc_masks_to_apply("/tmp/proc");
  if (::chdir("/tmp") < 0 || ::syscall(SYS_pivot_root, ".", ".") < 0)
    startup_failed("minimal_root", "pivot_root", errno);
  if (::umount2(".", MNT_DETACH) < 0 || ::chdir("/") < 0)
    startup_failed("minimal_root", "umount old root", errno);
  // The memory cgroup's OOM killer should kill the sandbox's processes, not
  // its init (whose end ends the sandbox): init inherits this from us, and
  // sets 0 for every command it starts (init.cpp). Only while we are the
  // host's root, with CAP_SYS_RESOURCE, can we lower it (without, init keeps
  // 0 and starts every command at 500 instead, init_oom_score_fd: a command
  // that lowers itself back to 0 may get init killed, and the whole sandbox
  // ends, still bounded);
  // -999, not -1000, so that nothing is immune: a command may go back down to
  // -999 (the floor this sets), never below.
  if (int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); fd >= 0) {
    init_resets_oom_score_adj = ::write(fd, "-999", 4) == 4;
    ::close(fd);
  }
  // Become the sandbox user namespace's root.
  if (::setns(userns_fd, CLONE_NEWUSER) < 0)
    startup_failed("enter_userns", "setns", errno);
  if (::setgroups(0, nullptr) < 0 || ::setresgid(0, 0, 0) < 0 || ::setresuid(0, 0, 0) < 0)
    startup_failed("enter_userns", "setresuid", errno);
  ::close(userns_fd);
  // Each prctl(PR_CAPBSET_DROP) commits new credentials: do the thirty-odd of
  // them once here rather than in every sandbox. It limits only what an execve
  // can gain, so the sandboxes still have what their setup needs.
  if (int rc = security::limit_bounding_set(); rc < 0)
    startup_failed("bounding_set", "prctl(PR_CAPBSET_DROP)", -rc);
  // A live sandbox holds two of our descriptors (pidfd, network namespace).
  ::getrlimit(RLIMIT_NOFILE, &z.nofile);
  rlimit more = z.nofile;
  more.rlim_cur = more.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &more);
  z.pool.epoll = ::epoll_create1(EPOLL_CLOEXEC);
  if (z.pool.epoll < 0)
    startup_failed("netns_pool", "epoll_create1", errno);
  for (unsigned i = 0; i < prewarm; ++i) {
    int fd = make_netns();
    if (fd < 0)
      startup_failed("netns_pool", "unshare(CLONE_NEWNET)", errno);
    z.pool.free.push_back(fd);
  }
}

// ---- the sandbox's first process ------------------------------------------

struct child_ctx {
  const zygote_state* z;
  const proto::spawn* req;
  const char* mount_paths; // req->host_mounts targets, NUL-terminated in turn
  int* fds;
  size_t nfds;
  int ctl;
  int netns; // from the pool, or -1 with spawn_net
  proto::ready ready;
  uint64_t last;
};

[[noreturn]] void child_fail(child_ctx& c, proto::child_step step, const char* path, int err) {
  proto::setup_failed m;
  m.step = static_cast<uint32_t>(step);
  m.err = err;
  copy_str(m.path, sizeof m.path, path);
  (void) unix_socket::send(c.ctl, &m, sizeof m, nullptr, 0);
  ::_exit(1);
}

void mark(child_ctx& c, proto::child_step step) {
  auto t = now_ns();
  c.ready.step_ns[static_cast<size_t>(step)] = t - c.last;
  c.ready.taken |= 1u << static_cast<uint32_t>(step);
  c.last = t;
}

bool loopback_up() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return false;
  ifreq ifr{};
  std::strcpy(ifr.ifr_name, "lo");
  bool ok = ::ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  ok = ok && ::ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
  int err = errno;
  ::close(s);
  errno = err;
  return ok;
}

// A Chronus sandbox's mounts, made before it enters its root (docs/chronus.md):
//  - dsec's own files over the overlay's /.dsec (a bind of the pristine root's,
//    which is the system layer's): a read-only mount point, which the agent
//    can neither write, remove, rename nor cover (it cannot mount); the only
//    parent is "/", so no rename of a parent moves it either;
//  - the pristine root at the zygote's /pristine: the layers without the
//    writable layer, with /proc and /dev/pts (the sandbox's own), a private
//    /tmp, and the agent's root (the overlay alone, without its submounts)
//    read-only at /.dsec/agent. The sandbox's root covers /pristine once it is
//    entered: only the trusted helper's descriptor of it reaches it.
// Returns the descriptors the helper keeps: the trusted channel and the
// pristine root (O_PATH).
void chronus_mounts(child_ctx& c, int& channel, int& pristine) {
  using S = proto::child_step;
  int* at = c.fds + 2 + c.req->cgroup_fds;
  auto attach = [&](int fd, const char* where) {
    if (sys::move_mount(fd, "", AT_FDCWD, where, MOVE_MOUNT_F_EMPTY_PATH) < 0)
      child_fail(c, S::chronus_mounts, where, errno);
    ::close(fd);
  };
  auto bind = [&](const char* from, const char* to, unsigned recursive, uint64_t attrs) {
    int t = sys::open_tree(AT_FDCWD, from, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | recursive);
    if (t < 0)
      child_fail(c, S::chronus_mounts, from, errno);
    if (attrs != 0) {
      mount_attr a{};
      a.attr_set = attrs;
      if (sys::mount_setattr(t, "", AT_EMPTY_PATH | recursive, &a) < 0)
        child_fail(c, S::chronus_mounts, to, errno);
    }
    attach(t, to);
  };
  // Every mount here is made from an attached one (the kernels before 6.15
  // clone no detached mount): dsec's files from the pristine root, which
  // nothing in the sandbox can write.
  attach(at[proto::chronus_fd::pristine_root], "/pristine");
  bind("/pristine/.dsec", "/mnt/.dsec", 0, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
  bind("/mnt/proc", "/pristine/proc", AT_RECURSIVE, 0);
  bind("/mnt/dev/pts", "/pristine/dev/pts", 0, 0);
  attach(at[proto::chronus_fd::pristine_tmp], "/pristine/tmp");
  bind("/mnt", "/pristine/.dsec/agent", 0,
       MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
  pristine = ::open("/pristine", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (pristine < 0)
    child_fail(c, S::chronus_mounts, "/pristine", errno);
  channel = at[proto::chronus_fd::channel];
}

// The host mounts (runtime/host_mount.hpp), each a detached mount made by
// the node, at its target inside the root at /mnt: the target is looked up
// in the root (its symlinks resolved inside it) without crossing a mount
// (so never into /proc, /dev/pts or another host mount), its missing
// directories made (the sandbox's root owns them, in the writable layer),
// and for a file an empty file made to mount over. No process of the
// sandbox exists yet.
void host_mounts(child_ctx& c) {
  using S = proto::child_step;
  const auto& req = *c.req;
  int* at = c.fds + 2 + req.cgroup_fds
            + ((req.flags & proto::spawn_chronus) ? size_t{proto::chronus_fd::count} : 0);
  int root = ::open("/mnt", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0)
    child_fail(c, S::host_mounts, "/", errno);
  auto lookup = [&](const char* path, uint64_t flags) {
    open_how how{};
    how.flags = flags | O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS;
    return static_cast<int>(::syscall(SYS_openat2, root, path, &how, sizeof how));
  };
  const char* target = c.mount_paths;
  char path[1024];
  for (uint32_t i = 0; i < req.host_mounts; ++i, target += std::strlen(target) + 1) {
    bool dir = (req.mount_dirs >> i) & 1u;
    size_t len = std::strlen(target);
    if (len == 0 || len >= sizeof path || target[0] != '/')
      child_fail(c, S::host_mounts, target, EINVAL);
    // Each ancestor, then the target itself: found, or made in its parent.
    for (size_t end = 1; end <= len; ++end) {
      if (end < len && target[end] != '/')
        continue;
      std::memcpy(path, target, end);
      path[end] = '\0';
      bool last = end == len;
      int fd = lookup(path + 1, (last && !dir) ? 0 : O_DIRECTORY);
      if (fd < 0 && errno == ENOENT) {
        char* slash = std::strrchr(path, '/');
        *slash = '\0';
        int parent = slash == path ? ::fcntl(root, F_DUPFD_CLOEXEC, 0)
                                   : lookup(path + 1, O_DIRECTORY);
        *slash = '/';
        if (parent < 0)
          child_fail(c, S::host_mounts, path, errno);
        int made = (last && !dir)
                     ? ::openat(parent, slash + 1, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW
                                                     | O_CLOEXEC, 0644)
                     : ::mkdirat(parent, slash + 1, 0755);
        int err = errno;
        ::close(parent);
        if (made < 0 && err != EEXIST)
          child_fail(c, S::host_mounts, path, err);
        if (last && !dir && made >= 0)
          ::close(made);
        fd = lookup(path + 1, (last && !dir) ? 0 : O_DIRECTORY);
      }
      if (fd < 0)
        child_fail(c, S::host_mounts, path, errno);
      if (!last) {
        ::close(fd);
        continue;
      }
      struct stat st{};
      if (::fstat(fd, &st) < 0)
        child_fail(c, S::host_mounts, path, errno);
      if (!dir && !S_ISREG(st.st_mode))
        child_fail(c, S::host_mounts, path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL);
      if (sys::move_mount(at[i], "", fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH)
          < 0)
        child_fail(c, S::host_mounts, path, errno);
      ::close(fd);
      ::close(at[i]);
    }
  }
  ::close(root);
}

// Closes every descriptor but the `n` in `keep`.
void close_all_but(int* keep, size_t n) {
  std::sort(keep, keep + n);
  unsigned next = 0;
  for (size_t i = 0; i < n; ++i) {
    if (keep[i] < 0)
      continue;
    if (static_cast<unsigned>(keep[i]) > next)
      sys::close_range(next, static_cast<unsigned>(keep[i]) - 1, 0);
    next = static_cast<unsigned>(keep[i]) + 1;
  }
  sys::close_range(next, ~0U, 0);
}

// The creation steps inside the sandbox, in order (proto::child_step).
[[noreturn]] void child_main(child_ctx& c) {
  using S = proto::child_step;
  const auto& req = *c.req;
  // Nothing of the zygote may reach the sandbox.
  ::close(host_sock);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  pollfd p{c.z->host_pidfd, POLLIN, 0};
  if (::poll(&p, 1, 0) != 0) // the dsec process died before we could watch it
    ::_exit(1);
  ::close(c.z->host_pidfd);
  // What `ps` shows as pid 1 in the sandbox: not our path or the host's pid.
  if (c.z->argv_len > 0) {
    std::memset(c.z->argv_begin, 0, c.z->argv_len);
    copy_str(c.z->argv_begin, c.z->argv_len, "dsec-init");
  }
  ::prctl(PR_SET_NAME, "dsec-init", 0, 0, 0);
  c.last = now_ns();

  for (uint32_t i = 0; i < req.cgroup_fds; ++i) {
    if (::write(c.fds[2 + i], "0", 1) != 1)
      child_fail(c, S::join_cgroup, "cgroup.procs", errno);
    ::close(c.fds[2 + i]);
  }
  mark(c, S::join_cgroup);
  // /proc/self/cgroup then shows "/" instead of the host's cgroup paths.
  if (::unshare(CLONE_NEWCGROUP) < 0)
    child_fail(c, S::enter_cgroup_ns, "unshare(CLONE_NEWCGROUP)", errno);
  mark(c, S::enter_cgroup_ns);
  if (sys::move_mount(c.fds[0], "", AT_FDCWD, "/mnt", MOVE_MOUNT_F_EMPTY_PATH) < 0)
    child_fail(c, S::attach_root, "/mnt", errno);
  ::close(c.fds[0]);
  mark(c, S::attach_root);
  if (::mount("proc", "/mnt/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
    child_fail(c, S::mount_proc, "/proc", errno);
  mark(c, S::mount_proc);
  // /proc/sys read-only (the sandbox's root owns its network namespace's
  // sysctls, and that namespace goes to another sandbox afterwards), and the
  // host's files masked as container runtimes do (runtime/proc_mask.hpp).
  {
    const char* failed = "";
    if (int rc = mask_proc("/mnt/proc", "/mask", c.z->proc_masks, &failed); rc < 0) {
      char path[64];
      std::snprintf(path, sizeof path, "/proc/%s", failed);
      child_fail(c, S::protect_proc, path, -rc);
    }
  }
  mark(c, S::protect_proc);
  if (::mount("devpts", "/mnt/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620,gid=5") < 0)
    child_fail(c, S::mount_devpts, "/dev/pts", errno);
  // Its root, kept by init for the sandbox's terminals (init_devpts_fd): no
  // process of the sandbox exists yet, so this is the instance just mounted.
  init_devpts_fd = ::open("/mnt/dev/pts", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  {
    struct statfs fs{};
    if (init_devpts_fd < 0 || ::fstatfs(init_devpts_fd, &fs) < 0)
      child_fail(c, S::mount_devpts, "/dev/pts", errno);
    if (fs.f_type != DEVPTS_SUPER_MAGIC)
      child_fail(c, S::mount_devpts, "/dev/pts", ENOTTY);
  }
  mark(c, S::mount_devpts);
  if (req.host_mounts > 0) {
    host_mounts(c);
    mark(c, S::host_mounts);
  }
  bool chronus = (req.flags & proto::spawn_chronus) != 0;
  int channel = -1, pristine = -1;
  if (chronus) {
    chronus_mounts(c, channel, pristine);
    mark(c, S::chronus_mounts);
  }
  // MS_MOVE + chroot instead of pivot_root: pivot_root walks every task on the
  // host. What lies beneath is the zygote's empty tmpfs, and the sandbox keeps
  // neither CAP_SYS_CHROOT nor CAP_SYS_ADMIN to climb out.
  if (::chdir("/mnt") < 0 || ::mount(".", "/", nullptr, MS_MOVE, nullptr) < 0
      || ::chroot(".") < 0 || ::chdir("/") < 0)
    child_fail(c, S::enter_root, "/", errno);
  mark(c, S::enter_root);
  if (::sethostname(req.hostname, ::strnlen(req.hostname, sizeof req.hostname)) < 0)
    child_fail(c, S::set_hostname, req.hostname, errno);
  mark(c, S::set_hostname);
  if (req.flags & proto::spawn_netns) {
    // Wired by the host already (its loopback too).
    if (::setns(c.fds[c.nfds - 1], CLONE_NEWNET) < 0)
      child_fail(c, S::setup_network, "setns(egress netns)", errno);
  } else if (req.flags & proto::spawn_net) {
    if (!loopback_up())
      child_fail(c, S::setup_network, "lo", errno);
  } else if (::setns(c.netns, CLONE_NEWNET) < 0) {
    child_fail(c, S::setup_network, "setns(netns)", errno);
  }
  mark(c, S::setup_network);
  // Without CAP_SYS_RESOURCE: init's own oom_score_adj, for raising its
  // children (init.hpp). Its /proc files are the user namespace's root's only
  // while it is dumpable (made 0 again below), for this open; no process of
  // the sandbox exists yet.
  if (!init_resets_oom_score_adj && ::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0)
    init_oom_score_fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (int rc = security::restrict_landlock(c.z->landlock_abi); rc < 0)
    child_fail(c, S::landlock, "landlock_restrict_self", -rc);
  mark(c, S::landlock);
  // A Chronus sandbox's init keeps CAP_SYS_CHROOT until it has forked the
  // trusted helper, the one process that keeps it (for pristine commands).
  if (int rc = security::drop_capabilities(chronus ? 1ULL << CAP_SYS_CHROOT : 0); rc < 0)
    child_fail(c, S::drop_capabilities, "capset", -rc);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
    child_fail(c, S::drop_capabilities, "no_new_privs", errno);
  // Not dumpable: no process of the sandbox can ptrace init or read its memory.
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
    child_fail(c, S::drop_capabilities, "dumpable", errno);
  mark(c, S::drop_capabilities);
  if (int rc = security::install_seccomp(security::compiled_filter,
                                         std::size(security::compiled_filter));
      rc < 0)
    child_fail(c, S::seccomp, "seccomp", -rc);
  mark(c, S::seccomp);
  ::setrlimit(RLIMIT_NOFILE, &c.z->nofile);
  // Of the zygote's descriptors (its pool, its epoll, our parent's stdio) only
  // the control socket stays, and in a Chronus sandbox the helper's two.
  {
    int keep[5] = {c.ctl, channel, pristine, init_oom_score_fd, init_devpts_fd};
    close_all_but(keep, 5);
  }
  // A Chronus sandbox: the trusted helper stays in the sandbox's Landlock
  // domain, init (and every untrusted command it starts) enters a nested one.
  // Confined like init (it is a fork of it now) and holding only its socket.
  int helper = -1;
  if (chronus) {
    c.last = now_ns();
    if (c.z->landlock_abi < 6) // dsec checks this first; never run with less
      child_fail(c, S::trusted_helper, "Landlock ABI 6", ENOTSUP);
    helper = start_trusted_helper(c.ctl, c.z->argv_begin, c.z->argv_len, channel, pristine);
    if (helper < 0)
      child_fail(c, S::trusted_helper, "fork", -helper);
    if (int rc = security::drop_capabilities(); rc < 0)
      child_fail(c, S::trusted_helper, "capset", -rc);
    if (int rc = security::restrict_landlock(c.z->landlock_abi); rc < 0)
      child_fail(c, S::trusted_helper, "landlock_restrict_self", -rc);
    mark(c, S::trusted_helper);
  }
  c.ready.steps = static_cast<uint32_t>(S::count);
  if (unix_socket::send(c.ctl, &c.ready, sizeof c.ready, nullptr, 0) < 0)
    ::_exit(1);
  init_main(c.ctl, helper);
}

pid_t clone_sandbox(uint32_t flags, int* pidfd) {
  clone_args args{};
  args.flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_PARENT
               | CLONE_PIDFD;
  if ((flags & proto::spawn_net) && !(flags & proto::spawn_netns))
    args.flags |= CLONE_NEWNET;
  args.pidfd = reinterpret_cast<uint64_t>(pidfd);
  args.exit_signal = 0; // CLONE_PARENT: the child signals our parent like we would
  return static_cast<pid_t>(::syscall(SYS_clone3, &args, sizeof args));
}

void serve(zygote_state& z) {
  // One spawn request and its host mounts' targets (proto::spawn).
  static struct {
    proto::spawn req;
    char paths[proto::max_mount_paths];
  } msg;
  auto& req = msg.req;
  for (;;) {
    int fds[unix_socket::max_fds];
    size_t nfds = 0;
    ssize_t n = unix_socket::recv(host_sock, &msg, sizeof msg, fds, unix_socket::max_fds, &nfds);
    if (n == 0)
      ::_exit(0); // the dsec process closed the socket: we are done
    if (n == static_cast<ssize_t>(sizeof(proto::give_netns)) && req.h.magic == proto::magic
        && req.h.kind == proto::type::give_netns) {
      for (size_t i = 0; i < nfds; ++i) {
        if (i == 0 && z.pool.free.size() < z.pool.max_free)
          z.pool.free.push_back(fds[i]);
        else
          ::close(fds[i]);
      }
      continue;
    }
    if (n == static_cast<ssize_t>(sizeof(proto::make_netns)) && req.h.magic == proto::magic
        && req.h.kind == proto::type::make_netns) {
      for (size_t i = 0; i < nfds; ++i)
        ::close(fds[i]);
      proto::netns_made made;
      int fd = make_netns();
      if (fd < 0)
        made.err = errno;
      if (unix_socket::send(host_sock, &made, sizeof made, &fd, fd >= 0 ? 1 : 0) < 0)
        ::_exit(1);
      if (fd >= 0)
        ::close(fd);
      continue;
    }
    proto::spawn_reply reply;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      reply.err = errno;
    } else if (static_cast<size_t>(n) < sizeof req || req.h.magic != proto::magic
               || req.h.kind != proto::type::spawn || nfds < 2
               || req.host_mounts > proto::max_spawn_mounts
               || req.paths_len > proto::max_mount_paths
               || static_cast<size_t>(n) != sizeof req + req.paths_len
               || std::count(msg.paths, msg.paths + req.paths_len, '\0')
                    != static_cast<long>(req.host_mounts)
               || nfds != 2 + static_cast<size_t>(req.cgroup_fds)
                            + ((req.flags & proto::spawn_chronus) ? size_t{proto::chronus_fd::count} : 0)
                            + req.host_mounts
                            + ((req.flags & proto::spawn_netns) ? 1 : 0)
               || ((req.flags & proto::spawn_netns) && !(req.flags & proto::spawn_net))) {
      reply.err = EPROTO;
    }
    int pidfd = -1;
    int netns = -1;
    bool pooled = reply.err == 0 && !(req.flags & (proto::spawn_net | proto::spawn_netns));
    if (pooled) {
      recycle(z.pool);
      if (!z.pool.free.empty()) {
        netns = z.pool.free.back();
        z.pool.free.pop_back();
      } else if ((netns = make_netns()) < 0) {
        reply.err = errno;
      }
    }
    if (reply.err == 0) {
      pid_t pid = clone_sandbox(req.flags, &pidfd);
      if (pid == 0) {
        child_ctx c{&z, &req, msg.paths, fds, nfds, fds[1], netns, {}, 0};
        child_main(c);
      }
      if (pid < 0)
        reply.err = errno;
      else
        reply.pid = pid;
    }
    if (pooled && netns >= 0) {
      // Lend the namespace until the sandbox's pidfd says it ended.
      size_t slot;
      if (!z.pool.spare.empty()) {
        slot = z.pool.spare.back();
        z.pool.spare.pop_back();
      } else {
        slot = z.pool.out.size();
        z.pool.out.push_back({-1, -1});
      }
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = slot;
      int watch = reply.err == 0 ? ::fcntl(pidfd, F_DUPFD_CLOEXEC, 0) : -1;
      if (watch >= 0 && ::epoll_ctl(z.pool.epoll, EPOLL_CTL_ADD, watch, &ev) == 0) {
        z.pool.out[slot] = {watch, netns};
      } else {
        // Not watchable (or the clone failed): never reuse it.
        if (watch >= 0)
          ::close(watch);
        ::close(netns);
        z.pool.spare.push_back(slot);
      }
    }
    for (size_t i = 0; i < nfds; ++i)
      ::close(fds[i]);
    if (unix_socket::send(host_sock, &reply, sizeof reply, &pidfd, pidfd >= 0 ? 1 : 0) < 0)
      ::_exit(1);
    if (pidfd >= 0)
      ::close(pidfd);
  }
}

} // namespace

int zygote_main(int argc, char** argv) {
  unsigned prewarm = 1;
  if (argc == 5 && std::strcmp(argv[3], "--netns-prewarm") == 0)
    prewarm = static_cast<unsigned>(std::atoi(argv[4]));
  if ((argc != 3 && argc != 5) || std::strcmp(argv[1], "--zygote") != 0
      || (argc == 5 && std::strcmp(argv[3], "--netns-prewarm") != 0) || prewarm > 1024) {
    const char* usage =
      "dsec-spawner is dsec's internal sandbox spawner; dsec starts it itself.\n"
      "usage: dsec-spawner --zygote HOST_PID [--netns-prewarm N]\n"
      "       (fd 3: control socket, fd 4: user namespace)\n";
    (void) !::write(2, usage, std::strlen(usage));
    return 2;
  }
  pid_t host = static_cast<pid_t>(std::atoi(argv[2]));
  zygote_state z;
  z.argv_begin = argv[0];
  z.argv_len = static_cast<size_t>(argv[argc - 1] + std::strlen(argv[argc - 1]) + 1 - argv[0]);
  set_up(z, host, prewarm);
  proto::hello h;
  h.landlock_abi = z.landlock_abi;
  if (unix_socket::send(host_sock, &h, sizeof h, nullptr, 0) < 0)
    return 1;
  serve(z);
  return 0;
}

} // namespace dsec
