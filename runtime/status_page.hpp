// status_page: a dsecd's /status page and the /status.json it draws from
// (docs/observability.md). A thread of its own samples the metrics registry
// every interval and keeps the last samples (10 minutes at the default 2 s);
// /status.json is now's view (the cluster's nodes as the coordinator's
// heartbeats tell them, sessions, sandboxes, the layer store, the process)
// with that history (each entry the interval since the sample before: its
// end t and length dt_s, creates, destroys and failures per second, create
// latency quantiles per interval, live sandboxes per node). /status is one
// HTML page with a small script (no framework, nothing fetched from
// elsewhere) that polls /status.json and draws the tables and SVG plots.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/metrics.hpp"

namespace dsec::metrics {

class status_history {
public:
  /// Starts sampling `r` (a first sample now, then every `interval`).
  status_history(registry& r, std::chrono::milliseconds interval = std::chrono::seconds{2},
                 size_t points = 300);
  /// Stops and joins the sampling thread.
  ~status_history();
  status_history(const status_history&) = delete;
  status_history& operator=(const status_history&) = delete;

  /// Takes one sample now (the thread's step; tests call it too).
  void sample();

  /// /status.json's body.
  [[nodiscard]] std::string json() const;

  /// How many samples are kept now.
  [[nodiscard]] size_t size() const;

private:
  struct point {
    double t = 0; ///< unix time, seconds
    double creates = 0, destroys = 0, failures = 0;
    double live = 0;
    histogram::snapshot create_seconds;
    std::map<std::string, double> node_live; ///< by node, from heartbeats
  };

  registry& reg_;
  std::chrono::milliseconds interval_;
  size_t points_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<point> history_;
  std::thread thread_;
};

/// The page (/status): HTML with its script and style inline.
const std::string& status_html();

} // namespace dsec::metrics
