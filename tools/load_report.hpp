// dsec-load's report: the run's rates over time and its latency histograms,
// as one self-contained HTML file (inline SVG plots, no script, nothing
// fetched) that embeds the same figures as JSON, and as that JSON alone.
#pragma once

#include <string>
#include <vector>

namespace dsec::load {

/// One kind of call's samples: when each completed (seconds since the run's
/// start) and how long it took (ms).
struct timed_samples {
  std::vector<double> at_s;
  std::vector<double> ms;

  void add(double at, double took_ms) {
    at_s.push_back(at);
    ms.push_back(took_ms);
  }
};

/// What the report shows.
struct report_input {
  std::string title;        ///< e.g. the run's one-line description
  std::string summary_json; ///< the run's summary object (what --json writes)
  double wall_s = 0;
  timed_samples create, exec, destroy, chronus;
  std::vector<double> failure_at_s; ///< when each failed episode failed
};

/// Width of a time bin: the smallest of 0.1, 0.2, 0.5, 1, 2, 5, 10... seconds
/// that splits `wall_s` into at most `max_bins` bins.
double bin_width(double wall_s, size_t max_bins = 120);

/// Upper bounds (ms) of the latency histograms' buckets: 1-2-5 steps from
/// 0.1 ms to 100 s; a last bucket takes what is above.
const std::vector<double>& bucket_bounds();

/// The figures as a JSON object: {"summary": ..., "bin_s": W, "timeline":
/// [{"t": start_s, "creates", "execs", "destroys", "failures", "chronus"
/// (counts in the bin), "create_p50_ms", "create_p99_ms" (null when none)}],
/// "histograms": {"create": [{"le_ms": B (null for the last), "count": N}],
/// "exec", "destroy", "chronus"}}.
std::string report_json(const report_input& in);

/// The HTML page: the title, the summary as a table, the plots (rates over
/// time, create latency over time, one histogram per kind of call) and the
/// JSON of report_json in a <script type="application/json"
/// id="dsec-load-data"> element.
std::string report_html(const report_input& in);

} // namespace dsec::load
