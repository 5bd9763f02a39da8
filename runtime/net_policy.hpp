// net_policy: the rules of an egress sandbox's network policy
// (environment::allow / environment::deny), parsed. No kernel objects here:
// runtime/egress.hpp turns a parsed policy into nftables set elements.
//
// A rule is one of
//   CIDR[:PORT[-PORT]]   an IPv4 address or network, optionally one port or a
//                        range of ports (TCP and UDP); no port: every port
//   DOMAIN               an exact DNS name (example.org)
//   *.DOMAIN             every name below DOMAIN (not DOMAIN itself)
//   NAME                 a service named in the node's --services file (pypi)
// A bare word without a dot is a service name; a word with a dot that is not
// an address is a domain.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"

namespace dsec {

/// An IPv4 network: `addr` in host byte order, the low 32-prefix bits zero.
struct ipv4_net {
  uint32_t addr = 0;
  uint8_t prefix = 32;

  [[nodiscard]] uint32_t first() const { return addr; }
  [[nodiscard]] uint32_t last() const {
    return prefix == 0 ? 0xffffffffu : prefix >= 32 ? addr : addr | (0xffffffffu >> prefix);
  }
  /// Whether every address of `inner` is in this network.
  [[nodiscard]] bool contains(const ipv4_net& inner) const {
    return inner.prefix >= prefix && inner.first() >= first() && inner.last() <= last();
  }
  [[nodiscard]] bool contains(uint32_t a) const { return a >= first() && a <= last(); }
  /// "10.0.0.0/8" ("1.2.3.4" for a /32).
  [[nodiscard]] std::string to_string() const;
  friend bool operator==(const ipv4_net&, const ipv4_net&) = default;
};

/// "1.2.3.4" from a host-order address.
std::string ipv4_to_string(uint32_t a);
/// Parses "A.B.C.D" or "A.B.C.D/N"; the host bits must be zero ("10.0.0.1/8"
/// is refused, naming the network it meant).
expected<ipv4_net> parse_ipv4_net(std::string_view text);

struct net_rule {
  enum class kind : uint8_t { cidr, domain, wildcard, service };
  kind what = kind::cidr;
  std::string text;      ///< as written
  ipv4_net net;          ///< cidr
  uint16_t port_lo = 0;  ///< cidr: 0-65535 when no port was given
  uint16_t port_hi = 65535;
  std::string name;      ///< domain (lower case), wildcard (the part after "*."), service
};

/// Parses one rule; the error names the rule and what is wrong with it.
expected<net_rule> parse_net_rule(std::string_view text);

/// The ranges an egress sandbox never reaches unless a rule names them (an
/// allow CIDR inside one of them): "this" network, RFC 1918, carrier-grade
/// NAT, loopback, link-local (with the cloud metadata address
/// 169.254.169.254), IETF protocol assignments, documentation ranges,
/// multicast and the reserved rest. Not the benchmarking range 198.18.0.0/15,
/// which dsec's tests use as "the internet" (a node adds it, or any range of
/// its own, with dsecd --deny-range).
std::vector<ipv4_net> always_denied_ranges();

/// Whether an allow rule "names" a denied range: its network lies inside one
/// of `special` (allow 10.1.0.0/16 opens that; allow 0.0.0.0/0 does not).
bool names_special(const ipv4_net& n, const std::vector<ipv4_net>& special);

} // namespace dsec
