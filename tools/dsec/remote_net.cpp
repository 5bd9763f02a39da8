// dsec --connect HOST:PORT net: changes the egress policy of a live sandbox.
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/net_policy.hpp"

namespace dsec::cli::remote {

namespace {

const char* net_usage = R"(usage: dsec --connect HOST:PORT net ID [--allow RULE]... [--deny RULE]...

Replaces the network policy of egress sandbox ID (made with --network egress)
with the rules given: new connections follow it at once, established ones go
on, and what its old domain rules admitted is dropped. With no rule at all,
everything is denied. RULE is CIDR[:PORT[-PORT]] (TCP and UDP; no port: every
port), DOMAIN, *.DOMAIN (names below DOMAIN; through the node's DNS proxy), or
a service the node names (dsecd --services). Private, link-local
(169.254.169.254) and the node's denied ranges stay denied under a wider rule,
unless a rule names a network inside them; the node itself is never reached.
A --deny rule wins over an --allow rule. Prints `ID: allow N, deny M`.

Options:
  --allow RULE   allowed (repeatable)
  --deny RULE    denied (repeatable)
  -h, --help     this text
)";

} // namespace

int net_main(context& ctx, args& a) {
  auto verb = ctx.verb("net");
  std::string id;
  std::vector<std::string> allow, deny;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(net_usage, stdout);
      return 0;
    }
    std::string v;
    for (auto [name, list] : {std::pair{"--allow", &allow}, std::pair{"--deny", &deny}}) {
      auto got = a.option(name, v);
      if (!got)
        return usage_error(verb, got.error_value().message);
      if (*got) {
        if (auto r = parse_net_rule(v); !r)
          return usage_error(verb, std::string{name} + ": " + r.error_value().message);
        list->push_back(v);
        goto next;
      }
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    if (!id.empty())
      return usage_error(verb, "one sandbox id at a time (got " + id + " and "
                                 + std::string{a.peek()} + ")");
    id = std::string{a.next()};
  next:;
  }
  if (id.empty())
    return usage_error(verb, "no sandbox id given (dsec --connect HOST:PORT net ID --allow RULE)");
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto named = resolve_sandbox(**c, id); // a name is looked up (ps shows them)
  if (!named)
    return fail(named.error_value());
  id = *named;
  if (auto r = (*c)->set_network(id, allow, deny); !r)
    return fail(r.error_value());
  std::printf("%s: allow %zu, deny %zu\n", id.c_str(), allow.size(), deny.size());
  return 0;
}

} // namespace dsec::cli::remote
