#include "runtime/units.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

namespace dsec {

namespace {

error bad(std::string_view what, std::string_view s, std::string_view why) {
  return make_error(errc::invalid_argument, std::string{what} + ": bad value '"
                                              + std::string{s} + "': " + std::string{why});
}

// Parses a non-negative decimal number at the start of s; returns the rest.
bool parse_number(std::string_view& s, double& out) {
  size_t i = 0;
  bool digits = false, dot = false;
  while (i < s.size() && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !dot))) {
    if (s[i] == '.')
      dot = true;
    else
      digits = true;
    ++i;
  }
  if (!digits)
    return false;
  out = std::strtod(std::string{s.substr(0, i)}.c_str(), nullptr);
  s.remove_prefix(i);
  return true;
}

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

} // namespace

expected<uint64_t> parse_size(std::string_view s, std::string_view what) {
  auto rest = s;
  double n = 0;
  if (!parse_number(rest, n))
    return bad(what, s, "expected a number with an optional unit (k, m, g, t), e.g. 512m");
  double mult = 1;
  if (!rest.empty()) {
    switch (lower(rest.front())) {
      case 'b': mult = 1; rest.remove_prefix(1); break;
      case 'k': mult = 1024.0; rest.remove_prefix(1); break;
      case 'm': mult = 1024.0 * 1024; rest.remove_prefix(1); break;
      case 'g': mult = 1024.0 * 1024 * 1024; rest.remove_prefix(1); break;
      case 't': mult = 1024.0 * 1024 * 1024 * 1024; rest.remove_prefix(1); break;
      default: return bad(what, s, "unknown unit (use k, m, g or t)");
    }
    if (mult > 1) {
      if (!rest.empty() && lower(rest.front()) == 'i')
        rest.remove_prefix(1);
      if (!rest.empty() && lower(rest.front()) == 'b')
        rest.remove_prefix(1);
    }
    if (!rest.empty())
      return bad(what, s, "trailing characters after the unit");
  }
  double bytes = n * mult;
  if (bytes >= static_cast<double>(std::numeric_limits<uint64_t>::max()))
    return bad(what, s, "too large");
  return static_cast<uint64_t>(std::llround(bytes));
}

expected<std::chrono::milliseconds> parse_duration(std::string_view s,
                                                   std::string_view what) {
  auto rest = s;
  double n = 0;
  if (!parse_number(rest, n))
    return bad(what, s, "expected a number with a unit (ms, s, m, h), e.g. 30s");
  double ms;
  if (rest.empty() || rest == "s")
    ms = n * 1000;
  else if (rest == "ms")
    ms = n;
  else if (rest == "m")
    ms = n * 60'000;
  else if (rest == "h")
    ms = n * 3'600'000;
  else
    return bad(what, s, "unknown unit (use ms, s, m or h)");
  if (ms > 1e15)
    return bad(what, s, "too large");
  return std::chrono::milliseconds{static_cast<int64_t>(std::llround(ms))};
}

std::string format_size(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else if (v == std::floor(v))
    std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string format_duration(std::chrono::milliseconds d) {
  auto ms = d.count();
  char buf[32];
  if (ms < 1000)
    std::snprintf(buf, sizeof buf, "%lldms", static_cast<long long>(ms));
  else if (ms % 3'600'000 == 0)
    std::snprintf(buf, sizeof buf, "%lldh", static_cast<long long>(ms / 3'600'000));
  else if (ms % 60'000 == 0)
    std::snprintf(buf, sizeof buf, "%lldm", static_cast<long long>(ms / 60'000));
  else if (ms % 1000 == 0)
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(ms / 1000));
  else
    std::snprintf(buf, sizeof buf, "%.3gs", static_cast<double>(ms) / 1000);
  return buf;
}

} // namespace dsec
