// chronus_detail: what the parts of runtime/chronus (chronus.cpp, chronus_values.cpp)
// share and nobody else uses; include it only from runtime/chronus*.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/chronus.hpp"
#include "runtime/error.hpp"

namespace dsec::chronus_detail {

/// invalid_argument with `message`.
error invalid(std::string message);

/// 1..limit bytes of printable ASCII, else invalid_argument naming `what`, the
/// offending byte and its offset.
expected<void> check_printable(std::string_view s, std::string_view what, size_t limit);

/// The body of a request or event of `kind` against the limits of chronus.hpp.
expected<void> check_body(chronus_kind kind, const std::string& text,
                          const std::vector<chronus_metric>& metrics,
                          const std::string& payload);

} // namespace dsec::chronus_detail
