// dsec-e2b's gateway: the E2B control plane and the sandbox endpoint ("envd")
// over dsec::client. One dsec session per API key (opened at start, owned by
// the gateway's client: its sandboxes end with the gateway); E2B sandboxes are
// that session's sandboxes, by their dsec ids; templates are dsec
// environments (docs/e2b.md). No CAF in this header.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/environment.hpp"
#include "runtime/error.hpp"
#include "tools/e2b/http.hpp"

namespace dsec {
class client;
}

namespace dsec::e2b {

struct template_def {
  environment env;
  std::string cwd = "/"; ///< where commands run and relative paths resolve
};

/// Reads a template file: {"templates": {"NAME": {"base": "N@V", "workdir":
/// "N@V", "tools": ["N@V"], "memory": "1g", "disk": "1g", "cpus": 1, "pids":
/// 256, "network": "none"|"loopback"|{"allow": [...], "deny": [...]}, "cwd":
/// "/", "backend": "container"}}}. The error names the template and the field.
expected<std::map<std::string, template_def>> load_templates(const std::string& path);

/// Reads a keys file: one API key a line (e2b_ and hex digits); blank lines and
/// lines starting with '#' are skipped.
expected<std::vector<std::string>> load_keys(const std::string& path);

struct gateway_options {
  std::map<std::string, template_def> templates;
  std::vector<std::string> keys;
  uint32_t quota = 1024; ///< live sandboxes per key
  /// Reported as each sandbox's `domain`: the SDK's getHost(PORT) is then
  /// "PORT-ID.DOMAIN" (empty: null, the SDK's E2B_DOMAIN applies).
  std::string domain;
};

/// The port of envd, which the gateway itself answers for every sandbox.
inline constexpr uint16_t envd_port = 49983;

/// The envd version the gateway reports: it selects the SDK's code paths
/// (docs/e2b.md, "envdVersion").
inline constexpr const char* envd_version = "0.5.7";

class gateway {
public:
  /// Opens one session per key on `c`.
  static expected<std::unique_ptr<gateway>> open(client& c, gateway_options o);
  /// Answers one HTTP request (control plane or sandbox endpoint).
  void handle(http_request req, std::shared_ptr<responder> r);
  /// The server's router: takes a request whose Host is "PORT-ID.DOMAIN" (or
  /// that names E2b-Sandbox-Id and an E2b-Sandbox-Port other than envd's) and
  /// tunnels its connection to that port of the sandbox (docs/e2b.md, "Ports").
  bool tunnel(const http_request& head, std::function<void(route)> decide);
  /// The server's streams_body: the requests whose body is read as it arrives
  /// (process.Process/StreamInput, client-streamed).
  static bool streams_body(const http_request& head);
  ~gateway();

  struct impl;
private:
  explicit gateway(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

} // namespace dsec::e2b
