// dsec --connect HOST:PORT session watch: a session's Chronus events, printed as
// JSON lines as they come.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "runtime/chronus.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

namespace dsec::cli::remote {

namespace {

const char* watch_usage = R"(usage: dsec --connect HOST:PORT session watch ID [--count N] [--for DUR]

Prints the Chronus events of session ID as they come, one JSON object a line:
  {"sandbox":"ab12..","seq":3,"monotonic_ns":...,"kind":"stage","stage":"test"}
  kinds: stage (a stage name), report ("metrics":{KEY:VALUE,...}), log ("log"),
  feedback ("id":N, "payload_base64"): a trusted command in that sandbox waits
  for `dsec --connect HOST:PORT feedback SANDBOX N ...`.
The events the session kept while nobody watched come first. It ends when the
session ends (status 0), after N events, after DUR, or on SIGINT/SIGTERM.

Options:
  --count N    stop after N events
  --for DUR    stop after DUR (e.g. 30s, 5m)
  -h, --help   this text

Exit status: 0; 1 when the session is unknown or the daemon cannot be
reached; 2 on a usage error.
)";

std::atomic<bool> stop_requested{false};

void on_stop(int) {
  stop_requested = true;
}

} // namespace

int watch_main(context& ctx, args& a) {
  auto verb = ctx.verb("session watch");
  std::string id;
  uint64_t count = 0;
  std::optional<std::chrono::milliseconds> limit;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(watch_usage, stdout);
      return 0;
    }
    std::string v;
    auto got = a.option("--count", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      if (!parse_u64(v, count) || count == 0)
        return usage_error(verb, "--count: expected a positive whole number, got '" + v + "'");
      continue;
    }
    got = a.option("--for", v);
    if (!got)
      return usage_error(verb, got.error_value().message);
    if (*got) {
      auto d = parse_duration(v, "--for");
      if (!d)
        return usage_error(verb, d.error_value().message);
      if (d->count() <= 0)
        return usage_error(verb, "--for: must be positive");
      limit = *d;
      continue;
    }
    if (int rc = take_session_id(a, verb, id); rc >= 0)
      return rc;
  }
  if (id.empty())
    return usage_error(verb, "no session id given");
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  for (int sig : {SIGINT, SIGTERM, SIGHUP})
    ::sigaction(sig, &sa, nullptr);
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto s = (*c)->find_session(id);
  if (!s)
    return fail(s.error_value());
  auto w = (*s)->watch();
  if (!w)
    return fail(w.error_value());
  auto until = limit ? std::chrono::steady_clock::now() + *limit
                     : std::chrono::steady_clock::time_point::max();
  uint64_t seen = 0;
  while (!stop_requested && (count == 0 || seen < count)) {
    auto now = std::chrono::steady_clock::now();
    if (now >= until)
      break;
    auto wait = std::chrono::milliseconds(200);
    if (until - now < wait)
      wait = std::chrono::duration_cast<std::chrono::milliseconds>(until - now) +
             std::chrono::milliseconds(1);
    auto ev = (*w)->next(wait);
    if (!ev) {
      if (ev.error_value().code == errc::disconnected)
        return 0; // the session ended: so does the watch
      return fail(ev.error_value());
    }
    if (!*ev)
      continue;
    auto line = event_to_json(**ev);
    line += '\n';
    if (!write_all(1, line))
      return 0; // our reader left
    ++seen;
  }
  return 0;
}

} // namespace dsec::cli::remote
