// dsec-client: the verbs of `dsec --connect HOST:PORT VERB`, which talk to a
// dsecd through dsec::client. Each verb parses its arguments first (so --help
// and usage errors need no daemon), then connects.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "actors/client.hpp"
#include "tools/dsec/cli.hpp"

namespace dsec::cli::remote {

/// The daemon to talk to, and the connection once made.
class context {
public:
  /// `tls`: --tls DIR (or $DSEC_TLS); empty for plain TCP.
  context(std::string host, uint16_t port, tls_options tls = {});
  ~context();

  /// HOST:PORT as given.
  [[nodiscard]] const std::string& where() const { return where_; }

  /// `--connect HOST:PORT VERB`: how usage errors name the verb.
  [[nodiscard]] std::string verb(std::string_view v) const {
    return "--connect " + where_ + " " + std::string{v};
  }

  /// Starts an actor system and connects (once); the error names HOST:PORT.
  expected<client*> connect();

private:
  std::string host_, where_;
  uint16_t port_;
  tls_options tls_;
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::unique_ptr<client> client_;
};

// The verbs; each returns the exit status.
int ps_main(context& c, args& a);
int rm_main(context& c, args& a);
int session_main(context& c, args& a);
int node_main(context& c, args& a);
int cluster_main(context& c, args& a);
int exec_main(context& c, args& a);
int run_main(context& c, args& a);
int cp_main(context& c, args& a);
int watch_main(context& c, args& a);    // session watch
int feedback_main(context& c, args& a);
int call_main(context& c, args& a);     // tools/dsec/pool.cpp
int pool_main(context& c, args& a);     // tools/dsec/pool.cpp
/// The warm pools of `node stats` (tools/dsec/pool.cpp).
void print_pools(const node_stats& s);

/// Writes all of `data` to `fd`; false (errno set) if it cannot, e.g. EPIPE
/// when the reader left (SIGPIPE is ignored).
bool write_all(int fd, std::string_view data);

/// Reads all of `fd` (our stdin for -i).
expected<std::string> read_all(int fd);

/// The exit status of a command that could not be started, from the daemon's
/// error: 127 not found, 126 cannot be executed (or --cwd, --user failed);
/// 0 when the error is about something else.
int exec_failure_status(const error& e);

} // namespace dsec::cli::remote
