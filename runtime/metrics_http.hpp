// metrics_http: the HTTP endpoint beside a dsecd's actors (docs/observability.md):
// GET /metrics (a registry in the Prometheus text format), /healthz (the
// process answers), /readyz (the daemon's readiness check), and /status with
// its /status.json (runtime/status_page.hpp). It is
// cpp-httplib (Debian's libcpp-httplib-dev) on threads of its own: a scrape
// reads atomics and never waits on an actor. Plain HTTP on loopback, or
// HTTPS that requires a client certificate of the daemon's CA (--tls DIR),
// optionally with a bearer token.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "runtime/error.hpp"
#include "runtime/metrics.hpp"

namespace dsec {

struct metrics_http_options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;      ///< 0: a free one (port() says which)
  std::string tls_dir;    ///< ca.pem, cert.pem, key.pem; empty: plain HTTP
  std::string token;      ///< non-empty: requests need "Authorization: Bearer TOKEN"
  /// nullopt: ready; else why not (the body of a 503 from /readyz).
  std::function<std::optional<std::string>()> ready;
  /// How often /status.json's history samples the registry.
  std::chrono::milliseconds status_interval{2000};
};

class metrics_http {
public:
  /// Binds and starts serving; an error names the address that failed.
  static expected<std::unique_ptr<metrics_http>> start(metrics_http_options opts,
                                                       metrics::registry& reg);
  [[nodiscard]] uint16_t port() const { return port_; }
  /// Stops accepting, finishes what is in flight, joins its threads.
  ~metrics_http();

  struct impl;

private:
  metrics_http() = default;
  std::unique_ptr<impl> impl_;
  uint16_t port_ = 0;
};

/// Reads a bearer token from `path` (one line; the file must be open to
/// neither group nor others).
expected<std::string> load_metrics_token(const std::string& path);

} // namespace dsec
