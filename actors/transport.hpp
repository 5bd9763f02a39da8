// dsec's transport between processes: CAF's middleman over plain TCP, or over
// TLS with CAF's OpenSSL module when an actor system was configured with a
// directory of certificates (docs/security.md). Both ends of a TLS connection
// must present a certificate signed by the CA of their DIR/ca.pem, and the
// handshake completes before CAF reads a single message: a peer without such a
// certificate, or one that does not speak TLS, is disconnected first.
//
//   caf::actor_system_config cfg;
//   dsec::client::configure(cfg);                    // the middleman first
//   if (auto ok = dsec::configure_tls(cfg, {.dir = "/etc/dsec/tls"}); !ok) ...
//   caf::actor_system sys{cfg};
//   auto p = dsec::connect(sys, "10.0.0.7", 7070, sys.message_types<scheduler_actor>());
//   // or asynchronously, from an actor, over TLS when configured:
//   self->request(dsec::middleman_of(sys), caf::infinite, caf::connect_atom::value,
//                 host, port).then([](caf::node_id&, caf::strong_actor_ptr&,
//                                     std::set<std::string>&) {...});
#pragma once

#include <caf/fwd.hpp>
#include <caf/io/middleman_actor.hpp>

#include <chrono>
#include <cstdint>
#include <set>
#include <string>

#include "runtime/error.hpp"

namespace dsec {

/// Where the TLS files are. DIR holds ca.pem (the CA whose signature a peer's
/// certificate must carry; several CAs may be concatenated), cert.pem (this
/// process's certificate, optionally followed by intermediates) and key.pem
/// (its unencrypted private key, not readable by group or others).
/// tools/tls-certs makes them. An empty `dir` means plain TCP.
struct tls_options {
  std::string dir;

  [[nodiscard]] bool enabled() const { return !dir.empty(); }
};

/// Loads CAF's OpenSSL module into `cfg` with the files of `tls.dir`, after
/// checking them: each exists and is readable, parses as PEM, the key is the
/// certificate's, it is not readable by group or others, and the certificate
/// is valid (signed, not expired) under ca.pem. The error names the file and
/// what is wrong with it. The files are read once, here: CAF reads private
/// copies of them (sealed memfds) at every handshake, so the files in DIR may
/// change or go away while the process runs (restart it to use new ones).
/// Nothing is done when `tls.dir` is empty. Call it after the middleman is
/// loaded (client::configure) and before the actor system is made.
expected<void> configure_tls(caf::actor_system_config& cfg, const tls_options& tls);

/// True when `sys` was configured by configure_tls with a directory.
bool tls_enabled(caf::actor_system& sys);

/// The actor to send the middleman's requests to (connect_atom, publish_atom,
/// unpublish_atom, ...): the OpenSSL module's when TLS is configured, else the
/// plain middleman's. Its connections are TLS exactly when tls_enabled(sys).
caf::io::middleman_actor middleman_of(caf::actor_system& sys);

/// Publishes `whom` (with the interface `ifs`, from sys.message_types(handle))
/// on host:port ("" or "0.0.0.0": every IPv4 address), over TLS when
/// configured; port 0 picks a free one. Returns the port.
expected<uint16_t> publish(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                           const std::set<std::string>& ifs, uint16_t port,
                           const std::string& host);

/// Stops accepting connections for `whom` on `port` (0: on every port).
expected<void> unpublish(caf::actor_system& sys, const caf::actor_addr& whom, uint16_t port);

/// Connects to the actor published on host:port, over TLS when configured, and
/// checks that its interface is `ifs` (none: any). Fails with
/// errc::disconnected saying why (see connect_error) or errc::timeout when
/// nothing answered within `timeout`; a refused TLS handshake fails at once.
expected<caf::strong_actor_ptr> connect(caf::actor_system& sys, const std::string& host,
                                        uint16_t port, const std::set<std::string>& ifs = {},
                                        std::chrono::milliseconds timeout = std::chrono::seconds{60});

/// What a failed connect to host:port (as the middleman of middleman_of(sys)
/// reports it) means, in words: errc::disconnected with a message that starts
/// "cannot reach HOST:PORT: " and says whether TLS is the likely cause.
error connect_error(caf::actor_system& sys, const caf::error& e, const std::string& host,
                    uint16_t port);

} // namespace dsec
