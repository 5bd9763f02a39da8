// HOST:PORT, as every dsec program takes an address (`dsec --connect`, `dsecd
// --listen` and `--join`, `dsec-load --connect`, the Python SDK's connect):
// parsed once here, printed once here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/error.hpp"

namespace dsec {

/// A host (a name or an address; an IPv6 address without its brackets) and a port.
struct endpoint {
  std::string host;
  uint16_t port = 0;

  /// HOST:PORT, an IPv6 host in brackets ("[::1]:7070"): what parse_endpoint reads.
  [[nodiscard]] std::string to_string() const;
};

/// Whether port 0 (the kernel picks one: a listening address) is accepted.
enum class port_zero : bool { refused, allowed };

/// Parses "HOST:PORT" or "[IPV6]:PORT" (an unbracketed IPv6 address works too:
/// the port is after the last colon). `what` names the input in the error
/// (e.g. "--connect"), which says what was expected, repeats the value and
/// tells what is wrong with it: no colon, an empty host, a port that is missing,
/// not a number, 0 (unless `zero` allows it) or larger than 65535.
expected<endpoint> parse_endpoint(std::string_view value, std::string_view what,
                                  port_zero zero = port_zero::refused);

/// HOST:PORT for a host and port, an IPv6 host in brackets.
std::string format_endpoint(std::string_view host, uint16_t port);

} // namespace dsec
