// peer: who is on the other end of a TCP connection on this machine.
//
// A dsecd without TLS listens on loopback only, and admits a connection only
// when the process at its other end belongs to root or to a member of the
// group `dsec` (docs/security.md). TCP has no SO_PEERCRED, but both ends of a
// loopback connection are sockets of this machine's network namespace, and the
// kernel knows the owner of each: sock_diag (NETLINK_SOCK_DIAG, as `ss -e`
// reads it) looks the peer's socket up by its four-tuple and reports its uid.
// An unprivileged user cannot make a socket owned by another uid, so the check
// holds whatever the peer sends afterwards; it is made before the first byte.
#pragma once

#include <sys/types.h>

#include <string>

#include "runtime/error.hpp"

namespace dsec {

/// The other end of a connected TCP socket.
struct tcp_peer {
  bool loopback = false; ///< its address is 127.0.0.0/8, ::1 or ::ffff:127.x
  uid_t uid = static_cast<uid_t>(-1); ///< the owner of its socket (loopback only)
  std::string address;   ///< "127.0.0.1:40312" or "[::1]:40312"
};

/// Finds the other end of `fd` (a connected TCP socket). For a loopback peer
/// it also finds the uid that owns the peer's socket, through sock_diag; a
/// peer that is already gone fails with not_found.
expected<tcp_peer> tcp_peer_of(int fd);

/// The gid of group `name`, or -1 when there is no such group.
gid_t group_id(const char* name);

/// Whether `uid` is root or a member of group `gid` (its primary group or a
/// supplementary one, as /etc/group and NSS say); false for gid -1 unless root.
bool uid_in_group(uid_t uid, gid_t gid);

} // namespace dsec
