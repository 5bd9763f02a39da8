// Pausing a sandbox (snapshots, issue 16): its processes frozen by the cgroup
// freezer, v2 first, else v1.
//
//   v2  the sandbox's own cgroup on the cgroup2 mount (one of its limits'):
//       cgroup.freeze 1 / 0, cgroup.events says when it is frozen.
//   v1  the freezer hierarchy: <own freezer cgroup>/dsec/<owner>/<name>, made
//       on the first pause only (nothing on the create path). Its processes
//       (listed by one of the sandbox's v1 cgroups) are moved in, then
//       freezer.state FROZEN; moved again until none is left outside (a fork
//       racing the move), so the whole sandbox is frozen.
// Destroy order: kill the sandbox first, then thaw (a frozen v1 task takes a
// SIGKILL only once thawed), then remove. What a SIGKILLed dsecd leaves (its
// paused sandboxes' init took PR_SET_PDEATHSIG but stays frozen) is collected
// by the next dsec: collect_freezer_garbage kills, thaws and removes the dead
// owners' freezer cgroups (cgroup_root::collect_garbage calls it first).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"

namespace dsec {

class sandbox_freezer {
public:
  sandbox_freezer() = default;
  sandbox_freezer(sandbox_freezer&&) noexcept;
  sandbox_freezer& operator=(sandbox_freezer&&) noexcept;
  sandbox_freezer(const sandbox_freezer&) = delete;
  sandbox_freezer& operator=(const sandbox_freezer&) = delete;
  /// Thaws and removes (errors ignored): call destroy() once the processes are gone.
  ~sandbox_freezer();

  /// For the sandbox named `name` (one path component) whose cgroup
  /// directories are `cgroup_dirs` (sandbox_cgroup::paths()); `owner` is the
  /// cgroup root's owner ("<pid>-<starttime>"). unsupported when it has no
  /// cgroup (no limits) or the host has no freezer.
  static expected<sandbox_freezer> open(const std::vector<std::string>& cgroup_dirs,
                                        std::string_view name, const std::string& owner);

  /// Freezes every process; waits (at most ~200 ms) until the kernel says
  /// frozen, else thaws again and fails with errc::timeout.
  expected<void> freeze();
  /// Thaws them.
  expected<void> thaw();
  [[nodiscard]] bool frozen() const noexcept { return frozen_; }
  /// "v2" or "v1".
  [[nodiscard]] const char* version() const noexcept { return v2_ ? "v2" : "v1"; }
  /// The freezer cgroup (v1), or the sandbox's v2 cgroup.
  [[nodiscard]] const std::string& path() const noexcept { return dir_; }

  /// Thaws, and (v1) removes the freezer cgroup once empty (EBUSY retried
  /// for ~1 s). Idempotent.
  expected<void> destroy();

private:
  bool v2_ = false;
  bool made_ = false;   // v1: dir_ was made by us
  bool frozen_ = false;
  std::string dir_;     // v2: the sandbox's cgroup; v1: the freezer cgroup (made at freeze)
  std::string procs_;   // v1: a cgroup of the sandbox that lists its processes
  std::string owner_dir_; // v1: <own>/dsec/<owner>
};

/// Removes the v1 freezer cgroups of dead owners (not `self_owner`): kills
/// their processes, thaws, removes. Appends what it removed.
void collect_freezer_garbage(const std::string& self_owner, std::vector<std::string>& removed);

} // namespace dsec
