// The host side of a zygote (see zygote.hpp): starts dsec-spawner and asks it
// for sandbox inits. One spawner serves one request at a time (a mutex guards
// it); a dsec process that spawns from several threads keeps several.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"
#include "runtime/userns.hpp"

namespace dsec {

class spawner {
public:
  struct options {
    std::string binary; ///< dsec-spawner; empty: find_binary()
    id_range ids;       ///< host ids of the sandbox user namespace
  };

  /// What the zygote made: the sandbox init, a child of this process.
  struct spawned {
    pid_t pid = -1;
    unique_fd pidfd;
  };

  /// Starts the zygote and waits until it is ready (or says why not).
  static expected<std::unique_ptr<spawner>> start(const options& opts);

  /// $DSEC_SPAWNER, else dsec-spawner beside /proc/self/exe, else the
  /// installed copy in the libexec dir.
  static expected<std::string> find_binary();

  /// Creates a sandbox init whose root is `overlay` (a detached mount), which
  /// talks over `ctl` and joins the cgroups behind `cgroup_fds`. Thread-safe.
  expected<spawned> spawn(int overlay, int ctl, std::span<const int> cgroup_fds,
                          const std::string& hostname, bool net);

  /// The sandbox user namespace (to idmap layer mounts with).
  [[nodiscard]] int userns_fd() const { return userns_.get(); }
  [[nodiscard]] const id_range& ids() const { return ids_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  /// The highest Landlock ABI the kernel offers (0: sandboxes run without it).
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
};

} // namespace dsec
