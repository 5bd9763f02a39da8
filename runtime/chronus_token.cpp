// Chronus's per-sandbox pieces (see chronus.hpp): the token a sandbox's requests
// must carry (generated, parsed, compared in constant time) and the token bucket
// that limits how many frames a sandbox may send.
#include "runtime/chronus.hpp"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>

#include "runtime/hex.hpp"

namespace dsec {

// ---- token --------------------------------------------------------------------------

expected<chronus_token> chronus_token::generate() {
  std::array<std::byte, chronus_token_size> b;
  size_t got = 0;
  while (got < b.size()) {
    ssize_t n = ::getrandom(b.data() + got, b.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return sys_error("getrandom");
    }
    got += static_cast<size_t>(n);
  }
  return chronus_token{b};
}

expected<chronus_token> chronus_token::from_hex(std::string_view hex) {
  if (hex.size() != 2 * chronus_token_size)
    return make_error(errc::invalid_argument,
                      "a Chronus token is 64 hex characters, not " + std::to_string(hex.size()));
  std::array<std::byte, chronus_token_size> b;
  for (size_t i = 0; i < b.size(); ++i) {
    int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return make_error(errc::invalid_argument,
                        "a Chronus token has a character that is not hex at offset " +
                            std::to_string(hi < 0 ? 2 * i : 2 * i + 1));
    b[i] = static_cast<std::byte>(hi << 4 | lo);
  }
  return chronus_token{b};
}

std::string chronus_token::to_hex() const {
  static const char hex[] = "0123456789abcdef";
  std::string s(2 * chronus_token_size, '0');
  for (size_t i = 0; i < bytes_.size(); ++i) {
    auto v = std::to_integer<unsigned>(bytes_[i]);
    s[2 * i] = hex[v >> 4];
    s[2 * i + 1] = hex[v & 15];
  }
  return s;
}

bool chronus_token::matches(std::span<const std::byte> other) const noexcept {
  if (other.size() != bytes_.size())
    return false;
  // No early exit: the time taken does not tell how many leading bytes matched.
  volatile unsigned diff = 0;
  for (size_t i = 0; i < bytes_.size(); ++i)
    diff = diff | std::to_integer<unsigned>(bytes_[i] ^ other[i]);
  return diff == 0;
}

// ---- rate limit ---------------------------------------------------------------------

namespace {
constexpr uint64_t nano = 1'000'000'000;
}

chronus_rate_limiter::chronus_rate_limiter(config cfg, uint64_t now_ns) noexcept
    : cfg_(cfg), level_(uint64_t{cfg.burst} * nano), last_ns_(now_ns) {}

uint64_t chronus_rate_limiter::level_at(uint64_t now_ns) const noexcept {
  uint64_t cap = uint64_t{cfg_.burst} * nano; // <= 2^32 * 1e9 < 2^64
  if (now_ns <= last_ns_ || cfg_.rate == 0 || level_ >= cap)
    return std::min(level_, cap);
  // `rate` tokens a second is `rate` units of 1e-9 token a nanosecond. Clamp the
  // elapsed time first so that the product cannot overflow.
  uint64_t elapsed = std::min(now_ns - last_ns_, cap / cfg_.rate + 1);
  return std::min(cap, level_ + elapsed * cfg_.rate);
}

bool chronus_rate_limiter::admit(uint64_t now_ns) noexcept {
  level_ = level_at(now_ns);
  if (now_ns > last_ns_)
    last_ns_ = now_ns;
  if (level_ < nano)
    return false;
  level_ -= nano;
  return true;
}

uint64_t chronus_rate_limiter::available(uint64_t now_ns) const noexcept {
  return level_at(now_ns) / nano;
}

} // namespace dsec
