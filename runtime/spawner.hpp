// The host side of a zygote (see zygote.hpp): starts dsec-spawner and asks it
// for sandbox inits. One spawner serves one request at a time (a mutex guards
// it); a dsec process that spawns from several threads keeps several.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "runtime/error.hpp"
#include "runtime/host_mount.hpp"
#include "runtime/fd.hpp"
#include "runtime/userns.hpp"

namespace dsec {

class spawner {
public:
  struct options {
    std::string binary; ///< dsec-spawner; empty: find_binary()
    id_range ids;       ///< host ids of the sandbox user namespace
    /// Network namespaces the zygote makes while it starts, for sandboxes
    /// without networking (each gets one of its own, recycled after it ends).
    /// Making one costs ~0.36 ms; more are made on demand.
    unsigned netns_prewarm = 1;
  };

  /// What the zygote made: the sandbox init, a child of this process.
  struct spawned {
    pid_t pid = -1;
    unique_fd pidfd;
  };

  /// Starts the zygote. It sets itself up while the caller goes on (mounting
  /// layers, say); ready() or the first spawn() waits for it. The pdeathsig of
  /// every sandbox is tied to the calling thread: start spawners from a thread
  /// that lives as long as the process (the main thread).
  static expected<std::unique_ptr<spawner>> start(const options& opts);

  /// Waits until the zygote has set itself up, or says why it could not.
  expected<void> ready();

  /// $DSEC_SPAWNER, else dsec-spawner beside /proc/self/exe, else the
  /// installed copy in the libexec dir.
  static expected<std::string> find_binary();

  /// What a Chronus sandbox gets besides its root (proto::chronus_fd).
  struct chronus_fds {
    int pristine_root = -1; ///< make_lower_view: the pristine root
    int pristine_tmp = -1;  ///< make_scratch_tmpfs: its /tmp
    int channel = -1;       ///< the sandbox's end of the trusted channel
  };

  /// Creates a sandbox init whose root is `overlay` (a detached mount), which
  /// talks over `ctl` and joins the cgroups behind `cgroup_fds`. With
  /// `chronus`: init starts the trusted helper (proto::spawn_chronus), with
  /// these descriptors. `mounts` (host_mount_policy::prepare) are attached
  /// at their targets inside the root before anything of the sandbox runs.
  /// With `net` and a `netns` (one make_netns() of this spawner made, wired
  /// since): init joins it instead of a fresh one. Thread-safe.
  expected<spawned> spawn(int overlay, int ctl, std::span<const int> cgroup_fds,
                          const std::string& hostname, bool net,
                          const chronus_fds* chronus = nullptr,
                          std::span<const prepared_mount> mounts = {}, int netns = -1);

  /// A fresh network namespace owned by the sandbox user namespace, with
  /// nothing up, from the zygote (~0.4 ms of its time): for the host to wire
  /// and hand to a spawn. Thread-safe.
  expected<unique_fd> make_netns();

  /// The sandbox user namespace (to idmap layer mounts with).
  [[nodiscard]] int userns_fd() const { return userns_.get(); }
  [[nodiscard]] const id_range& ids() const { return ids_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  /// The highest Landlock ABI the kernel offers (0: sandboxes run without it).
  /// Valid once ready() succeeded.
  [[nodiscard]] uint32_t landlock_abi() const { return landlock_abi_; }

  /// Closes the socket (the zygote exits) and reaps the zygote.
  ~spawner();

  spawner(const spawner&) = delete;
  spawner& operator=(const spawner&) = delete;

private:
  spawner() = default;
  std::mutex mu_;
  unique_fd sock_;
  unique_fd userns_;
  pid_t pid_ = -1;
  id_range ids_;
  uint32_t landlock_abi_ = 0;
  std::string binary_;
  std::optional<userns_helper> helper_; // making the first netns while we start
  bool hello_ = false;               // the zygote reported in
  std::optional<error> start_error_; // ...or why it could not start
};

} // namespace dsec
