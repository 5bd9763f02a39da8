// dsec --connect HOST:PORT node stats: the daemon's counters and layer cache.
#include "tools/dsec/remote.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/units.hpp"

namespace dsec::cli::remote {

namespace {

const char* node_usage = R"(usage: dsec --connect HOST:PORT node stats

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

} // namespace

int node_main(context& ctx, args& a) {
  if (a.help()) {
    std::fputs(node_usage, stdout);
    return 0;
  }
  if (a.empty())
    return usage_error(ctx.verb("node"), "expected 'stats'");
  std::string sub{a.next()};
  if (sub != "stats")
    return usage_error(ctx.verb("node"), "unknown sub-verb '" + sub + "' (expected 'stats')");
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
  std::printf("clients refused %llu (before their first message)\n", u(s.refused_clients));
  std::printf("refused internal %llu (internal messages without the cluster's key, and "
              "CAF's own messages from a connection: docs/security.md)\n",
              u(s.refused_internal));
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
