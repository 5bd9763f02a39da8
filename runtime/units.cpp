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
  // One number with a unit, or several from larger to smaller units
  // ("1h30m", "2m30s", "1s500ms"); a bare number is seconds.
  auto rest = s;
  double ms = 0;
  int last_rank = 5; // h 4, m 3, s 2, ms 1
  bool first = true;
  do {
    double n = 0;
    if (!parse_number(rest, n))
      return bad(what, s, first ? "expected a number with a unit (ms, s, m, h), e.g. 30s or 1h30m"
                                : "expected a number after the unit");
    double unit;
    int rank;
    if (rest.empty() && first) {
      unit = 1000, rank = 2;
    } else if (rest.substr(0, 2) == "ms") {
      unit = 1, rank = 1, rest.remove_prefix(2);
    } else if (!rest.empty() && rest.front() == 's') {
      unit = 1000, rank = 2, rest.remove_prefix(1);
    } else if (!rest.empty() && rest.front() == 'm') {
      unit = 60'000, rank = 3, rest.remove_prefix(1);
    } else if (!rest.empty() && rest.front() == 'h') {
      unit = 3'600'000, rank = 4, rest.remove_prefix(1);
    } else {
      return bad(what, s, rest.empty() ? "a number without a unit after another (1h30m, not 1h30)"
                                       : "unknown unit (use ms, s, m or h)");
    }
    if (rank >= last_rank)
      return bad(what, s, "units must go from larger to smaller, each once (e.g. 1h30m)");
    last_rank = rank;
    ms += n * unit;
    first = false;
  } while (!rest.empty());
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
