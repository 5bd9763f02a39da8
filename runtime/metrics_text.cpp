#include "runtime/metrics_text.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

namespace dsec::metrics {

std::string sample::label(std::string_view k) const {
  for (const auto& [n, v] : l)
    if (n == k)
      return v;
  return {};
}

namespace {

bool name_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'
         || (!first && c >= '0' && c <= '9');
}

double parse_number(std::string_view t, bool& ok) {
  ok = true;
  if (t == "+Inf" || t == "Inf")
    return INFINITY;
  if (t == "-Inf")
    return -INFINITY;
  if (t == "NaN")
    return NAN;
  std::string s{t};
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  ok = !s.empty() && end == s.c_str() + s.size();
  return v;
}

} // namespace

expected<std::vector<sample>> parse_text(std::string_view text) {
  std::vector<sample> out;
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    auto nl = text.find('\n');
    auto line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    auto bad = [&](const char* why) {
      return make_error(errc::malformed, "metrics text, line " + std::to_string(line_no) + ": "
                                           + why + ": '" + std::string{line.substr(0, 80)}
                                           + "'");
    };
    if (line.empty() || line[0] == '#')
      continue;
    sample s;
    size_t i = 0;
    while (i < line.size() && name_char(line[i], i == 0))
      ++i;
    if (i == 0)
      return bad("expected a metric name");
    s.name = std::string{line.substr(0, i)};
    if (i < line.size() && line[i] == '{') {
      ++i;
      for (;;) {
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        size_t k = i;
        while (i < line.size() && name_char(line[i], i == k) && line[i] != ':')
          ++i;
        if (i == k || i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"')
          return bad("expected label=\"value\"");
        std::string key{line.substr(k, i - k)};
        i += 2;
        std::string value;
        for (;;) {
          if (i >= line.size())
            return bad("an unfinished label value");
          char c = line[i++];
          if (c == '"')
            break;
          if (c == '\\') {
            if (i >= line.size())
              return bad("an unfinished escape");
            char e = line[i++];
            value += e == 'n' ? '\n' : e;
          } else {
            value += c;
          }
        }
        s.l.emplace_back(std::move(key), std::move(value));
        if (i < line.size() && line[i] == ',')
          ++i;
      }
    }
    if (i >= line.size() || line[i] != ' ')
      return bad("expected a space before the value");
    while (i < line.size() && line[i] == ' ')
      ++i;
    auto rest = line.substr(i);
    auto sp = rest.find(' ');
    bool ok = false;
    s.value = parse_number(rest.substr(0, sp), ok);
    if (!ok)
      return bad("expected a number");
    out.push_back(std::move(s));
  }
  return out;
}

double sum_of(const std::vector<sample>& s, std::string_view name, const labels& match) {
  double total = 0;
  for (const auto& x : s) {
    if (x.name != name)
      continue;
    bool all = std::all_of(match.begin(), match.end(),
                           [&](const auto& kv) { return x.label(kv.first) == kv.second; });
    if (all)
      total += x.value;
  }
  return total;
}

histogram::snapshot histogram_of(const std::vector<sample>& s, std::string_view name) {
  std::string bucket = std::string{name} + "_bucket";
  std::map<double, double> by_le;
  for (const auto& x : s) {
    if (x.name != bucket)
      continue;
    bool ok = false;
    double le = parse_number(x.label("le"), ok);
    if (ok)
      by_le[le] += x.value;
  }
  histogram::snapshot h;
  for (const auto& [le, n] : by_le) {
    if (!std::isinf(le))
      h.bounds.push_back(le);
    h.cumulative.push_back(static_cast<uint64_t>(n));
  }
  if (!by_le.empty() && !std::isinf(by_le.rbegin()->first))
    h.cumulative.push_back(h.cumulative.back()); // no +Inf line: as many as the last
  h.sum = sum_of(s, std::string{name} + "_sum");
  return h;
}

histogram::snapshot difference(const histogram::snapshot& b, const histogram::snapshot& a) {
  if (a.bounds != b.bounds)
    return b; // a restarted exporter with other buckets: all of b is new
  auto d = b;
  for (size_t i = 0; i < d.cumulative.size() && i < a.cumulative.size(); ++i)
    d.cumulative[i] = d.cumulative[i] >= a.cumulative[i] ? d.cumulative[i] - a.cumulative[i] : 0;
  d.sum = b.sum - a.sum;
  return d;
}

} // namespace dsec::metrics
