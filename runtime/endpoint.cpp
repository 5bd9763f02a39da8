#include "runtime/endpoint.hpp"

namespace dsec {

std::string format_endpoint(std::string_view host, uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos)
    out.append("[").append(host).append("]");
  else
    out.append(host);
  return out + ":" + std::to_string(port);
}

std::string endpoint::to_string() const {
  return format_endpoint(host, port);
}

expected<endpoint> parse_endpoint(std::string_view value, std::string_view what,
                                  port_zero zero) {
  const bool zero_ok = zero == port_zero::allowed;
  auto bad = [&](std::string_view why) {
    return make_error(errc::invalid_argument,
                      std::string{what} + ": expected HOST:PORT (a port from "
                        + (zero_ok ? "0" : "1") + " to 65535), got '" + std::string{value}
                        + "': " + std::string{why});
  };
  auto colon = value.rfind(':');
  if (colon == std::string_view::npos)
    return bad("no ':' before a port");
  endpoint ep;
  auto host = value.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  else if (host.find_first_of("[]") != std::string_view::npos)
    return bad("a bracket that does not enclose the whole host (write [IPV6]:PORT)");
  if (host.empty())
    return bad("the host is empty");
  auto port = value.substr(colon + 1);
  if (port.empty())
    return bad("the port is missing");
  uint32_t n = 0;
  for (char c : port) {
    if (c < '0' || c > '9')
      return bad("the port '" + std::string{port} + "' is not a number");
    n = n * 10 + static_cast<uint32_t>(c - '0');
    if (n > 65535)
      return bad("the port '" + std::string{port} + "' is larger than 65535");
  }
  if (n == 0 && !zero_ok)
    return bad("port 0 is not a port one can connect to");
  ep.host = std::string{host};
  ep.port = static_cast<uint16_t>(n);
  return ep;
}

} // namespace dsec
