// dsec --connect HOST:PORT cluster status: a coordinator's nodes, as a table or
// as JSON.
#include "tools/dsec/remote.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

#include "tools/dsec/remote_common.hpp"

namespace dsec::cli::remote {

namespace {

const char* cluster_usage = R"(usage: dsec --connect HOST:PORT cluster status [--json]

Asks a coordinator (dsecd --coordinator) for its cluster, one node per line:
  NODE      its name (the address it listens on); '*' marks the coordinator's
            own node
  STATE     up, or lost (for a while after; the reason follows the table)
  BEAT      since its last heartbeat
  SLOTS     its admission limit (after oversubscription)
  LIVE      sandboxes there now, and being created
  FREE      slots left, counting what was placed since the heartbeat
  LAYERS    layers in its store (fetched from peers so far)
  CREATED   sandboxes created there since it started
Then the warm pools (`pool set`, dsecd --pool), one per line: the node it is
on, its owner (a session id, or "node"), its environment, ready sandboxes of
its size, and the creates it served.
With --json: one JSON object with a "nodes" array of the same fields and the
names of each node's layers, and a "pools" array.

Options:
  --json       JSON instead of the table
  -h, --help   this text
)";

} // namespace

int cluster_main(context& ctx, args& a) {
  if (a.help()) {
    std::fputs(cluster_usage, stdout);
    return 0;
  }
  if (a.empty())
    return usage_error(ctx.verb("cluster"), "expected 'status'");
  std::string sub{a.next()};
  if (sub != "status")
    return usage_error(ctx.verb("cluster"), "unknown sub-verb '" + sub + "' (expected 'status')");
  auto verb = ctx.verb("cluster status");
  bool json = false;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(cluster_usage, stdout);
      return 0;
    }
    if (a.flag("--json")) {
      json = true;
      continue;
    }
    return usage_error(verb, "unexpected argument '" + std::string{a.peek()} + "'");
  }
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto nodes = (*c)->cluster();
  if (!nodes)
    return fail(nodes.error_value());
  // Warm pools, per node: a create that a pool can serve prefers those.
  auto pools = (*c)->pools();
  if (!pools)
    return fail(pools.error_value());
  auto u = [](uint64_t x) { return static_cast<unsigned long long>(x); };
  auto free_of = [](const member_info& m) {
    uint64_t used = uint64_t{m.last.live} + m.placed;
    return used >= m.last.slots ? 0u : static_cast<unsigned>(m.last.slots - used);
  };
  if (json) {
    std::string out = "{\"nodes\":[";
    bool first = true;
    for (const auto& m : *nodes) {
      if (!first)
        out += ',';
      first = false;
      out += "{\"name\":";
      json_string(out, m.name);
      out += ",\"state\":";
      json_string(out, m.state);
      if (!m.why.empty()) {
        out += ",\"why\":";
        json_string(out, m.why);
      }
      out += ",\"coordinator\":";
      out += m.coordinator ? "true" : "false";
      out += ",\"since_beat_ms\":" + std::to_string(m.since_beat_ms);
      out += ",\"slots\":" + std::to_string(m.last.slots);
      out += ",\"live\":" + std::to_string(m.last.live);
      out += ",\"creating\":" + std::to_string(m.last.creating);
      out += ",\"free\":" + std::to_string(free_of(m));
      out += ",\"created\":" + std::to_string(m.last.created);
      out += ",\"failed\":" + std::to_string(m.last.failed);
      out += ",\"destroyed\":" + std::to_string(m.last.destroyed);
      out += ",\"fetched_layers\":" + std::to_string(m.last.fetched_layers);
      out += ",\"fetched_bytes\":" + std::to_string(m.last.fetched_bytes);
      out += ",\"backends\":[";
      for (size_t i = 0; i < m.last.backends.size(); ++i) {
        if (i)
          out += ',';
        json_string(out, m.last.backends[i].name);
      }
      out += "]";
      out += ",\"layers\":[";
      for (size_t i = 0; i < m.last.layers.size(); ++i) {
        if (i)
          out += ',';
        json_string(out, m.last.layers[i]);
      }
      out += "]}";
    }
    out += "],\"pools\":[";
    for (size_t i = 0; i < pools->size(); ++i) {
      const auto& p = (*pools)[i];
      if (i)
        out += ',';
      out += "{\"node\":";
      json_string(out, p.node);
      out += ",\"owner\":";
      json_string(out, p.owner);
      out += ",\"environment\":" + p.env.to_json();
      out += ",\"target\":" + std::to_string(p.target) + ",\"ready\":" + std::to_string(p.ready)
             + ",\"warming\":" + std::to_string(p.warming)
             + ",\"claimed\":" + std::to_string(p.claimed) + "}";
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
    return 0;
  }
  size_t up = 0;
  std::printf("%-24s %-6s %8s %7s %11s %7s %10s %9s\n", "NODE", "STATE", "BEAT", "SLOTS",
              "LIVE", "FREE", "LAYERS", "CREATED");
  for (const auto& m : *nodes) {
    bool is_up = m.state == "up";
    up += is_up;
    auto name = (m.coordinator ? "*" : " ") + m.name;
    auto beat = is_up ? std::to_string(m.since_beat_ms) + "ms" : std::string{"-"};
    auto live = std::to_string(m.last.live) + "/" + std::to_string(m.last.creating);
    auto layers = std::to_string(m.last.layers.size()) + " (" + std::to_string(m.last.fetched_layers) + ")";
    std::printf("%-24s %-6s %8s %7u %11s %7u %10s %9llu\n", name.c_str(), m.state.c_str(),
                beat.c_str(), m.last.slots, live.c_str(), is_up ? free_of(m) : 0u, layers.c_str(),
                u(m.last.created));
  }
  for (const auto& m : *nodes)
    if (m.state != "up")
      std::printf("%s was lost: %s\n", m.name.c_str(), m.why.c_str());
  std::printf("%zu node%s up\n", up, up == 1 ? "" : "s");
  if (!pools->empty()) {
    std::printf("\n%-24s %-10s %-40s %11s %9s\n", "POOL ON", "OWNER", "ENVIRONMENT",
                "READY/SIZE", "CLAIMED");
    for (const auto& p : *pools) {
      auto ready = std::to_string(p.ready) + "/" + std::to_string(p.target);
      std::printf("%-24s %-10s %-40s %11s %9llu\n", p.node.c_str(), p.owner.c_str(),
                  layers_of(p.env).c_str(), ready.c_str(), u(p.claimed));
    }
  }
  return 0;
}

} // namespace dsec::cli::remote
