// nft_elements: adds and removes elements of one nftables table's sets in one
// transaction, as netlink messages built with libnftnl and sent with libmnl.
//
// Why not libnftables (which makes the table, runtime/egress.cpp): each of
// its calls parses text and fetches the kernel's view of the table first, and
// for a change to an interval set it fetches every element of that set, so a
// create's or a destroy's cost grew with the egress sandboxes attached (about
// 0.75 ms to add a sandbox's elements, 2.5 ms to delete them, with one
// attached). This sends what `nft add element` / `nft delete element` would
// send (the same messages: `nft --debug=netlink` shows them), and nothing
// else. The table and its sets must exist: they are libnftables' to make.
//
// Keys are laid out as the kernel compares them: each field of a
// concatenation at a multiple of 4 bytes, in network order; an ifname is
// IFNAMSIZ bytes, zero-padded. An element of an interval set carries the key
// of its first and of its last value (a concatenation's range, as nft sends
// it for the kernel's pipapo sets).
//
// No CAF. Not thread-safe: its owner serialises the calls.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/error.hpp"

struct mnl_socket;

namespace dsec {

/// A set element's key: its fields, each padded to 4 bytes.
struct nft_key {
  std::array<uint8_t, 32> bytes{};
  uint8_t len = 0;
  /// An interface name (IFNAMSIZ bytes).
  nft_key& ifname(const std::string& name);
  /// An IPv4 address, given in host order.
  nft_key& ipv4(uint32_t addr);
  /// A TCP or UDP port (inet_service).
  nft_key& port(uint16_t port);
  friend bool operator==(const nft_key&, const nft_key&) = default;
};

struct nft_elem {
  nft_key key;
  nft_key key_end;        ///< an interval set's: the last value (len 0: none)
  uint64_t timeout_ms = 0; ///< a set with timeouts: this element's (0: the set's)
  friend bool operator==(const nft_elem&, const nft_elem&) = default;
};

/// Elements of one set.
struct nft_set_elems {
  std::string set;
  std::vector<nft_elem> elems;
};

class nft_elements {
public:
  /// A netlink socket for the sets of table `table` of family inet.
  static expected<nft_elements> open(std::string table);

  /// In one transaction, all or nothing: deletes `del` (each element must
  /// be there), then adds `add` (an element already there is left as it
  /// is, like `nft add element`). The error names the set and the verb.
  expected<void> apply(std::span<const nft_set_elems> del, std::span<const nft_set_elems> add);

  nft_elements(nft_elements&&) noexcept;
  nft_elements& operator=(nft_elements&&) noexcept;
  ~nft_elements();

private:
  nft_elements() = default;
  mnl_socket* nl_ = nullptr;
  uint32_t portid_ = 0;
  uint32_t seq_ = 0;
  std::string table_;
  std::vector<char> buf_; // the batch, reused
};

} // namespace dsec
