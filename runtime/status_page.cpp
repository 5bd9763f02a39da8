#include "runtime/status_page.hpp"

#include <nlohmann/json.hpp>

#include "runtime/metrics_text.hpp"

namespace dsec::metrics {

namespace {

using njson = nlohmann::json;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
    .count();
}

std::vector<sample> scrape(const registry& r) {
  auto s = parse_text(r.expose());
  return s ? std::move(*s) : std::vector<sample>{};
}

/// Samples of `name` by the value of their label `key`.
std::map<std::string, double> by_label(const std::vector<sample>& s, std::string_view name,
                                       std::string_view key) {
  std::map<std::string, double> out;
  for (const auto& x : s)
    if (x.name == name)
      out[x.label(key)] += x.value;
  return out;
}

bool has_series(const std::vector<sample>& s, std::string_view name) {
  for (const auto& x : s)
    if (x.name == name)
      return true;
  return false;
}

njson quantile_ms(const histogram::snapshot& h, double q) {
  if (h.count() == 0)
    return nullptr;
  return h.quantile(q) * 1000;
}

} // namespace

status_history::status_history(registry& r, std::chrono::milliseconds interval, size_t points)
  : reg_(r), interval_(interval), points_(std::max<size_t>(points, 2)) {
  sample();
  thread_ = std::thread([this] {
    std::unique_lock g{mu_};
    while (!cv_.wait_for(g, interval_, [this] { return stop_; })) {
      g.unlock();
      sample();
      g.lock();
    }
  });
}

status_history::~status_history() {
  {
    std::lock_guard g{mu_};
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void status_history::sample() {
  auto s = scrape(reg_); // outside the lock: collectors may take a while
  point p;
  p.t = unix_now();
  // A coordinator's rates are its cluster's (its nodes' heartbeat counters);
  // any other daemon's its own.
  bool cluster = has_series(s, "dsec_cluster_node_creates_total");
  p.creates = sum_of(s, cluster ? "dsec_cluster_node_creates_total" : "dsec_sandbox_creates_total");
  p.destroys =
    sum_of(s, cluster ? "dsec_cluster_node_destroys_total" : "dsec_sandbox_destroys_total");
  p.failures =
    sum_of(s, cluster ? "dsec_cluster_node_failures_total" : "dsec_sandbox_failures_total");
  p.live = sum_of(s, "dsec_sandboxes_live");
  // A coordinator's create latency is its cluster's too (the nodes'
  // histograms from their heartbeats, dsec_cluster_create_seconds).
  bool cluster_latency = has_series(s, "dsec_cluster_create_seconds_bucket");
  p.create_seconds = histogram_of(
    s, cluster_latency ? "dsec_cluster_create_seconds" : "dsec_sandbox_create_seconds");
  p.node_live = by_label(s, "dsec_cluster_node_live", "node");
  std::lock_guard g{mu_};
  history_.push_back(std::move(p));
  while (history_.size() > points_)
    history_.pop_front();
}

size_t status_history::size() const {
  std::lock_guard g{mu_};
  return history_.size();
}

std::string status_history::json() const {
  auto s = scrape(reg_);
  njson j;
  j["now"] = unix_now();
  j["interval_s"] = std::chrono::duration<double>(interval_).count();
  for (const auto& x : s)
    if (x.name == "dsec_build_info") {
      j["version"] = x.label("version");
      j["role"] = x.label("role");
    }
  // The cluster's nodes, as the coordinator's heartbeats tell them (a
  // standalone daemon has none: it shows its own sandboxes below).
  auto up = by_label(s, "dsec_cluster_node_up", "node");
  auto age = by_label(s, "dsec_cluster_node_heartbeat_age_seconds", "node");
  auto slots = by_label(s, "dsec_cluster_node_slots", "node");
  auto live = by_label(s, "dsec_cluster_node_live", "node");
  auto cordoned = by_label(s, "dsec_cluster_node_cordoned", "node");
  j["nodes"] = njson::array();
  for (const auto& [node, u] : up) {
    njson n{{"node", node},
           {"up", u > 0},
           {"slots", slots[node]},
           {"live", live[node]},
           {"cordoned", cordoned[node] > 0}};
    n["heartbeat_age_s"] = age.count(node) ? njson(age[node]) : njson(nullptr);
    j["nodes"].push_back(std::move(n));
  }
  if (!up.empty())
    j["cluster"] = {{"created", sum_of(s, "dsec_cluster_node_creates_total")},
                    {"destroyed", sum_of(s, "dsec_cluster_node_destroys_total")},
                    {"failed", sum_of(s, "dsec_cluster_node_failures_total")},
                    {"live", sum_of(s, "dsec_cluster_node_live")}};
  j["rates_of"] = up.empty() ? "this daemon" : "the cluster (the nodes' heartbeats)";
  j["latency_of"] = has_series(s, "dsec_cluster_create_seconds_bucket") ? "the cluster's nodes (their heartbeats)"
                                    : "this daemon's own node";
  j["sessions"] = sum_of(s, "dsec_sessions");
  j["sandboxes"] = {{"live", sum_of(s, "dsec_sandboxes_live")},
                    {"creating", sum_of(s, "dsec_sandboxes_creating")},
                    {"pooled", sum_of(s, "dsec_sandboxes_pooled")},
                    {"paused", sum_of(s, "dsec_sandboxes_paused")},
                    {"slots", sum_of(s, "dsec_slots")},
                    {"slots_used", sum_of(s, "dsec_slots_used")},
                    {"created", sum_of(s, "dsec_sandbox_creates_total")},
                    {"destroyed", sum_of(s, "dsec_sandbox_destroys_total")},
                    {"failed", sum_of(s, "dsec_sandbox_failures_total")}};
  j["failures_by_reason"] = by_label(s, "dsec_sandbox_failures_total", "reason");
  j["layers"] = {{"cache_bytes", sum_of(s, "dsec_layer_cache_bytes")},
                 {"hits", sum_of(s, "dsec_layer_cache_hits_total")},
                 {"misses", sum_of(s, "dsec_layer_cache_misses_total")},
                 {"evictions", sum_of(s, "dsec_layer_cache_evictions_total")},
                 {"fetches", sum_of(s, "dsec_layer_fetches_total")},
                 {"fetch_bytes", sum_of(s, "dsec_layer_fetch_bytes_total")}};
  j["process"] = {{"rss_bytes", sum_of(s, "process_resident_memory_bytes")},
                  {"cpu_seconds", sum_of(s, "process_cpu_seconds_total")},
                  {"open_fds", sum_of(s, "process_open_fds")},
                  {"threads", sum_of(s, "process_threads")}};
  // The history: each entry covers the interval since the one before.
  njson h = njson::array();
  {
    std::lock_guard g{mu_};
    for (size_t i = 1; i < history_.size(); ++i) {
      const auto &a = history_[i - 1], &b = history_[i];
      double dt = b.t - a.t;
      if (!(dt > 0))
        continue;
      auto d = difference(b.create_seconds, a.create_seconds);
      h.push_back({{"t", b.t},
                   {"dt_s", dt},
                   {"creates_per_s", std::max(0.0, b.creates - a.creates) / dt},
                   {"destroys_per_s", std::max(0.0, b.destroys - a.destroys) / dt},
                   {"failures_per_s", std::max(0.0, b.failures - a.failures) / dt},
                   {"live", b.live},
                   {"create_p50_ms", quantile_ms(d, 0.50)},
                   {"create_p99_ms", quantile_ms(d, 0.99)},
                   {"nodes_live", b.node_live}});
    }
  }
  j["history"] = std::move(h);
  return j.dump();
}

const std::string& status_html() {
  static const std::string page = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dsec status</title>
<style>
body{font-family:sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1em}
th,td{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:13px}
td.num{text-align:right}.down{color:#c33;font-weight:bold}
svg text{font-size:11px}figure{margin:0.5em 0}figcaption{font-weight:bold}
#error{color:#c33}
</style></head><body>
<h1>dsec status <span id="role"></span></h1>
<p id="updated">loading /status.json &hellip;</p><p id="error"></p>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>node</th><th>state</th><th>heartbeat age s</th>
<th>slots</th><th>live</th></tr></thead><tbody></tbody></table>
<h2>This daemon</h2>
<table id="daemon"><tbody></tbody></table>
<h2>Layer store</h2>
<table id="layers"><tbody></tbody></table>
<h2>The last minutes</h2>
<figure id="plot-rates"><figcaption>per second: creates, destroys, failures</figcaption></figure>
<figure id="plot-latency"><figcaption>create latency of this daemon's own node, ms (p50, p99 per
interval)</figcaption></figure>
<figure id="plot-live"><figcaption>live sandboxes per node</figcaption></figure>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#2a7", "#47c", "#c33", "#a6c", "#c80", "#088", "#777"];
// A bearer token, if the daemon needs one, comes in the fragment: /status#token=T
const token = new URLSearchParams(location.hash.slice(1)).get("token");
function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(NS, tag.slice(4))
                                   : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v !== "number") return String(v);
  return Math.abs(v) >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toPrecision(3);
}
function bytes(v) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; ++i; }
  return fmt(v) + " " + u[i];
}
function rows(id, pairs) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...pairs.map(([k, v]) => {
    const tr = el("tr");
    tr.append(el("th", {}, k), el("td", {class: "num"}, v));
    return tr;
  }));
}
// A line chart: series [{name, points: [[t, v|null]...]}] over the same times.
function plot(id, series) {
  const fig = document.getElementById(id);
  const W = 760, H = 180, L = 50, T = 10, B = 30;
  const svg = el("svg:svg", {width: W + L + 20, height: H + T + B, class: "plot"});
  let tmin = Infinity, tmax = -Infinity, vmax = 0;
  for (const s of series) for (const [t, v] of s.points) {
    tmin = Math.min(tmin, t); tmax = Math.max(tmax, t);
    if (v !== null) vmax = Math.max(vmax, v);
  }
  if (!isFinite(tmin)) { tmin = 0; tmax = 1; }
  if (tmax <= tmin) tmax = tmin + 1;
  if (vmax <= 0) vmax = 1;
  const X = t => L + (t - tmin) / (tmax - tmin) * W, Y = v => T + H - v / vmax * H;
  svg.append(el("svg:rect", {x: L, y: T, width: W, height: H, fill: "#fafafa", stroke: "#888"}));
  for (const f of [0, 0.5, 1]) {
    svg.append(el("svg:text", {x: L - 4, y: Y(vmax * f) + 4, "text-anchor": "end"}, fmt(vmax * f)));
  }
  svg.append(el("svg:text", {x: L, y: T + H + 16}, "-" + fmt(tmax - tmin) + " s"));
  svg.append(el("svg:text", {x: L + W, y: T + H + 16, "text-anchor": "end"}, "now"));
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    let pts = [];
    const flush = () => {
      if (pts.length) svg.append(el("svg:polyline", {class: "series", "data-series": s.name,
        fill: "none", stroke: color, "stroke-width": 2, points: pts.join(" ")}));
      pts = [];
    };
    for (const [t, v] of s.points) {
      if (v === null) { flush(); continue; }
      pts.push(X(t).toFixed(1) + "," + Y(v).toFixed(1));
    }
    flush();
    svg.append(el("svg:rect", {x: L + 10 + i * 130, y: T + 6, width: 12, height: 4, fill: color}));
    svg.append(el("svg:text", {x: L + 26 + i * 130, y: T + 12}, s.name));
  });
  fig.querySelector("svg")?.remove();
  fig.append(svg);
}
function render(s) {
  document.getElementById("role").textContent =
    "(" + (s.role || "?") + ", " + (s.version || "?") + ")";
  document.getElementById("updated").textContent =
    "updated " + new Date(s.now * 1000).toISOString() + ", sampled every " + s.interval_s + " s";
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren(...s.nodes.map(n => {
    const tr = el("tr", {class: "node", "data-node": n.node});
    const state = !n.up ? "lost" : n.cordoned ? "cordoned" : "up";
    tr.append(el("td", {}, n.node), el("td", {class: state === "lost" ? "down" : ""}, state),
              el("td", {class: "num"}, fmt(n.heartbeat_age_s)), el("td", {class: "num"}, fmt(n.slots)),
              el("td", {class: "num"}, fmt(n.live)));
    return tr;
  }));
  if (!s.nodes.length) {
    const tr = el("tr");
    tr.append(el("td", {colspan: 5}, "not a coordinator: no cluster view"));
    body.append(tr);
  }
  const b = s.sandboxes;
  rows("daemon", [["sessions", fmt(s.sessions)], ["live", fmt(b.live)], ["creating", fmt(b.creating)],
                  ["pooled", fmt(b.pooled)], ["paused", fmt(b.paused)],
                  ["slots used", fmt(b.slots_used) + " of " + fmt(b.slots)],
                  ["created", fmt(b.created)], ["destroyed", fmt(b.destroyed)], ["failed", fmt(b.failed)],
                  ["resident memory", bytes(s.process.rss_bytes)],
                  ["CPU seconds", fmt(s.process.cpu_seconds)]]);
  const l = s.layers;
  rows("layers", [["cache", bytes(l.cache_bytes)], ["hits", fmt(l.hits)], ["misses", fmt(l.misses)],
                  ["evictions", fmt(l.evictions)], ["fetches", fmt(l.fetches)],
                  ["fetched", bytes(l.fetch_bytes)]]);
  document.querySelector("#plot-rates figcaption").textContent =
    "per second, of " + s.rates_of + ": creates, destroys, failures";
  document.querySelector("#plot-latency figcaption").textContent =
    "create latency of " + s.latency_of + ", ms (p50, p99 per interval)";
  const h = s.history;
  const pts = key => h.map(p => [p.t - s.now, p[key]]);
  plot("plot-rates", [{name: "creates/s", points: pts("creates_per_s")},
                      {name: "destroys/s", points: pts("destroys_per_s")},
                      {name: "failures/s", points: pts("failures_per_s")}]);
  plot("plot-latency", [{name: "p50", points: pts("create_p50_ms")},
                        {name: "p99", points: pts("create_p99_ms")}]);
  const names = [...new Set(h.flatMap(p => Object.keys(p.nodes_live)))].sort();
  plot("plot-live", names.length
    ? names.map(n => ({name: n, points: h.map(p => [p.t - s.now, p.nodes_live[n] ?? null])}))
    : [{name: "live", points: pts("live")}]);
  document.body.setAttribute("data-rendered", String(h.length));
}
async function refresh() {
  try {
    const r = await fetch("status.json", token ? {headers: {Authorization: "Bearer " + token}} : {});
    if (!r.ok) throw new Error("status.json: HTTP " + r.status);
    render(await r.json());
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = String(e);
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body></html>
)HTML";
  return page;
}

} // namespace dsec::metrics
