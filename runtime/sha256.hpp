// SHA-256 (FIPS 180-4), self-contained: the layer store names blobs by the digest
// of their bytes, and runtime/ takes no crypto library dependency for one hash.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/error.hpp"

namespace dsec {

/// An incremental SHA-256. Feed bytes with update(), then call finish() once.
class sha256 {
public:
  sha256() noexcept;

  /// Hashes `size` more bytes.
  void update(const void* data, size_t size) noexcept;

  /// True when this CPU's SHA extensions (x86 SHA-NI) do the work: about ten
  /// times the speed of the portable code.
  [[nodiscard]] static bool accelerated() noexcept;

  /// Pads, returns the 32-byte digest. The object must not be used afterwards
  /// (create a new one for the next message).
  [[nodiscard]] std::array<uint8_t, 32> finish() noexcept;

private:
  void compress(const uint8_t* block) noexcept;
  void compress_blocks(const uint8_t* blocks, size_t count) noexcept;

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;      ///< bytes waiting in buffer_ (< 64)
  uint64_t total_bytes_ = 0; ///< message length so far
};

/// Lower-case hex of a digest (64 characters).
[[nodiscard]] std::string to_hex(const std::array<uint8_t, 32>& digest);

/// The lower-case hex SHA-256 of a whole file, read from offset 0 with pread (the
/// descriptor's offset is neither used nor moved) through one 1 MiB buffer.
[[nodiscard]] expected<std::string> sha256_hex_of_file(int fd);

} // namespace dsec
