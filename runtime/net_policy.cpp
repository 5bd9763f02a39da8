#include "runtime/net_policy.hpp"

#include <arpa/inet.h>

#include <cctype>
#include <charconv>

namespace dsec {

std::string ipv4_to_string(uint32_t a) {
  return std::to_string(a >> 24) + "." + std::to_string((a >> 16) & 255) + "."
         + std::to_string((a >> 8) & 255) + "." + std::to_string(a & 255);
}

std::string ipv4_net::to_string() const {
  auto s = ipv4_to_string(addr);
  return prefix == 32 ? s : s + "/" + std::to_string(prefix);
}

expected<ipv4_net> parse_ipv4_net(std::string_view text) {
  auto slash = text.find('/');
  std::string host{text.substr(0, slash)};
  in_addr a{};
  if (host.empty() || ::inet_pton(AF_INET, host.c_str(), &a) != 1)
    return make_error(errc::invalid_argument,
                      "'" + std::string{text} + "' is not an IPv4 address or network (A.B.C.D[/N])");
  ipv4_net n;
  n.addr = ntohl(a.s_addr);
  if (slash != std::string_view::npos) {
    auto p = text.substr(slash + 1);
    unsigned v = 0;
    auto r = std::from_chars(p.data(), p.data() + p.size(), v);
    if (p.empty() || r.ec != std::errc{} || r.ptr != p.data() + p.size() || v > 32)
      return make_error(errc::invalid_argument, "'" + std::string{text}
                                                  + "': the prefix length must be 0 to 32");
    n.prefix = static_cast<uint8_t>(v);
  }
  uint32_t mask = n.prefix == 0 ? 0 : 0xffffffffu << (32 - n.prefix);
  if ((n.addr & ~mask) != 0) {
    ipv4_net meant{n.addr & mask, n.prefix};
    return make_error(errc::invalid_argument, "'" + std::string{text}
                                                + "' has host bits set (did you mean "
                                                + meant.to_string() + "?)");
  }
  return n;
}

namespace {

expected<uint16_t> parse_port(std::string_view p, std::string_view rule) {
  unsigned v = 0;
  auto r = std::from_chars(p.data(), p.data() + p.size(), v);
  if (p.empty() || r.ec != std::errc{} || r.ptr != p.data() + p.size() || v == 0 || v > 65535)
    return make_error(errc::invalid_argument, "rule '" + std::string{rule} + "': port '"
                                                + std::string{p}
                                                + "' is not a number from 1 to 65535");
  return static_cast<uint16_t>(v);
}

bool dns_label_ok(std::string_view l) {
  if (l.empty() || l.size() > 63 || l.front() == '-' || l.back() == '-')
    return false;
  for (char c : l)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_')
      return false;
  return true;
}

bool dns_name_ok(std::string_view n) {
  if (n.empty() || n.size() > 253)
    return false;
  size_t at = 0;
  for (;;) {
    auto dot = n.find('.', at);
    if (!dns_label_ok(n.substr(at, dot - at)))
      return false;
    if (dot == std::string_view::npos)
      return true;
    at = dot + 1;
  }
}

std::string lower(std::string_view s) {
  std::string out{s};
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

} // namespace

expected<net_rule> parse_net_rule(std::string_view text) {
  net_rule r;
  r.text = std::string{text};
  if (text.empty())
    return make_error(errc::invalid_argument, "an empty network rule (expected CIDR[:PORT], "
                                              "DOMAIN, *.DOMAIN or a service name)");
  bool looks_ip = std::isdigit(static_cast<unsigned char>(text.front()))
                  && text.find_first_not_of("0123456789./:-") == std::string_view::npos;
  if (looks_ip) {
    auto colon = text.find(':');
    auto ip = parse_ipv4_net(text.substr(0, colon));
    if (!ip)
      return make_error(errc::invalid_argument,
                        "rule '" + r.text + "': " + ip.error_value().message);
    r.what = net_rule::kind::cidr;
    r.net = *ip;
    if (colon != std::string_view::npos) {
      auto ports = text.substr(colon + 1);
      auto dash = ports.find('-');
      DSEC_TRY(lo, parse_port(ports.substr(0, dash), text));
      r.port_lo = r.port_hi = lo;
      if (dash != std::string_view::npos) {
        DSEC_TRY(hi, parse_port(ports.substr(dash + 1), text));
        if (hi < lo)
          return make_error(errc::invalid_argument, "rule '" + r.text
                                                      + "': the port range ends before it starts");
        r.port_hi = hi;
      }
    }
    return r;
  }
  if (text.starts_with("*.")) {
    auto rest = text.substr(2);
    if (rest.find('.') == std::string_view::npos || !dns_name_ok(rest))
      return make_error(errc::invalid_argument,
                        "rule '" + r.text + "': '*.' must be followed by a domain with a dot "
                                            "(*.example.org)");
    r.what = net_rule::kind::wildcard;
    r.name = lower(rest);
    return r;
  }
  if (text.find('.') == std::string_view::npos) {
    if (!dns_label_ok(text))
      return make_error(errc::invalid_argument,
                        "rule '" + r.text + "' is not a CIDR[:PORT], a domain or a service name "
                                            "(letters, digits, '-' and '_')");
    r.what = net_rule::kind::service;
    r.name = lower(text);
    return r;
  }
  auto name = text.back() == '.' ? text.substr(0, text.size() - 1) : text;
  if (!dns_name_ok(name))
    return make_error(errc::invalid_argument,
                      "rule '" + r.text + "' is not a CIDR[:PORT], a domain or a service name");
  r.what = net_rule::kind::domain;
  r.name = lower(name);
  return r;
}

std::vector<ipv4_net> always_denied_ranges() {
  const char* ranges[] = {"0.0.0.0/8",     "10.0.0.0/8",      "100.64.0.0/10",  "127.0.0.0/8",
                          "169.254.0.0/16", "172.16.0.0/12",  "192.0.0.0/24",   "192.0.2.0/24",
                          "192.168.0.0/16", "198.51.100.0/24", "203.0.113.0/24",
                          "224.0.0.0/3"};
  std::vector<ipv4_net> out;
  for (auto* r : ranges)
    out.push_back(*parse_ipv4_net(r));
  return out;
}

bool names_special(const ipv4_net& n, const std::vector<ipv4_net>& special) {
  for (const auto& s : special)
    if (s.contains(n))
      return true;
  return false;
}

} // namespace dsec
