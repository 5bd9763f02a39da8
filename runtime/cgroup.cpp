#include "runtime/cgroup.hpp"
#include "runtime/freezer.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/io.hpp"
#include "runtime/sys.hpp"

namespace dsec {

namespace {

using namespace std::chrono_literals;

constexpr std::array<const char*, cgroup_controller_count> controller_names = {
  "memory", "pids", "cpu"};

constexpr uint8_t bit(size_t c) { return static_cast<uint8_t>(1u << c); }

// How long destroy() and collect_garbage() wait for the tasks of a cgroup to
// finish exiting: a killed pid namespace takes a moment to empty its cgroup.
constexpr auto busy_wait = 1s;

// Reads a whole (small, procfs or cgroupfs) file. Returns 0 or an errno.
int read_small(const std::string& path, std::string& out) {
  auto r = read_file(AT_FDCWD, path);
  if (!r) {
    out.clear();
    return r.error_value().sys_errno;
  }
  out = std::move(*r);
  return 0;
}

// Writes `data` to a cgroup file with one write(2), as cgroupfs expects.
// Returns 0 or an errno.
int write_at(int dirfd, const char* path, std::string_view data) {
  unique_fd fd(sys::retry([&] { return ::openat(dirfd, path, O_WRONLY | O_CLOEXEC); }));
  if (!fd)
    return errno;
  auto n = sys::retry([&] { return ::write(fd.get(), data.data(), data.size()); });
  if (n < 0)
    return errno;
  return static_cast<size_t>(n) == data.size() ? 0 : EIO;
}

// Splits on any of `seps`, skipping empty tokens.
template <class F>
void for_each_token(std::string_view s, std::string_view seps, F&& f) {
  size_t i = 0;
  while (i < s.size()) {
    auto j = s.find_first_of(seps, i);
    if (j == std::string_view::npos)
      j = s.size();
    if (j > i)
      f(s.substr(i, j - i));
    i = j + 1;
  }
}

bool has_token(std::string_view s, std::string_view seps, std::string_view tok) {
  bool found = false;
  for_each_token(s, seps, [&](std::string_view t) { found = found || t == tok; });
  return found;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_mountinfo(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' &&
        s[i + 2] >= '0' && s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 +
                               (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The directory of cgroup `path` (as /proc/self/cgroup shows it) on a mount of
// its hierarchy whose root (mountinfo field 4) is `root`, or nothing when the
// mount does not show it.
std::optional<std::string> dir_on_mount(std::string_view mountpoint,
                                        std::string_view root, std::string_view path) {
  std::string_view rel;
  if (root == "/") {
    rel = path;
  } else if (path.substr(0, root.size()) == root &&
             (path.size() == root.size() || path[root.size()] == '/')) {
    rel = path.substr(root.size());
  } else {
    return std::nullopt;
  }
  std::string dir(mountpoint);
  if (rel != "/" && !rel.empty()) {
    if (!dir.empty() && dir.back() == '/')
      dir.pop_back();
    dir += rel;
  }
  return dir;
}

struct mount_entry {
  std::string root;
  std::string mountpoint;
  std::string fstype;
  std::string super_options;
};

std::vector<mount_entry> parse_cgroup_mounts(std::string_view mountinfo) {
  std::vector<mount_entry> out;
  for_each_token(mountinfo, "\n", [&](std::string_view line) {
    std::vector<std::string_view> f;
    for_each_token(line, " ", [&](std::string_view t) { f.push_back(t); });
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
    auto sep = std::find(f.begin(), f.end(), std::string_view("-"));
    if (f.size() < 6 || sep == f.end() || sep - f.begin() < 6 || f.end() - sep < 3)
      return;
    auto fstype = sep[1];
    if (fstype != "cgroup" && fstype != "cgroup2")
      return;
    out.push_back({unescape_mountinfo(f[3]), unescape_mountinfo(f[4]),
                   std::string(fstype), f.end() - sep >= 4 ? std::string(sep[3]) : ""});
  });
  return out;
}

// "<pid>-<starttime>" parsed; nothing for names that are not owner dirs.
std::optional<std::pair<pid_t, uint64_t>> parse_owner(std::string_view s) {
  auto dash = s.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == s.size())
    return std::nullopt;
  uint64_t pid = 0, start = 0;
  auto a = std::from_chars(s.data(), s.data() + dash, pid);
  auto b = std::from_chars(s.data() + dash + 1, s.data() + s.size(), start);
  if (a.ec != std::errc{} || a.ptr != s.data() + dash || b.ec != std::errc{} ||
      b.ptr != s.data() + s.size() || pid == 0 || pid > 0x7fffffff)
    return std::nullopt;
  return std::pair{static_cast<pid_t>(pid), start};
}

// Field 22 of /proc/<pid>/stat: the start time in clock ticks after boot. The
// comm field (2) may hold spaces and parentheses, so count from the last ')'.
std::optional<uint64_t> stat_starttime(std::string_view stat) {
  auto close = stat.rfind(')');
  if (close == std::string_view::npos)
    return std::nullopt;
  std::optional<uint64_t> out;
  int field = 2;
  for_each_token(stat.substr(close + 1), " \n", [&](std::string_view t) {
    if (++field == 22) {
      uint64_t v = 0;
      auto r = std::from_chars(t.data(), t.data() + t.size(), v);
      if (r.ec == std::errc{})
        out = v;
    }
  });
  return out;
}

expected<std::string> self_owner() {
  std::string stat;
  if (int err = read_small(std::string("/proc/self/stat"), stat))
    return sys_error("cannot read", "/proc/self/stat", err);
  auto start = stat_starttime(stat);
  if (!start)
    return make_error(errc::system_error, "cannot parse the start time in /proc/self/stat");
  return std::to_string(::getpid()) + '-' + std::to_string(*start);
}

// True when `pid` runs and started at `start` (it is the same process). A
// zombie (killed, not reaped yet by its parent) runs no more: its cgroups are
// garbage already, and a dsecd started right after a kill -9 takes them.
bool owner_alive(pid_t pid, uint64_t start) {
  std::string stat;
  if (read_small("/proc/" + std::to_string(pid) + "/stat", stat) != 0)
    return false;
  auto s = stat_starttime(stat);
  if (!s || *s != start)
    return false;
  auto close = stat.rfind(')'); // "pid (comm) S ...": the state follows the name
  char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
  return state != 'Z' && state != 'X';
}

// Owner dirs are shared by all roots of this process (same owner, same paths):
// the last root to go removes them. The mutex also orders a root's preparation
// against another's removal.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, int>& registry() {
  static std::map<std::string, int> r;
  return r;
}

int make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST)
    return 0;
  return errno;
}

// "+memory +pids" for the controllers in `mask` (v2 names match ours).
std::string enable_line(uint8_t mask) {
  std::string s;
  for (size_t c = 0; c < cgroup_controller_count; ++c)
    if (mask & bit(c)) {
      if (!s.empty())
        s += ' ';
      s += '+';
      s += controller_names[c];
    }
  return s;
}

// Enables the controllers of `mask` for the children of `dir` unless they are
// already (a write that enables something new is refused while `dir` has
// processes, even when it is a no-op for the rest). Returns 0 or an errno.
int enable_subtree(const std::string& dir, uint8_t mask) {
  std::string cur;
  auto file = dir + "/cgroup.subtree_control";
  if (int err = read_small(file, cur))
    return err;
  uint8_t missing = 0;
  for (size_t c = 0; c < cgroup_controller_count; ++c)
    if ((mask & bit(c)) && !has_token(cur, " \n", controller_names[c]))
      missing |= bit(c);
  if (!missing)
    return 0;
  return write_at(AT_FDCWD, file.c_str(), enable_line(missing));
}

std::string mask_names(uint8_t mask) {
  std::string s;
  for (size_t c = 0; c < cgroup_controller_count; ++c)
    if (mask & bit(c)) {
      if (!s.empty())
        s += ", ";
      s += controller_names[c];
    }
  return s;
}

// The pids listed in a cgroup.procs file.
std::vector<pid_t> read_procs(const std::string& dir) {
  std::vector<pid_t> out;
  std::string s;
  if (read_small(dir + "/cgroup.procs", s) != 0)
    return out;
  for_each_token(s, "\n", [&](std::string_view t) {
    int v = 0;
    auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    if (r.ec == std::errc{} && v > 0)
      out.push_back(v);
  });
  return out;
}

// SIGKILLs every process in the cgroup `dir` (not its children cgroups). A pid
// read from cgroup.procs may be recycled before we signal it: pin each with a
// pidfd first, then signal only those still listed, which are members for sure.
void kill_members(const std::string& dir, cgroup_version v) {
  if (v == cgroup_version::v2 &&
      write_at(AT_FDCWD, (dir + "/cgroup.kill").c_str(), "1") == 0)
    return;
  auto pids = read_procs(dir);
  if (pids.empty())
    return;
  std::vector<std::pair<pid_t, unique_fd>> pinned;
  for (auto pid : pids) {
    unique_fd fd(sys::pidfd_open(pid, 0));
    if (fd)
      pinned.emplace_back(pid, std::move(fd));
  }
  auto still = read_procs(dir);
  for (auto& [pid, fd] : pinned)
    if (std::find(still.begin(), still.end(), pid) != still.end())
      sys::pidfd_send_signal(fd.get(), SIGKILL);
}

// rmdir with EBUSY retried until `deadline`. Returns 0 (also when already gone)
// or an errno.
int remove_dir(const std::string& path, std::chrono::steady_clock::time_point deadline) {
  auto pause = 100us;
  for (;;) {
    if (::rmdir(path.c_str()) == 0 || errno == ENOENT)
      return 0;
    int err = errno;
    if (err != EBUSY || std::chrono::steady_clock::now() >= deadline)
      return err;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, 20ms);
  }
}

error busy_error(const std::string& path, int err) {
  auto e = sys_error("cannot remove cgroup", path, err);
  if (err == EBUSY) {
    e.code = errc::in_use;
    e.message = "cannot remove cgroup " + path +
                ": processes are still in it after 1 s (kill and reap them first): " +
                std::strerror(err);
  }
  return e;
}

// Removes a dead owner's cgroup tree depth-first, killing what is left in it.
void remove_tree(const std::string& path, cgroup_version v, int depth,
                 std::vector<std::string>& removed, std::optional<error>& first_err) {
  if (depth < 16) {
    std::vector<std::string> subdirs;
    if (DIR* d = ::opendir(path.c_str())) {
      while (auto* ent = ::readdir(d)) {
        std::string_view n = ent->d_name;
        if (ent->d_type == DT_DIR && n != "." && n != "..")
          subdirs.emplace_back(path + '/' + ent->d_name);
      }
      ::closedir(d);
    }
    for (auto& sub : subdirs)
      remove_tree(sub, v, depth + 1, removed, first_err);
  }
  kill_members(path, v);
  if (int err = remove_dir(path, std::chrono::steady_clock::now() + busy_wait)) {
    if (!first_err)
      first_err = busy_error(path, err);
    return;
  }
  removed.push_back(path);
}

} // namespace

// --- limits -------------------------------------------------------------------

bool limits::any() const noexcept {
  return memory_bytes || pids || cpus;
}

expected<void> limits::validate() const {
  constexpr uint64_t min_memory = 4ull << 20;
  constexpr uint64_t max_pids = 4194304; // PID_MAX_LIMIT: pids.max refuses more
  if (memory_bytes && *memory_bytes < min_memory)
    return make_error(errc::invalid_argument,
                      "--memory " + std::to_string(*memory_bytes) +
                        " is too small: a sandbox needs at least 4 MiB (4194304 bytes)");
  if (pids && (*pids < 1 || *pids > max_pids))
    return make_error(errc::invalid_argument,
                      "--pids " + std::to_string(*pids) +
                        " is out of range: it must be between 1 and 4194304");
  if (cpus && !(*cpus >= 0.01 && *cpus <= 1024.0)) { // also rejects NaN
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof(buf), *cpus);
    return make_error(errc::invalid_argument,
                      "--cpus " + std::string(buf, r.ptr) +
                        " is out of range: it must be between 0.01 and 1024");
  }
  return {};
}

const char* to_string(cgroup_controller c) noexcept {
  return controller_names[static_cast<size_t>(c)];
}

const char* to_string(cgroup_version v) noexcept {
  switch (v) {
    case cgroup_version::absent: return "absent";
    case cgroup_version::v1: return "v1";
    case cgroup_version::v2: return "v2";
  }
  return "unknown";
}

// --- cgroup_layout ------------------------------------------------------------

cgroup_version cgroup_layout::preferred(cgroup_controller c) const noexcept {
  auto i = static_cast<size_t>(c);
  if (v2_listed[i] && !v2_dir.empty())
    return cgroup_version::v2;
  if (!v1_dirs[i].empty())
    return cgroup_version::v1;
  return cgroup_version::absent;
}

const std::string& cgroup_layout::own_dir(cgroup_controller c) const noexcept {
  static const std::string none;
  switch (preferred(c)) {
    case cgroup_version::v2: return v2_dir;
    case cgroup_version::v1: return v1_dirs[static_cast<size_t>(c)];
    case cgroup_version::absent: break;
  }
  return none;
}

expected<cgroup_layout> cgroup_layout::parse(std::string_view self_cgroup,
                                             std::string_view mountinfo,
                                             std::string_view v2_controllers) {
  // /proc/self/cgroup: "ID:CONTROLLERS:PATH"; v2 is "0::PATH".
  struct self_line {
    std::string_view controllers;
    std::string_view path;
  };
  std::vector<self_line> v1_lines;
  std::optional<std::string_view> v2_path;
  std::optional<error> bad;
  for_each_token(self_cgroup, "\n", [&](std::string_view line) {
    auto a = line.find(':');
    auto b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos || line.size() == b + 1 || line[b + 1] != '/') {
      if (!bad)
        bad = make_error(errc::invalid_argument,
                         "malformed /proc/self/cgroup line '" + std::string(line) + "'");
      return;
    }
    auto id = line.substr(0, a);
    auto ctl = line.substr(a + 1, b - a - 1);
    auto path = line.substr(b + 1);
    if (id == "0" && ctl.empty())
      v2_path = path;
    else
      v1_lines.push_back({ctl, path});
  });
  if (bad)
    return std::move(*bad);

  auto mounts = parse_cgroup_mounts(mountinfo);
  cgroup_layout out;
  if (v2_path) {
    for (auto& m : mounts) {
      if (m.fstype != "cgroup2")
        continue;
      if (auto dir = dir_on_mount(m.mountpoint, m.root, *v2_path)) {
        out.v2_dir = std::move(*dir);
        break;
      }
    }
  }
  if (!out.v2_dir.empty())
    for (size_t c = 0; c < cgroup_controller_count; ++c)
      out.v2_listed[c] = has_token(v2_controllers, " \t\n", controller_names[c]);

  for (size_t c = 0; c < cgroup_controller_count; ++c) {
    auto name = controller_names[c];
    auto line = std::find_if(v1_lines.begin(), v1_lines.end(), [&](const self_line& l) {
      return has_token(l.controllers, ",", name);
    });
    if (line == v1_lines.end())
      continue;
    for (auto& m : mounts) {
      if (m.fstype != "cgroup" || !has_token(m.super_options, ",", name))
        continue;
      if (auto dir = dir_on_mount(m.mountpoint, m.root, line->path)) {
        out.v1_dirs[c] = std::move(*dir);
        break;
      }
    }
  }
  return out;
}

namespace {

// Writes the limits of `lim` for the controllers in `here` into the cgroup at
// `dirfd`/`prefix` (prefix: "NAME/" relative to an owner dir fd, or an
// absolute "PATH/" with AT_FDCWD). `old`: what the files hold now (a pooled
// cgroup: only what differs is written); null for a fresh cgroup. `path` names
// the cgroup in errors.
expected<void> put_limits(int dirfd, std::string_view prefix, const std::string& path,
                          cgroup_version version, bool swap_file, uint8_t here,
                          const limits& lim, const limits* old) {
  char rel[512];
  if (prefix.size() + 64 > sizeof rel)
    return make_error(errc::invalid_argument, "cgroup path too long: " + path);
  std::memcpy(rel, prefix.data(), prefix.size());
  char* file = rel + prefix.size();
  char num[64];
  auto put = [&](const char* f, std::string_view value) -> expected<void> {
    std::strcpy(file, f);
    if (int err = write_at(dirfd, rel, value)) {
      auto e = sys_error("cannot write '" + std::string(value) + "' to", path + '/' + f, err);
      if (e.code == errc::not_found) // the file, not the request, is missing
        e.code = errc::unsupported;
      return e;
    }
    return {};
  };
  auto number = [&](uint64_t v, const char* suffix = "") {
    auto r = std::to_chars(num, num + 32, v);
    std::strcpy(r.ptr, suffix);
    return std::string_view(num, static_cast<size_t>(r.ptr - num) + std::strlen(suffix));
  };
  bool v2 = version == cgroup_version::v2;
  if ((here & bit(0)) && (!old || old->memory_bytes != lim.memory_bytes)) {
    auto bytes = number(*lim.memory_bytes);
    if (v2) {
      DSEC_TRY_VOID(put("memory.max", bytes));
      if (swap_file && !old)
        DSEC_TRY_VOID(put("memory.swap.max", "0"));
    } else if (!swap_file) {
      DSEC_TRY_VOID(put("memory.limit_in_bytes", bytes));
    } else {
      // memsw (memory+swap) may never be below the memory limit: when the
      // limit goes up, memsw first; when it goes down (from "max" too), after.
      bool up = old && old->memory_bytes && *lim.memory_bytes > *old->memory_bytes;
      std::string value(bytes);
      if (up)
        DSEC_TRY_VOID(put("memory.memsw.limit_in_bytes", value));
      DSEC_TRY_VOID(put("memory.limit_in_bytes", value));
      if (!up)
        DSEC_TRY_VOID(put("memory.memsw.limit_in_bytes", value));
    }
  }
  if ((here & bit(1)) && (!old || old->pids != lim.pids))
    DSEC_TRY_VOID(put("pids.max", number(*lim.pids)));
  if ((here & bit(2)) && (!old || old->cpus != lim.cpus)) {
    auto quota = static_cast<uint64_t>(std::llround(*lim.cpus * 100000.0));
    if (v2) {
      DSEC_TRY_VOID(put("cpu.max", number(quota, " 100000")));
    } else {
      if (!old)
        DSEC_TRY_VOID(put("cpu.cfs_period_us", "100000"));
      DSEC_TRY_VOID(put("cpu.cfs_quota_us", number(quota)));
    }
  }
  return {};
}

// "oom_kill N" of memory.events (v2) or memory.oom_control (v1); 0 if unknown.
uint64_t oom_kills(const std::string& dir, cgroup_version v) {
  std::string s;
  if (read_small(dir + (v == cgroup_version::v2 ? "/memory.events" : "/memory.oom_control"), s))
    return 0;
  uint64_t n = 0;
  for_each_token(s, "\n", [&](std::string_view line) {
    constexpr std::string_view key = "oom_kill ";
    if (line.substr(0, key.size()) == key) {
      auto v = line.substr(key.size());
      std::from_chars(v.data(), v.data() + v.size(), n);
    }
  });
  return n;
}

// Bytes of shmem (tmpfs, memfd, SysV shm) charged to a memory cgroup, from its
// memory.stat ("shmem N", v1 and v2); nothing if it cannot be read.
std::optional<uint64_t> shmem_bytes(const std::string& dir) {
  std::string s;
  if (read_small(dir + "/memory.stat", s))
    return std::nullopt;
  std::optional<uint64_t> n;
  for_each_token(s, "\n", [&](std::string_view line) {
    constexpr std::string_view key = "shmem ";
    if (!n && line.substr(0, key.size()) == key) {
      uint64_t v = 0;
      auto t = line.substr(key.size());
      if (std::from_chars(t.data(), t.data() + t.size(), v).ec == std::errc{})
        n = v;
    }
  });
  return n;
}

} // namespace

// Released sandbox cgroups, by the controllers they were made for (a mask of
// cgroup_controller bits), ready for the next create() of the same kind.
struct cgroup_pool {
  std::mutex mu;
  bool open = true;
  size_t max_idle = 0;
  uint64_t next_name = 0;
  std::array<std::vector<sandbox_cgroup>, 1u << cgroup_controller_count> idle;
  cgroup_pool_stats stats;

  std::optional<sandbox_cgroup> take(uint8_t need) {
    std::lock_guard lock(mu);
    auto& v = idle[need];
    if (!open || v.empty())
      return std::nullopt;
    sandbox_cgroup cg = std::move(v.back());
    v.pop_back();
    --stats.idle;
    ++stats.reused;
    return cg;
  }

  // Keeps `cg` if there is room; false (and `cg` untouched) otherwise.
  bool put(sandbox_cgroup& cg) {
    std::lock_guard lock(mu);
    if (!open || stats.idle >= max_idle)
      return false;
    cg.pool_.reset(); // no cycle: what the pool holds does not hold the pool
    idle[cg.need_].push_back(std::move(cg));
    ++stats.idle;
    return true;
  }

  void discarded() {
    std::lock_guard lock(mu);
    ++stats.discarded;
  }

  // Removes every idle cgroup; later releases remove theirs.
  void close() {
    std::array<std::vector<sandbox_cgroup>, 1u << cgroup_controller_count> gone;
    {
      std::lock_guard lock(mu);
      open = false;
      gone.swap(idle);
      stats.idle = 0;
    }
    for (auto& v : gone)
      for (auto& cg : v)
        (void) cg.remove_dirs();
  }
};

// --- cgroup_root --------------------------------------------------------------

expected<cgroup_root> cgroup_root::detect() {
  std::string self, mountinfo, controllers;
  if (int err = read_small(std::string("/proc/self/cgroup"), self))
    return sys_error("cannot read", "/proc/self/cgroup", err);
  if (int err = read_small(std::string("/proc/self/mountinfo"), mountinfo))
    return sys_error("cannot read", "/proc/self/mountinfo", err);
  DSEC_TRY(layout, cgroup_layout::parse(self, mountinfo, {}));
  if (!layout.v2_dir.empty() &&
      read_small(layout.v2_dir + "/cgroup.controllers", controllers) == 0) {
    DSEC_TRY(full, cgroup_layout::parse(self, mountinfo, controllers));
    return open(full);
  }
  return open(layout);
}

expected<cgroup_root> cgroup_root::open(const cgroup_layout& layout) {
  cgroup_root r;
  r.pid_ = ::getpid();
  DSEC_TRY(owner, self_owner());
  r.owner_ = std::move(owner);

  std::array<cgroup_version, cgroup_controller_count> chosen{};
  for (size_t c = 0; c < cgroup_controller_count; ++c) {
    chosen[c] = layout.preferred(static_cast<cgroup_controller>(c));
    if (chosen[c] == cgroup_version::absent)
      r.why_absent_[c] = std::string("neither cgroup v2 nor a v1 hierarchy offers the ") +
                         controller_names[c] + " controller to this process";
  }

  std::lock_guard lock(registry_mutex());

  // Prepares one hierarchy; on failure returns why and leaves nothing behind
  // that this process does not otherwise use.
  auto prepare = [&](hierarchy& h) -> std::optional<std::string> {
    auto dsec_dir = h.own + "/dsec";
    h.owner_dir = dsec_dir + '/' + r.owner_;
    auto undo = [&] {
      if (registry().count(h.owner_dir) == 0) {
        ::rmdir(h.owner_dir.c_str());
        ::rmdir(dsec_dir.c_str());
      }
    };
    int err = 0;
    std::string where;
    // Another dsec may remove an empty <own>/dsec between our mkdirs (its root
    // going away): ENOENT then means "start over".
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (h.version == cgroup_version::v2) {
        if ((err = enable_subtree(h.own, h.controllers))) {
          if (err == EBUSY)
            return "cgroup v2 cannot enable " + mask_names(h.controllers) + " below " + h.own +
                   " because that cgroup holds processes of its own (the kernel's "
                   "no-internal-process rule): dsec needs a delegated cgroup whose own "
                   "processes live in a leaf child, e.g. start dsecd with "
                   "`systemd-run --scope -p Delegate=yes` and move it into a child "
                   "cgroup of the scope";
          return "cgroup v2 cannot enable " + mask_names(h.controllers) + " in " + h.own +
                 "/cgroup.subtree_control: " + std::strerror(err);
        }
      }
      where = dsec_dir;
      if ((err = make_dir(dsec_dir)))
        continue;
      if (h.version == cgroup_version::v2 && (err = enable_subtree(dsec_dir, h.controllers)))
        continue;
      where = h.owner_dir;
      if ((err = make_dir(h.owner_dir)))
        continue;
      if (h.version == cgroup_version::v2 &&
          (err = enable_subtree(h.owner_dir, h.controllers)))
        continue;
      h.owner_fd.reset(::open(h.owner_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!h.owner_fd) {
        err = errno;
        continue;
      }
      break;
    }
    if (err) {
      undo();
      return "cannot prepare " + where + ": " + std::strerror(err);
    }
    if (h.controllers & bit(0)) {
      auto swap = h.version == cgroup_version::v2 ? "memory.swap.max"
                                                  : "memory.memsw.limit_in_bytes";
      h.swap_file = ::faccessat(h.owner_fd.get(), swap, F_OK, 0) == 0;
    }
    ++registry()[h.owner_dir];
    return std::nullopt;
  };

  uint8_t v2_mask = 0;
  for (size_t c = 0; c < cgroup_controller_count; ++c)
    if (chosen[c] == cgroup_version::v2)
      v2_mask |= bit(c);
  if (v2_mask) {
    hierarchy h;
    h.version = cgroup_version::v2;
    h.own = layout.v2_dir;
    h.controllers = v2_mask;
    if (auto why = prepare(h)) {
      for (size_t c = 0; c < cgroup_controller_count; ++c) {
        if (!(v2_mask & bit(c)))
          continue;
        if (!layout.v1_dirs[c].empty()) {
          chosen[c] = cgroup_version::v1;
        } else {
          chosen[c] = cgroup_version::absent;
          r.why_absent_[c] = *why;
        }
      }
    } else {
      for (size_t c = 0; c < cgroup_controller_count; ++c)
        if (v2_mask & bit(c))
          r.index_[c] = static_cast<int8_t>(r.hier_.size());
      r.hier_.push_back(std::move(h));
    }
  }

  // v1: one hierarchy per mount, which may carry several of our controllers.
  std::vector<hierarchy> groups;
  for (size_t c = 0; c < cgroup_controller_count; ++c) {
    if (chosen[c] != cgroup_version::v1)
      continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const hierarchy& g) { return g.own == layout.v1_dirs[c]; });
    if (it == groups.end()) {
      groups.emplace_back();
      it = groups.end() - 1;
      it->version = cgroup_version::v1;
      it->own = layout.v1_dirs[c];
    }
    it->controllers |= bit(c);
  }
  for (auto& g : groups) {
    if (auto why = prepare(g)) {
      for (size_t c = 0; c < cgroup_controller_count; ++c)
        if (g.controllers & bit(c))
          r.why_absent_[c] = *why;
      continue;
    }
    for (size_t c = 0; c < cgroup_controller_count; ++c)
      if (g.controllers & bit(c))
        r.index_[c] = static_cast<int8_t>(r.hier_.size());
    r.hier_.push_back(std::move(g));
  }
  return r;
}

cgroup_root::cgroup_root(cgroup_root&& other) noexcept
  : hier_(std::move(other.hier_)),
    index_(other.index_),
    why_absent_(std::move(other.why_absent_)),
    owner_(std::move(other.owner_)),
    pid_(other.pid_),
    pool_(std::move(other.pool_)) {
  other.hier_.clear();
  other.index_ = {-1, -1, -1};
}

cgroup_root& cgroup_root::operator=(cgroup_root&& other) noexcept {
  if (this != &other) {
    release();
    hier_ = std::move(other.hier_);
    index_ = other.index_;
    why_absent_ = std::move(other.why_absent_);
    owner_ = std::move(other.owner_);
    pid_ = other.pid_;
    pool_ = std::move(other.pool_);
    other.hier_.clear();
    other.index_ = {-1, -1, -1};
  }
  return *this;
}

cgroup_root::~cgroup_root() {
  release();
}

void cgroup_root::release() noexcept {
  if (hier_.empty() || pid_ != ::getpid())
    return;
  if (pool_) {
    pool_->close();
    pool_.reset();
  }
  std::lock_guard lock(registry_mutex());
  for (auto& h : hier_) {
    h.owner_fd.reset();
    auto it = registry().find(h.owner_dir);
    if (it != registry().end() && --it->second > 0)
      continue;
    if (it != registry().end())
      registry().erase(it);
    // Fails (and stays for collect_garbage) while sandbox cgroups remain; the
    // shared <own>/dsec stays while other dsec processes use it.
    ::rmdir(h.owner_dir.c_str());
    ::rmdir((h.own + "/dsec").c_str());
  }
  hier_.clear();
}

expected<sandbox_cgroup> cgroup_root::create(std::string_view name,
                                             const limits& lim) const {
  if (auto ok = lim.validate(); !ok)
    return std::move(ok).error_value();
  // One path component, short enough for the relative paths built below.
  if (name.empty() || name.size() > 200 || name == "." || name == ".." ||
      name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos)
    return make_error(errc::invalid_argument,
                      "invalid cgroup name '" + std::string(name) +
                        "': it must be 1 to 200 characters without '/'");

  uint8_t need = 0;
  if (lim.memory_bytes)
    need |= bit(0);
  if (lim.pids)
    need |= bit(1);
  if (lim.cpus)
    need |= bit(2);
  static constexpr std::array<const char*, cgroup_controller_count> options = {
    "--memory", "--pids", "--cpus"};
  for (size_t c = 0; c < cgroup_controller_count; ++c)
    if ((need & bit(c)) && index_[c] < 0)
      return make_error(errc::unsupported, std::string("the ") + options[c] +
                                             " limit needs the cgroup " + controller_names[c] +
                                             " controller, which is not available: " +
                                             why_absent_[c]);
  if (!pool_ || !need)
    return make(name, need, lim);

  while (auto hit = pool_->take(need)) {
    hit->pid_ = ::getpid();
    hit->pool_ = pool_;
    if (hit->write_limits(lim, false))
      return std::move(*hit);
    // A limit the kernel refuses on this one (e.g. memory below what it
    // holds): remove it and try the next, or make a fresh one.
    pool_->discarded();
    (void) hit->remove_dirs();
  }
  std::string fresh;
  {
    std::lock_guard lock(pool_->mu);
    fresh = "pool-" + std::to_string(pool_->next_name++);
  }
  DSEC_TRY(cg, make(fresh, need, lim));
  cg.pool_ = pool_;
  {
    std::lock_guard lock(pool_->mu);
    ++pool_->stats.made;
  }
  return cg;
}

expected<sandbox_cgroup> cgroup_root::make(std::string_view name, uint8_t need,
                                           const limits& lim) const {
  sandbox_cgroup out;
  out.pid_ = ::getpid();
  out.need_ = need;
  out.written_ = lim;
  out.parts_.reserve(3);

  // "<name>/<file>" relative to the owner dir fd: no walk of the long prefix.
  char rel[256];
  std::memcpy(rel, name.data(), name.size());
  rel[name.size()] = '/';
  std::string_view prefix(rel, name.size() + 1);

  for (auto& h : hier_) {
    uint8_t here = h.controllers & need;
    if (!here)
      continue;
    rel[name.size()] = '\0';
    if (::mkdirat(h.owner_fd.get(), rel, 0755) != 0) {
      int err = errno;
      auto path = h.owner_dir + '/' + std::string(name);
      if (err == EEXIST)
        return make_error(errc::already_exists, "cgroup " + path + " already exists");
      return sys_error("cannot create cgroup", path, err);
    }
    rel[name.size()] = '/';
    out.parts_.push_back({h.owner_dir + '/' + std::string(name), unique_fd{}, h.version,
                          (here & bit(0)) != 0, h.swap_file, here});
    DSEC_TRY_VOID(put_limits(h.owner_fd.get(), prefix, out.parts_.back().path, h.version,
                             h.swap_file, here, lim, nullptr));
    std::strcpy(rel + name.size() + 1, "cgroup.procs");
    out.parts_.back().procs.reset(::openat(h.owner_fd.get(), rel, O_WRONLY | O_CLOEXEC));
    if (!out.parts_.back().procs)
      return sys_error("cannot open", out.parts_.back().path + "/cgroup.procs");
  }
  return out;
}

void cgroup_root::enable_pool(size_t max_idle) {
  if (!pool_)
    pool_ = std::make_shared<cgroup_pool>();
  std::lock_guard lock(pool_->mu);
  pool_->max_idle = max_idle;
}

expected<void> cgroup_root::prewarm(const limits& lim, size_t n) const {
  if (!pool_ || !lim.any())
    return {};
  std::vector<sandbox_cgroup> made;
  {
    std::lock_guard lock(pool_->mu);
    n = std::min(n, pool_->max_idle > pool_->stats.idle ? pool_->max_idle - pool_->stats.idle : 0);
  }
  DSEC_TRY_VOID(lim.validate());
  uint8_t need = (lim.memory_bytes ? bit(0) : 0) | (lim.pids ? bit(1) : 0) | (lim.cpus ? bit(2) : 0);
  for (size_t c = 0; c < cgroup_controller_count; ++c)
    if ((need & bit(c)) && index_[c] < 0)
      return make_error(errc::unsupported, std::string("cannot prewarm cgroups: the ") +
                                             controller_names[c] + " controller is absent: " +
                                             why_absent_[c]);
  for (size_t i = 0; i < n; ++i) {
    std::string name;
    {
      std::lock_guard lock(pool_->mu);
      name = "pool-" + std::to_string(pool_->next_name++);
      ++pool_->stats.made;
    }
    DSEC_TRY(cg, make(name, need, lim));
    cg.pool_ = pool_;
    made.push_back(std::move(cg));
  }
  for (auto& cg : made) {
    cg.close_join_fds();
    DSEC_TRY_VOID(cg.destroy()); // into the pool: nothing ever ran in it
  }
  return {};
}

cgroup_pool_stats cgroup_root::pool_stats() const {
  if (!pool_)
    return {};
  std::lock_guard lock(pool_->mu);
  return pool_->stats;
}

expected<std::vector<std::string>> cgroup_root::collect_garbage() const {
  std::vector<std::string> removed;
  std::optional<error> first_err;
  // Paused sandboxes of a dead owner stay frozen (a frozen v1 task takes no
  // SIGKILL): thawed and killed first, or their cgroups below stay busy.
  collect_freezer_garbage(owner_, removed);
  for (auto& h : hier_) {
    auto dsec_dir = h.own + "/dsec";
    std::vector<std::string> dead;
    DIR* d = ::opendir(dsec_dir.c_str());
    if (!d)
      continue;
    while (auto* ent = ::readdir(d)) {
      if (ent->d_type != DT_DIR)
        continue;
      std::string_view n = ent->d_name;
      auto owner = parse_owner(n);
      if (!owner || n == owner_ || owner_alive(owner->first, owner->second))
        continue;
      dead.emplace_back(dsec_dir + '/' + ent->d_name);
    }
    ::closedir(d);
    for (auto& dir : dead)
      remove_tree(dir, h.version, 0, removed, first_err);
  }
  if (first_err)
    return std::move(*first_err);
  return removed;
}

std::string cgroup_root::describe() const {
  std::string s;
  for (size_t c = 0; c < cgroup_controller_count; ++c) {
    if (!s.empty())
      s += ", ";
    s += controller_names[c];
    s += ": ";
    if (index_[c] < 0) {
      s += "absent (";
      s += why_absent_[c];
      s += ')';
      continue;
    }
    auto& h = hier_[static_cast<size_t>(index_[c])];
    s += to_string(h.version);
    s += ' ';
    s += h.own;
    s += "/dsec";
  }
  return s;
}

cgroup_version cgroup_root::version(cgroup_controller c) const noexcept {
  auto i = index_[static_cast<size_t>(c)];
  return i < 0 ? cgroup_version::absent : hier_[static_cast<size_t>(i)].version;
}

std::string cgroup_root::owner_dir(cgroup_controller c) const {
  auto i = index_[static_cast<size_t>(c)];
  return i < 0 ? std::string{} : hier_[static_cast<size_t>(i)].owner_dir;
}

// --- sandbox_cgroup -----------------------------------------------------------

sandbox_cgroup& sandbox_cgroup::operator=(sandbox_cgroup&& other) noexcept {
  if (this != &other) {
    (void)destroy();
    parts_ = std::move(other.parts_);
    other.parts_.clear();
    pid_ = other.pid_;
    pool_ = std::move(other.pool_);
    need_ = other.need_;
    written_ = other.written_;
    oom_base_ = other.oom_base_;
  }
  return *this;
}

sandbox_cgroup::~sandbox_cgroup() {
  if (!parts_.empty() && pid_ == ::getpid())
    (void)destroy();
}

std::vector<int> sandbox_cgroup::join_fds() const {
  std::vector<int> fds;
  for (auto& p : parts_)
    if (p.procs)
      fds.push_back(p.procs.get());
  return fds;
}

void sandbox_cgroup::close_join_fds() noexcept {
  for (auto& p : parts_)
    p.procs.reset();
}

bool sandbox_cgroup::oom_killed() const {
  for (auto& p : parts_)
    if (p.memory)
      return oom_kills(p.path, p.version) > oom_base_;
  return false;
}

expected<void> sandbox_cgroup::write_limits(const limits& lim, bool fresh) {
  for (auto& p : parts_)
    DSEC_TRY_VOID(put_limits(AT_FDCWD, p.path + '/', p.path, p.version, p.swap_file,
                             p.controllers, lim, fresh ? nullptr : &written_));
  written_ = lim;
  return {};
}

std::vector<std::string> sandbox_cgroup::paths() const {
  std::vector<std::string> out;
  out.reserve(parts_.size());
  for (auto& p : parts_)
    out.push_back(p.path);
  return out;
}

expected<void> sandbox_cgroup::destroy() {
  close_join_fds();
  if (pool_ && pid_ == ::getpid() && !parts_.empty())
    return release_to_pool();
  return remove_dirs();
}

expected<void> sandbox_cgroup::release_to_pool() {
  auto deadline = std::chrono::steady_clock::now() + busy_wait;
  // Kept only once empty: the tasks of a just-killed pid namespace may still
  // be on their way out (as rmdir's EBUSY says for a cgroup that goes).
  for (auto& p : parts_) {
    auto pause = 100us;
    while (!read_procs(p.path).empty()) {
      if (std::chrono::steady_clock::now() >= deadline)
        return busy_error(p.path, EBUSY);
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, 20ms);
    }
  }
  bool keep = true;
  for (auto& p : parts_) {
    if (p.memory) {
      // Pages of the sandbox's writable layer still charged here (its tmpfs
      // outlives the sandbox while a descriptor holds it) would count against
      // the next sandbox's limit.
      auto shmem = shmem_bytes(p.path);
      keep = keep && shmem && *shmem == 0;
      oom_base_ = oom_kills(p.path, p.version);
    }
    if (keep) {
      p.procs.reset(::open((p.path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
      keep = static_cast<bool>(p.procs);
    }
  }
  auto pool = pool_;
  if (keep && pool->put(*this))
    return {};
  pool->discarded();
  close_join_fds();
  return remove_dirs();
}

expected<void> sandbox_cgroup::remove_dirs() {
  auto deadline = std::chrono::steady_clock::now() + busy_wait;
  std::optional<error> first_err;
  std::vector<part> kept;
  // Reverse creation order; a part that stays is kept so a later call retries.
  while (!parts_.empty()) {
    part p = std::move(parts_.back());
    parts_.pop_back();
    if (int err = remove_dir(p.path, deadline)) {
      if (!first_err)
        first_err = busy_error(p.path, err);
      kept.push_back(std::move(p));
    }
  }
  std::reverse(kept.begin(), kept.end());
  parts_ = std::move(kept);
  if (first_err)
    return std::move(*first_err);
  return {};
}

expected<std::string> process_owner_name() { return self_owner(); }

bool process_owner_alive(std::string_view name) {
  auto o = parse_owner(name);
  return o && owner_alive(o->first, o->second);
}

} // namespace dsec
