// dsec --connect HOST:PORT fork ID -n N: N new sandboxes with a sandbox's
// files, from one shared diff layer (issue 16).
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <charconv>
#include <cstdio>
#include <string>

namespace dsec::cli::remote {

namespace {

const char* fork_usage = R"(usage: dsec --connect HOST:PORT fork ID [-n N]

Forks sandbox ID into N new sandboxes (default 1) that start with its files:
one snapshot of its writable layer (a diff layer named fork-ID@<unix ms>,
mounted once per node however many forks use it, kept in the store until
`dsec layer rm`), then one create batch of N sandboxes of its environment on
top of it, in ID's session. The source goes on running (frozen only for the
copy). Processes are not copied: the forks start idle. Prints the new ids,
one a line.

Options:
  -n, --count N   how many (1 to the session's quota)
  -h, --help      this text
)";

} // namespace

int fork_main(context& ctx, args& a) {
  auto verb = ctx.verb("fork");
  std::string id;
  uint32_t n = 1;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(fork_usage, stdout);
      return 0;
    }
    if (a.peek() == "-n" || a.peek() == "--count") {
      a.next();
      if (a.empty())
        return usage_error(verb, "-n needs a count");
      auto v = a.next();
      auto r = std::from_chars(v.data(), v.data() + v.size(), n);
      if (r.ec != std::errc{} || r.ptr != v.data() + v.size() || n == 0)
        return usage_error(verb, "-n '" + std::string{v} + "': not a positive count");
      continue;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    if (!id.empty())
      return usage_error(verb, "one sandbox id only");
    id = std::string{a.next()};
  }
  if (id.empty())
    return usage_error(verb, "no sandbox id given (dsec --connect HOST:PORT fork ID -n N)");
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto named = resolve_sandbox(**c, id); // a name is looked up (ps shows them)
  if (!named)
    return fail(named.error_value());
  id = *named;
  auto r = (*c)->fork(id, n);
  if (!r)
    return fail(r.error_value());
  for (const auto& x : *r)
    std::printf("%s\n", x.c_str());
  if (r->size() == n)
    return 0;
  std::fprintf(stderr, "dsec: fork: %zu of %u sandboxes were made (see `node stats`)\n",
               r->size(), n);
  return 1;
}

} // namespace dsec::cli::remote
