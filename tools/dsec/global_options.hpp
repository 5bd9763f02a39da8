// The options that come before the verb, for both programs of the command line:
// the static dsec (local verbs; it hands --connect over to dsec-client) and
// dsec-client (the daemon's verbs). One parser, so that both read them alike.
#pragma once

#include <optional>
#include <string>

#include "runtime/endpoint.hpp"

namespace dsec::cli {

class args;

/// `dsec [--state DIR] [--connect HOST:PORT [--tls DIR]] VERB ...`.
struct global_options {
  std::string state_dir;           ///< --state, else $DSEC_STATE, else /var/lib/dsec
  std::optional<endpoint> connect; ///< --connect: the verb is a daemon's
  std::string tls_dir;             ///< --tls (only the option; see tls())
  bool help = false;               ///< -h or --help came (parsing stopped there)
  bool version = false;            ///< --version came (parsing stopped there)

  /// The TLS directory for --connect: --tls, else $DSEC_TLS; empty: plain TCP.
  [[nodiscard]] std::string tls() const;
};

/// Reads the global options from `a` up to the verb (or up to -h/--help or
/// --version, which it records and stops at). A usage error is printed
/// ("dsec: MESSAGE" and a pointer to 'dsec --help'); then it returns the exit
/// status (2), else nullopt. `g.state_dir` should hold the default already.
std::optional<int> parse_global_options(args& a, global_options& g);

} // namespace dsec::cli
