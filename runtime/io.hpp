// io: whole-file reads and writes on a file descriptor, and the directory fsync
// that makes a rename or unlink durable. Errors keep errno and name the path.
#pragma once

#include <string>
#include <string_view>

#include "runtime/error.hpp"

namespace dsec {

/// Reads from `fd`'s current position to end of file (a regular file, a procfs
/// or cgroupfs file, a pipe or a socket). A failed read is a system_error
/// "WHAT PATH: strerror" with `what` defaulting to "cannot read".
expected<std::string> read_all(int fd, std::string_view path,
                               std::string_view what = "cannot read");

/// Opens `path` (relative to `dirfd`, AT_FDCWD for the working directory)
/// read-only and reads it whole; errors as read_all's, "cannot open" when the
/// file cannot be opened (sys_errno tells ENOENT from the rest).
expected<std::string> read_file(int dirfd, const std::string& path);

/// Writes all of `data` to `fd`, retrying short writes and EINTR. A failed (or a
/// zero-byte) write is a system_error "WHAT PATH: strerror".
expected<void> write_all(int fd, std::string_view data, std::string_view path,
                         std::string_view what = "cannot write");

/// fsync(2) of the directory `path`: without it a crash can undo a rename,
/// link or unlink in it. Errors are "WHAT PATH: strerror".
expected<void> fsync_dir(const std::string& path,
                         std::string_view what = "cannot sync directory");

} // namespace dsec
