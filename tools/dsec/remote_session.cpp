// dsec --connect HOST:PORT session open|resume|close (and `session watch`, in
// remote_watch.cpp): sessions nobody owns.
#include "tools/dsec/remote.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <cstdlib>
#include <string>

#include "runtime/units.hpp"
#include "tools/dsec/remote_common.hpp"

namespace dsec::cli::remote {

namespace {

const char* session_usage = R"(usage: dsec --connect HOST:PORT session open [--quota N] [--ttl DUR] [--name NAME]
                                                [--trajectory]
       dsec --connect HOST:PORT session list [--json]
       dsec --connect HOST:PORT session resume ID
       dsec --connect HOST:PORT session pause ID
       dsec --connect HOST:PORT session close ID
       dsec --connect HOST:PORT session watch ID [--count N] [--for DUR]

open   Opens a session that nobody owns: it lives until `session close` (or
       until the daemon stops), and prints its id. Use it with
       `run --detach --session ID` and `ps --session ID`.
         --quota N    most sandboxes alive at once in it (default 1024)
         --ttl DUR    the default lifetime of its sandboxes (default 1h), e.g.
                      30s, 10m, 1h30m; `run --ttl` overrides it for one sandbox
         --name NAME  a name for it, unique among the open sessions: it
                      stands for the id in `ps --session`, `run --session`,
                      `session close` and `session watch`
         --trajectory keep a trajectory log: every create, command and put
                      with its result, durably, so that `session resume`
                      can answer them again after the daemon restarts
                      (docs/trajectory.md)
list   The daemon's sessions, one a line: the live ones (with how many
       sandboxes each has now, its quota, whether a trainer owns it (it ends
       with its trainer) and whether it keeps a trajectory log), and the
       trajectory logs that no live session has: those can be resumed
       (`session resume ID`) or deleted (`session close ID`).
         --json       a JSON array, a session a line: id, name, state ("live"
                      or "resumable"), sandboxes, quota, owned, trajectory,
                      log_ms (its log's last write, unix ms; 0 without one)
pause  Pauses every sandbox of live session ID at once (see `pause --help`:
       frozen, TTL clocks stopped, commands refused); prints how many.
resume Resumes every paused sandbox of session ID when it is live and has
       some (prints how many). Otherwise it reopens session ID from its
       trajectory log after the daemon (or the
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

// The one session id of `session resume|close ID`: -1 when it was read into
// `id`, else the exit status (0 after --help, 2 after a usage error).
int one_session_id(args& a, const std::string& verb, std::string& id) {
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(session_usage, stdout);
      return 0;
    }
    if (int rc = take_session_id(a, verb, id); rc >= 0)
      return rc;
  }
  if (id.empty())
    return usage_error(verb, "no session id given");
  return -1;
}


// `session list [--json]`.
int list_sessions(context& ctx, args& a, const std::string& verb) {
  bool json = false;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(session_usage, stdout);
      return 0;
    }
    if (a.flag("--json"))
      json = true;
    else if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    else
      return usage_error(verb, "unexpected argument '" + std::string{a.peek()} + "'");
  }
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto all = (*c)->sessions();
  if (!all)
    return fail(all.error_value());
  // Sandboxes per live session, as the session lists them (a resumed one's
  // replaying sandboxes too). One that ended meanwhile counts 0.
  std::map<std::string, uint32_t> boxes;
  for (const auto& x : *all) {
    if (x.state != "live")
      continue;
    if (auto s = (*c)->find_session(x.id))
      if (auto l = (*s)->list())
        boxes[x.id] = static_cast<uint32_t>(l->size());
  }
  if (json) {
    std::printf("[");
    for (size_t k = 0; k < all->size(); ++k) {
      const auto& x = (*all)[k];
      std::string o = "{\"id\":" + json_quoted(x.id) + ",\"name\":" + json_quoted(x.name)
                      + ",\"state\":" + json_quoted(x.state) + ",\"sandboxes\":"
                      + std::to_string(boxes[x.id]) + ",\"quota\":" + std::to_string(x.quota)
                      + ",\"owned\":" + (x.owned ? "true" : "false") + ",\"trajectory\":"
                      + (x.trajectory ? "true" : "false") + ",\"log_ms\":"
                      + std::to_string(x.log_ms) + "}";
      std::printf("%s\n%s", k ? "," : "", o.c_str());
    }
    std::printf("%s]\n", all->empty() ? "" : "\n");
    return 0;
  }
  size_t w_id = 2, w_name = 4;
  for (const auto& x : *all) {
    w_id = std::max(w_id, x.id.size());
    w_name = std::max(w_name, x.name.size());
  }
  std::printf("%-*s  %-*s  %-9s  %9s  %7s  %-5s  %s\n", static_cast<int>(w_id), "ID",
              static_cast<int>(w_name), "NAME", "STATE", "SANDBOXES", "QUOTA", "OWNED", "LOG");
  for (const auto& x : *all) {
    bool live = x.state == "live";
    std::string log = !x.trajectory ? "-" : x.log_ms ? "yes" : "yes (empty)";
    std::printf("%-*s  %-*s  %-9s  %9s  %7s  %-5s  %s\n", static_cast<int>(w_id), x.id.c_str(),
                static_cast<int>(w_name), x.name.empty() ? "-" : x.name.c_str(), x.state.c_str(),
                live ? std::to_string(boxes[x.id]).c_str() : "-",
                live ? std::to_string(x.quota).c_str() : "-",
                live ? (x.owned ? "yes" : "no") : "-", log.c_str());
  }
  return 0;
}

} // namespace

int session_main(context& ctx, args& a) {
  if (a.help()) {
    std::fputs(session_usage, stdout);
    return 0;
  }
  if (a.empty())
    return usage_error(ctx.verb("session"),
                       "expected 'open', 'list', 'resume', 'pause', 'close' or 'watch'");
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
  if (sub == "list")
    return list_sessions(ctx, a, verb);
  if (sub == "pause") {
    std::string id;
    if (int rc = one_session_id(a, verb, id); rc >= 0)
      return rc;
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value());
    auto s = (*c)->find_session(id);
    if (!s)
      return fail(s.error_value());
    auto n = (*s)->pause_all();
    if (!n)
      return fail(n.error_value());
    std::printf("paused session %s: %u sandbox%s\n", id.c_str(), *n, *n == 1 ? "" : "es");
    return 0;
  }
  if (sub == "resume") {
    std::string id;
    if (int rc = one_session_id(a, verb, id); rc >= 0)
      return rc;
    auto c = ctx.connect();
    if (!c)
      return fail(c.error_value());
    if (auto live = (*c)->find_session(id)) { // live: thaw its paused sandboxes
      auto n = (*live)->resume_all();
      if (!n)
        return fail(n.error_value());
      if (*n > 0) {
        std::printf("resumed session %s: %u paused sandbox%s\n", id.c_str(), *n,
                    *n == 1 ? "" : "es");
        return 0;
      }
      // Nothing was paused: a resume from the log (which says it is live).
    }
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
                                            + "' (expected 'open', 'list', 'resume', 'pause', 'close' or 'watch')");
}

} // namespace dsec::cli::remote
