#include "runtime/metrics.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dsec::metrics {

namespace {

bool valid_name(std::string_view n, bool colon) {
  if (n.empty())
    return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'
              || (colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok)
      return false;
  }
  return true;
}

void escape_into(std::string& out, std::string_view v, bool quote) {
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (quote && c == '"')
      out += "\\\"";
    else
      out += c;
  }
}

// {a="x",b="y"}, with `extra` (le="...") last; nothing when both are empty.
void labels_into(std::string& out, const labels& l, const char* extra_name = nullptr,
                 const std::string& extra_value = {}) {
  if (l.empty() && !extra_name)
    return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : l) {
    if (!first)
      out += ',';
    first = false;
    out += k;
    out += "=\"";
    escape_into(out, v, true);
    out += '"';
  }
  if (extra_name) {
    if (!first)
      out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

void header_into(std::string& out, std::string_view name, std::string_view help,
                 std::string_view type) {
  out += "# HELP ";
  out += name;
  out += ' ';
  escape_into(out, help, false);
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

} // namespace

std::string format_value(double v) {
  if (std::isnan(v))
    return "NaN";
  if (std::isinf(v))
    return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 9.0e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else {
    // The shortest of 15 to 17 digits that reads back as v.
    for (int digits = 15; digits <= 17; ++digits) {
      std::snprintf(buf, sizeof buf, "%.*g", digits, v);
      if (std::strtod(buf, nullptr) == v)
        break;
    }
  }
  return buf;
}

// ---- histogram ---------------------------------------------------------------

histogram::histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  if (!std::is_sorted(bounds_.begin(), bounds_.end())
      || std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end())
    throw std::logic_error("histogram bounds must be strictly ascending");
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i)
    buckets_[i].store(0, std::memory_order_relaxed);
}

void histogram::observe(double v) noexcept {
  // le is inclusive: the first bound not below v.
  auto i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v)
                               - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

histogram::snapshot histogram::read() const {
  snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    acc += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = acc;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

double histogram::snapshot::quantile(double q) const {
  uint64_t n = count();
  if (n == 0 || bounds.empty())
    return 0;
  double rank = q * static_cast<double>(n);
  for (size_t i = 0; i < cumulative.size(); ++i) {
    if (static_cast<double>(cumulative[i]) < rank)
      continue;
    if (i == bounds.size()) // in +Inf: the highest finite bound, as Prometheus says
      return bounds.back();
    double lo = i == 0 ? 0 : bounds[i - 1];
    double below = i == 0 ? 0 : static_cast<double>(cumulative[i - 1]);
    double in = static_cast<double>(cumulative[i]) - below;
    if (in <= 0)
      return bounds[i];
    return lo + (bounds[i] - lo) * (rank - below) / in;
  }
  return bounds.back();
}

const std::vector<double>& latency_buckets() {
  static const std::vector<double> b{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                     0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                     5,      10,      30,     60};
  return b;
}

// ---- registry ----------------------------------------------------------------

registry::family& registry::family_of(std::string_view name, std::string_view help, kind k,
                                      const labels& l) {
  if (!valid_name(name, true))
    throw std::logic_error("malformed metric name '" + std::string{name} + "'");
  std::vector<std::string> names;
  for (const auto& [n, v] : l) {
    if (!valid_name(n, false) || n == "le" || n.rfind("__", 0) == 0)
      throw std::logic_error("malformed label name '" + n + "' of metric "
                             + std::string{name});
    names.push_back(n);
  }
  auto it = families_.find(name);
  if (it == families_.end()) {
    family f;
    f.k = k;
    f.help = std::string{help};
    f.label_names = names;
    it = families_.emplace(std::string{name}, std::move(f)).first;
  }
  if (it->second.k != k || it->second.label_names != names)
    throw std::logic_error("metric " + std::string{name}
                           + " registered again with another type or other labels");
  return it->second;
}

counter& registry::get_counter(std::string_view name, std::string_view help, const labels& l) {
  std::lock_guard<std::mutex> g{mu_};
  auto& f = family_of(name, help, kind::counter, l);
  auto& p = f.counters[l];
  if (!p)
    p = std::make_unique<counter>();
  return *p;
}

gauge& registry::get_gauge(std::string_view name, std::string_view help, const labels& l) {
  std::lock_guard<std::mutex> g{mu_};
  auto& f = family_of(name, help, kind::gauge, l);
  auto& p = f.gauges[l];
  if (!p)
    p = std::make_unique<gauge>();
  return *p;
}

histogram& registry::get_histogram(std::string_view name, std::string_view help,
                                   const std::vector<double>& bounds, const labels& l) {
  std::lock_guard<std::mutex> g{mu_};
  auto& f = family_of(name, help, kind::histogram, l);
  auto& p = f.histograms[l];
  if (!p)
    p = std::make_unique<histogram>(bounds);
  return *p;
}

uint64_t registry::add_collector(collector c) {
  std::lock_guard<std::mutex> g{mu_};
  auto h = next_collector_++;
  collectors_.emplace(h, std::move(c));
  return h;
}

void registry::remove_collector(uint64_t handle) {
  std::lock_guard<std::mutex> g{mu_};
  collectors_.erase(handle);
}

double registry::value(std::string_view name, const labels& l) const {
  std::lock_guard<std::mutex> g{mu_};
  auto it = families_.find(name);
  if (it == families_.end())
    return 0;
  if (auto c = it->second.counters.find(l); c != it->second.counters.end())
    return static_cast<double>(c->second->value());
  if (auto v = it->second.gauges.find(l); v != it->second.gauges.end())
    return v->second->value();
  return 0;
}

std::string registry::expose() const {
  std::vector<sample_family> computed;
  std::vector<collector> run;
  {
    std::lock_guard<std::mutex> g{mu_};
    for (const auto& [h, c] : collectors_)
      run.push_back(c);
  }
  for (const auto& c : run) // outside the lock: a collector may read the registry
    c(computed);
  std::string out;
  {
    std::lock_guard<std::mutex> g{mu_};
    for (const auto& [name, f] : families_) {
      switch (f.k) {
      case kind::counter:
        header_into(out, name, f.help, "counter");
        for (const auto& [l, c] : f.counters) {
          out += name;
          labels_into(out, l);
          out += ' ';
          out += format_value(static_cast<double>(c->value()));
          out += '\n';
        }
        break;
      case kind::gauge:
        header_into(out, name, f.help, "gauge");
        for (const auto& [l, v] : f.gauges) {
          out += name;
          labels_into(out, l);
          out += ' ';
          out += format_value(v->value());
          out += '\n';
        }
        break;
      case kind::histogram:
        header_into(out, name, f.help, "histogram");
        for (const auto& [l, h] : f.histograms) {
          auto s = h->read();
          for (size_t i = 0; i <= s.bounds.size(); ++i) {
            out += name;
            out += "_bucket";
            labels_into(out, l, "le", i < s.bounds.size() ? format_value(s.bounds[i]) : "+Inf");
            out += ' ';
            out += format_value(static_cast<double>(s.cumulative[i]));
            out += '\n';
          }
          out += name;
          out += "_sum";
          labels_into(out, l);
          out += ' ' + format_value(s.sum) + '\n';
          out += name;
          out += "_count";
          labels_into(out, l);
          out += ' ' + format_value(static_cast<double>(s.count())) + '\n';
        }
        break;
      }
    }
  }
  std::sort(computed.begin(), computed.end(),
            [](const sample_family& a, const sample_family& b) { return a.name < b.name; });
  for (const auto& f : computed) {
    header_into(out, f.name, f.help, f.type);
    for (size_t i = 0; i < f.samples.size(); ++i) {
      const auto& [l, v] = f.samples[i];
      out += f.name;
      if (i < f.suffixes.size())
        out += f.suffixes[i];
      labels_into(out, l);
      out += ' ' + format_value(v) + '\n';
    }
  }
  return out;
}

registry& process_registry() {
  static registry* r = new registry; // never destroyed: actors may publish during exit
  return *r;
}

// ---- the process -------------------------------------------------------------

namespace {

std::string read_small(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

void add_process_collector(registry& r) {
  static std::once_flag once;
  std::call_once(once, [&r] {
    r.add_collector([](std::vector<sample_family>& out) {
      static const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
      static const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
      auto stat = read_small("/proc/self/stat");
      // Fields after the command's closing parenthesis (the name may hold spaces).
      auto close = stat.rfind(')');
      if (close == std::string::npos)
        return;
      std::istringstream in(stat.substr(close + 2));
      std::vector<std::string> f;
      for (std::string w; in >> w;)
        f.push_back(w);
      // f[0] is field 3 (state): utime 14, stime 15, num_threads 20, starttime 22, rss 24.
      auto at = [&](size_t field) { return field - 3 < f.size() ? std::strtod(f[field - 3].c_str(), nullptr) : 0.0; };
      double cpu = (at(14) + at(15)) / tick;
      double rss = at(24) * page;
      double threads = at(20);
      double boot = 0;
      for (std::istringstream s(read_small("/proc/stat")); s;) {
        std::string key;
        s >> key;
        if (key == "btime") {
          s >> boot;
          break;
        }
        s.ignore(1 << 20, '\n');
      }
      double start = boot + at(22) / tick;
      double fds = 0;
      if (DIR* d = ::opendir("/proc/self/fd")) {
        while (auto* e = ::readdir(d))
          if (e->d_name[0] != '.')
            ++fds;
        ::closedir(d);
        --fds; // opendir's own
      }
      out.push_back({"process_cpu_seconds_total", "User and system CPU time spent in seconds.",
                     "counter", {{{}, cpu}}});
      out.push_back({"process_resident_memory_bytes", "Resident memory size in bytes.", "gauge",
                     {{{}, rss}}});
      out.push_back({"process_open_fds", "Number of open file descriptors.", "gauge",
                     {{{}, fds}}});
      out.push_back({"process_threads", "Number of OS threads in the process.", "gauge",
                     {{{}, threads}}});
      out.push_back({"process_start_time_seconds",
                     "Start time of the process since unix epoch in seconds.", "gauge",
                     {{{}, start}}});
    });
  });
}

} // namespace dsec::metrics
