// What the host looks like from this test process, to compare before and after:
// mounts, dsec cgroups, network namespaces, processes, open descriptors.
//
// Other dsec processes may run on this machine at the same time (benchmarks,
// another suite): processes started by them (below a process that has a
// dsec-spawner child and is not this one) and their live cgroup owner dirs are
// left out, so that only what this process (and what it started) left counts.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace dsec::test {

using namespace std::chrono_literals;

/// One line of /proc/PID/stat, the parts we need.
struct proc_entry {
  pid_t pid = 0;
  pid_t ppid = 0;
  std::string comm;
  uint64_t starttime = 0;
};

/// Every process on the host, by pid.
std::map<pid_t, proc_entry> process_table();

/// Pids of `root` and all its descendants in `table`.
std::set<pid_t> descendants(const std::map<pid_t, proc_entry>& table, pid_t root);

/// Our own cgroup directory in each mounted hierarchy (v1 and v2), e.g.
/// "/sys/fs/cgroup/memory/process_api/ab12".
std::vector<std::string> own_cgroup_dirs();

struct host_snapshot {
  size_t mount_count = 0;                   ///< lines of /proc/self/mountinfo
  std::multiset<std::string> fs_mounts;     ///< erofs, overlay, tmpfs, nsfs: "TYPE SOURCE AT"
  std::set<std::string> cgroup_dirs;        ///< everything below <own>/dsec/ in each hierarchy
  std::set<std::string> net_namespaces;     ///< "net:[INODE]" of every (relevant) process
  std::set<pid_t> children;                 ///< ppid == getpid()
  std::set<pid_t> dsec_inits;               ///< (relevant) processes named dsec-init
  size_t fd_count = 0;                      ///< entries of /proc/self/fd

  static host_snapshot take();
};

/// Human-readable differences; empty when equal.
std::string diff(const host_snapshot& before, const host_snapshot& after);

/// diff(before, now), retaken until it is empty or `safety` passes. What we
/// leave stays; what others' sandboxes do in passing (a `dsec run` exiting
/// elsewhere: its init is briefly an orphan) goes away.
std::string lasting_diff(const host_snapshot& before, std::chrono::seconds safety = 30s);

/// A snapshot of a settled host: the system layer exists (it is built on first
/// use), and a run with a limit collected the cgroups that dead dsec processes
/// left (as any such run does), so neither counts as a change later.
host_snapshot settled_snapshot();

/// Fails the current test if anything of `before` changed for good.
void check_nothing_left(const host_snapshot& before);

/// Calls `cond` until it is true or `safety` passes; returns its last result.
/// For things that happen asynchronously (a killed process going away).
bool eventually(const std::function<bool()>& cond, std::chrono::seconds safety = 60s);

} // namespace dsec::test
