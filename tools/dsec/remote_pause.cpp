// dsec --connect HOST:PORT pause ID... | resume ID...: freezes sandboxes (their
// TTL clock stops, commands are refused) and lets them run again (issue 16).
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace dsec::cli::remote {

namespace {

const char* pause_usage = R"(usage: dsec --connect HOST:PORT pause ID...
       dsec --connect HOST:PORT resume ID...

pause freezes every process of each sandbox (the cgroup freezer: v2, else the
v1 freezer hierarchy) and stops its TTL clock: it costs no CPU, `ps` shows it
as paused, and exec, cp and call into it are refused (error `paused`) until
it is resumed. resume lets it run again at once, its TTL counting on from
where it stopped. Each prints `paused ID` / `resumed ID` (or `ID was already
paused` / `ID was not paused`). An unknown id is reported and makes the exit
status 1; the other sandboxes are still handled. Every sandbox of a session
at once: `session pause|resume ID`.

Options:
  -h, --help     this text
)";

} // namespace

int pause_main(context& ctx, args& a, bool on) {
  auto verb = ctx.verb(on ? "pause" : "resume");
  std::vector<std::string> ids;
  const char* synopsis =
    on ? "dsec --connect HOST:PORT pause ID..." : "dsec --connect HOST:PORT resume ID...";
  if (int rc = take_sandbox_ids(a, verb, pause_usage, synopsis, ids); rc >= 0)
    return rc;
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  return for_each_sandbox(**c, ids, [&](const std::string& id) -> expected<void> {
    auto r = on ? (*c)->pause(id) : (*c)->resume(id);
    if (!r)
      return r.error_value();
    if (*r)
      std::printf("%s %s\n", on ? "paused" : "resumed", id.c_str());
    else
      std::printf("%s %s\n", id.c_str(), on ? "was already paused" : "was not paused");
    std::fflush(stdout);
    return {};
  });
}

} // namespace dsec::cli::remote
