// The trajectory log's file: an append-only sequence of records, each framed
// as
//
//   u32 length (little-endian) | u32 CRC-32C of the payload | payload
//
// after a header: "DSECTRJ2" and a u32 (little-endian) naming the format of
// the payloads, which the caller gives when it creates the file
// (actors/trajectory.hpp: trajectory_format). A file of the first framing,
// with the 8-byte header "DSECTRJ1" alone, reads as payload format 1.
// Appends go to the page cache at once;
// sync() makes everything appended so far durable (fdatasync), so callers
// batch records between syncs. A crash can leave a torn tail: a partial frame
// or a frame whose CRC does not match. Opening the file stops at the first
// such frame, reports how many bytes it dropped, and (when opened to append)
// truncates them so the next record follows the last whole one.
//
// What the payloads mean is the caller's business (actors/trajectory.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

namespace dsec {

/// CRC-32C (Castagnoli), as the frames use it.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0) noexcept;

/// The largest payload a record may have.
inline constexpr uint32_t max_trajectory_record = 256u << 20;

class trajectory_file {
public:
  /// Opens (creating with `create`) the log at `path` for appending. The
  /// records already there are read into `existing` (if given); a torn tail
  /// is cut off. A file it creates names payload format `format` in its
  /// header; an existing one keeps its own (format()).
  static expected<trajectory_file> open(const std::string& path, bool create,
                                        std::vector<std::string>* existing = nullptr,
                                        uint32_t format = 1);

  /// Reads every whole record of the log at `path` without changing it.
  /// `torn_bytes` (if given) gets the size of a torn tail left out, `format`
  /// (if given) the payload format its header names.
  static expected<std::vector<std::string>> read(const std::string& path,
                                                 uint64_t* torn_bytes = nullptr,
                                                 uint32_t* format = nullptr);

  /// Appends one record (to the page cache: durable after sync()).
  expected<void> append(std::string_view payload);
  /// Makes every record appended so far durable.
  expected<void> sync();

  [[nodiscard]] uint64_t size() const { return size_; }
  [[nodiscard]] uint64_t torn_bytes() const { return torn_; }
  [[nodiscard]] bool dirty() const { return synced_ < size_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  /// The payload format its header names.
  [[nodiscard]] uint32_t format() const { return format_; }

private:
  unique_fd fd_;
  std::string path_;
  uint64_t size_ = 0;   ///< bytes of whole records (and the header)
  uint64_t synced_ = 0; ///< of which durable
  uint64_t torn_ = 0;   ///< dropped at open
  uint32_t format_ = 1;
  std::string frame_;   ///< reused for each append
};

} // namespace dsec
