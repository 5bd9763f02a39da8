// metrics_text: reads the Prometheus text format (what metrics::registry::
// expose() prints, and what any exporter serves), for `dsec top`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/metrics.hpp"

namespace dsec::metrics {

struct sample {
  std::string name;
  labels l;
  double value = 0;
  /// The value of label `k` ("" without it).
  [[nodiscard]] std::string label(std::string_view k) const;
};

/// Every sample line of `text` (comments and blank lines skipped; a timestamp
/// after the value is ignored). A malformed line is errc::malformed, naming
/// its number.
expected<std::vector<sample>> parse_text(std::string_view text);

/// The sum over samples named `name` whose labels include all of `match`.
double sum_of(const std::vector<sample>& s, std::string_view name, const labels& match = {});

/// The histogram `name` (its _bucket samples summed over their other labels).
histogram::snapshot histogram_of(const std::vector<sample>& s, std::string_view name);

/// b - a, bucket by bucket (the observations between two scrapes).
histogram::snapshot difference(const histogram::snapshot& b, const histogram::snapshot& a);

} // namespace dsec::metrics
