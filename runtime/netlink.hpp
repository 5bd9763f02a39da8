// netlink: the few rtnetlink operations egress networking needs (links,
// addresses, routes), through libnl-route-3. One rtnl object is one netlink
// socket in one network namespace: the caller's, or a sandbox's (open_in,
// which enters it on the calling thread only long enough to make the socket).
// No CAF; not thread-safe (one per thread, or a lock around it).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/error.hpp"

struct nl_sock;

namespace dsec {

class rtnl {
public:
  /// A socket in the calling thread's network namespace.
  static expected<rtnl> open();
  /// A socket in the network namespace of `ns` (a namespace fd or a pidfd),
  /// made while the calling thread is in it; `home` (a namespace fd) is where
  /// the thread goes back to.
  static expected<rtnl> open_in(int ns, int home);

  /// A veth pair: `name` here, `peer` in the network namespace of process
  /// `peer_pid` (0: here too); both down (the kernel refuses to bring up
  /// one end before the pair is complete): set_up() each in its namespace.
  expected<void> add_veth(const std::string& name, const std::string& peer, pid_t peer_pid);
  /// The same, the peer in the network namespace `peer_ns` (a namespace fd).
  expected<void> add_veth_into(const std::string& name, const std::string& peer, int peer_ns);
  /// Brings the link up.
  expected<void> set_up(const std::string& name);
  /// set_up(), then index_of().
  expected<int> set_up_index(const std::string& name);
  /// A dummy link, up.
  expected<void> add_dummy(const std::string& name);
  /// The link's index, or not_found.
  expected<int> index_of(const std::string& name);
  expected<void> add_address(int ifindex, uint32_t addr, uint8_t prefix);
  /// The default route via `gw` (host order) out of `ifindex`.
  expected<void> add_default_route(int ifindex, uint32_t gw);
  /// Deletes the link (and its veth peer); not_found if there is none.
  expected<void> delete_link(const std::string& name);
  /// The names of the links whose name starts with `prefix`.
  expected<std::vector<std::string>> links_with_prefix(const std::string& prefix);
  /// Every IPv4 address of every link here (host order).
  expected<std::vector<uint32_t>> ipv4_addresses();

  rtnl(rtnl&&) noexcept;
  rtnl& operator=(rtnl&&) noexcept;
  ~rtnl();

private:
  explicit rtnl(nl_sock* s) : sk_(s) {}
  nl_sock* sk_ = nullptr;
};

} // namespace dsec
