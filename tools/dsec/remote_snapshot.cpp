// dsec --connect HOST:PORT snapshot ID --as NAME@VERSION: pack_diff, a
// sandbox's writable layer as a diff layer (issue 16).
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <cstdio>
#include <string>

namespace dsec::cli::remote {

namespace {

const char* snapshot_usage = R"(usage: dsec --connect HOST:PORT snapshot ID --as NAME@VERSION

Makes sandbox ID's writable layer (its overlay upper dir: the files it wrote,
with their owners, modes, xattrs and hard links, and the whiteouts and opaque
directories of what it deleted or replaced) a new EROFS layer NAME@VERSION of
kind diff in its node's store, recording the environment it sits on. The
sandbox is frozen for the copy only (a paused one stays paused). Prints the
layer's digest. Start sandboxes from it with `run --snapshot NAME@VERSION`
(or environment.snapshot); `dsec layer ls` shows its chain.

Options:
  --as NAME@VERSION   the new layer's name (versions are immutable)
  -h, --help          this text
)";

} // namespace

int snapshot_main(context& ctx, args& a) {
  auto verb = ctx.verb("snapshot");
  std::string id, as;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(snapshot_usage, stdout);
      return 0;
    }
    if (a.peek() == "--as") {
      a.next();
      if (a.empty())
        return usage_error(verb, "--as needs NAME@VERSION");
      as = std::string{a.next()};
      continue;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    if (!id.empty())
      return usage_error(verb, "one sandbox id only");
    id = std::string{a.next()};
  }
  if (id.empty())
    return usage_error(verb, "no sandbox id given (dsec --connect HOST:PORT snapshot ID --as NAME@VERSION)");
  if (as.empty())
    return usage_error(verb, "--as NAME@VERSION is required");
  if (auto r = parse_layer_ref(as); !r)
    return usage_error(verb, "--as '" + as + "': " + r.error_value().message);
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto named = resolve_sandbox(**c, id); // a name is looked up (ps shows them)
  if (!named)
    return fail(named.error_value());
  id = *named;
  auto r = (*c)->snapshot(id, as);
  if (!r)
    return fail(r.error_value());
  std::printf("%s %s\n", as.c_str(), r->c_str());
  return 0;
}

} // namespace dsec::cli::remote
