// dsec-e2b: an E2B-compatible API in front of a dsec cluster, so the `e2b` SDK
// runs on dsec unchanged (docs/e2b.md). A client of the cluster through
// dsec::client like any trainer: one session per API key, E2B sandboxes are
// that session's sandboxes, templates are dsec environments.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "actors/client.hpp"
#include "runtime/endpoint.hpp"
#include "tools/dsec/cli.hpp"
#include "tools/e2b/gateway.hpp"
#include "tools/e2b/http.hpp"

namespace {

const char* usage = R"(usage: dsec-e2b --connect HOST:PORT --listen HOST:PORT --templates FILE --keys FILE
                [--tls DIR] [--threads N] [--quota N] [--domain DOMAIN]

An E2B-compatible API over a dsecd (docs/e2b.md). Point the e2b SDK at it with
E2B_API_URL=http://HOST:PORT and E2B_SANDBOX_URL=http://HOST:PORT (the same
listener serves the control plane and every sandbox's envd endpoint, told apart
by the E2b-Sandbox-Id header) and E2B_API_KEY=one of the keys.

  --connect HOST:PORT  the dsecd (a node or a coordinator) to use
  --listen HOST:PORT   where to serve HTTP/1.1 (port 0: any; the port is printed)
  --templates FILE     {"templates": {"NAME": {"base": "N@V", "workdir": "N@V",
                       "tools": ["N@V"], "memory": "1g", "disk": "1g", "cpus": 1,
                       "pids": 256, "network": "none"|"loopback"|{"allow": [..]},
                       "cwd": "/"}}}: E2B template ids to dsec environments;
                       E2B's allowInternetAccess, allowOut and denyOut can
                       only narrow a template's network
  --keys FILE          the API keys, one a line (e2b_ and hex digits); each gets
                       its own dsec session, and sees only its own sandboxes
  --tls DIR            talk TLS to the dsecd, with the certificates of DIR
  --threads N          HTTP threads (default 2)
  --quota N            live sandboxes per key (default 1024)
  --domain DOMAIN      the sandboxes' domain: the SDK's getHost(PORT) is then
                       PORT-ID.DOMAIN, and a request for that host (this
                       listener, by its Host header) reaches PORT inside sandbox
                       ID, which dsec exposes on first use (its template needs
                       "network": "loopback" or an egress policy). Without it,
                       the SDK's E2B_DOMAIN makes the names; such requests are
                       served all the same. E.g. localhost:PORT, which curl
                       resolves with no DNS

Every sandbox is destroyed when dsec-e2b stops (SIGINT, SIGTERM).
)";

int bad(const std::string& msg) {
  std::fprintf(stderr, "dsec-e2b: %s\n", msg.c_str());
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  std::string connect, listen, templates, keys, tls, threads = "2", quota = "1024", domain;
  dsec::cli::args a{argc, argv, 1};
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(usage, stdout);
      return 0;
    }
    bool any = false;
    for (auto [name, dst] : {std::pair{"--connect", &connect}, {"--listen", &listen},
                             {"--templates", &templates}, {"--keys", &keys}, {"--tls", &tls},
                             {"--threads", &threads}, {"--quota", &quota},
                             {"--domain", &domain}}) {
      auto r = a.option(name, *dst);
      if (!r)
        return bad(r.error_value().message);
      if (*r) {
        any = true;
        break;
      }
    }
    if (!any)
      return bad("unknown argument '" + std::string{a.peek()} + "' (try --help)");
  }
  if (connect.empty() || listen.empty() || templates.empty() || keys.empty())
    return bad("--connect, --listen, --templates and --keys are required (try --help)");
  auto cep = dsec::parse_endpoint(connect, "--connect");
  if (!cep)
    return bad(cep.error_value().message);
  auto lep = dsec::parse_endpoint(listen, "--listen", dsec::port_zero::allowed);
  if (!lep)
    return bad(lep.error_value().message);
  uint64_t nthreads = 0, nquota = 0;
  if (!dsec::cli::parse_uint(threads, 64, nthreads) || nthreads == 0)
    return bad("--threads must be a number from 1 to 64, not '" + threads + "'");
  if (!dsec::cli::parse_uint(quota, 1u << 20, nquota) || nquota == 0)
    return bad("--quota must be a positive number, not '" + quota + "'");
  auto tmpl = dsec::e2b::load_templates(templates);
  if (!tmpl)
    return bad(tmpl.error_value().message);
  auto k = dsec::e2b::load_keys(keys);
  if (!k)
    return bad(k.error_value().message);

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  caf::actor_system_config cfg;
  if (auto ok = dsec::client::configure(cfg, dsec::tls_options{tls}); !ok)
    return bad("--tls " + tls + ": " + ok.error_value().to_string());
  cfg.set("logger.console", caf::atom("none"));
  caf::actor_system sys{cfg};
  auto c = dsec::client::connect(sys, cep->host, cep->port);
  if (!c) {
    std::fprintf(stderr, "dsec-e2b: --connect %s: %s\n", connect.c_str(),
                 c.error_value().to_string().c_str());
    return 1;
  }
  dsec::e2b::gateway_options go;
  go.templates = std::move(*tmpl);
  go.keys = std::move(*k);
  go.quota = static_cast<uint32_t>(nquota);
  go.domain = domain;
  auto gw = dsec::e2b::gateway::open(**c, std::move(go));
  if (!gw) {
    std::fprintf(stderr, "dsec-e2b: %s\n", gw.error_value().to_string().c_str());
    return 1;
  }
  dsec::e2b::server_options so;
  so.host = lep->host;
  so.port = lep->port;
  so.threads = static_cast<unsigned>(nthreads);
  so.streams_body = &dsec::e2b::gateway::streams_body;
  auto* g = gw->get();
  auto srv = dsec::e2b::server::listen(
    so, [g](dsec::e2b::http_request req, std::shared_ptr<dsec::e2b::responder> r) {
      g->handle(std::move(req), std::move(r));
    },
    [g](const dsec::e2b::http_request& head, std::function<void(dsec::e2b::route)> decide) {
      return g->tunnel(head, std::move(decide));
    });
  if (!srv)
    return bad(srv.error_value().message);
  std::printf("dsec-e2b: listening on %s (dsecd %s)\n",
              dsec::format_endpoint(lep->host, (*srv)->port()).c_str(), connect.c_str());
  std::fflush(stdout);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop, &sig);
    (*srv)->stop();
  });
  (*srv)->run();
  waiter.join();
  // The gateway's sessions are owned by the client: dropping it destroys
  // every sandbox.
  gw->reset();
  c->reset();
  std::printf("dsec-e2b: stopped\n");
  return 0;
}
