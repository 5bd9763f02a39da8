// json: see json.hpp.
#include "runtime/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>

namespace dsec {

size_t utf8_sequence(const unsigned char* p, size_t n) noexcept {
  unsigned char c = p[0];
  if (c < 0x80)
    return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xbf; // the range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0)
      lo = 0xa0; // overlong
    else if (c == 0xed)
      hi = 0x9f; // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0)
      lo = 0x90; // overlong
    else if (c == 0xf4)
      hi = 0x8f; // above U+10FFFF
  } else {
    return 0;
  }
  if (n < len || p[1] < lo || p[1] > hi)
    return 0;
  for (size_t i = 2; i < len; ++i)
    if (p[i] < 0x80 || p[i] > 0xbf)
      return 0;
  return len;
}

void json_string(std::string& out, std::string_view s) {
  static const char hex[] = "0123456789abcdef";
  out += '"';
  auto p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = p[i];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20 || c == 0x7f) {
      switch (c) {
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
      }
      ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else if (size_t len = utf8_sequence(p + i, s.size() - i); len != 0) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out += "\\ufffd";
      ++i;
    }
  }
  out += '"';
}

void json_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void json_base64(std::string& out, std::string_view s) {
  static const char table[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  out += '"';
  auto p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  for (; i + 3 <= s.size(); i += 3) {
    uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    out += table[v >> 18];
    out += table[(v >> 12) & 63];
    out += table[(v >> 6) & 63];
    out += table[v & 63];
  }
  if (size_t rest = s.size() - i; rest != 0) {
    uint32_t v = uint32_t{p[i]} << 16;
    if (rest == 2)
      v |= uint32_t{p[i + 1]} << 8;
    out += table[v >> 18];
    out += table[(v >> 12) & 63];
    out += rest == 2 ? table[(v >> 6) & 63] : '=';
    out += '=';
  }
  out += '"';
}

std::string json_quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  json_string(out, s);
  return out;
}

} // namespace dsec
