// dsec --connect HOST:PORT stats ID...: what sandboxes use now (memory, CPU
// time, tasks, their writable layer, egress traffic), as their nodes read it
// from the host's side (runtime/usage.hpp); --interval repeats it with the
// CPU share between two samples.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "runtime/json.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

namespace dsec::cli::remote {

namespace {

const char* stats_usage = R"(usage: dsec --connect HOST:PORT stats ID... [--json] [--interval DUR [--count N]]

Prints what each sandbox ID (or name) uses now, read by its node from the
host's side, never from inside the sandbox:
  MEMORY     charged to its memory cgroup (its processes, page cache and the
             files in its writable layer, which is memory) / its limit
  CPU        CPU time its processes used since it began (the live ones and
             every one that ended); with --interval, CPU % is the share of
             one CPU it used between two samples (200% is two CPUs)
  TASKS      processes and threads alive / its pids limit; PROCS: processes
  DISK       bytes used in its writable layer / the layer's size (--disk)
  FILES      files in its writable layer / how many it may hold
  NET        egress sandboxes: bytes sent / received through the node
             (- for a sandbox without egress)
A limit of - means none is set.

Options:
  --json          one JSON object per sandbox per sample, a line each:
                  id, node, uptime_ms, memory_bytes, memory_limit, cpu_ms,
                  tasks, tasks_limit, processes, disk_bytes, disk_limit,
                  inodes, inodes_limit, and for egress sandboxes sent_bytes,
                  received_bytes, connections, denied (packets); with
                  --interval, cpu_percent from the second sample on
  --interval DUR  sample again every DUR (100ms to 1h) until interrupted
  --count N       with --interval: stop after N samples
  -h, --help      this text

`dsec --connect HOST:PORT top ID` lists a sandbox's processes. (Without
--connect, `dsec top HOST:PORT...` is the daemons' metrics view.)

Exit status: 0; 1 when a sandbox was not found (named on stderr; the others
are printed), the daemon reported an error or cannot be reached; 2 on a usage
error.
)";

std::string of_limit(uint64_t used, uint64_t limit, bool bytes) {
  auto f = [&](uint64_t v) { return bytes ? format_size(v) : std::to_string(v); };
  return f(used) + " / " + (limit ? f(limit) : std::string{"-"});
}

std::string cpu_time(uint64_t ms) {
  char buf[32];
  if (ms < 60000)
    std::snprintf(buf, sizeof buf, "%.2fs", static_cast<double>(ms) / 1000);
  else
    return age(ms);
  return buf;
}

std::string json_of(const sandbox_usage& s, double cpu_percent) {
  const auto& u = s.usage;
  std::string o = "{\"id\": ";
  json_string(o, s.id);
  o += ", \"node\": ";
  json_string(o, s.node);
  o += ", \"uptime_ms\": " + std::to_string(s.uptime_ms) +
       ", \"memory_bytes\": " + std::to_string(u.memory_bytes) +
       ", \"memory_limit\": " + std::to_string(u.memory_limit) +
       ", \"cpu_ms\": " + std::to_string(u.cpu_ms) + ", \"tasks\": " + std::to_string(u.tasks) +
       ", \"tasks_limit\": " + std::to_string(u.tasks_limit) +
       ", \"processes\": " + std::to_string(u.processes) +
       ", \"disk_bytes\": " + std::to_string(u.disk_bytes) +
       ", \"disk_limit\": " + std::to_string(u.disk_limit) +
       ", \"inodes\": " + std::to_string(u.inodes) +
       ", \"inodes_limit\": " + std::to_string(u.inodes_limit);
  if (s.egress)
    o += ", \"sent_bytes\": " + std::to_string(s.traffic.sent_bytes) +
         ", \"received_bytes\": " + std::to_string(s.traffic.received_bytes) +
         ", \"connections\": " + std::to_string(s.traffic.connections) +
         ", \"denied\": " + std::to_string(s.traffic.denied);
  if (cpu_percent >= 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", cpu_percent);
    o += std::string{", \"cpu_percent\": "} + buf;
  }
  return o + "}";
}

} // namespace

int stats_main(context& ctx, args& a) {
  auto verb = ctx.verb("stats");
  std::vector<std::string> ids;
  std::string interval_text, count_text;
  bool json = false;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(stats_usage, stdout);
      return 0;
    }
    if (a.flag("--json")) {
      json = true;
      continue;
    }
    bool taken = false;
    for (auto [name, into] : {std::pair{"--interval", &interval_text}, {"--count", &count_text}}) {
      auto got = a.option(name, *into);
      if (!got)
        return usage_error(verb, got.error_value().message);
      if ((taken = *got))
        break;
    }
    if (taken)
      continue;
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    ids.emplace_back(a.next());
  }
  if (ids.empty())
    return usage_error(verb, "no sandbox id given (dsec --connect HOST:PORT stats ID...)");
  std::chrono::milliseconds interval{0};
  if (!interval_text.empty()) {
    auto d = parse_duration(interval_text, "--interval");
    if (!d)
      return usage_error(verb, d.error_value().message);
    if (*d < std::chrono::milliseconds{100} || *d > std::chrono::hours{1})
      return usage_error(verb, "--interval: between 100ms and 1h, got '" + interval_text + "'");
    interval = *d;
  }
  uint64_t count = 1;
  if (!count_text.empty()) {
    if (interval.count() == 0)
      return usage_error(verb, "--count needs --interval");
    if (!parse_uint(count_text, UINT32_MAX, count) || count == 0)
      return usage_error(verb, "--count: expected a number of samples, got '" + count_text + "'");
  } else if (interval.count() > 0) {
    count = 0; // until interrupted
  }
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  int rc = 0;
  std::vector<std::string> resolved; // ids that name a sandbox, in the order given
  for (const auto& id : ids) {
    auto r = resolve_sandbox(**c, id);
    if (!r) {
      rc = fail_for(id, r.error_value());
      continue;
    }
    resolved.push_back(*r);
  }
  int id_width = 2;
  for (const auto& id : resolved)
    id_width = std::max(id_width, static_cast<int>(id.size()));
  struct last_t {
    uint64_t cpu_ms = 0;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, last_t> last;
  for (uint64_t n = 0; count == 0 || n < count; ++n) {
    if (n > 0)
      std::this_thread::sleep_for(interval);
    if (!json) {
      if (interval.count() > 0 && n > 0)
        std::printf("\n");
      std::printf("%-*s %9s", id_width, "ID", "CPU");
      if (interval.count() > 0)
        std::printf(" %7s", "CPU %");
      std::printf("  %-21s %-11s %5s  %-21s %-15s %s\n", "MEMORY", "TASKS", "PROCS", "DISK",
                  "FILES", "NET (SENT / RECEIVED)");
    }
    size_t shown = 0;
    for (const auto& id : resolved) {
      auto r = (*c)->usage(id);
      auto now = std::chrono::steady_clock::now();
      if (!r) {
        rc = fail_for(id, r.error_value());
        continue;
      }
      ++shown;
      double pct = -1;
      if (auto it = last.find(id); it != last.end()) {
        auto dt = std::chrono::duration<double, std::milli>(now - it->second.at).count();
        if (dt > 0)
          pct = 100.0 * static_cast<double>(r->usage.cpu_ms - std::min(r->usage.cpu_ms,
                                                                        it->second.cpu_ms)) / dt;
      }
      last[id] = {r->usage.cpu_ms, now};
      if (json) {
        std::printf("%s\n", json_of(*r, pct).c_str());
        continue;
      }
      const auto& u = r->usage;
      std::string net = r->egress ? format_size(r->traffic.sent_bytes) + " / " +
                                      format_size(r->traffic.received_bytes)
                                  : "-";
      std::printf("%-*s %9s", id_width, r->id.c_str(), cpu_time(u.cpu_ms).c_str());
      if (interval.count() > 0) {
        char p[16] = "-";
        if (pct >= 0)
          std::snprintf(p, sizeof p, "%.1f%%", pct);
        std::printf(" %7s", p);
      }
      std::printf("  %-21s %-11s %5llu  %-21s %-15s %s\n",
                  of_limit(u.memory_bytes, u.memory_limit, true).c_str(),
                  of_limit(u.tasks, u.tasks_limit, false).c_str(),
                  static_cast<unsigned long long>(u.processes),
                  of_limit(u.disk_bytes, u.disk_limit, true).c_str(),
                  of_limit(u.inodes, u.inodes_limit, false).c_str(), net.c_str());
    }
    std::fflush(stdout);
    if (shown == 0)
      break; // nothing left to sample
  }
  return rc;
}

} // namespace dsec::cli::remote
