// door: how a dsecd without TLS lets a connection in.
//
// Without --tls, dsecd listens on loopback only, and before CAF reads a byte of
// a new connection its doorman asks the kernel who owns the other end
// (runtime/peer.hpp). Root and the members of the group `dsec` get in; any
// other local user's connection is closed at once and counted. With --tls the
// peer's certificate decides instead (actors/transport.cpp).
//
// CAF 0.17 lets a connected peer address every actor of the process by id and
// name any sender, so who may connect at all is the first boundary
// (docs/security.md has the rest).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include <caf/fwd.hpp>

#include "runtime/error.hpp"

namespace dsec {

/// What a door admitted and refused; shared by the doorman (on CAF's I/O
/// thread) and whoever reports it (node stats).
struct door_counts {
  std::atomic<uint64_t> admitted{0};
  std::atomic<uint64_t> refused{0};
};

/// Who may come in: root, and the members of this group (by name; a missing
/// group admits root only).
struct door_policy {
  std::string group = "dsec";
  std::shared_ptr<door_counts> counts = std::make_shared<door_counts>();
};

/// Publishes `whom` on host:port (plain TCP) like dsec::publish, with a
/// doorman that admits only local peers of root or of `policy.group`.
expected<uint16_t> publish_behind_door(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                                       const std::set<std::string>& ifs, uint16_t port,
                                       const std::string& host, door_policy policy);

} // namespace dsec
