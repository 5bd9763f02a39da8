// dsec --connect HOST:PORT pool set|ls: warm pools of ready sandboxes
// (actors/warm_pool.hpp); print_pools for `node stats`.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/container.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"
#include "tools/dsec/run_options.hpp"

namespace dsec::cli::remote {

namespace {

const char* pool_usage = R"(usage: dsec --connect HOST:PORT pool set [OPTIONS] --size N
       dsec --connect HOST:PORT pool ls

Warm pools: ready sandboxes of one environment (containers, or microVMs
already booted), made in the background, that no caller has touched. A create (`run`, a trainer's create) or a `call` of an
equal environment (same layers, limits, network and its rules, -v mounts:
every option but the TTL) claims one in one message, and the pool refills.
A create goes to a node that has one ready. Pooled sandboxes take slots of
their node, give them up to real creates first, and shrink under memory
pressure.

  pool set   keeps N ready sandboxes of the environment, spread over the
             daemon's nodes (N / nodes each; the first N % nodes one more);
             --size 0 removes the pool. These pools are the nodes' own: they
             live until removed or the node stops (a trainer's own pools,
             session::pool, end with its session). Prints how many the nodes
             took.
  pool ls    every node's pools: node, owner (a session id, or "node"),
             environment, target, ready, warming, claimed, refills, evicted

Options of pool set:
  --base NAME@VERSION, --workdir NAME@VERSION, --tool NAME@VERSION
  --net, --network MODE, --allow RULE, --deny RULE, --memory SIZE, --pids N,
  --cpus N, --disk SIZE, -v HOST:SANDBOX[:OPTS] (the node must allow it)
  --backend container|microvm
                           what the pool keeps (default container); a pool of
                           microVMs goes to the nodes that offer them, and a
                           `run --backend microvm` of its environment skips the boot
  --size N                 ready sandboxes to keep (required; 0 removes)
  -h, --help               this text
)";

std::string pool_layers(const environment& env) {
  std::string s = env.base;
  if (!env.workdir.empty())
    s += "+" + env.workdir;
  for (const auto& t : env.tools)
    s += "+" + t;
  if (env.net)
    s += " net";
  if (env.chronus)
    s += " chronus";
  if (env.backend == "microvm")
    s += " microvm";
  return s;
}

int pool_ls(context& ctx) {
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto pools = (*c)->pools();
  if (!pools)
    return fail(pools.error_value());
  std::printf("%-22s %-12s %-40s %6s %6s %7s %8s %8s %8s\n", "NODE", "OWNER", "ENVIRONMENT",
              "TARGET", "READY", "WARMING", "CLAIMED", "REFILLS", "EVICTED");
  for (const auto& p : *pools)
    std::printf("%-22s %-12s %-40s %6u %6u %7u %8llu %8llu %8llu\n", p.node.c_str(),
                p.owner.c_str(), pool_layers(p.env).c_str(), p.target, p.ready, p.warming,
                static_cast<unsigned long long>(p.claimed),
                static_cast<unsigned long long>(p.refills),
                static_cast<unsigned long long>(p.evicted));
  return 0;
}

} // namespace

void print_pools(const node_stats& s) {
  std::printf("warm pools      %zu, %u pooled sandboxes%s\n", s.pools.size(), s.pooled,
              s.memory_pressure ? " (shrunk: memory pressure)" : "");
  for (const auto& p : s.pools)
    std::printf("                %s (%s): target %u, ready %u, warming %u, claimed %llu, "
                "refills %llu, evicted %llu\n",
                pool_layers(p.env).c_str(), p.owner.c_str(), p.target, p.ready, p.warming,
                static_cast<unsigned long long>(p.claimed),
                static_cast<unsigned long long>(p.refills),
                static_cast<unsigned long long>(p.evicted));
}


int pool_main(context& ctx, args& a) {
  auto verb = ctx.verb("pool");
  if (a.empty())
    return usage_error(verb, "expected set or ls");
  if (a.help()) {
    std::fputs(pool_usage, stdout);
    return 0;
  }
  std::string what{a.next()};
  if (what == "ls") {
    if (!a.empty()) {
      if (a.help()) {
        std::fputs(pool_usage, stdout);
        return 0;
      }
      return usage_error(verb + " ls", "unexpected argument '" + std::string{a.peek()} + "'");
    }
    return pool_ls(ctx);
  }
  if (what != "set")
    return usage_error(verb, "unknown '" + what + "' (expected set or ls)");
  sandbox_options sb;
  std::optional<uint32_t> size;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(pool_usage, stdout);
      return 0;
    }
    auto p = parse_sandbox_option(a, verb, sb);
    if (p == parsed::bad)
      return 2;
    if (p == parsed::yes)
      continue;
    std::string v;
    auto got = a.option("--backend", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      if (v != "container" && v != "microvm")
        return usage_error(verb, "--backend: a pool keeps container or microvm sandboxes, not '"
                                   + v + "'");
      sb.env.backend = v;
      continue;
    }
    got = a.option("--size", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      char* end = nullptr;
      unsigned long n = std::strtoul(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n > 100000)
        return usage_error(verb, "--size: expected a number from 0 to 100000, got '" + v + "'");
      size = static_cast<uint32_t>(n);
      continue;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    return usage_error(verb, "unexpected argument '" + std::string{a.peek()} + "'");
  }
  if (!size)
    return usage_error(verb, "pool set needs --size N (0 removes the pool)");
  if (auto rc = check_daemon_sandbox_options(verb, sb))
    return *rc;
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto n = (*c)->pool(sb.env, *size);
  if (!n)
    return fail(n.error_value());
  std::printf("%u\n", *n);
  return 0;
}


} // namespace dsec::cli::remote
