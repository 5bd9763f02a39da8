#include "runtime/defaults.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "runtime/io.hpp"
#include "runtime/units.hpp"

namespace dsec {

namespace {

// A whole procfs or cgroupfs file; empty if it cannot be read.
std::string slurp(const std::string& path) {
  auto text = read_file(AT_FDCWD, path);
  return text ? std::move(*text) : std::string{};
}

std::optional<uint64_t> number_in(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  uint64_t v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc{} || r.ptr == s.data())
    return std::nullopt;
  return v;
}

// Our own memory cgroup's limit, if it has one.
std::optional<uint64_t> own_memory_limit() {
  auto layout = cgroup_layout::parse(slurp("/proc/self/cgroup"), slurp("/proc/self/mountinfo"),
                                     {});
  if (!layout)
    return std::nullopt;
  auto mem = static_cast<size_t>(cgroup_controller::memory);
  std::optional<uint64_t> best;
  auto take = [&](std::optional<uint64_t> v) {
    if (v && (!best || *v < *best))
      best = v;
  };
  if (!layout->v1_dirs[mem].empty())
    take(number_in(slurp(layout->v1_dirs[mem] + "/memory.limit_in_bytes")));
  if (!layout->v2_dir.empty())
    take(number_in(slurp(layout->v2_dir + "/memory.max"))); // "max" parses as nothing
  return best;
}

constexpr uint64_t mib = 1ull << 20;

} // namespace

machine_resources machine_resources::probe() {
  machine_resources m;
  auto meminfo = slurp("/proc/meminfo");
  if (auto p = meminfo.find("MemTotal:"); p != std::string::npos)
    if (auto kb = number_in(std::string_view(meminfo).substr(p + 9)))
      m.memory_bytes = *kb * 1024;
  if (auto lim = own_memory_limit(); lim && *lim < m.memory_bytes)
    m.memory_bytes = *lim;
  m.pid_max = number_in(slurp("/proc/sys/kernel/pid_max")).value_or(32768);
  if (auto t = number_in(slurp("/proc/sys/kernel/threads-max")); t && *t < m.pid_max)
    m.pid_max = *t;
  return m;
}

limits sandbox_defaults::as_limits() const {
  limits l;
  l.memory_bytes = memory_bytes;
  l.pids = pids;
  return l;
}

void sandbox_defaults::apply(limits& lim) const {
  if (!lim.memory_bytes)
    lim.memory_bytes = memory_bytes;
  if (!lim.pids)
    lim.pids = pids;
}

void sandbox_defaults::apply(environment& env) const {
  if (env.memory == 0)
    env.memory = memory_bytes.value_or(0);
  if (env.pids == 0)
    env.pids = pids.value_or(0);
  if (env.disk == 0)
    env.disk = disk_bytes;
}

std::string sandbox_defaults::describe() const {
  return "memory " + (memory_bytes ? format_size(*memory_bytes) : std::string{"none"})
         + ", pids " + (pids ? std::to_string(*pids) : std::string{"none"}) + ", disk "
         + (disk_bytes ? format_size(disk_bytes) : std::string{"half of RAM"});
}

sandbox_defaults derive_defaults(const machine_resources& m, uint32_t slots,
                                 double oversubscribe) {
  double admitted_d = std::ceil(std::max<uint32_t>(slots, 1) * std::max(oversubscribe, 0.01));
  uint64_t admitted = std::max<uint64_t>(1, static_cast<uint64_t>(admitted_d));
  sandbox_defaults d;
  uint64_t ram = std::max<uint64_t>(m.memory_bytes, 64 * mib);
  uint64_t mem = ram / admitted;
  mem = std::max<uint64_t>(mem, 256 * mib);
  mem = std::min<uint64_t>(mem, ram / 2);
  mem = std::max<uint64_t>(mem / mib * mib, 4 * mib); // whole MiB, and what validate() takes
  d.memory_bytes = mem;
  uint64_t pid_max = std::max<uint64_t>(m.pid_max, 64);
  uint64_t pids = pid_max * 3 / 4 / admitted;
  pids = std::max<uint64_t>(pids, 512);
  pids = std::min<uint64_t>(pids, pid_max / 2);
  d.pids = std::min<uint64_t>(pids, 4194304);
  d.disk_bytes = std::max<uint64_t>(mem / 2 / mib * mib, mib);
  return d;
}

} // namespace dsec
