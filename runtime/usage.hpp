// usage: what a live sandbox uses now, read from the host's side (procfs,
// cgroupfs, statfs), for `dsec stats ID` and `dsec top ID` (issue 23).
//
// Nothing here reads a file the sandbox can write or change the meaning of:
// its processes are found in its cgroup's cgroup.procs (or, with no cgroup,
// by their pid namespace), their figures come from /proc/PID/{stat,status,
// cmdline} (kernel files), its writable layer's use from statfs of its root
// (overlayfs answers with its upper tmpfs). A process that exits while it is
// being read is skipped.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"

namespace dsec {

/// One process of a sandbox (`dsec top ID`), as the sandbox sees it.
struct sandbox_process {
  int32_t pid = 0;        ///< in the sandbox's pid namespace (its init is 1)
  int32_t ppid = 0;       ///< likewise; 0 for init, whose parent is outside
  uint32_t uid = 0;       ///< real uid in the sandbox's user namespace
  std::string state;      ///< /proc/PID/stat's letter: R, S, D, Z, T, ...
  uint32_t threads = 0;
  uint64_t rss_bytes = 0; ///< resident memory
  uint64_t cpu_ms = 0;    ///< user + system CPU time it used so far
  uint64_t age_ms = 0;    ///< since it started
  std::string command;    ///< its argv joined by spaces (at most 4 KiB), or [comm]
};

/// What a sandbox uses now (`dsec stats ID`). Limits are 0 when none is set.
struct resource_usage {
  uint64_t memory_bytes = 0;  ///< charged to its memory cgroup (page cache and
                              ///< its writable layer's pages too); else the
                              ///< sum of its processes' resident memory
  uint64_t memory_limit = 0;
  uint64_t cpu_ms = 0;        ///< CPU time of its live processes and of every
                              ///< one that ended (reaped into their parents)
  uint64_t tasks = 0;         ///< processes and threads alive (pids.current, or counted)
  uint64_t tasks_limit = 0;
  uint64_t processes = 0;     ///< processes alive
  uint64_t disk_bytes = 0;    ///< used in its writable layer
  uint64_t disk_limit = 0;    ///< the writable layer's size
  uint64_t inodes = 0;        ///< files in its writable layer (used inodes)
  uint64_t inodes_limit = 0;
  bool memory_from_cgroup = false; ///< memory_bytes is the cgroup's figure
};

/// The processes of the sandbox whose init is host pid `init`, ordered by pid,
/// and (through `usage`, if not null) its resource figures. `cgroup_paths`
/// are its cgroup directories (sandbox_cgroup::paths(); may be empty): the
/// first one that lists processes names them, else every process in init's
/// pid namespace is. not_found when init is gone.
expected<std::vector<sandbox_process>> read_sandbox_processes(
  pid_t init, const std::vector<std::string>& cgroup_paths, resource_usage* usage = nullptr);

/// Parses one /proc/PID/stat line into `p` (state, threads, rss in pages,
/// cpu and start in clock ticks; the command name, which may hold spaces and
/// parentheses, into `comm`). False when the line is malformed.
struct proc_stat {
  std::string comm;
  std::string state;
  int64_t ppid = 0;
  uint64_t utime = 0, stime = 0, cutime = 0, cstime = 0; ///< clock ticks
  uint64_t threads = 0;
  uint64_t start = 0;     ///< clock ticks after boot
  uint64_t rss_pages = 0;
};
bool parse_proc_stat(std::string_view line, proc_stat& p);

} // namespace dsec
