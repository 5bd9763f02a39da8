#include "tools/load_report.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

namespace dsec::load {

namespace {

using nlohmann::json;

std::optional<double> nearest_rank(std::vector<double> v, double p) {
  if (v.empty())
    return std::nullopt;
  std::sort(v.begin(), v.end());
  auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

size_t bin_of(double at, double width, size_t bins) {
  if (!(at > 0))
    return 0;
  return std::min(bins - 1, static_cast<size_t>(at / width));
}

struct bin {
  size_t creates = 0, execs = 0, destroys = 0, failures = 0, chronus = 0;
  std::vector<double> create_ms;
};

std::vector<bin> timeline(const report_input& in, double width) {
  size_t n = std::max<size_t>(1, static_cast<size_t>(std::ceil(in.wall_s / width)));
  std::vector<bin> bins(n);
  for (size_t i = 0; i < in.create.at_s.size(); ++i) {
    auto& b = bins[bin_of(in.create.at_s[i], width, n)];
    ++b.creates;
    b.create_ms.push_back(in.create.ms[i]);
  }
  for (double t : in.exec.at_s)
    ++bins[bin_of(t, width, n)].execs;
  for (double t : in.destroy.at_s)
    ++bins[bin_of(t, width, n)].destroys;
  for (double t : in.chronus.at_s)
    ++bins[bin_of(t, width, n)].chronus;
  for (double t : in.failure_at_s)
    ++bins[bin_of(t, width, n)].failures;
  return bins;
}

std::vector<size_t> histogram(const std::vector<double>& ms) {
  const auto& bounds = bucket_bounds();
  std::vector<size_t> counts(bounds.size() + 1);
  for (double v : ms) {
    auto it = std::lower_bound(bounds.begin(), bounds.end(), v); // first bound >= v
    ++counts[static_cast<size_t>(it - bounds.begin())];
  }
  return counts;
}

json histogram_json(const std::vector<double>& ms) {
  auto counts = histogram(ms);
  const auto& bounds = bucket_bounds();
  json out = json::array();
  for (size_t i = 0; i < counts.size(); ++i)
    out.push_back({{"le_ms", i < bounds.size() ? json(bounds[i]) : json(nullptr)},
                   {"count", counts[i]}});
  return out;
}

json figures(const report_input& in) {
  json j;
  j["summary"] = in.summary_json.empty() ? json::object() : json::parse(in.summary_json);
  double w = bin_width(in.wall_s);
  j["bin_s"] = w;
  json tl = json::array();
  auto bins = timeline(in, w);
  for (size_t i = 0; i < bins.size(); ++i) {
    const auto& b = bins[i];
    auto p50 = nearest_rank(b.create_ms, 0.50), p99 = nearest_rank(b.create_ms, 0.99);
    tl.push_back({{"t", static_cast<double>(i) * w},
                  {"creates", b.creates},
                  {"execs", b.execs},
                  {"destroys", b.destroys},
                  {"failures", b.failures},
                  {"chronus", b.chronus},
                  {"create_p50_ms", p50 ? json(*p50) : json(nullptr)},
                  {"create_p99_ms", p99 ? json(*p99) : json(nullptr)}});
  }
  j["timeline"] = std::move(tl);
  j["histograms"] = {{"create", histogram_json(in.create.ms)},
                     {"exec", histogram_json(in.exec.ms)},
                     {"destroy", histogram_json(in.destroy.ms)},
                     {"chronus", histogram_json(in.chronus.ms)}};
  return j;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  if (v != 0 && std::fabs(v) < 0.01)
    std::snprintf(buf, sizeof buf, "%.3g", v);
  else
    std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

/// A tick step of 1, 2 or 5 times a power of ten giving about `n` ticks up to `max`.
double tick_step(double max, int n = 5) {
  if (!(max > 0))
    return 1;
  double raw = max / n, p = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p)
      return m * p;
  return 10 * p;
}

constexpr double plot_w = 760, plot_h = 220, left = 60, top = 20, bottom = 40;

struct line_series {
  std::string name, color;
  std::vector<std::optional<double>> y; // per bin; nullopt: a gap
};

/// A line chart over time: one polyline per series, axes, ticks and a legend.
std::string line_chart(const std::string& id, const std::string& title, const std::string& unit,
                       double width_s, const std::vector<line_series>& series) {
  size_t n = 0;
  double ymax = 0;
  for (const auto& s : series) {
    n = std::max(n, s.y.size());
    for (auto v : s.y)
      if (v)
        ymax = std::max(ymax, *v);
  }
  double xmax = std::max(width_s * static_cast<double>(n), width_s);
  double ystep = tick_step(ymax);
  double ytop = ymax > 0 ? std::ceil(ymax / ystep) * ystep : 1;
  auto X = [&](double t) { return left + t / xmax * plot_w; };
  auto Y = [&](double v) { return top + plot_h - v / ytop * plot_h; };
  std::ostringstream o;
  o << "<figure id=\"" << id << "\"><figcaption>" << escape(title) << "</figcaption>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"" << left + plot_w + 20
    << "\" height=\"" << top + plot_h + bottom << "\">\n";
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\""
    << plot_h << "\" fill=\"#fafafa\" stroke=\"#888\"/>\n";
  for (double v = 0; v <= ytop + ystep / 2; v += ystep)
    o << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << Y(v)
      << "\" y2=\"" << Y(v) << "\" stroke=\"#ddd\"/><text x=\"" << left - 6 << "\" y=\""
      << Y(v) + 4 << "\" text-anchor=\"end\">" << num(v) << "</text>\n";
  double xstep = tick_step(xmax, 8);
  for (double t = 0; t <= xmax + xstep / 2; t += xstep)
    o << "<text x=\"" << X(t) << "\" y=\"" << top + plot_h + 16 << "\" text-anchor=\"middle\">"
      << num(t) << "</text>\n";
  o << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << top + plot_h + 34
    << "\" text-anchor=\"middle\">seconds since the start (bins of " << num(width_s)
    << " s)</text>\n<text x=\"14\" y=\"" << top + plot_h / 2
    << "\" transform=\"rotate(-90 14 " << top + plot_h / 2 << ")\" text-anchor=\"middle\">"
    << escape(unit) << "</text>\n";
  double lx = left + 10;
  for (const auto& s : series) {
    // Each bin's value at its middle; a gap (no sample) breaks the line.
    std::string pts;
    auto flush = [&] {
      if (!pts.empty())
        o << "<polyline class=\"series\" data-series=\"" << escape(s.name)
          << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\" points=\"" << pts
          << "\"/>\n";
      pts.clear();
    };
    for (size_t i = 0; i < s.y.size(); ++i) {
      if (!s.y[i]) {
        flush();
        continue;
      }
      pts += num(X((static_cast<double>(i) + 0.5) * width_s)) + "," + num(Y(*s.y[i])) + " ";
    }
    flush();
    o << "<rect x=\"" << lx << "\" y=\"" << top + 6 << "\" width=\"12\" height=\"4\" fill=\""
      << s.color << "\"/><text x=\"" << lx + 16 << "\" y=\"" << top + 12 << "\">"
      << escape(s.name) << "</text>\n";
    lx += 24 + 7.0 * static_cast<double>(s.name.size());
  }
  o << "</svg></figure>\n";
  return o.str();
}

/// A histogram of latencies: the buckets from the first to the last non-empty one.
std::string histogram_chart(const std::string& kind, const std::vector<double>& ms) {
  auto counts = histogram(ms);
  const auto& bounds = bucket_bounds();
  std::ostringstream o;
  o << "<figure id=\"histogram-" << kind << "\"><figcaption>" << kind << " latency: "
    << ms.size() << " call" << (ms.size() == 1 ? "" : "s") << " by bucket (ms)</figcaption>\n";
  size_t first = counts.size(), last = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i]) {
      first = std::min(first, i);
      last = i;
    }
  if (first == counts.size()) {
    o << "<p class=\"empty\">none</p></figure>\n";
    return o.str();
  }
  size_t n = last - first + 1, cmax = *std::max_element(counts.begin(), counts.end());
  double bw = plot_w / static_cast<double>(n);
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"" << left + plot_w + 20
    << "\" height=\"" << top + plot_h + bottom << "\">\n"
    << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\""
    << plot_h << "\" fill=\"#fafafa\" stroke=\"#888\"/>\n"
    << "<text x=\"" << left - 6 << "\" y=\"" << top + 4 << "\" text-anchor=\"end\">" << cmax
    << "</text><text x=\"" << left - 6 << "\" y=\"" << top + plot_h << "\" text-anchor=\"end\">0"
    << "</text>\n";
  for (size_t i = first; i <= last; ++i) {
    double h = static_cast<double>(counts[i]) / static_cast<double>(cmax) * plot_h;
    double x = left + static_cast<double>(i - first) * bw;
    std::string label = i < bounds.size() ? "\u2264" + num(bounds[i]) : ">" + num(bounds.back());
    o << "<rect class=\"bar\" data-le=\"" << (i < bounds.size() ? num(bounds[i]) : "inf")
      << "\" data-count=\"" << counts[i] << "\" x=\"" << x + 1 << "\" y=\"" << top + plot_h - h
      << "\" width=\"" << std::max(1.0, bw - 2) << "\" height=\"" << h
      << "\" fill=\"#4878a8\"><title>" << escape(label) << " ms: " << counts[i]
      << "</title></rect>\n<text x=\"" << x + bw / 2 << "\" y=\"" << top + plot_h + 16
      << "\" text-anchor=\"middle\">" << escape(label) << "</text>\n";
  }
  o << "</svg></figure>\n";
  return o.str();
}

std::string summary_table(const json& s) {
  std::ostringstream o;
  o << "<table id=\"summary\">\n";
  for (const auto& [k, v] : s.items()) {
    if (v.is_array())
      continue; // failures and environments have their own tables
    std::string text;
    if (v.is_object()) {
      for (const auto& [sk, sv] : v.items())
        text += (text.empty() ? "" : ", ") + sk + " " + (sv.is_number() ? num(sv.get<double>())
                                                                        : sv.dump());
    } else if (v.is_number()) {
      text = num(v.get<double>());
    } else {
      text = v.is_string() ? v.get<std::string>() : v.dump();
    }
    o << "<tr><th>" << escape(k) << "</th><td>" << escape(text) << "</td></tr>\n";
  }
  o << "</table>\n";
  if (s.contains("failures") && !s["failures"].empty()) {
    o << "<h2>Failures</h2>\n<table id=\"failures\"><tr><th>count</th><th>message</th></tr>\n";
    for (const auto& f : s["failures"])
      o << "<tr><td>" << f.value("count", 0) << "</td><td>"
        << escape(f.value("message", std::string{})) << "</td></tr>\n";
    o << "</table>\n";
  }
  return o.str();
}

} // namespace

double bin_width(double wall_s, size_t max_bins) {
  for (double p = 0.1;; p *= 10)
    for (double m : {1.0, 2.0, 5.0})
      if (wall_s <= m * p * static_cast<double>(max_bins))
        return m * p;
}

const std::vector<double>& bucket_bounds() {
  static const std::vector<double> b = [] {
    std::vector<double> v;
    for (int e = -1; e <= 4; ++e)
      for (double m : {1.0, 2.0, 5.0})
        v.push_back(m * std::pow(10.0, e));
    v.push_back(1e5);
    return v;
  }();
  return b;
}

std::string report_json(const report_input& in) {
  return figures(in).dump(2) + "\n";
}

std::string report_html(const report_input& in) {
  auto j = figures(in);
  double w = j["bin_s"].get<double>();
  auto bins = timeline(in, w);
  auto per_s = [&](size_t bin::*field) {
    std::vector<std::optional<double>> y;
    for (const auto& b : bins)
      y.push_back(static_cast<double>(b.*field) / w);
    return y;
  };
  std::vector<line_series> rates = {{"creates/s", "#2a7", per_s(&bin::creates)},
                                    {"destroys/s", "#47c", per_s(&bin::destroys)},
                                    {"failures/s", "#c33", per_s(&bin::failures)}};
  if (!in.exec.ms.empty())
    rates.push_back({"execs/s", "#a6c", per_s(&bin::execs)});
  if (!in.chronus.ms.empty())
    rates.push_back({"chronus events/s", "#c80", per_s(&bin::chronus)});
  std::vector<std::optional<double>> p50, p99;
  for (const auto& b : bins) {
    p50.push_back(nearest_rank(b.create_ms, 0.50));
    p99.push_back(nearest_rank(b.create_ms, 0.99));
  }
  // The JSON goes into a <script>: "</" must not end it early ("<\/" is the same JSON).
  std::string data = j.dump();
  for (size_t at = data.find("</"); at != std::string::npos; at = data.find("</", at + 3))
    data.replace(at, 2, "<\\/");

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>"
    << escape(in.title) << "</title>\n<style>\n"
    << "body{font-family:sans-serif;margin:2em;color:#222}"
       "table{border-collapse:collapse;margin-bottom:1em}"
       "th,td{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:13px}"
       "svg text{font-size:11px}figure{margin:1em 0}figcaption{font-weight:bold}\n"
    << "</style></head><body>\n<h1>" << escape(in.title) << "</h1>\n"
    << summary_table(j["summary"]) << "<h2>Over time</h2>\n"
    << line_chart("rates", "calls completed per second", "per second", w, rates)
    << line_chart("create-latency", "create latency of the creates completed in each bin",
                  "ms", w, {{"p50", "#2a7", p50}, {"p99", "#c33", p99}})
    << "<h2>Latency histograms</h2>\n" << histogram_chart("create", in.create.ms)
    << histogram_chart("exec", in.exec.ms) << histogram_chart("destroy", in.destroy.ms);
  if (!in.chronus.ms.empty())
    o << histogram_chart("chronus", in.chronus.ms);
  o << "<script type=\"application/json\" id=\"dsec-load-data\">" << data
    << "</script>\n</body></html>\n";
  return o.str();
}

} // namespace dsec::load
