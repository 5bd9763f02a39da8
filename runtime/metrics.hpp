// metrics: counters, gauges and fixed-bucket histograms kept in atomics, and
// their exposition in the Prometheus text format (version 0.0.4). No CAF, no
// HTTP: the actors publish here (an atomic add on their own thread), and a
// scrape (runtime/metrics_http.hpp, on a thread of its own) reads.
//
// A metric is registered once by name and labels and lives as long as its
// registry; hot paths keep the reference they got. Labels are for small,
// fixed sets (a backend, a reason, a node of the cluster), never an id.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsec::metrics {

/// Label names and values, in the order they are printed.
using labels = std::vector<std::pair<std::string, std::string>>;

class counter {
public:
  void inc(uint64_t n = 1) noexcept { v_.fetch_add(n, std::memory_order_relaxed); }
  [[nodiscard]] uint64_t value() const noexcept { return v_.load(std::memory_order_relaxed); }

private:
  std::atomic<uint64_t> v_{0};
};

class gauge {
public:
  void set(double v) noexcept { v_.store(v, std::memory_order_relaxed); }
  void add(double d) noexcept { v_.fetch_add(d, std::memory_order_relaxed); }
  [[nodiscard]] double value() const noexcept { return v_.load(std::memory_order_relaxed); }

private:
  std::atomic<double> v_{0};
};

/// Observations counted in fixed buckets (upper bounds, ascending; +Inf is
/// implied), with their sum.
class histogram {
public:
  explicit histogram(std::vector<double> bounds);
  void observe(double v) noexcept;

  struct snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative; ///< one per bound, then +Inf (= count)
    double sum = 0;
    [[nodiscard]] uint64_t count() const { return cumulative.empty() ? 0 : cumulative.back(); }
    /// The q-quantile (0..1) by linear interpolation within its bucket, as
    /// PromQL's histogram_quantile computes it; 0 without observations.
    [[nodiscard]] double quantile(double q) const;
  };
  [[nodiscard]] snapshot read() const;

private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_; // per bucket (not cumulative), +Inf last
  std::atomic<double> sum_{0};
};

/// Latency buckets in seconds, 100 us to 60 s, for create, exec, destroy and
/// fetch times.
const std::vector<double>& latency_buckets();

/// Values computed when scraped (process RSS, a reactor's atomics): a
/// collector adds whole families.
struct sample_family {
  std::string name, help, type; ///< type: counter, gauge or histogram
  std::vector<std::pair<labels, double>> samples;
  /// Per sample, what follows the name ("_bucket", "_sum", "_count" of a
  /// histogram); none when empty.
  std::vector<std::string> suffixes;
};
using collector = std::function<void(std::vector<sample_family>&)>;

class registry {
public:
  /// The metric of that name and labels, made at the first call. A name used
  /// with another type or other label names, or a malformed name, is a bug
  /// (std::logic_error).
  counter& get_counter(std::string_view name, std::string_view help, const labels& l = {});
  gauge& get_gauge(std::string_view name, std::string_view help, const labels& l = {});
  histogram& get_histogram(std::string_view name, std::string_view help,
                           const std::vector<double>& bounds, const labels& l = {});

  /// Runs at every expose(), on the scraping thread; a handle to remove it.
  uint64_t add_collector(collector c);
  void remove_collector(uint64_t handle);

  /// Every family, sorted by name, in the Prometheus text format.
  [[nodiscard]] std::string expose() const;

  /// The value of a counter or gauge (0 if it does not exist), for tests and
  /// readiness checks.
  [[nodiscard]] double value(std::string_view name, const labels& l = {}) const;

private:
  enum class kind { counter, gauge, histogram };
  struct family {
    kind k;
    std::string help;
    std::vector<std::string> label_names;
    std::map<labels, std::unique_ptr<counter>> counters;
    std::map<labels, std::unique_ptr<gauge>> gauges;
    std::map<labels, std::unique_ptr<histogram>> histograms;
  };
  family& family_of(std::string_view name, std::string_view help, kind k, const labels& l);

  mutable std::mutex mu_;
  std::map<std::string, family, std::less<>> families_;
  std::map<uint64_t, collector> collectors_;
  uint64_t next_collector_ = 1;
};

/// The process's registry: what dsecd's /metrics shows. Every node, sandbox
/// and cache actor of the process adds to it.
registry& process_registry();

/// Adds process_resident_memory_bytes, process_cpu_seconds_total,
/// process_open_fds, process_threads and process_start_time_seconds (from
/// /proc/self) to `r`, once.
void add_process_collector(registry& r);

/// `v` as the exposition format prints a sample value (+Inf, NaN, integers
/// without a fraction).
std::string format_value(double v);

} // namespace dsec::metrics
