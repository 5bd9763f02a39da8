// The limits a sandbox gets when its request names none: every sandbox has a
// memory and a pids limit and a bounded writable layer, so that no sandbox can
// take the node's memory or pids. dsecd takes them from --default-memory,
// --default-pids and --default-disk, and `dsec run` from its own --memory,
// --pids and --disk; both start from derive_defaults() for this machine.
//
// The rule (derive_defaults): a node sized for `slots` sandboxes admits
// slots * oversubscribe of them; each gets its share of the machine, within
// bounds:
//   memory = its share of the memory (MemTotal, or our own memory cgroup's
//            limit when lower), at least 256 MiB, at most half the memory;
//   pids   = its share of 3/4 of kernel.pid_max, at least 512, at most half;
//   disk   = half the memory limit: the writable layer is a tmpfs, in RAM, and
//            its pages count against the memory limit too (they are charged to
//            the memory cgroup of the process that writes them), so a full disk
//            answers ENOSPC before the memory limit OOM-kills.
// The floors mean that many small slots overcommit: 3,200 sandboxes of 512 pids
// are more than a pid_max of 32,768. Each sandbox is still bounded, which is
// the point: one sandbox cannot take the node.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/cgroup.hpp"
#include "runtime/environment.hpp"

namespace dsec {

/// What this machine offers its sandboxes.
struct machine_resources {
  uint64_t memory_bytes = 0; ///< MemTotal, or our memory cgroup's limit when lower
  uint64_t pid_max = 0;      ///< kernel.pid_max (kernel.threads-max when lower)
  /// Reads /proc/meminfo, /proc/sys/kernel/{pid_max,threads-max} and our own
  /// memory cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes).
  static machine_resources probe();
};

/// The limits of a sandbox that asks for none. An unset memory or pids means
/// no default for it (`--default-memory none`).
struct sandbox_defaults {
  std::optional<uint64_t> memory_bytes;
  std::optional<uint64_t> pids;
  uint64_t disk_bytes = 0; ///< 0: the tmpfs default (half of RAM)

  /// The memory and pids limits as cgroup limits.
  [[nodiscard]] limits as_limits() const;
  /// Fills what `lim` leaves unset (memory, pids) from these defaults.
  void apply(limits& lim) const;
  /// Fills what `env` leaves at 0 (memory, pids, disk) from these defaults: a
  /// node does it before it builds a sandbox, so that `ps` shows the limits.
  void apply(environment& env) const;
  /// "memory 256 MiB, pids 512, disk 128 MiB" ("none" for what is unset).
  [[nodiscard]] std::string describe() const;
};

/// The rule above. slots >= 1 (0 is taken as 1), oversubscribe > 0.
sandbox_defaults derive_defaults(const machine_resources& m, uint32_t slots,
                                 double oversubscribe);

/// The slots and oversubscription that dsecd assumes without --slots and
/// --oversubscribe, and that `dsec run` derives its defaults from.
inline constexpr uint32_t default_slots = 3200;
inline constexpr double default_oversubscribe = 1.0;

} // namespace dsec
