// dsec-client: the verbs of `dsec --connect HOST:PORT VERB`, which talk to a
// dsecd through dsec::client. Each verb lives in its own file (remote_VERB.cpp),
// parses its arguments first (so --help and usage errors need no daemon), then
// connects; remote.cpp is dsec-client's main, remote_common.* what they share.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "actors/client.hpp"
#include "runtime/endpoint.hpp"
#include "tools/dsec/cli.hpp"

namespace dsec::cli::remote {

/// The daemon to talk to, and the connection once made.
class context {
public:
  /// `tls`: --tls DIR (or $DSEC_TLS); empty for plain TCP.
  context(endpoint where, tls_options tls = {});
  ~context();

  /// HOST:PORT (an IPv6 host in brackets).
  [[nodiscard]] const std::string& where() const { return where_; }

  /// `--connect HOST:PORT VERB`: how usage errors name the verb.
  [[nodiscard]] std::string verb(std::string_view v) const {
    return "--connect " + where_ + " " + std::string{v};
  }

  /// Starts an actor system and connects (once); the error names HOST:PORT.
  expected<client*> connect();

private:
  endpoint endpoint_;
  std::string where_;
  tls_options tls_;
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::unique_ptr<client> client_;
};

// The verbs; each returns the exit status.
int ps_main(context& c, args& a);
int inspect_main(context& c, args& a); // tools/dsec/remote_VERB.cpp
int rm_main(context& c, args& a);
int session_main(context& c, args& a);
int node_main(context& c, args& a);
int cluster_main(context& c, args& a);
int exec_main(context& c, args& a);
int run_main(context& c, args& a);
int cp_main(context& c, args& a);
int watch_main(context& c, args& a);    // session watch
int feedback_main(context& c, args& a);
int call_main(context& c, args& a);     // tools/dsec/remote_VERB.cpp
int pool_main(context& c, args& a);     // tools/dsec/remote_VERB.cpp
int net_main(context& c, args& a);      // egress policy (issue 14)
int expose_main(context& c, args& a);   // port exposure (issue 14)
// snapshots (issue 16): tools/dsec/remote_pause.cpp (pause: on, resume: !on),
// remote_snapshot.cpp, remote_fork.cpp
int pause_main(context& c, args& a, bool on);
int snapshot_main(context& c, args& a);
int fork_main(context& c, args& a);
// detached commands' output and ends (issue 23): remote_logs.cpp, remote_wait.cpp,
// remote_kill.cpp
int logs_main(context& c, args& a);
int wait_main(context& c, args& a);
int kill_main(context& c, args& a);
int stats_main(context& c, args& a);
int top_main(context& c, args& a);
int attach_main(context& c, args& a);
/// The warm pools of `node stats` (tools/dsec/remote_pool.cpp).
void print_pools(const node_stats& s);

} // namespace dsec::cli::remote
