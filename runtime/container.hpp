// A live sandbox: the resource (the spec is a value, container_options).
//
// create() runs the creation steps below, in order, each timed; a failure names
// its step and the path involved. Host steps, in this process:
//   make_upper    a detached tmpfs for the writable upper and work dirs
//   make_overlay  a detached overlay of the layers under it
//   make_chronus  (options.chronus only; not even listed otherwise) the Chronus
//                 socket, bound in the overlay (it lands in the upper dir):
//                 /run/chronus.sock; the trusted channel (a socketpair); a clone
//                 of the system layer's .dsec for /.dsec; the pristine root (a
//                 read-only overlay of the layers) and its /tmp
//   make_cgroup   a cgroup with the limits (only when limits are set)
//   spawn         the zygote clones the sandbox init into fresh namespaces
//   wait_ready    init reports its own steps (proto::child_step) done
// Nothing is mounted in the host's mount namespace; the sandbox's mounts die
// with its mount namespace when init dies.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/cgroup.hpp"
#include "runtime/error.hpp"
#include "runtime/host_mount.hpp"
#include "runtime/fd.hpp"
#include "runtime/proto.hpp"

namespace dsec {

class spawner;

/// 12 random hex digits: how sandboxes are named.
std::string new_sandbox_id();

/// What a sandbox is made of, besides its layers.
struct container_options {
  std::string id;          ///< the sandbox id; empty: a random one
  std::string hostname;    ///< empty: the sandbox id
  bool net = false;        ///< a private network namespace with loopback up
  /// With net: the network namespace to join instead of a fresh one (not
  /// owned; made by the spawner that spawns this sandbox, spawner::make_netns,
  /// and wired: egress_network::take).
  int netns = -1;
  uint64_t disk_bytes = 0; ///< size of the writable layer; 0: tmpfs default (half of RAM)
  limits lim;              ///< cgroup limits; none set: no cgroup of its own
  /// A Chronus sandbox: a listening SOCK_SEQPACKET socket at /run/chronus.sock
  /// (container::chronus_fd()), the trusted channel (container::channel_fd()),
  /// dsec's own files read-only at /.dsec, and trusted commands
  /// (command::trusted) that the agent's processes can neither ptrace, read nor
  /// signal, optionally in the pristine root (command::pristine). The topmost
  /// layer must be dsec's system layer (it has .dsec). Needs Landlock ABI 6
  /// (Linux 6.12): creation fails with errc::unsupported below that.
  bool chronus = false;
  /// Keep a descriptor of the writable layer's mount (container::upper_mount_fd())
  /// so that packs (runtime/pack.hpp, the trajectory log) and snapshots
  /// (store::pack_diff) of it can be taken.
  bool keep_upper = false;
  /// Egress networking: written as /etc/resolv.conf of the writable layer
  /// (after a seed pack), naming the node's resolver; empty: nothing written.
  std::string resolv_conf;
  /// A pack (runtime/pack.hpp) to restore into the writable layer before the
  /// overlay is mounted: the file seed_pack, or the manifest seed_manifest
  /// itself; and the blob directory its contents are in.
  std::string seed_pack;
  std::string seed_manifest;
  std::string seed_blobs;
  /// Host paths to attach inside the root (host_mount_policy::prepare: the
  /// policy was applied there); their descriptors are closed once init has
  /// them.
  std::vector<prepared_mount> host_mounts;
};

/// A command's pseudo-terminal (command::pty): its window size.
struct pty_size {
  uint16_t rows = 24;
  uint16_t cols = 80;
};

/// A command to run in a sandbox.
struct command {
  std::vector<std::string> argv;
  std::vector<std::string> env; ///< "K=V"; the whole environment
  std::string cwd = "/";
  std::optional<uint32_t> uid;   ///< sandbox uid; none: root (0)
  std::optional<uint32_t> gid;
  /// Supplementary groups (with a uid): none, unless a user looked up by
  /// name belongs to groups of the image's /etc/group (resolve_command_user).
  /// At most proto::max_groups.
  std::vector<uint32_t> groups;
  /// Started by the sandbox's trusted helper, outside the agent's Landlock
  /// domain: untrusted commands (the agent's) cannot ptrace it, so cannot read
  /// its environment or memory or take its descriptors, nor signal it. It can
  /// see and trace theirs. Otherwise it runs and is reported like any command.
  /// Only in a sandbox made with container_options::chronus (else
  /// errc::invalid_argument). Its argv stays readable (/proc/PID/cmdline):
  /// secrets go in `env`. Its environment gets PATH=/.dsec/bin:... (dsec's own
  /// `chronus` first, from a mount the agent cannot touch) and CHRONUS_FD=3:
  /// fd 3 is the trusted channel to Chronus (docs/chronus.md); CHRONUS_FD,
  /// CHRONUS_SOCKET and DSEC_CHRONUS_TOKEN in `env` are dropped.
  bool trusted = false;
  /// A trusted command whose root is the pristine root: the sandbox's layers
  /// without its writable layer (nothing the agent wrote), a private /tmp, and
  /// the agent's root read-only at /.dsec/agent. Needs `trusted`.
  bool pristine = false;
  /// Run it on a pseudo-terminal of the sandbox's own devpts, of this size
  /// (docs/security.md, "Terminals"): init opens the master through the
  /// devpts it kept from setup (no path of the sandbox), the command is a
  /// session leader whose controlling terminal is the slave, at its stdin,
  /// stdout and stderr (the stdio given is not used). The master comes with
  /// `started` (container_event::pty; take_pty() in the synchronous API). Not
  /// for trusted commands (errc::unsupported): the agent, root in the sandbox,
  /// can open the terminals of its devpts.
  std::optional<pty_size> pty;

  /// PATH, HOME=/root, TERM (from the host if set), LANG=C.UTF-8.
  static std::vector<std::string> default_env();
};

/// Descriptors handed to a command; -1 means /dev/null.
struct stdio {
  int in = -1;
  int out = -1;
  int err = -1;
};

/// How a command ended.
struct exit_status {
  int code = 0;   ///< exit code, when it exited
  int signal = 0; ///< the signal that killed it, else 0

  /// The shell convention: code, or 128 + signal.
  [[nodiscard]] int shell_code() const { return signal != 0 ? 128 + signal : code; }
  [[nodiscard]] std::string to_string() const;
  static exit_status from_wait_status(int status);
};

struct step_timing {
  const char* name;
  uint64_t ns;
};

/// Something init reported (the asynchronous API).
struct container_event {
  enum class kind {
    none,        ///< nothing to read now
    ready,       ///< creation finished
    started,     ///< command `id` runs
    exited,      ///< command `id` ended with `status`
    exec_failed, ///< command `id` could not start: `failure`
  };
  kind what = kind::none;
  uint64_t id = 0;
  exit_status status;
  std::optional<error> failure;
  /// `started` of a command::pty command: the terminal's master, checked to
  /// be a pty master, non-blocking and close-on-exec. Its reads end with EIO
  /// once every holder of the slave closed it.
  unique_fd pty;
};

class container {
public:
  /// Creates a sandbox from `lowers` (directory fds of mounted layers, topmost
  /// first) and waits until it is ready. `cgroups` may be null when opts.lim
  /// sets no limit.
  static expected<std::unique_ptr<container>>
  create(spawner& sp, std::span<const int> lowers, const container_options& opts,
         const cgroup_root* cgroups);

  // ---- the asynchronous API (dsecd: an event loop watches the descriptors) ----

  /// Runs the host steps and the spawn, and returns while init sets itself up:
  /// watch control_fd() for POLLIN and call next_event() until `ready`.
  static expected<std::unique_ptr<container>>
  start(spawner& sp, std::span<const int> lowers, const container_options& opts,
        const cgroup_root* cgroups);

  /// Reads one message from init without blocking. An error if creation failed
  /// (naming the step) or init is gone (sandbox_failed).
  expected<container_event> next_event();

  /// Sends a command to init without waiting for it to start; returns its id.
  /// next_event() reports `started` or `exec_failed`, then `exited`.
  expected<uint64_t> send_exec(const command& cmd, const stdio& io);

  /// Sends SIGKILL to init: everything in the sandbox dies. Does not wait;
  /// watch pidfd() for POLLIN and call reap().
  void kill();

  /// Reaps init if it has exited (never blocks); true once reaped. Then the
  /// cgroup is released too. After true the container is destroyed.
  expected<bool> reap();

  [[nodiscard]] int control_fd() const { return ctl_.get(); }

  /// The Chronus socket's listening end (SOCK_SEQPACKET, non-blocking,
  /// close-on-exec) in a sandbox made with options.chronus; -1 otherwise, once
  /// released, or once the sandbox is destroyed or reaped (it is closed then).
  /// The sandbox connects to it at /run/chronus.sock.
  [[nodiscard]] int chronus_fd() const { return chronus_.get(); }
  /// Hands the listening socket over to the caller (then chronus_fd() is -1).
  /// Like any bound socket it holds its file system, here the sandbox's
  /// overlay (its upper tmpfs and its layers): close it once the sandbox is gone.
  unique_fd release_chronus_fd() { return std::move(chronus_); }
  /// The node's end of the trusted channel (SOCK_SEQPACKET, non-blocking,
  /// close-on-exec) in a Chronus sandbox, else -1: each packet from a trusted
  /// command is a connection to serve (chronus_endpoint). Closed like
  /// chronus_fd().
  [[nodiscard]] int channel_fd() const { return channel_.get(); }
  unique_fd release_channel_fd() { return std::move(channel_); }
  /// The writable layer's tmpfs mount (its root holds upper/, the upper dir,
  /// and work/): with options.keep_upper, else -1. Closed on destroy. Read
  /// the upper dir through it (openat(fd, "upper")), never write it while the
  /// sandbox lives; snapshots clone the mount (store::pack_diff).
  [[nodiscard]] int upper_mount_fd() const { return upper_mnt_.get(); }
  /// The host uid the sandbox's root maps to (owners in the upper dir).
  [[nodiscard]] uint32_t uid_base() const { return uid_base_; }
  /// Its cgroup directories (sandbox_cgroup::paths()); empty without limits.
  /// For the freezer (runtime/freezer.hpp; snapshots).
  [[nodiscard]] std::vector<std::string> cgroup_paths() const {
    return cgroup_ ? cgroup_->paths() : std::vector<std::string>{};
  }
  /// Whether the sandbox was made with options.chronus (trusted commands work).
  [[nodiscard]] bool chronus() const { return chronus_enabled_; }

  /// Turns init's report of a failed exec into a message naming the program,
  /// the directory or the ids that did not work.
  static error describe_exec_failure(const command& cmd, error e);

  // ---- the synchronous API (the CLI, tests, benchmarks) ----

  /// Starts a command; returns its id once it runs (or why it could not start:
  /// not_found for a missing program, with the program's name).
  expected<uint64_t> exec(const command& cmd, const stdio& io);

  /// A command::pty command's terminal master, once it runs (exec() returned
  /// its id); the caller owns it. Invalid if there is none, or taken already.
  unique_fd take_pty(uint64_t id);

  /// Waits for a command to end. With a deadline, errc::timeout once it passes
  /// (the command keeps running). errc::sandbox_failed if the sandbox died.
  expected<exit_status>
  wait(uint64_t id, std::optional<std::chrono::steady_clock::time_point> deadline = {});

  /// Sends a signal to a command's process group.
  expected<void> signal(uint64_t id, int sig);

  /// Kills everything in the sandbox, reaps init, releases the cgroup. The
  /// mounts go with the mount namespace. Idempotent; the destructor calls it.
  expected<void> destroy();

  /// True if the kernel's OOM killer killed something in the sandbox's cgroup.
  [[nodiscard]] bool oom_killed() const;

  [[nodiscard]] const std::string& id() const { return id_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  [[nodiscard]] int pidfd() const { return pidfd_.get(); }
  /// Host and child creation steps with their durations, in order.
  [[nodiscard]] std::span<const step_timing> timings() const {
    return {timings_.data(), ntimings_};
  }

  ~container();
  container(const container&) = delete;
  container& operator=(const container&) = delete;

private:
  container() = default;
  struct create_ctx;
  friend struct create_steps;

  // Waits up to `deadline` for one event and records it in cmds_. Returns false
  // on timeout.
  expected<bool> pump(std::optional<std::chrono::steady_clock::time_point> deadline);
  expected<void> wait_until_ready();
  error init_died();
  void add_timings(const proto::ready& r);

  std::string id_;
  pid_t pid_ = -1;
  unique_fd pidfd_;
  unique_fd ctl_;
  std::optional<sandbox_cgroup> cgroup_;
  unique_fd chronus_;
  unique_fd channel_;
  bool chronus_enabled_ = false;
  unique_fd upper_mnt_;
  uint32_t uid_base_ = 0;
  uint64_t next_id_ = 1;
  bool destroyed_ = false;
  bool init_gone_ = false;
  bool ready_ = false;

  struct pending {
    uint64_t id;
    bool started = false;
    bool done = false;
    exit_status status;
    std::optional<error> failure;
    unique_fd pty;
  };
  std::vector<pending> cmds_;
  std::vector<char> msg_; // reused exec message buffer

  static constexpr size_t max_timings = 6 + static_cast<size_t>(proto::child_step::count);
  std::array<step_timing, max_timings> timings_{};
  size_t ntimings_ = 0;
};

} // namespace dsec
