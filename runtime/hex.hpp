// hex: the value of one hexadecimal digit, for the parsers of dsec's 64-digit
// secrets (runtime/chronus.hpp's token, actors/surface.hpp's keys).
#pragma once

namespace dsec {

/// 0..15 for '0'-'9', 'a'-'f' and 'A'-'F'; -1 for anything else.
constexpr int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

} // namespace dsec
