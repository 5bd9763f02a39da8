// The private wire format between a dsec process, its zygote (dsec-spawner) and
// each sandbox's init. Fixed-layout structs over SOCK_SEQPACKET: both ends are
// built from the same tree, so there is no versioning; every message starts with
// a header and the receiver checks magic, type and size before it trusts it.
//
// In a Chronus sandbox (spawn_chronus) init also talks to its trusted helper
// over a socketpair of its own, with the same messages: init forwards a trusted
// command's `exec` (the same bytes, stdin/stdout/stderr attached) and the
// helper answers `started` or `exec_failed`; init forwards `signal` with the
// command's pidfd attached, and the helper does not answer.
//
// The trusted channel (docs/chronus.md) is not a message of this protocol: it is
// a descriptor the helper holds from the start and puts at fd 3 of each trusted
// command (trusted_channel_fd).
#pragma once

#include <cstddef>
#include <iterator>
#include <cstdint>

namespace dsec::proto {

constexpr uint32_t magic = 0x63657364; // "dsec"

enum class type : uint32_t {
  hello = 1,     ///< zygote -> host, once: started (or why not)
  spawn,         ///< host -> zygote: create a sandbox init
  spawn_reply,   ///< zygote -> host: its pid, and its pidfd attached
  setup_failed,  ///< init -> host: a creation step failed; init exits
  ready,         ///< init -> host: the sandbox is up; step timings
  exec,          ///< host -> init: run a command; stdin/stdout/stderr attached
  signal,        ///< host -> init: signal a command's process group
  started,       ///< init -> host: the command runs
  exec_failed,   ///< init -> host: the command could not be started
  exited,        ///< init -> host: the command ended; its wait status
  give_netns,    ///< host -> zygote: a network namespace for the pool attached
  make_netns,    ///< host -> zygote: make a network namespace for the host
  netns_made,    ///< zygote -> host: it (attached), or why not
};

struct header {
  uint32_t magic = proto::magic;
  type kind;
};

/// The steps the sandbox's first process takes, in order. Names are what errors
/// and timings print; keep them in sync with child_step_names.
enum class child_step : uint32_t {
  join_cgroup,
  enter_cgroup_ns,
  attach_root,
  mount_proc,
  protect_proc,
  mount_devpts,
  host_mounts,    ///< with spawn::host_mounts only: each at its target
  chronus_mounts, ///< spawn_chronus only: /.dsec, and the pristine root
  enter_root,
  set_hostname,
  setup_network,
  landlock,
  drop_capabilities,
  seccomp,
  trusted_helper, ///< spawn_chronus only: fork the helper, enter the agent's domain
  count
};

inline const char* child_step_name(uint32_t s) {
  static const char* names[] = {"join_cgroup",    "enter_cgroup_ns", "attach_root",
                                "mount_proc",     "protect_proc",    "mount_devpts",
                                "host_mounts",    "chronus_mounts",  "enter_root",
                                "set_hostname",   "setup_network",   "landlock",
                                "drop_capabilities", "seccomp",      "trusted_helper"};
  static_assert(std::size(names) == static_cast<size_t>(child_step::count));
  return s < static_cast<uint32_t>(child_step::count) ? names[s] : "unknown";
}

/// Why the zygote could not start (hello.err != 0): which of its steps failed.
struct hello {
  header h{magic, type::hello};
  int32_t err = 0;
  char step[32] = {};
  char path[128] = {};
  uint32_t landlock_abi = 0; ///< 0: Landlock unavailable
};

/// A fresh network namespace with loopback up. Without it the sandbox gets a
/// network namespace of its own from the zygote's pool: recycled from sandboxes
/// that ended, with no device up, so it has no network at all.
constexpr uint32_t spawn_net = 1;

/// A Chronus sandbox: before it reports ready, init forks the trusted helper,
/// which stays in the sandbox's Landlock domain, and then enters a nested one
/// (the agent's) that scopes signals and abstract sockets. Trusted commands are
/// started by the helper, so no process of the agent's domain can ptrace,
/// signal or read them. Needs Landlock ABI 6.
///
/// It also gets dsec's own files, read-only, at /.dsec (a mount the agent can
/// neither write, remove nor rename: the `chronus` client of trusted commands),
/// and the pristine root that `exec_pristine` commands run in: the sandbox's
/// layers without its writable layer, a private /tmp, /proc and /dev/pts, and
/// the agent's root read-only at /.dsec/agent (pristine_agent_dir).
constexpr uint32_t spawn_chronus = 2;

/// With spawn_net: join the network namespace attached last (made by this
/// zygote through make_netns and wired by the host: an egress sandbox's,
/// runtime/egress.hpp) instead of cloning a fresh one.
constexpr uint32_t spawn_netns = 4;

/// Where dsec's own files are, in every root of a Chronus sandbox; trusted
/// commands' PATH starts with its bin/.
inline constexpr const char* dsec_dir = "/.dsec";
inline constexpr const char* dsec_bin_dir = "/.dsec/bin";
/// The agent's root (its writable layer over the layers), read-only, in the
/// pristine root.
inline constexpr const char* pristine_agent_dir = "/.dsec/agent";
/// The descriptor of a trusted command that is its Chronus channel ($CHRONUS_FD).
inline constexpr int trusted_channel_fd = 3;

/// Descriptors attached, in order: the overlay mount, init's end of the control
/// socket, `cgroup_fds` cgroup.procs files to join, then with spawn_chronus the
/// chronus_fd::count below, then `host_mounts` detached mounts
/// (runtime/host_mount.hpp) to attach inside the root, then with spawn_netns
/// the network namespace to join.
/// With spawn_chronus, after the cgroup files: the pristine root (a read-only
/// overlay of the layers; its /.dsec is also mounted over the sandbox's own),
/// its /tmp (a tmpfs), and the sandbox's end of the trusted channel.
struct chronus_fd {
  enum : uint32_t { pristine_root, pristine_tmp, channel, count };
};

struct spawn {
  header h{magic, type::spawn};
  uint32_t flags = 0;
  uint32_t cgroup_fds = 0;
  char hostname[64] = {};
  /// Host mounts: how many; bit i set: mount i is a directory (else a file);
  /// the bytes after this struct in the message: their targets in the
  /// sandbox's root, in order, each NUL-terminated (at most max_mount_paths).
  uint32_t host_mounts = 0;
  uint32_t mount_dirs = 0;
  uint32_t paths_len = 0;
  uint32_t pad = 0;
};

/// The most host mounts of one spawn (host_mount.hpp's max_host_mounts), and
/// the most bytes their targets take.
inline constexpr uint32_t max_spawn_mounts = 16;
inline constexpr uint32_t max_mount_paths = max_spawn_mounts * 1024;

/// A network namespace (owned by the sandbox user namespace, nothing up) for
/// the zygote's pool; its fd attached. No reply.
struct give_netns {
  header h{magic, type::give_netns};
};

/// Asks the zygote for a fresh network namespace owned by the sandbox user
/// namespace (nothing up), for the host to wire before a spawn_netns.
struct make_netns {
  header h{magic, type::make_netns};
};

/// The namespace attached when err == 0.
struct netns_made {
  header h{magic, type::netns_made};
  int32_t err = 0;
  int32_t pad = 0;
};

/// pidfd attached when err == 0.
struct spawn_reply {
  header h{magic, type::spawn_reply};
  int32_t err = 0;
  int32_t pid = 0;
};

struct setup_failed {
  header h{magic, type::setup_failed};
  uint32_t step = 0;
  int32_t err = 0;
  char path[192] = {};
};

struct ready {
  header h{magic, type::ready};
  uint32_t steps = 0;
  uint32_t taken = 0; ///< bit i: step i was taken (the others are a kind's only)
  uint64_t step_ns[static_cast<size_t>(child_step::count)] = {};
};

constexpr uint32_t exec_set_ids = 1; ///< uid/gid are set: switch to them
constexpr uint32_t exec_trusted = 2; ///< started by the trusted helper (spawn_chronus)
/// With exec_trusted: the command's root is the pristine root, not the agent's.
constexpr uint32_t exec_pristine = 4;
/// On a pseudo-terminal (untrusted commands only): init opens its master from
/// the sandbox's devpts instance, through the descriptor of that instance's
/// root it took at setup (no path of the sandbox is looked up), takes the slave
/// with TIOCGPTPEER, sets the window size (rows, cols), and starts the command
/// as a session leader whose controlling terminal is the slave, at its stdin,
/// stdout and stderr. No descriptors are attached to the exec; `started`
/// comes with the master attached (init keeps no copy of either end).
constexpr uint32_t exec_pty = 8;
/// The strings (cwd, argv, env) do not follow the header: they are the
/// `data_len` bytes of a sealed memfd attached after the other descriptors
/// (the last one). dsec sends them so when they do not fit max_exec_message,
/// up to max_exec_data; the message is the header alone.
constexpr uint32_t exec_data_fd = 16;

/// Followed by `data_len` bytes: cwd NUL, argc args each NUL-terminated, then
/// envc "K=V" strings each NUL-terminated, then (exec_set_ids) `ngroups`
/// supplementary gids, 4 bytes each in host order. stdin, stdout, stderr
/// attached (none with exec_pty).
struct exec {
  header h{magic, type::exec};
  uint64_t id = 0;
  uint32_t flags = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t argc = 0;
  uint32_t envc = 0;
  uint32_t data_len = 0;
  uint16_t rows = 0; ///< exec_pty: the terminal's window size
  uint16_t cols = 0;
  uint32_t ngroups = 0; ///< supplementary gids after the strings (exec_set_ids)
};

/// Most supplementary groups of one command.
constexpr uint32_t max_groups = 256;

/// Largest exec message (header + strings). SEQPACKET messages must fit the
/// socket buffer, so longer command lines go in a memfd (exec_data_fd).
constexpr size_t max_exec_message = 128 * 1024;
/// Most bytes of strings (cwd, argv, env with their NULs) of one command, and
/// most strings. Above the kernel's own execve limit (a quarter of the stack
/// limit: 2 MiB for the usual 8 MiB, each string at most 128 KiB), which
/// therefore decides: the command fails to start with E2BIG beyond it. The
/// host refuses more than this with a clear error.
constexpr size_t max_exec_data = 4 * 1024 * 1024;
constexpr size_t max_exec_strings = 512 * 1024;

struct signal {
  header h{magic, type::signal};
  uint64_t id = 0;
  int32_t sig = 0;
};

/// With exec_pty, the terminal's master is attached.
struct started {
  header h{magic, type::started};
  uint64_t id = 0;
  int32_t pid = 0; ///< in the sandbox's pid namespace
};

enum class exec_stage : uint32_t { fork, chdir, set_ids, execve, root };

inline const char* exec_stage_name(uint32_t s) {
  switch (static_cast<exec_stage>(s)) {
    case exec_stage::root: return "chroot";
    case exec_stage::fork: return "fork";
    case exec_stage::chdir: return "chdir";
    case exec_stage::set_ids: return "setuid";
    case exec_stage::execve: return "execve";
  }
  return "unknown";
}

struct exec_failed {
  header h{magic, type::exec_failed};
  uint64_t id = 0;
  uint32_t stage = 0;
  int32_t err = 0;
  int32_t pid = 0; ///< helper -> init: the child that failed (init's to reap), else 0
  uint32_t pad = 0;
};

struct exited {
  header h{magic, type::exited};
  uint64_t id = 0;
  int32_t status = 0; ///< a wait(2) status
};

} // namespace dsec::proto
