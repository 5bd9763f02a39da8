// dsec --connect HOST:PORT call | pool: the function backend and warm pools
// (actors/warm_pool.hpp).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/container.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/run_options.hpp"

namespace dsec::cli::remote {

namespace {

const char* call_usage = R"(usage: dsec --connect HOST:PORT call [OPTIONS] -- CMD [ARGS...]

The function backend: runs CMD in a fresh sandbox of the daemon, taken from a
warm pool of that environment when one has a ready sandbox (else made for the
call), prints CMD's stdout and stderr once it ended, and exits with its
status. The sandbox is destroyed after the call, never reused; a call sees
nothing another call left. The call lives in a session of its own.

Layers (in the daemon's store):
  --base NAME@VERSION      the base image (required)
  --workdir NAME@VERSION   a working-directory layer
  --tool NAME@VERSION      a tool layer; repeat for several (the last on top)

Limits and command (as `run`; see `run --help`):
  --net, --memory SIZE, --pids N, --cpus N, --disk SIZE
  -i, --stdin, --env KEY=VALUE, --cwd DIR, --user UID[:GID], --timeout DUR
  -h, --help               this text

A pool's sandboxes match a call with the same layers, limits and --net: set
one with `dsec --connect HOST:PORT pool set` or dsecd --pool.

Exit status: CMD's exit_code: its own status, 128+N if a signal N killed it;
124 on timeout; 126 if CMD cannot be executed, 127 if it is not found; 125 if
dsec or the daemon failed (the message says why); 2 on a usage error.
)";

const char* pool_usage = R"(usage: dsec --connect HOST:PORT pool set [OPTIONS] --size N
       dsec --connect HOST:PORT pool ls

Warm pools: ready sandboxes of one environment, made in the background, that
no caller has touched. A create (`run`, a trainer's create) or a `call` of an
equal environment (same layers, limits, --net) claims one in one message, and
the pool refills. Pooled sandboxes take slots of their node, give them up to
real creates first, and shrink under memory pressure.

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
  --net, --memory SIZE, --pids N, --cpus N, --disk SIZE
  --size N                 ready sandboxes to keep (required; 0 removes)
  -h, --help               this text
)";

environment environment_of(const sandbox_spec& sb) {
  environment env;
  env.base = sb.base->to_string();
  if (sb.workdir)
    env.workdir = sb.workdir->to_string();
  for (const auto& t : sb.tools)
    env.tools.push_back(t.to_string());
  env.memory = sb.lim.memory_bytes.value_or(0);
  env.pids = sb.lim.pids.value_or(0);
  env.cpus = sb.lim.cpus.value_or(0);
  env.disk = sb.disk_bytes;
  env.net = sb.net;
  return env;
}

std::string layers_of(const environment& env) {
  std::string s = env.base;
  if (!env.workdir.empty())
    s += "+" + env.workdir;
  for (const auto& t : env.tools)
    s += "+" + t;
  if (env.net)
    s += " net";
  if (env.chronus)
    s += " chronus";
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
                p.owner.c_str(), layers_of(p.env).c_str(), p.target, p.ready, p.warming,
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
                layers_of(p.env).c_str(), p.owner.c_str(), p.target, p.ready, p.warming,
                static_cast<unsigned long long>(p.claimed),
                static_cast<unsigned long long>(p.refills),
                static_cast<unsigned long long>(p.evicted));
}

int call_main(context& ctx, args& a) {
  auto verb = ctx.verb("call");
  constexpr int dsec_failed = 125;
  sandbox_spec sb;
  command_spec cs;
  bool input = false;
  std::vector<std::string> argv;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(call_usage, stdout);
      return 0;
    }
    if (a.peek() == "--") {
      a.rest(argv);
      break;
    }
    if (a.flag("-i") || a.flag("--stdin")) {
      input = true;
      continue;
    }
    auto p = parse_sandbox_option(a, verb, sb);
    if (p == parsed::bad)
      return 2;
    if (p == parsed::yes)
      continue;
    p = parse_command_option(a, verb, cs);
    if (p == parsed::bad)
      return 2;
    if (p == parsed::yes)
      continue;
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    return usage_error(verb, "unexpected argument '" + std::string{a.peek()}
                               + "' (put the command after --)");
  }
  if (argv.empty())
    return usage_error(verb, "no command given (call [OPTIONS] -- CMD [ARGS...])");
  if (auto rc = check_sandbox_spec(verb, sb))
    return *rc;
  if (sb.no_memory || sb.no_pids)
    return usage_error(verb, std::string{sb.no_memory ? "--memory" : "--pids"}
                               + " none is for a local `dsec run`");
  auto env = environment_of(sb);
  env.backend = "function";
  exec_request req;
  req.argv = std::move(argv);
  req.env = cs.env;
  req.cwd = cs.cwd;
  if (cs.uid)
    req.uid = static_cast<int32_t>(*cs.uid);
  if (cs.gid)
    req.gid = static_cast<int32_t>(*cs.gid);
  if (cs.timeout)
    req.timeout_ms = static_cast<uint64_t>(cs.timeout->count());
  if (input) {
    auto in = read_all(0);
    if (!in)
      return fail(in.error_value(), dsec_failed);
    req.input = std::move(*in);
  }
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value(), dsec_failed);
  auto s = (*c)->open_session({.quota = 1, .name = "call"});
  if (!s)
    return fail(s.error_value(), dsec_failed);
  auto r = (*s)->call(env, req);
  if (!r) {
    fail(r.error_value());
    int st = exec_failure_status(r.error_value());
    return st != 0 ? st : dsec_failed;
  }
  (void) write_all(1, r->out);
  (void) write_all(2, r->err);
  if (r->timed_out) {
    std::fprintf(stderr, "dsec: timed out; the command was killed\n");
    return 124;
  }
  exit_status st{r->exit_code, r->signal};
  if (st.signal != 0)
    std::fprintf(stderr, "dsec: the command was %s%s\n", st.to_string().c_str(),
                 r->oom_killed ? " (out of memory: the --memory limit was reached)" : "");
  return st.shell_code();
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
  sandbox_spec sb;
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
    auto got = a.option("--size", v);
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
  if (auto rc = check_sandbox_spec(verb, sb))
    return *rc;
  if (sb.no_memory || sb.no_pids)
    return usage_error(verb, std::string{sb.no_memory ? "--memory" : "--pids"}
                               + " none is for a local `dsec run`");
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto n = (*c)->pool(environment_of(sb), *size);
  if (!n)
    return fail(n.error_value());
  std::printf("%u\n", *n);
  return 0;
}

} // namespace dsec::cli::remote
