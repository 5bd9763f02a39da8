#include "runtime/usage.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <ctime>
#include <map>

#include "runtime/fd.hpp"
#include "runtime/io.hpp"

namespace dsec {

namespace {

bool to_u64(std::string_view s, uint64_t& out) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
    s.remove_suffix(1);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size();
}

// A cgroup file's number; "max" (v2) and v1's "no limit" (near 2^63) are 0.
bool cgroup_number(const std::string& dir, const char* file, uint64_t& out) {
  auto text = read_file(AT_FDCWD, dir + "/" + file);
  if (!text)
    return false;
  if (text->rfind("max", 0) == 0) {
    out = 0;
    return true;
  }
  if (!to_u64(*text, out))
    return false;
  if (out >= (uint64_t{1} << 62))
    out = 0;
  return true;
}

// The words of `s`, split at spaces, tabs and newlines.
std::vector<std::string_view> split_fields(std::string_view s) {
  std::vector<std::string_view> out;
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n'; };
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && blank(s[i]))
      ++i;
    size_t j = i;
    while (j < s.size() && !blank(s[j]))
      ++j;
    if (j > i)
      out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// The value of a "Key:\tv1\tv2..." line of /proc/PID/status: its last field
// (NSpid: the pid in the innermost namespace) or its first (Uid: the real uid).
bool status_field(std::string_view status, std::string_view key, bool last, int64_t& out) {
  size_t at = 0;
  while (at < status.size()) {
    size_t end = status.find('\n', at);
    if (end == std::string_view::npos)
      end = status.size();
    auto line = status.substr(at, end - at);
    at = end + 1;
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':')
      continue;
    auto fields = split_fields(line.substr(key.size() + 1));
    if (fields.empty())
      return false;
    auto f = last ? fields.back() : fields.front();
    auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), out);
    return ec == std::errc{} && p == f.data() + f.size();
  }
  return false;
}

// "inside outside count" lines of a uid_map: the inside uid of a host uid
// (overflow uid 65534 when unmapped, as the kernel shows it).
uint32_t map_uid(std::string_view map, uint64_t host) {
  size_t at = 0;
  while (at < map.size()) {
    size_t end = map.find('\n', at);
    if (end == std::string_view::npos)
      end = map.size();
    std::string line{map.substr(at, end - at)};
    at = end + 1;
    unsigned long long in = 0, out = 0, n = 0;
    if (std::sscanf(line.c_str(), "%llu %llu %llu", &in, &out, &n) == 3 && host >= out &&
        host < out + n)
      return static_cast<uint32_t>(in + (host - out));
  }
  return 65534;
}

// The tgids in a cgroup's cgroup.procs; false when it cannot be read.
bool cgroup_pids(const std::string& dir, std::vector<pid_t>& out) {
  auto text = read_file(AT_FDCWD, dir + "/cgroup.procs");
  if (!text)
    return false;
  size_t at = 0;
  while (at < text->size()) {
    size_t end = text->find('\n', at);
    if (end == std::string::npos)
      end = text->size();
    uint64_t v = 0;
    if (to_u64(std::string_view{*text}.substr(at, end - at), v) && v > 0)
      out.push_back(static_cast<pid_t>(v));
    at = end + 1;
  }
  return true;
}

// Every process whose pid namespace is init's (a sandbox without a cgroup).
std::vector<pid_t> pidns_pids(pid_t init) {
  std::vector<pid_t> out;
  struct stat ns {};
  if (::stat(("/proc/" + std::to_string(init) + "/ns/pid").c_str(), &ns) < 0)
    return out;
  unique_fd proc{::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  DIR* d = proc ? ::fdopendir(::dup(proc.get())) : nullptr;
  if (!d)
    return out;
  while (auto* e = ::readdir(d)) {
    uint64_t v = 0;
    if (!to_u64(e->d_name, v) || v == 0)
      continue;
    struct stat st {};
    if (::fstatat(proc.get(), (std::string{e->d_name} + "/ns/pid").c_str(), &st, 0) == 0 &&
        st.st_ino == ns.st_ino && st.st_dev == ns.st_dev)
      out.push_back(static_cast<pid_t>(v));
  }
  ::closedir(d);
  return out;
}

uint64_t ticks_to_ms(uint64_t ticks) {
  static const long hz = ::sysconf(_SC_CLK_TCK) > 0 ? ::sysconf(_SC_CLK_TCK) : 100;
  return ticks * 1000 / static_cast<uint64_t>(hz);
}

} // namespace

bool parse_proc_stat(std::string_view line, proc_stat& p) {
  // "PID (COMM) S PPID ...": COMM may hold anything but ends at the last ')'.
  auto open = line.find('(');
  auto close = line.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open)
    return false;
  p.comm = std::string{line.substr(open + 1, close - open - 1)};
  auto f = split_fields(line.substr(close + 1)); // f[0] is field 3 (state)
  if (f.size() < 22) // up to field 24 (rss)
    return false;
  auto num = [&](size_t field, uint64_t& out) { return to_u64(f[field - 3], out); };
  p.state = std::string{f[0]};
  uint64_t ppid = 0;
  bool ok = num(4, ppid) && num(14, p.utime) && num(15, p.stime) && num(20, p.threads) &&
            num(22, p.start) && num(24, p.rss_pages);
  // cutime, cstime are signed in the kernel's format (never negative in practice)
  ok = ok && num(16, p.cutime) && num(17, p.cstime);
  p.ppid = static_cast<int64_t>(ppid);
  return ok;
}

expected<std::vector<sandbox_process>> read_sandbox_processes(
  pid_t init, const std::vector<std::string>& cgroup_paths, resource_usage* usage) {
  const std::string init_dir = "/proc/" + std::to_string(init);
  auto uid_map = read_file(AT_FDCWD, init_dir + "/uid_map");
  if (!uid_map)
    return make_error(errc::not_found, "the sandbox's init (pid " + std::to_string(init) +
                                         ") is gone");
  std::vector<pid_t> pids;
  bool listed = false;
  for (const auto& dir : cgroup_paths)
    if (cgroup_pids(dir, pids)) {
      listed = true;
      break;
    }
  if (!listed)
    pids = pidns_pids(init);
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());

  timespec boot{};
  ::clock_gettime(CLOCK_BOOTTIME, &boot);
  const uint64_t now_ms = static_cast<uint64_t>(boot.tv_sec) * 1000 + boot.tv_nsec / 1000000;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

  struct row {
    sandbox_process p;
    int64_t host_ppid = 0;
  };
  std::vector<row> rows;
  std::map<int64_t, int32_t> inner; // host pid -> the sandbox's
  uint64_t cpu_ticks = 0, rss = 0, threads = 0;
  for (pid_t host : pids) {
    const std::string dir = "/proc/" + std::to_string(host);
    auto stat = read_file(AT_FDCWD, dir + "/stat");
    auto status = read_file(AT_FDCWD, dir + "/status");
    if (!stat || !status)
      continue; // it ended while we looked
    proc_stat ps;
    int64_t nspid = 0, uid = 0;
    if (!parse_proc_stat(*stat, ps) || !status_field(*status, "NSpid", true, nspid) ||
        !status_field(*status, "Uid", false, uid))
      continue;
    row r;
    r.p.pid = static_cast<int32_t>(nspid);
    r.host_ppid = ps.ppid;
    r.p.uid = map_uid(*uid_map, static_cast<uint64_t>(uid));
    r.p.state = ps.state;
    r.p.threads = static_cast<uint32_t>(ps.threads);
    r.p.rss_bytes = ps.rss_pages * page;
    r.p.cpu_ms = ticks_to_ms(ps.utime + ps.stime);
    auto started = ticks_to_ms(ps.start);
    r.p.age_ms = now_ms > started ? now_ms - started : 0;
    // what it and its reaped children used: the ended ones' time is in their
    // reapers' cutime/cstime, up to init
    cpu_ticks += ps.utime + ps.stime + ps.cutime + ps.cstime;
    rss += r.p.rss_bytes;
    threads += ps.threads;
    if (auto cmd = read_file(AT_FDCWD, dir + "/cmdline"); cmd && !cmd->empty()) {
      auto& c = *cmd;
      if (c.size() > 4096)
        c.resize(4096);
      while (!c.empty() && c.back() == '\0')
        c.pop_back();
      std::replace(c.begin(), c.end(), '\0', ' ');
      r.p.command = std::move(c);
    }
    if (r.p.command.empty())
      r.p.command = "[" + ps.comm + "]";
    inner[host] = r.p.pid;
    rows.push_back(std::move(r));
  }
  std::vector<sandbox_process> out;
  out.reserve(rows.size());
  for (auto& r : rows) {
    auto it = inner.find(r.host_ppid);
    r.p.ppid = it == inner.end() ? 0 : it->second;
    out.push_back(std::move(r.p));
  }
  std::sort(out.begin(), out.end(),
            [](const sandbox_process& a, const sandbox_process& b) { return a.pid < b.pid; });
  if (!usage)
    return out;

  auto& u = *usage;
  u = resource_usage{};
  u.processes = out.size();
  u.cpu_ms = ticks_to_ms(cpu_ticks);
  u.memory_bytes = rss;
  u.tasks = threads;
  for (const auto& dir : cgroup_paths) {
    uint64_t v = 0;
    if (cgroup_number(dir, "memory.current", v) || cgroup_number(dir, "memory.usage_in_bytes", v)) {
      u.memory_bytes = v;
      u.memory_from_cgroup = true;
      if (cgroup_number(dir, "memory.max", v) || cgroup_number(dir, "memory.limit_in_bytes", v))
        u.memory_limit = v;
    }
    if (cgroup_number(dir, "pids.current", v)) {
      u.tasks = v;
      if (cgroup_number(dir, "pids.max", v))
        u.tasks_limit = v;
    }
  }
  // overlayfs answers statfs with its upper layer's file system: the
  // sandbox's writable tmpfs
  struct statfs fs {};
  if (::statfs((init_dir + "/root/").c_str(), &fs) == 0) {
    auto bsize = static_cast<uint64_t>(fs.f_bsize);
    u.disk_limit = static_cast<uint64_t>(fs.f_blocks) * bsize;
    u.disk_bytes = static_cast<uint64_t>(fs.f_blocks - fs.f_bfree) * bsize;
    u.inodes_limit = fs.f_files;
    u.inodes = fs.f_files - fs.f_ffree;
  }
  return out;
}

} // namespace dsec
