// dsec-client: `dsec --connect HOST:PORT VERB ...`. The static dsec execs this
// program with its own argv when it sees --connect; it can be run directly too.
// This file: the global options, the connection, ps, rm, session and node.
#include "tools/dsec/remote.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "runtime/units.hpp"

namespace dsec::cli::remote {

namespace {

const char* usage = R"(usage: dsec --connect HOST:PORT VERB [ARGS...]

Talks to the dsec daemon (dsecd) listening on HOST:PORT. Its sandboxes live in
the daemon, in sessions: `run` without --detach uses a session of its own, closed
when the command ends; detached sandboxes go to the daemon's "default" session
(or to one opened with `session open`) and live until `rm`, their TTL, or the
end of their session.

Verbs:
  ps [--session ID]                 list the sandboxes
  run [OPTIONS] -- CMD [ARGS...]    run CMD in a fresh sandbox; --detach leaves it
                                    running and prints its id
  exec [OPTIONS] ID -- CMD [ARGS...]
                                    run CMD in sandbox ID
  cp SRC DST                        copy into or out of a sandbox (ID:/PATH)
  rm ID...                          destroy sandboxes
  session open [OPTIONS]            open a session nobody owns; prints its id
  session resume ID                 reopen a session from its trajectory log
  session close ID                  close a session and destroy its sandboxes
  session watch ID                  print a session's Chronus events (JSON lines)
  feedback SANDBOX REQ [OPTIONS]    answer a Chronus feedback request
  node stats                        the daemon's counters and its layer cache
  cluster status [--json]           the cluster's nodes (a coordinator)
  call [OPTIONS] -- CMD [ARGS...]   the function backend: CMD in a fresh sandbox
                                    (from a warm pool), destroyed after
  pool set|ls                       warm pools of ready sandboxes

Global options:
  --connect HOST:PORT   the daemon (dsecd --listen); required
  --tls DIR             speak TLS with the CA, certificate and key in DIR
                        (ca.pem, cert.pem, key.pem; tools/tls-certs makes them),
                        as a dsecd started with --tls requires; default $DSEC_TLS
  --state DIR           accepted and ignored: the daemon has its own state
  -h, --help            this text; 'dsec --connect HOST:PORT VERB --help'
                        describes a verb
  --version             print the version

Layers are built on the daemon's machine, in its state directory:
'dsec --state DIR layer build ...' (no --connect).

Exit status: 0 on success; 1 when the daemon reported an error or cannot be
reached; 2 on a usage error. `run` and `exec` pass the command's status through
(see their --help).
)";

const char* ps_usage = R"(usage: dsec --connect HOST:PORT ps [--session ID]

Lists the daemon's sandboxes, oldest first:
  ID           the sandbox id (for exec, cp, rm)
  SESSION      the session it belongs to ("default": detached by `run --detach`)
  STATE        creating, ready, running (a command runs), destroying;
               "no answer" (--session): its node did not answer in time
  ENVIRONMENT  its layers: base/workdir/tool,tool... ("-": no workdir)
  AGE          since it became ready
  TTL LEFT     until it is destroyed by its TTL ("-": none)
  RUNNING      commands running in it now
  NODE         the node it lives on (a cluster's; docs/cluster.md)

Through a coordinator, each node gets 3 s to answer: a node that does not
(hung, or cut off and not yet lost) is named on stderr after the rows of the
others ("node HOST:PORT did not answer within 3 s: its sandboxes are not
listed"), and ps exits 1. With --session, its sandboxes there are rows of
state "no answer" and ps exits 1 too.

Options:
  --session ID   only the sandboxes of session ID
  -h, --help     this text

Exit status: 0 when every node answered; 1 when the daemon reported an error,
cannot be reached, or a node did not answer (the rows printed are those of
the nodes that did); 2 on a usage error.
)";

const char* rm_usage = R"(usage: dsec --connect HOST:PORT rm ID...

Destroys each sandbox (its processes are killed, its writable layer is gone)
and prints `removed ID`. An unknown id is reported and makes the exit status 1,
but the other sandboxes are still removed.

Options:
  -h, --help     this text
)";

const char* session_usage = R"(usage: dsec --connect HOST:PORT session open [--quota N] [--ttl DUR] [--name NAME]
                                                [--trajectory]
       dsec --connect HOST:PORT session resume ID
       dsec --connect HOST:PORT session close ID
       dsec --connect HOST:PORT session watch ID [--count N] [--for DUR]

open   Opens a session that nobody owns: it lives until `session close` (or
       until the daemon stops), and prints its id. Use it with
       `run --detach --session ID` and `ps --session ID`.
         --quota N    most sandboxes alive at once in it (default 1024)
         --ttl DUR    the default lifetime of its sandboxes (default 1h), e.g.
                      30s, 10m, 2h; `run --ttl` overrides it for one sandbox
         --name NAME  a name for it (default: its id)
         --trajectory keep a trajectory log: every create, command and put
                      with its result, durably, so that `session resume`
                      can answer them again after the daemon restarts
                      (docs/trajectory.md)
resume Reopens session ID from its trajectory log after the daemon (or the
       session's trainer) died. Its sandboxes keep their ids; each answers the
       commands it already ran, given again in order, with their logged
       results, and is rebuilt from its last pack (re-running the commands
       marked --idempotent after it) when a command differs or goes past the
       log. Prints its sandboxes and their state ("replaying": not rebuilt yet).
close  Destroys every sandbox of session ID, ends the session, deletes its
       trajectory log, and prints how many sandboxes went with it. A session
       that is not live but left a log (its trainer or daemon died) is
       closed too: its log is deleted. The daemon's "default" session cannot
       be closed.
watch  Prints the Chronus events of session ID as JSON lines (see
       `session watch --help`).

Options:
  -h, --help   this text
)";

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
With --json: one JSON object with a "nodes" array of the same fields and the
names of each node's layers.

Options:
  --json       JSON instead of the table
  -h, --help   this text
)";

bool parse_host_port(const std::string& v, std::string& host, uint16_t& port) {
  auto colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= v.size()
      || v.size() - colon - 1 > 5)
    return false;
  unsigned n = 0;
  for (char c : v.substr(colon + 1)) {
    if (c < '0' || c > '9')
      return false;
    n = n * 10 + static_cast<unsigned>(c - '0');
  }
  if (n == 0 || n > 65535)
    return false;
  host = v.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  port = static_cast<uint16_t>(n);
  return true;
}

// "42s", "3m07s", "2h05m", "3d04h".
std::string age(uint64_t ms) {
  uint64_t s = ms / 1000;
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%llus", static_cast<unsigned long long>(s));
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%llum%02llus", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  else if (s < 86400)
    std::snprintf(buf, sizeof buf, "%lluh%02llum", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s % 3600 / 60));
  else
    std::snprintf(buf, sizeof buf, "%llud%02lluh", static_cast<unsigned long long>(s / 86400),
                  static_cast<unsigned long long>(s % 86400 / 3600));
  return buf;
}

std::string layers_of(const environment& env) {
  std::string s = env.base;
  if (!env.workdir.empty() || !env.tools.empty())
    s += "/" + (env.workdir.empty() ? std::string{"-"} : env.workdir);
  for (size_t i = 0; i < env.tools.size(); ++i)
    s += (i == 0 ? "/" : ",") + env.tools[i];
  return s;
}

uint64_t unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count());
}

} // namespace

// ---- the connection -------------------------------------------------------------

context::context(std::string host, uint16_t port, tls_options tls)
  : host_(std::move(host)), port_(port), tls_(std::move(tls)) {
  where_ = (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":"
           + std::to_string(port_);
}

context::~context() {
  client_.reset(); // before the actor system it lives in
  sys_.reset();
}

expected<client*> context::connect() {
  if (client_)
    return client_.get();
  if (!sys_) {
    cfg_ = std::make_unique<caf::actor_system_config>();
    if (auto ok = client::configure(*cfg_, tls_); !ok) {
      auto e = std::move(ok).error_value();
      e.message = "--tls " + tls_.dir + ": " + e.message;
      cfg_.reset();
      return e;
    }
    cfg_->set("scheduler.policy", caf::atom("sharing"));
    cfg_->set("scheduler.max-threads", size_t{2});
    cfg_->set("logger.console", caf::atom("none"));
    sys_ = std::make_unique<caf::actor_system>(*cfg_);
  }
  auto c = client::connect(*sys_, host_, port_);
  if (!c)
    return std::move(c).error_value();
  client_ = std::move(*c);
  return client_.get();
}

// ---- helpers ----------------------------------------------------------------------

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    auto n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

expected<std::string> read_all(int fd) {
  std::string out;
  char buf[64 * 1024];
  for (;;) {
    auto n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return sys_error("reading stdin");
    if (n == 0)
      return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

int exec_failure_status(const error& e) {
  // The daemon's message is the runtime's: "step 'execve' failed: cannot
  // execute 'x' in the sandbox: ..." (the step itself does not cross the wire).
  const std::string& m = e.message;
  if (m.rfind("step 'execve' failed", 0) == 0)
    return e.code == errc::not_found ? 127 : 126;
  if (m.rfind("step 'chdir' failed", 0) == 0 || m.rfind("step 'setuid' failed", 0) == 0)
    return 126;
  return 0;
}

// ---- ps ---------------------------------------------------------------------------

int ps_main(context& ctx, args& a) {
  auto verb = ctx.verb("ps");
  std::string session_id;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(ps_usage, stdout);
      return 0;
    }
    auto got = a.option("--session", session_id);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      if (session_id.empty())
        return usage_error(verb, "--session needs a session id");
      continue;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    return usage_error(verb, "unexpected argument '" + std::string{a.peek()} + "'");
  }
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  expected<std::vector<sandbox_info>> infos = std::vector<sandbox_info>{};
  // The nodes that did not answer in time (a hung node of a cluster): the
  // others' rows are printed, then a line for each of them.
  std::vector<std::string> silent;
  size_t silent_boxes = 0;
  if (session_id.empty()) {
    auto all = (*c)->list_all();
    if (!all)
      return fail(all.error_value());
    infos = std::move(all->sandboxes);
    silent = std::move(all->missing);
  } else {
    auto s = (*c)->find_session(session_id);
    if (!s)
      return fail(s.error_value());
    infos = (*s)->list();
    if (infos) {
      std::set<std::string> nodes;
      for (const auto& i : *infos)
        if (i.state == "no answer") {
          ++silent_boxes;
          nodes.insert(i.node.empty() ? std::string{"(unknown)"} : i.node);
        }
      silent.assign(nodes.begin(), nodes.end());
    }
  }
  if (!infos)
    return fail(infos.error_value());
  auto tell_silent = [&] {
    if (silent_boxes > 0)
      std::fprintf(stderr,
                   "dsec: ps: %zu sandbox%s did not answer within 3 s (their node%s: ", silent_boxes,
                   silent_boxes == 1 ? "" : "es", silent.size() == 1 ? "" : "s");
    for (size_t k = 0; silent_boxes > 0 && k < silent.size(); ++k)
      std::fprintf(stderr, "%s%s", k ? ", " : "", silent[k].c_str());
    if (silent_boxes > 0)
      std::fputs("; hung, or cut off and not yet lost)\n", stderr);
    else
      for (const auto& n : silent)
        std::fprintf(stderr,
                     "dsec: ps: node %s did not answer within 3 s (hung, or cut off and not yet "
                     "lost): its sandboxes are not listed\n",
                     n.c_str());
    return silent.empty() && silent_boxes == 0 ? 0 : 1;
  };
  if (infos->empty()) {
    std::puts("no sandboxes");
    return tell_silent();
  }
  auto& v = *infos;
  // Oldest first; those still being created (no time yet) last.
  std::sort(v.begin(), v.end(), [](const sandbox_info& x, const sandbox_info& y) {
    auto kx = x.created_ms ? x.created_ms : UINT64_MAX;
    auto ky = y.created_ms ? y.created_ms : UINT64_MAX;
    return kx != ky ? kx < ky : x.id < y.id;
  });
  auto now = unix_ms();
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"ID", "SESSION", "STATE", "ENVIRONMENT", "AGE", "TTL LEFT", "RUNNING", "NODE"});
  for (const auto& i : v)
    rows.push_back({i.id, i.session, i.state, layers_of(i.env),
                    i.created_ms ? age(now > i.created_ms ? now - i.created_ms : 0) : "-",
                    i.env.ttl_ms && i.created_ms ? age(i.ttl_left_ms) : "-",
                    std::to_string(i.running), i.node.empty() ? "-" : i.node});
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& r : rows)
    for (size_t k = 0; k < r.size(); ++k)
      width[k] = std::max(width[k], r[k].size());
  for (const auto& r : rows) {
    std::string line;
    for (size_t k = 0; k < r.size(); ++k) {
      line += r[k];
      if (k + 1 < r.size())
        line.append(width[k] - r[k].size() + 2, ' ');
    }
    std::puts(line.c_str());
  }
  std::fflush(stdout);
  return tell_silent();
}

// ---- rm ---------------------------------------------------------------------------

int rm_main(context& ctx, args& a) {
  auto verb = ctx.verb("rm");
  std::vector<std::string> ids;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(rm_usage, stdout);
      return 0;
    }
    if (a.peek() == "--") {
      a.rest(ids);
      break;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    ids.emplace_back(a.next());
  }
  if (ids.empty())
    return usage_error(verb, "no sandbox id given (dsec --connect HOST:PORT rm ID...)");
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  int rc = 0;
  for (const auto& id : ids) {
    auto r = (*c)->destroy(id);
    if (!r) {
      rc = fail(r.error_value());
      continue;
    }
    std::printf("removed %s\n", id.c_str());
    std::fflush(stdout);
  }
  return rc;
}

// ---- session ----------------------------------------------------------------------

// The one session id of `session resume|close ID`: -1 when it was read into
// `id`, else the exit status (0 after --help, 2 after a usage error).
int one_session_id(args& a, const std::string& verb, std::string& id) {
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(session_usage, stdout);
      return 0;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    if (!id.empty())
      return usage_error(verb, "one session id at a time, got '" + std::string{a.peek()}
                                 + "' too");
    id = a.next();
  }
  if (id.empty())
    return usage_error(verb, "no session id given");
  return -1;
}

int session_main(context& ctx, args& a) {
  if (a.help()) {
    std::fputs(session_usage, stdout);
    return 0;
  }
  if (a.empty())
    return usage_error(ctx.verb("session"), "expected 'open', 'resume', 'close' or 'watch'");
  std::string sub{a.next()};
  auto verb = ctx.verb("session " + sub);
  if (sub == "open") {
    session_options opts;
    while (!a.empty()) {
      if (a.help()) {
        std::fputs(session_usage, stdout);
        return 0;
      }
      std::string v;
      auto opt = [&](const char* name) -> int {
        auto got = a.option(name, v);
        if (!got)
          return -1;
        return *got ? 1 : 0;
      };
      int got;
      if ((got = opt("--quota")) != 0) {
        if (got < 0)
          return usage_error(verb, "option --quota needs a value");
        char* end = nullptr;
        long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 1 || n > 1'000'000)
          return usage_error(verb, "--quota: expected a whole number from 1 to 1000000, got '"
                                     + v + "'");
        opts.quota = static_cast<uint32_t>(n);
      } else if ((got = opt("--ttl")) != 0) {
        if (got < 0)
          return usage_error(verb, "option --ttl needs a value");
        auto d = parse_duration(v, "--ttl");
        if (!d)
          return usage_error(verb, d.error_value().message);
        if (d->count() <= 0)
          return usage_error(verb, "--ttl: must be positive");
        opts.default_ttl_ms = static_cast<uint64_t>(d->count());
      } else if (a.flag("--trajectory")) {
        opts.trajectory = true;
      } else if ((got = opt("--name")) != 0) {
        if (got < 0)
          return usage_error(verb, "option --name needs a value");
        if (v.empty() || v.size() > 64)
          return usage_error(verb, "--name: expected 1 to 64 characters");
        opts.name = v;
      } else if (a.at_option()) {
        return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
      } else {
        return usage_error(verb, "unexpected argument '" + std::string{a.peek()} + "'");
      }
    }
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value());
    auto s = (*c)->open_session(opts, false);
    if (!s)
      return fail(s.error_value());
    std::printf("%s\n", (*s)->id().c_str());
    return 0;
  }
  if (sub == "watch")
    return watch_main(ctx, a);
  if (sub == "resume") {
    std::string id;
    if (int rc = one_session_id(a, verb, id); rc >= 0)
      return rc;
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value());
    auto s = (*c)->resume_session(id, false);
    if (!s)
      return fail(s.error_value());
    auto boxes = (*s)->list();
    if (!boxes)
      return fail(boxes.error_value());
    std::printf("resumed session %s: %zu sandbox%s\n", id.c_str(), boxes->size(),
                boxes->size() == 1 ? "" : "es");
    for (const auto& b : *boxes)
      std::printf("%s  %s  %s\n", b.id.c_str(), b.state.c_str(), layers_of(b.env).c_str());
    return 0;
  }
  if (sub == "close") {
    std::string id;
    if (int rc = one_session_id(a, verb, id); rc >= 0)
      return rc;
    if (id == "default")
      return fail(make_error(errc::invalid_argument,
                             "the daemon's default session cannot be closed (remove its "
                             "sandboxes with rm)"));
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value());
    auto s = (*c)->find_session(id);
    bool from_log = false;
    if (!s && s.error_value().code == errc::not_found) {
      // Not live: maybe a trajectory log waits for a resume. Resuming builds
      // nothing until it is used, and closing deletes the log.
      auto r = (*c)->resume_session(id, false);
      if (!r && r.error_value().code != errc::not_found)
        return fail(r.error_value());
      if (r) {
        s = std::move(r);
        from_log = true;
      }
    }
    if (!s)
      return fail(s.error_value());
    auto n = (*s)->close();
    if (!n)
      return fail(n.error_value());
    std::printf("closed session %s: %u sandbox%s destroyed%s\n", id.c_str(), *n,
                *n == 1 ? "" : "es", from_log ? ", its trajectory log deleted" : "");
    return 0;
  }
  return usage_error(ctx.verb("session"), "unknown sub-verb '" + sub
                                            + "' (expected 'open', 'resume', 'close' or 'watch')");
}

// ---- node -------------------------------------------------------------------------

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

// ---- cluster ------------------------------------------------------------------------

namespace {

void json_str(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

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
      json_str(out, m.name);
      out += ",\"state\":";
      json_str(out, m.state);
      if (!m.why.empty()) {
        out += ",\"why\":";
        json_str(out, m.why);
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
      out += ",\"layers\":[";
      for (size_t i = 0; i < m.last.layers.size(); ++i) {
        if (i)
          out += ',';
        json_str(out, m.last.layers[i]);
      }
      out += "]}";
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
  return 0;
}

} // namespace dsec::cli::remote

int main(int argc, char** argv) {
  using namespace dsec::cli;
  // Descriptors 0-2 must be something, or the first sockets we open become them.
  for (int fd = 0; fd < 3; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF && ::open("/dev/null", O_RDWR) != fd)
      return 1;
  ::signal(SIGPIPE, SIG_IGN);
  args a{argc, argv, 1};
  std::string host;
  uint16_t port = 0;
  bool connect = false;
  dsec::tls_options tls;
  if (const char* env = std::getenv("DSEC_TLS"); env && *env)
    tls.dir = env;
  while (a.at_option()) {
    if (a.help()) {
      std::fputs(remote::usage, stdout);
      return 0;
    }
    if (a.flag("--version")) {
      std::printf("dsec %s\n", DSEC_VERSION);
      return 0;
    }
    std::string value;
    auto r = a.option("--state", value);
    if (!r)
      return usage_error("", r.error_value().message);
    if (*r)
      continue; // the daemon's state is its own
    r = a.option("--tls", value);
    if (!r)
      return usage_error("", r.error_value().message);
    if (*r) {
      if (value.empty())
        return usage_error("", "--tls needs a directory (with ca.pem, cert.pem and key.pem)");
      tls.dir = value;
      continue;
    }
    r = a.option("--connect", value);
    if (!r)
      return usage_error("", r.error_value().message);
    if (*r) {
      if (!remote::parse_host_port(value, host, port)) {
        std::fprintf(stderr, "dsec: --connect: expected HOST:PORT (a port from 1 to 65535), "
                             "got '%s'\nTry 'dsec --help'.\n", value.c_str());
        return 2;
      }
      connect = true;
      continue;
    }
    std::fprintf(stderr, "dsec: unknown global option '%s'\nTry 'dsec --connect HOST:PORT "
                         "--help'.\n", std::string{a.peek()}.c_str());
    return 2;
  }
  if (!connect) {
    std::fprintf(stderr, "dsec: the daemon's verbs need --connect HOST:PORT before the verb\n"
                         "Try 'dsec --help'.\n");
    return 2;
  }
  if (a.empty()) {
    std::fputs(remote::usage, stderr);
    return 2;
  }
  remote::context ctx{host, port, tls};
  std::string verb{a.next()};
  if (verb == "ps")
    return remote::ps_main(ctx, a);
  if (verb == "rm")
    return remote::rm_main(ctx, a);
  if (verb == "exec")
    return remote::exec_main(ctx, a);
  if (verb == "run")
    return remote::run_main(ctx, a);
  if (verb == "cp")
    return remote::cp_main(ctx, a);
  if (verb == "session")
    return remote::session_main(ctx, a);
  if (verb == "node")
    return remote::node_main(ctx, a);
  if (verb == "cluster")
    return remote::cluster_main(ctx, a);
  if (verb == "feedback")
    return remote::feedback_main(ctx, a);
  if (verb == "call")
    return remote::call_main(ctx, a);
  if (verb == "pool")
    return remote::pool_main(ctx, a);
  if (verb == "help") {
    std::fputs(remote::usage, stdout);
    return 0;
  }
  if (verb == "layer") {
    std::fprintf(stderr, "dsec: layer works on a local store, not through --connect: run "
                         "'dsec --state DIR layer ...' on the daemon's machine, with its "
                         "state directory\n");
    return 2;
  }
  std::fprintf(stderr, "dsec: unknown verb '%s' for --connect\nTry 'dsec --connect %s "
                       "--help'.\n", verb.c_str(), ctx.where().c_str());
  return 2;
}
