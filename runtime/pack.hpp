// Packs of a sandbox's writable layer (its overlay upper dir), for the
// trajectory log: write_pack() records the upper dir as it is now, restore_pack()
// recreates it in a fresh sandbox's empty upper dir before its overlay is
// mounted, so the new sandbox sees the same files as the old one did.
//
// A pack is a manifest file; file contents live beside it in a blob
// directory, one file per distinct content, named by its SHA-256, so packs
// taken one after another (and packs of several sandboxes) share what did not
// change. A pack_cache remembers what each file of the upper dir hashed to,
// keyed by inode, size and times: an unchanged file is neither read nor
// written again.
//
// What a pack keeps: directories, regular files, symbolic links and fifos,
// with mode, owner (relative to the sandbox's uid base) and modification time;
// overlayfs whiteouts (0/0 character devices) and the opaque and redirect
// xattrs of directories (trusted.overlay.opaque, trusted.overlay.redirect).
// What it does not: other xattrs, atime, hard links (each name gets its own
// copy). What it skips and records in the manifest (a "skipped" entry with the
// reason, which restore_pack() counts and leaves out): sockets (the Chronus
// socket is made anew), device nodes other than whiteouts, names that changed
// kind while the pack read them (a file swapped for a fifo), directories
// deeper than pack_limits::max_depth.
//
// The upper dir belongs to a running sandbox, which may change it while it is
// packed: nothing here may block on it or run unbounded. Only regular files are
// read, opened O_NONBLOCK|O_NOFOLLOW|O_NOCTTY and checked with fstat after the
// open (a fifo or device swapped in between is skipped, never waited on); a
// file is read up to the size fstat gave, a symlink target up to PATH_MAX;
// fifos are recorded from lstat and never opened. The whole pack is bounded
// in names, depth and time (pack_limits) and can be cancelled. A blob is named
// by the digest of the bytes it holds, read as they are copied: a file changed
// between the hashing and the copy is stored as what was copied.
//
// Manifest format (little-endian), after the 8 bytes "DSECPK1\n":
//   u8 kind | u32 mode | u32 uid | u32 gid | i64 mtime_s | u32 mtime_ns |
//   u8 flags (1: opaque) | u32 path length | path (relative, "" for the root)
//   then: file: u64 size, 32-byte SHA-256; symlink: u32 length, target;
//   dir: u32 length, redirect xattr (0 for none); skipped: u32 length, why
//   (kinds: 1 dir, 2 file, 3 symlink, 4 whiteout, 5 fifo, 6 skipped)
// The manifest is written to a temporary name, fsynced and renamed: a pack
// either exists whole or not at all; blobs are fsynced before it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/error.hpp"

namespace dsec {

struct pack_cache {
  struct entry {
    uint64_t ino = 0, size = 0;
    int64_t mtime_ns = 0, ctime_ns = 0;
    std::array<uint8_t, 32> digest{};
  };
  std::unordered_map<std::string, entry> files;
};

/// A name the pack left out, and why (also recorded in the manifest).
struct pack_skip {
  std::string path; ///< "/work/fifo", as the sandbox sees it
  std::string why;  ///< "a socket", "changed while packed: now a fifo", ...
};

struct pack_stats {
  uint64_t entries = 0;     ///< names in the pack (skipped ones included)
  uint64_t files = 0;       ///< regular files among them
  uint64_t bytes = 0;       ///< their total size
  uint64_t new_blobs = 0;   ///< contents written to the blob dir this time
  uint64_t new_bytes = 0;
  std::vector<pack_skip> skipped; ///< left out, in manifest order
};

/// Bounds of one write_pack(): it fails with errc::too_large past max_entries,
/// with errc::timeout past time_limit_ms or once `cancel` is true (the message
/// says which); directories deeper than max_depth are skipped and recorded.
struct pack_limits {
  uint32_t max_depth = 256;          ///< directory levels below the root
  uint64_t max_entries = 1'000'000;  ///< names in one pack
  uint64_t time_limit_ms = 120'000;  ///< the whole pack, reads included
  /// Bytes of new blobs one pack may store (0: no bound): a pack that would
  /// store more fails with errc::too_large before it copies the file that
  /// crosses it (issue 20: a session's log does not keep a huge put's bytes).
  uint64_t max_new_bytes = 0;
  const std::atomic<bool>* cancel = nullptr; ///< checked between entries and reads
};

/// Records the tree under `upper_fd` (an O_DIRECTORY fd) as the pack at
/// `pack_path`, storing contents in `blob_dir` (created if missing). Owners
/// are stored relative to `uid_base` (the host uid of the sandbox's root).
/// With `inline_manifest`, a manifest of at most `inline_limit` bytes is
/// returned there instead of written (the caller makes it durable, e.g. in
/// its own log record; new blobs are durable either way); a larger one is
/// written to `pack_path` and `inline_manifest` is left empty.
expected<pack_stats> write_pack(int upper_fd, const std::string& pack_path,
                                const std::string& blob_dir, pack_cache& cache,
                                uint32_t uid_base, std::string* inline_manifest = nullptr,
                                size_t inline_limit = 0, const pack_limits& limits = {});

/// Recreates the pack at `pack_path` under `dest_fd` (an empty O_DIRECTORY
/// fd: a fresh upper dir), owners shifted to `uid_base`. Never follows a
/// symbolic link of the tree it builds; opens only regular files (the pack
/// and its blobs, O_NONBLOCK|O_NOFOLLOW, checked with fstat, each blob's size
/// against the manifest's). Skipped entries are counted, not made.
expected<pack_stats> restore_pack(const std::string& pack_path, const std::string& blob_dir,
                                  int dest_fd, uint32_t uid_base);

/// What the manifest `data` (a pack file's bytes, or an inline manifest)
/// holds, without touching the disk: entries, files, bytes and what was
/// skipped. errc::malformed when it does not parse; `shown` names it.
expected<pack_stats> describe_pack(std::string_view data, const std::string& shown);

/// restore_pack() of a manifest in memory (one write_pack() returned inline);
/// `name` says what it is in errors.
expected<pack_stats> restore_manifest(std::string_view manifest, const std::string& name,
                                      const std::string& blob_dir, int dest_fd,
                                      uint32_t uid_base);

} // namespace dsec
