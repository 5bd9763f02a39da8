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
  return for_each_sandbox(**c, ids, [&](const std::string& id) -> expected<void> {
    auto r = (*c)->destroy(id);
    if (!r)
      return r.error_value();
    std::printf("removed %s\n", id.c_str());
    std::fflush(stdout);
    return {};
  });
}

} // namespace dsec::cli::remote
