// clock: the wall clock in milliseconds since the Unix epoch, as dsec's messages
// carry it (a sandbox's created_ms and TTL end, a member's joined_ms).
#pragma once

#include <chrono>
#include <cstdint>

namespace dsec {

/// Milliseconds since 1970-01-01 UTC by the system (wall) clock. Not monotonic:
/// measure durations with std::chrono::steady_clock.
inline uint64_t unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count());
}

} // namespace dsec
