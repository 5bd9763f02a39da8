// dsec --connect HOST:PORT top ID: the processes of a sandbox, as its node
// reads them from the host's side (runtime/usage.hpp), with the pids and
// uids the sandbox sees.
#include <cstdio>
#include <string>

#include "runtime/json.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

namespace dsec::cli::remote {

namespace {

const char* top_usage = R"(usage: dsec --connect HOST:PORT top ID [--json]

Lists the processes of sandbox ID (or its name), by pid, as the sandbox sees
them: PID and PPID in its pid namespace (its init is 1, whose parent is
outside: 0), UID in its user namespace, STATE (R running, S sleeping, D in
the kernel, Z a zombie, T stopped), THREADS, RSS (resident memory), CPU (the
CPU time it used), AGE (since it started) and COMMAND (its arguments, at most
4 KiB; [name] when it has none). The node reads them from /proc on the
host's side; a process that ends meanwhile is left out.

Options:
  --json       a JSON array of objects: pid, ppid, uid, state, threads,
               rss_bytes, cpu_ms, age_ms, command
  -h, --help   this text

Without --connect, `dsec top HOST:PORT...` is the daemons' metrics view
(dsec-top).

Exit status: 0; 1 when the sandbox was not found, the daemon reported an
error or cannot be reached; 2 on a usage error.
)";

} // namespace

int top_main(context& ctx, args& a) {
  auto verb = ctx.verb("top");
  std::string id;
  bool json = false;
  if (int rc = take_one_sandbox(a, verb, top_usage, "top", {{}, {{"--json", &json}}}, id); rc >= 0)
    return rc;
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto r = resolve_sandbox(**c, id);
  if (!r)
    return fail_for(id, r.error_value());
  auto u = (*c)->usage(*r, true);
  if (!u)
    return fail_for(*r, u.error_value());
  if (json) {
    std::string o = "[";
    for (size_t k = 0; k < u->processes.size(); ++k) {
      const auto& p = u->processes[k];
      o += std::string{k ? ",\n " : "\n "} + "{\"pid\": " + std::to_string(p.pid) +
           ", \"ppid\": " + std::to_string(p.ppid) + ", \"uid\": " + std::to_string(p.uid) +
           ", \"state\": ";
      json_string(o, p.state);
      o += ", \"threads\": " + std::to_string(p.threads) +
           ", \"rss_bytes\": " + std::to_string(p.rss_bytes) +
           ", \"cpu_ms\": " + std::to_string(p.cpu_ms) + ", \"age_ms\": " +
           std::to_string(p.age_ms) + ", \"command\": ";
      json_string(o, p.command);
      o += "}";
    }
    o += u->processes.empty() ? "]\n" : "\n]\n";
    std::fputs(o.c_str(), stdout);
    return 0;
  }
  std::printf("%7s %7s %6s %-5s %7s %10s %9s %9s  %s\n", "PID", "PPID", "UID", "STATE",
              "THREADS", "RSS", "CPU", "AGE", "COMMAND");
  for (const auto& p : u->processes) {
    char cpu[32];
    std::snprintf(cpu, sizeof cpu, "%.2fs", static_cast<double>(p.cpu_ms) / 1000);
    std::printf("%7d %7d %6u %-5s %7u %10s %9s %9s  %s\n", p.pid, p.ppid, p.uid, p.state.c_str(),
                p.threads, format_size(p.rss_bytes).c_str(), cpu, age(p.age_ms).c_str(),
                p.command.c_str());
  }
  return 0;
}

} // namespace dsec::cli::remote
