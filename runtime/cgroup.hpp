// Per-sandbox cgroups: memory, pids and cpu limits on cgroup v2, or on the v1
// hierarchies when v2 does not have the controller (hybrid hosts).
//
// Layout in every hierarchy dsec uses: <own cgroup>/dsec/<owner>/<sandbox name>,
// where <own cgroup> is this process's cgroup in that hierarchy (dsec only ever
// creates below it) and <owner> is "<pid>-<starttime>" of the creating process, so
// that the leftovers of a crashed dsec can be told apart from a live one's and
// collected (cgroup_root::collect_garbage).
//
// Cost: a v2 cgroup is ~32 us to create, a v1 memory cgroup ~213 us, so create()
// only touches the hierarchies the requested limits need, works relative to
// directory fds opened once, and allocates only the paths it returns. A root
// with a pool (enable_pool: dsecd, where every sandbox has limits) goes
// further: a sandbox's cgroups, once empty, are kept for the next sandbox
// (limits rewritten only when they differ, cgroup.procs reopened at release),
// so that a create from the pool makes no system call at all, and no dying
// memory cgroup piles up per sandbox. perf/runtime_bench measures both
// (BM_cgroup, BM_sandbox_limits).
#pragma once

#include <sys/types.h>

#include <array>
#include <memory>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

namespace dsec {

/// Resource limits of one sandbox. Unset members mean "no limit".
struct limits {
  /// Bytes of memory. v2: memory.max, plus memory.swap.max=0 when swap
  /// accounting exists; v1: memory.limit_in_bytes, plus
  /// memory.memsw.limit_in_bytes (same value) when the file exists, so that swap
  /// is no escape.
  std::optional<uint64_t> memory_bytes;
  /// Tasks (processes and threads) alive at once: pids.max.
  std::optional<uint64_t> pids;
  /// CPUs worth of time per 100 ms period. v2: cpu.max "QUOTA 100000";
  /// v1: cpu.cfs_period_us=100000 and cpu.cfs_quota_us=QUOTA.
  std::optional<double> cpus;

  /// True when any limit is set (a sandbox without limits needs no cgroup).
  [[nodiscard]] bool any() const noexcept;

  /// memory >= 4 MiB, 1 <= pids <= 4194304 (the kernel's PID_MAX_LIMIT),
  /// 0.01 <= cpus <= 1024. The invalid_argument error names the option
  /// (--memory, --pids, --cpus) and the bad value.
  [[nodiscard]] expected<void> validate() const;
};

/// The controllers dsec limits.
enum class cgroup_controller : uint8_t { memory = 0, pids = 1, cpu = 2 };
inline constexpr size_t cgroup_controller_count = 3;

/// "memory", "pids", "cpu".
const char* to_string(cgroup_controller c) noexcept;

/// Which cgroup version serves a controller.
enum class cgroup_version : uint8_t { absent, v1, v2 };

/// "absent", "v1", "v2".
const char* to_string(cgroup_version v) noexcept;

/// Where this process's own cgroups are, as /proc/self/cgroup, /proc/self/mountinfo
/// and the v2 cgroup.controllers file say. Pure data: parsing creates nothing, so
/// it can be tested with the contents of any machine's files.
struct cgroup_layout {
  /// Our own cgroup directory on the cgroup2 mount, e.g.
  /// "/sys/fs/cgroup/user.slice/dsecd.scope"; empty when no cgroup2 mount shows it.
  std::string v2_dir;
  /// Per controller (indexed by cgroup_controller): true when it is listed in
  /// v2_dir/cgroup.controllers, i.e. available to our v2 cgroup.
  std::array<bool, cgroup_controller_count> v2_listed{};
  /// Per controller: our own cgroup directory in the v1 hierarchy that has it,
  /// e.g. "/sys/fs/cgroup/memory/process_api/ab12"; empty when no v1 mount has it.
  std::array<std::string, cgroup_controller_count> v1_dirs;

  /// v2 when listed there, else v1 when a v1 hierarchy has it, else absent.
  [[nodiscard]] cgroup_version preferred(cgroup_controller c) const noexcept;

  /// Our own cgroup directory for the preferred version; empty when absent.
  [[nodiscard]] const std::string& own_dir(cgroup_controller c) const noexcept;

  /// Parses the contents of /proc/self/cgroup and /proc/self/mountinfo and of
  /// cgroup.controllers in our own v2 cgroup (empty if unknown). Handles mounts
  /// whose root is not "/" (bind mounts, cgroup namespaces) and escaped mount
  /// points. Fails only on malformed /proc/self/cgroup lines.
  static expected<cgroup_layout> parse(std::string_view self_cgroup,
                                       std::string_view mountinfo,
                                       std::string_view v2_controllers);
};

class sandbox_cgroup;
struct cgroup_pool;

/// What a root's pool did since it was enabled.
struct cgroup_pool_stats {
  uint64_t reused = 0;    ///< creates served from the pool
  uint64_t made = 0;      ///< cgroups made for it (misses and prewarm)
  uint64_t discarded = 0; ///< released cgroups removed instead of kept (pool full,
                          ///< pages of a writable layer still charged, a failed write)
  uint64_t idle = 0;      ///< kept now, ready for the next sandbox
};

/// Where this process creates sandbox cgroups: one directory <own>/dsec/<owner>
/// per hierarchy in use, created when the root is opened and removed (if empty)
/// when the last root of this process for it goes away. Move-only. create(),
/// describe() and collect_garbage() may be called from several threads at once.
class cgroup_root {
public:
  /// Reads /proc/self/cgroup, /proc/self/mountinfo and our v2 cgroup.controllers,
  /// then open()s the resulting layout.
  static expected<cgroup_root> detect();

  /// Prepares the hierarchies of a layout: for v2 controllers writes "+memory
  /// +pids +cpu" (those in use) into cgroup.subtree_control of <own>, <own>/dsec
  /// and <own>/dsec/<owner>. When <own> cannot enable them (EBUSY: it is not the
  /// root and has processes of its own) a controller falls back to its v1
  /// hierarchy if there is one, else it is absent and create() explains that
  /// dsec needs a delegated cgroup. A hierarchy that cannot be prepared (e.g. a
  /// read-only cgroupfs) makes its controllers absent rather than failing here.
  static expected<cgroup_root> open(const cgroup_layout& layout);

  cgroup_root(cgroup_root&&) noexcept;
  cgroup_root& operator=(cgroup_root&&) noexcept;
  cgroup_root(const cgroup_root&) = delete;
  cgroup_root& operator=(const cgroup_root&) = delete;
  /// Removes this process's <own>/dsec/<owner> directories (and <own>/dsec when
  /// empty) once no other root of this process uses them. Destroy every
  /// sandbox_cgroup first: a non-empty owner dir stays for collect_garbage().
  ~cgroup_root();

  /// Creates <own>/dsec/<owner>/<name> in each hierarchy the set limits need
  /// (none when !lim.any()) and writes the limits. `name` is one path component.
  /// invalid_argument for a bad name or limit, already_exists when taken,
  /// unsupported naming the controller when a needed one is absent.
  /// With a pool, a cgroup released earlier for the same controllers is taken
  /// instead (its limits rewritten where they differ), and new ones are named
  /// "pool-N", not `name` (which is still checked): they outlive the sandbox.
  [[nodiscard]] expected<sandbox_cgroup> create(std::string_view name,
                                                const limits& lim) const;

  /// From now on, keeps up to `max_idle` released sandbox cgroups for reuse
  /// by create(). A released cgroup is kept only once it holds no process and
  /// no page of a writable layer (tmpfs pages are charged to the memory
  /// cgroup of whoever wrote them, and stay until the tmpfs goes); its OOM-kill
  /// count so far is remembered, so that oom_killed() counts only the next
  /// sandbox's. The idle ones are removed with the root.
  void enable_pool(size_t max_idle);

  /// Makes `n` cgroups for `lim` into the pool ahead of the first sandboxes
  /// (at most the pool's max_idle). No-op without a pool.
  [[nodiscard]] expected<void> prewarm(const limits& lim, size_t n) const;

  /// The pool's counters (all 0 without a pool).
  [[nodiscard]] cgroup_pool_stats pool_stats() const;

  /// Removes what crashed dsec processes left: every <own>/dsec/<owner> whose
  /// owner is not alive with the same start time (and is not us). Processes still
  /// in such a cgroup are SIGKILLed by pid (through a pidfd, re-checked to be in
  /// the cgroup, so a recycled pid is never hit; v2 uses cgroup.kill). Never
  /// touches anything outside <own>/dsec. Returns the removed directories; the
  /// error names the first directory that could not be removed (the others are
  /// still attempted). Owner liveness is judged in our pid namespace.
  [[nodiscard]] expected<std::vector<std::string>> collect_garbage() const;

  /// One line per controller, e.g. "memory: v1 /sys/fs/cgroup/memory/x/dsec,
  /// pids: v1 /sys/fs/cgroup/pids/dsec, cpu: absent (no hierarchy has it)".
  [[nodiscard]] std::string describe() const;

  /// The version serving a controller after open() (fallbacks applied).
  [[nodiscard]] cgroup_version version(cgroup_controller c) const noexcept;

  /// <own>/dsec/<owner> of the controller's hierarchy; empty when absent.
  [[nodiscard]] std::string owner_dir(cgroup_controller c) const;

  /// "<pid>-<starttime>" of this process.
  [[nodiscard]] const std::string& owner() const noexcept { return owner_; }

private:
  struct hierarchy {
    cgroup_version version = cgroup_version::absent;
    std::string own;        // our own cgroup dir
    std::string owner_dir;  // own/dsec/<owner>
    unique_fd owner_fd;     // O_PATH dir fd of owner_dir; create() works from it
    uint8_t controllers = 0; // bit per cgroup_controller served here
    bool swap_file = false;  // memory.swap.max (v2) / memory.memsw.* (v1) exists
  };
  cgroup_root() = default;
  void release() noexcept;

  std::vector<hierarchy> hier_;
  std::array<int8_t, cgroup_controller_count> index_{-1, -1, -1}; // into hier_
  std::array<std::string, cgroup_controller_count> why_absent_;
  std::string owner_;
  pid_t pid_ = 0; // the creating process: a forked child must not clean up
  std::shared_ptr<cgroup_pool> pool_; // null: no pool
  // Makes one sandbox cgroup named `name` for the controllers in `need`.
  expected<sandbox_cgroup> make(std::string_view name, uint8_t need, const limits& lim) const;
};

/// The cgroups of one sandbox, one directory per hierarchy in use. Move-only;
/// destroyed (errors ignored) by the destructor.
class sandbox_cgroup {
public:
  sandbox_cgroup() = default;
  sandbox_cgroup(sandbox_cgroup&&) noexcept = default;
  sandbox_cgroup& operator=(sandbox_cgroup&& other) noexcept;
  sandbox_cgroup(const sandbox_cgroup&) = delete;
  sandbox_cgroup& operator=(const sandbox_cgroup&) = delete;
  ~sandbox_cgroup();

  /// One O_WRONLY|O_CLOEXEC fd on cgroup.procs per hierarchy, opened by this
  /// process. The sandbox's first process (a child in other namespaces, maybe in
  /// a user namespace) writes "0" into each to join before it execs: the kernel
  /// checks the opener's credentials and cgroup namespace, which is why this
  /// process opens them. Empty when no limit was set or after close_join_fds().
  [[nodiscard]] std::vector<int> join_fds() const;

  /// Closes the join fds once the first process has joined (1-3 fds per live
  /// sandbox add up at thousands of sandboxes). destroy() closes them too.
  void close_join_fds() noexcept;

  /// True when the kernel OOM-killed a process of the sandbox: "oom_kill N" with
  /// N > 0 in memory.events (v2) or memory.oom_control (v1). False without a
  /// memory limit.
  [[nodiscard]] bool oom_killed() const;

  /// The cgroup directories, one per hierarchy in use.
  [[nodiscard]] std::vector<std::string> paths() const;

  /// True when there is nothing (left) to destroy.
  [[nodiscard]] bool empty() const noexcept { return parts_.empty(); }

  /// Closes the fds and removes every directory, or, made by a root with a
  /// pool, gives them back to it (see cgroup_root::enable_pool). EBUSY (tasks
  /// of a just-killed pid namespace may still be exiting) is retried with short
  /// sleeps for up to ~1 s, as is a pooled cgroup that still lists a process;
  /// after that the in_use error names the path and a later call tries again.
  /// Idempotent.
  expected<void> destroy();

private:
  friend class cgroup_root;
  friend struct cgroup_pool;
  struct part {
    std::string path;
    unique_fd procs;
    cgroup_version version = cgroup_version::absent;
    bool memory = false; // this hierarchy holds the memory limit
    bool swap_file = false; // memory.swap.max / memory.memsw.* exists
    uint8_t controllers = 0; // bit per cgroup_controller limited here
  };
  // Writes the limits of `lim` that differ from `written_` (all of them when
  // `fresh`).
  expected<void> write_limits(const limits& lim, bool fresh);
  // Pooled: waits until no process is left, then hands the cgroup back to the
  // pool, or removes it when it cannot be reused.
  expected<void> release_to_pool();
  expected<void> remove_dirs();

  std::vector<part> parts_;
  pid_t pid_ = 0; // the creating process: a forked child must not clean up
  std::shared_ptr<cgroup_pool> pool_; // where it goes back to; null: removed
  uint8_t need_ = 0;   // the controllers it was made for
  limits written_;     // what its files hold now
  uint64_t oom_base_ = 0; // OOM kills before this sandbox (a reused cgroup)
};

/// "<pid>-<starttime>" of this process: how dsec names what one process owns
/// (its cgroups, a node's merged microVM disks), so that what a killed one
/// left can be told from what a live one holds.
expected<std::string> process_owner_name();
/// Whether `name` ("<pid>-<starttime>") is a process that runs now with that
/// start time (a zombie does not); false for any other name.
bool process_owner_alive(std::string_view name);

} // namespace dsec
