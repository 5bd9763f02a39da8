#include "runtime/sha256.hpp"

#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <memory>

#include "runtime/sys.hpp"

namespace dsec {

namespace {

constexpr std::array<uint32_t, 64> k_round = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
  0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
  0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
  0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
  0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
  0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
  0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
  0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
  0xc67178f2,
};

constexpr uint32_t rotr(uint32_t x, int n) noexcept {
  return (x >> n) | (x << (32 - n));
}

#if defined(__x86_64__)
// SHA-NI (Intel SHA extensions) with SSSE3 and SSE4.1, found with cpuid once.
bool have_sha_ni() noexcept {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
      return false;
    bool ssse3 = (c & bit_SSSE3) != 0, sse41 = (c & bit_SSE4_1) != 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
      return false;
    return ssse3 && sse41 && (b & bit_SHA) != 0;
  }();
  return yes;
}

// `count` 64-byte blocks with the SHA extensions. The state is kept in the
// layout sha256rnds2 wants (ABEF, CDGH) across the blocks. Each of the 16
// steps does 4 rounds on message words W[4g..4g+3] (msg[g % 4]) and, from the
// words so far, the schedule of the words 4 and 1 groups ahead.
__attribute__((target("sha,sse4.1,ssse3"))) void
compress_sha_ni(uint32_t* state, const uint8_t* data, size_t count) noexcept {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));
  __m128i state1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));
  tmp = _mm_shuffle_epi32(tmp, 0xB1);              // CDAB
  state1 = _mm_shuffle_epi32(state1, 0x1B);        // EFGH
  __m128i state0 = _mm_alignr_epi8(tmp, state1, 8); // ABEF
  state1 = _mm_blend_epi16(state1, tmp, 0xF0);     // CDGH
  for (; count > 0; --count, data += 64) {
    const __m128i abef = state0, cdgh = state1;
    __m128i msg[4];
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      __m128i& w = msg[g & 3];
      if (g < 4)
        w = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * g)),
                             bswap);
      __m128i m =
        _mm_add_epi32(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(&k_round[4 * g])));
      state1 = _mm_sha256rnds2_epu32(state1, state0, m);
      if (g >= 3 && g <= 14) { // W of group g+1: its msg1 part was done at g-2
        __m128i& next = msg[(g + 1) & 3];
        next = _mm_add_epi32(next, _mm_alignr_epi8(w, msg[(g - 1) & 3], 4));
        next = _mm_sha256msg2_epu32(next, w);
      }
      m = _mm_shuffle_epi32(m, 0x0E);
      state0 = _mm_sha256rnds2_epu32(state0, state1, m);
      if (g >= 1 && g <= 12) // the msg1 part of W of group g+3
        msg[(g - 1) & 3] = _mm_sha256msg1_epu32(msg[(g - 1) & 3], w);
    }
    state0 = _mm_add_epi32(state0, abef);
    state1 = _mm_add_epi32(state1, cdgh);
  }
  tmp = _mm_shuffle_epi32(state0, 0x1B);       // FEBA
  state1 = _mm_shuffle_epi32(state1, 0xB1);    // DCHG
  state0 = _mm_blend_epi16(tmp, state1, 0xF0); // DCBA
  state1 = _mm_alignr_epi8(state1, tmp, 8);    // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state), state0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), state1);
}
#else
bool have_sha_ni() noexcept { return false; }
#endif

} // namespace

sha256::sha256() noexcept
  : state_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c,
           0x1f83d9ab, 0x5be0cd19} {}

void sha256::compress(const uint8_t* block) noexcept {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t{block[4 * i]} << 24) | (uint32_t{block[4 * i + 1]} << 16)
           | (uint32_t{block[4 * i + 2]} << 8) | uint32_t{block[4 * i + 3]};
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = h + s1 + ch + k_round[i] + w[i];
    uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

bool sha256::accelerated() noexcept { return have_sha_ni(); }

void sha256::compress_blocks(const uint8_t* blocks, size_t count) noexcept {
#if defined(__x86_64__)
  if (have_sha_ni()) {
    compress_sha_ni(state_.data(), blocks, count);
    return;
  }
#endif
  for (; count > 0; --count, blocks += 64)
    compress(blocks);
}

void sha256::update(const void* data, size_t size) noexcept {
  auto p = static_cast<const uint8_t*>(data);
  total_bytes_ += size;
  if (buffered_ > 0) {
    size_t take = std::min(size, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < buffer_.size())
      return;
    compress_blocks(buffer_.data(), 1);
    buffered_ = 0;
  }
  // Whole blocks straight from the caller's memory: no copy on the hot path.
  compress_blocks(p, size / 64);
  p += size / 64 * 64;
  size %= 64;
  if (size > 0) {
    std::memcpy(buffer_.data(), p, size);
    buffered_ = size;
  }
}

std::array<uint8_t, 32> sha256::finish() noexcept {
  uint64_t bits = total_bytes_ * 8;
  buffer_[buffered_++] = 0x80;
  if (buffered_ > 56) {
    std::memset(buffer_.data() + buffered_, 0, buffer_.size() - buffered_);
    compress_blocks(buffer_.data(), 1);
    buffered_ = 0;
  }
  std::memset(buffer_.data() + buffered_, 0, 56 - buffered_);
  for (int i = 0; i < 8; ++i)
    buffer_[56 + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  compress_blocks(buffer_.data(), 1);
  buffered_ = 0;

  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = static_cast<uint8_t>(state_[i] >> 24);
    out[4 * i + 1] = static_cast<uint8_t>(state_[i] >> 16);
    out[4 * i + 2] = static_cast<uint8_t>(state_[i] >> 8);
    out[4 * i + 3] = static_cast<uint8_t>(state_[i]);
  }
  return out;
}

std::string to_hex(const std::array<uint8_t, 32>& digest) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(64, '0');
  for (size_t i = 0; i < digest.size(); ++i) {
    out[2 * i] = digits[digest[i] >> 4];
    out[2 * i + 1] = digits[digest[i] & 0xf];
  }
  return out;
}

expected<std::string> sha256_hex_of_file(int fd) {
  constexpr size_t buffer_size = size_t{1} << 20;
  // One buffer for the whole file: layer images are hundreds of MiB, and a large
  // read size keeps the system call count low.
  auto buffer = std::make_unique<uint8_t[]>(buffer_size);
  sha256 h;
  off_t offset = 0;
  for (;;) {
    auto n = sys::retry([&] { return ::pread(fd, buffer.get(), buffer_size, offset); });
    if (n < 0)
      return sys_error("cannot read", "fd " + std::to_string(fd));
    if (n == 0)
      break;
    h.update(buffer.get(), static_cast<size_t>(n));
    offset += n;
  }
  return to_hex(h.finish());
}

} // namespace dsec
