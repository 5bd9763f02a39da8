// Parsing of sizes ("512m", "2G", "1048576") and durations ("30s", "500ms", "2m").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/error.hpp"

namespace dsec {

/// Bytes from a size: an integer with an optional suffix k, m, g, t (powers of
/// 1024, case-insensitive, optionally followed by 'b' or 'ib'). `what` names the
/// option in the error, e.g. "--memory".
expected<uint64_t> parse_size(std::string_view s, std::string_view what);

/// A duration: an integer or decimal with a unit ms, s, m or h (a bare number
/// means seconds).
expected<std::chrono::milliseconds> parse_duration(std::string_view s,
                                                   std::string_view what);

/// "64 MiB", "1.5 GiB", "512 B".
std::string format_size(uint64_t bytes);

/// "250ms", "2s", "1.5s", "3m", "2h".
std::string format_duration(std::chrono::milliseconds d);

} // namespace dsec
