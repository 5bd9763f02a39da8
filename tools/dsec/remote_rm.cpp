// dsec --connect HOST:PORT rm: destroys sandboxes by id.
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace dsec::cli::remote {

namespace {

const char* rm_usage = R"(usage: dsec --connect HOST:PORT rm ID...

Destroys each sandbox (its processes are killed, its writable layer is gone)
and prints `removed ID`. An unknown id is reported and makes the exit status 1,
but the other sandboxes are still removed.

Options:
  -h, --help     this text
)";

} // namespace

int rm_main(context& ctx, args& a) {
  auto verb = ctx.verb("rm");
  std::vector<std::string> ids;
  if (int rc = take_sandbox_ids(a, verb, rm_usage, "dsec --connect HOST:PORT rm ID...", ids); rc >= 0)
    return rc;
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  int rc = 0;
  for (const auto& given : ids) {
    auto named = resolve_sandbox(**c, given);
    if (!named) {
      rc = fail(named.error_value());
      continue;
    }
    const auto& id = *named;
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

} // namespace dsec::cli::remote
