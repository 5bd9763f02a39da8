// dsec --connect HOST:PORT expose: forwards a port of a live sandbox's node to
// a TCP port inside it (docs/network.md, "Exposed ports").
#include "tools/dsec/remote.hpp"
#include "tools/dsec/remote_common.hpp"

#include <cstdio>
#include <string>

namespace dsec::cli::remote {

namespace {

const char* expose_usage = R"(usage: dsec --connect HOST:PORT expose ID PORT

Forwards a fresh TCP port of the node that runs sandbox ID (on its
--expose-address, 127.0.0.1 unless set) to 127.0.0.1:PORT inside the sandbox's
network namespace, and prints where to connect: `ID PORT HOST:HOSTPORT`. The
sandbox needs a network of its own (made with --net, --network loopback or
--network egress); a port already exposed is refused. The forward ends with
the sandbox; `dsec ps` shows it. `dsec run --detach --net --expose PORT`
exposes ports at creation.

Options:
  -h, --help     this text
)";

} // namespace

int expose_main(context& ctx, args& a) {
  auto verb = ctx.verb("expose");
  std::string id, port_text;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(expose_usage, stdout);
      return 0;
    }
    if (a.at_option())
      return usage_error(verb, "unknown option '" + std::string{a.peek()} + "'");
    if (id.empty())
      id = std::string{a.next()};
    else if (port_text.empty())
      port_text = std::string{a.next()};
    else
      return usage_error(verb, "one sandbox and one port at a time (dsec expose ID PORT)");
  }
  if (id.empty() || port_text.empty())
    return usage_error(verb, "expected a sandbox id and a port (dsec --connect HOST:PORT expose"
                             " ID PORT)");
  auto port = parse_port(port_text, "port");
  if (!port)
    return usage_error(verb, port.error_value().message);
  auto c = ctx.connect();
  if (!c)
    return fail(c.error_value());
  auto named = resolve_sandbox(**c, id); // a name is looked up (ps shows them)
  if (!named)
    return fail(named.error_value());
  id = *named;
  auto r = (*c)->expose(id, *port);
  if (!r)
    return fail(r.error_value());
  std::printf("%s %u %s\n", id.c_str(), static_cast<unsigned>(r->port), r->address().c_str());
  return 0;
}

} // namespace dsec::cli::remote
