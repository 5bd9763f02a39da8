// port_forward: exposed ports (docs/network.md, "Exposed ports"). A node's
// user-space TCP forwarder: each exposed port is a listening socket on the
// node (dsecd --expose-address, loopback by default; the port chosen by the
// kernel), and each connection accepted there is joined to a connection to
// 127.0.0.1:PORT made inside the sandbox's own network namespace.
//
// Why a proxy and not a DNAT: it works for loopback sandboxes (no veth, no
// route to them) as well as egress ones, reaches servers that listen on the
// sandbox's loopback only, needs no route_localnet or nft rule (so a killed
// daemon leaves nothing: its sockets die with it), and the egress policy's
// chains never see the forwarded traffic (it enters the sandbox on `lo`).
//
// The sandbox controls one end of every forwarded connection, so:
//  - every socket is non-blocking and one thread (epoll) moves the bytes: no
//    call of the daemon ever waits on a sandbox's socket;
//  - each connection has two fixed buffers (options.buffer bytes per
//    direction): a side that does not read stops the other side's reads
//    (TCP's own flow control then holds the writer), nothing grows;
//  - at most options.per_port connections per exposed port and
//    options.max_connections in all; a connection past either is closed at
//    once (counted as refused);
//  - a connection through which no byte moved either way for
//    options.idle_timeout is closed (the trainer's side reset, the sandbox's
//    closed), so a server that never answers cannot hold its slots for good.
// The inner socket is made by the forwarder's thread after a setns() to the
// sandbox's pidfd and straight back (a pidfd does not keep the namespace
// alive: a forward never keeps a sandbox's network, or its veth, from going).
//
// No CAF. Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

namespace dsec {

struct port_forward_options {
  /// dsecd --expose-address ADDR: where exposed ports listen (an IPv4 or
  /// IPv6 address of the node; 0.0.0.0 or :: for every address).
  std::string address = "127.0.0.1";
  size_t buffer = 64 * 1024;     ///< bytes per direction per connection
  size_t per_port = 64;          ///< connections at once per exposed port
  size_t max_connections = 1024; ///< connections at once, all ports together
  /// dsecd --expose-idle-timeout: a connection idle (no byte either way) this
  /// long is closed; 0: never.
  std::chrono::milliseconds idle_timeout{std::chrono::hours(1)};
};

class port_forwarder;
struct port_forward_impl;

/// One exposed port. The destructor closes its listener and every
/// connection through it before it returns.
class port_forward {
public:
  [[nodiscard]] uint16_t port() const { return port_; }           ///< inside the sandbox
  [[nodiscard]] const std::string& host() const { return host_; } ///< the node's address
  [[nodiscard]] uint16_t host_port() const { return host_port_; }
  ~port_forward();
  port_forward(const port_forward&) = delete;
  port_forward& operator=(const port_forward&) = delete;

private:
  friend class port_forwarder;
  port_forward() = default;
  std::shared_ptr<port_forward_impl> owner_; // harmless after the forwarder stopped
  uint64_t id_ = 0;
  uint16_t port_ = 0;
  std::string host_;
  uint16_t host_port_ = 0;
};

class port_forwarder {
public:
  /// Checks the address and starts the forwarder's thread.
  static expected<std::unique_ptr<port_forwarder>> start(const port_forward_options& opts);

  /// Listens on a fresh port of options.address; each connection there is
  /// forwarded to 127.0.0.1:`port` in the network namespace of the process
  /// `pidfd` refers to (dup'ed: the caller keeps its own).
  expected<std::unique_ptr<port_forward>> expose(int pidfd, uint16_t port);

  struct counters {
    uint64_t forwards = 0;    ///< exposed ports now
    uint64_t connections = 0; ///< open now
    uint64_t accepted = 0;    ///< since start, joined to the sandbox's side
    uint64_t refused = 0;     ///< since start: over a limit, sandbox gone, nothing listening
    uint64_t bytes = 0;       ///< since start, both directions
    uint64_t idle_closed = 0; ///< since start: closed after options.idle_timeout idle
  };
  [[nodiscard]] counters stats() const;
  [[nodiscard]] const port_forward_options& options() const { return opts_; }

  /// Stops the thread; closes every socket.
  ~port_forwarder();
  port_forwarder(const port_forwarder&) = delete;
  port_forwarder& operator=(const port_forwarder&) = delete;

private:
  port_forwarder() = default;
  port_forward_options opts_;
  std::shared_ptr<port_forward_impl> impl_;
};

} // namespace dsec
