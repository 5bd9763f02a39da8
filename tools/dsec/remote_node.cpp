// dsec --connect HOST:PORT node stats|cordon|uncordon|drain: the daemon's counters, and
// operating a node (docs/cluster.md).
#include "tools/dsec/remote.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/units.hpp"

namespace dsec::cli::remote {

namespace {

const char* node_usage = R"(usage: dsec --connect HOST:PORT node stats
       dsec --connect HOST:PORT node cordon|uncordon NODE
       dsec --connect HOST:PORT node drain NODE [--timeout DUR]

cordon    NODE admits no new sandbox (the coordinator places nothing there, the
          node refuses with `overloaded`); its own sandboxes go on. Prints how
          many it has. `cluster status` shows it cordoned.
uncordon  takes NODE back.
drain     cordons NODE and waits until its last sandbox is gone (ended by its
          session, its TTL or `rm`), then prints how many it had. With
          --timeout (e.g. 10m; default: no limit) it gives up after DUR, says
          how many are left and exits 1; NODE stays cordoned.
NODE is a node's name as `cluster status` shows it (HOST:PORT); a daemon that
is not a coordinator takes its own name only.

stats:

Prints the daemon's node: its name, slots (the admission limit, after
oversubscription), sandboxes live and being created, how many were created,
failed and destroyed since it started, open sessions, the layers its cache has
mounted and their size against the cache's budget, how many layers it evicted,
the limits a sandbox that asks for none gets (dsecd --default-memory,
--default-pids, --default-disk), how many sandbox cgroups came from its pool
and how many were made, and what its start-up garbage collection removed (left
by a dsec that crashed).

Options:
  -h, --help   this text
)";

// node cordon|uncordon|drain NODE [--timeout DUR]
int operate_main(context& ctx, args& a, const std::string& sub) {
  auto verb = ctx.verb("node " + sub);
  std::string node;
  std::chrono::milliseconds timeout{0};
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(node_usage, stdout);
      return 0;
    }
    std::string v;
    auto got = a.option("--timeout", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      if (sub != "drain")
        return usage_error(verb, "--timeout is for drain");
      auto d = parse_duration(v, "--timeout");
      if (!d)
        return usage_error(verb, d.error_value().message);
      if (d->count() <= 0)
        return usage_error(verb, "--timeout: must be positive");
      timeout = *d;
      continue;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    if (!node.empty())
      return usage_error(verb, "unexpected argument '" + std::string{a.peek()} + "'");
    node = std::string{a.next()};
  }
  if (node.empty())
    return usage_error(verb, "expected a NODE (HOST:PORT, as `cluster status` names it)");
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  if (sub == "drain") {
    auto n = (*c)->drain(node, timeout);
    if (!n)
      return fail(n.error_value());
    std::printf("drained %s: %u sandbox%s ended; it stays cordoned (node uncordon %s)\n",
                node.c_str(), *n, *n == 1 ? "" : "es", node.c_str());
    return 0;
  }
  auto n = (*c)->cordon(node, sub == "cordon");
  if (!n)
    return fail(n.error_value());
  std::printf("%s %s (%u sandbox%s live)\n", sub == "cordon" ? "cordoned" : "uncordoned",
              node.c_str(), *n, *n == 1 ? "" : "es");
  return 0;
}

} // namespace

int node_main(context& ctx, args& a) {
  if (a.help()) {
    std::fputs(node_usage, stdout);
    return 0;
  }
  if (a.empty())
    return usage_error(ctx.verb("node"), "expected 'stats', 'cordon', 'uncordon' or 'drain'");
  std::string sub{a.next()};
  if (sub == "cordon" || sub == "uncordon" || sub == "drain")
    return operate_main(ctx, a, sub);
  if (sub != "stats")
    return usage_error(ctx.verb("node"), "unknown sub-verb '" + sub
                                           + "' (expected 'stats', 'cordon', 'uncordon' or "
                                             "'drain')");
  auto verb = ctx.verb("node stats");
  if (a.help()) {
    std::fputs(node_usage, stdout);
    return 0;
  }
  if (!a.empty())
    return usage_error(verb, "unexpected argument '" + std::string{a.peek()} + "'");
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto st = (*c)->stats();
  if (!st)
    return fail(st.error_value());
  const auto& s = *st;
  auto u = [](uint64_t x) { return static_cast<unsigned long long>(x); };
  std::printf("node            %s\n", s.node.c_str());
  std::printf("slots           %u\n", s.slots);
  std::printf("live            %u\n", s.live);
  std::printf("creating        %u\n", s.creating);
  std::printf("created         %llu\n", u(s.created));
  std::printf("failed          %llu\n", u(s.failed));
  std::printf("destroyed       %llu\n", u(s.destroyed));
  std::printf("sessions        %u\n", s.sessions);
  std::string offers;
  for (const auto& b : s.backends)
    offers += (offers.empty() ? "" : ", ") + b.name + " (" + std::to_string(b.slots) + " slots, "
              + std::to_string(b.live) + " live)";
  std::printf("backends        %s\n", offers.empty() ? "none" : offers.c_str());
  if (s.memory_capacity)
    std::printf("memory          %s of %s admitted (what its sandboxes ask for)\n",
                format_size(s.memory_admitted).c_str(), format_size(s.memory_capacity).c_str());
  else
    std::printf("memory          no bound (--node-memory none: admitted by slots only)\n");
  if (s.cordoned)
    std::printf("cordoned        yes: it admits no new sandbox (dsec node uncordon)\n");
  std::printf("layers mounted  %u (%s; cache budget %s)\n", s.layers_mounted,
              format_size(s.layer_bytes).c_str(),
              s.cache_budget ? format_size(s.cache_budget).c_str() : "none");
  std::printf("evicted         %llu\n", u(s.evicted));
  std::printf("defaults        memory %s, pids %s, disk %s (a sandbox that asks for none)\n",
              s.default_memory ? format_size(s.default_memory).c_str() : "none",
              s.default_pids ? std::to_string(s.default_pids).c_str() : "none",
              s.default_disk ? format_size(s.default_disk).c_str() : "half of RAM");
  std::printf("cgroups         %llu from the pool, %llu made\n", u(s.cgroups_reused),
              u(s.cgroups_made));
  std::printf("chronus         %u sandboxes, %llu events, %llu answers\n", s.chronus_sandboxes,
              u(s.chronus_events), u(s.chronus_answered));
  std::printf("chronus refused %llu too large, %llu malformed, %llu bad token, %llu invalid, "
              "%llu flooding, %llu connections\n",
              u(s.chronus_too_large), u(s.chronus_malformed), u(s.chronus_unauthenticated),
              u(s.chronus_invalid), u(s.chronus_flooding), u(s.chronus_refused_connections));
  std::printf("egress          %u sandboxes, %llu packets allowed, %llu denied\n",
              s.egress_sandboxes, u(s.egress_allowed), u(s.egress_denied));
  for (const auto& t : s.egress_by_sandbox)
    std::printf("  sandbox %s  sent %s, received %s, %llu connections, %llu packets denied\n",
                t.sandbox.c_str(), format_size(t.sent_bytes).c_str(),
                format_size(t.received_bytes).c_str(), u(t.connections), u(t.denied));
  std::printf("exposed ports   %u now, %llu connections forwarded, %llu refused, "
              "%llu closed idle\n",
              s.exposed_ports, u(s.exposed_connections), u(s.exposed_refused),
              u(s.exposed_idle_closed));
  std::printf("clients refused %llu (before their first message)\n", u(s.refused_clients));
  std::printf("refused internal %llu (internal messages without the cluster's key, and "
              "CAF's own messages from a connection: docs/security.md)\n",
              u(s.refused_internal));
  print_pools(s);
  if (s.gc.empty()) {
    std::printf("start-up gc     nothing to remove\n");
  } else {
    std::printf("start-up gc     removed %zu:\n", s.gc.size());
    for (const auto& g : s.gc)
      std::printf("                %s\n", g.c_str());
  }
  return 0;
}

} // namespace dsec::cli::remote
