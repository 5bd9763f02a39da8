// store_detail: what the parts of dsec::store share, and nothing outside the store
// uses (include it only from runtime/store*.cpp). The store is one class assembled
// from these files:
//   store.cpp         open, build (a directory or a tar archive into a layer), and
//                     committing a layer (blob, then ref) that build and import share
//   store_files.cpp   file utilities: the layout's paths, the store lock, staging
//                     directories, the no-replace rename
//   store_tools.cpp   the external tools (tar, mkfs.erofs): running one, its argv,
//                     what a layer leaves out of its source tree
//   store_names.cpp   layer names and ref files: parsing and writing refs, digests,
//                     the natural order; list, find, lease, remove
//   store_system.cpp  the system layer (/dev, mount points, the chronus client)
//   store_import.cpp  staged files and import (a layer made elsewhere), open_blob
//   store_image.cpp   OCI images: scratch dirs, a layer tree's image, the tar index,
//                     committing a base of several lowers
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"
#include "runtime/layer.hpp"
#include "runtime/store.hpp"

namespace dsec::store_detail {

// ---- files (store_files.cpp) ------------------------------------------------------

/// a + "/" + b.
std::string join(std::string_view a, std::string_view b);

/// STATE/refs, STATE/blobs/sha256, STATE/tmp, STATE/system, STATE/refs/NAME@VERSION.
std::string refs_dir(const std::string& dir);
std::string blobs_dir(const std::string& dir);
std::string tmp_dir(const std::string& dir);
std::string system_dir(const std::string& dir);
std::string ref_path(const std::string& dir, const layer_ref& ref);

/// rename(2) that never replaces `to`: EEXIST tells the caller someone got there
/// first. Falls back to plain rename on file systems without RENAME_NOREPLACE; every
/// caller holds the store lock, so the existence check it already made still holds.
int rename_noreplace(const std::string& from, const std::string& to);

/// Opens STATE/lock and takes flock `op` (LOCK_SH or LOCK_EX) on it. A fresh open
/// per call: flock excludes open file descriptions, so this also excludes threads
/// of one process that share a store. Closing the fd releases the lock.
expected<unique_fd> lock_store(const std::string& dir, int op);

/// A directory under STATE/tmp that one build owns. It holds a flock(LOCK_EX) on the
/// directory for its whole life, which is how open() tells a live build's staging
/// dir (lock busy) from one a crashed build left (lock free). Removed with all its
/// contents on destruction, whatever happened.
class staging_dir {
public:
  staging_dir(staging_dir&& other) noexcept
    : path_(std::exchange(other.path_, {})), lock_(std::move(other.lock_)) {}
  staging_dir& operator=(staging_dir&&) = delete;
  ~staging_dir();

  static expected<staging_dir> create(const std::string& store_dir, std::string_view prefix);

  [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
  explicit staging_dir(std::string path) : path_(std::move(path)) {}

  std::string path_;
  unique_fd lock_;
};

/// Removes what builds that died left in STATE/tmp. The caller holds LOCK_EX on the
/// store, so no staging dir is between creation and locking.
expected<void> clean_tmp(const std::string& dir);

// ---- external tools (store_tools.cpp) ---------------------------------------------

/// Runs argv[0] (looked up in PATH) without a shell, stdin from /dev/null, stdout
/// and stderr captured, SOURCE_DATE_EPOCH set; `input_fd`, when not -1, is its
/// descriptor 3. `subject` (the layer source) goes into the error so the user
/// knows which input the tool choked on.
expected<void> run_tool(const std::vector<std::string>& argv, const std::string& subject,
                        int input_fd = -1);

/// The device nodes and sockets of `tree` that a layer leaves out, relative to
/// `tree`, and in `shown` "/PATH (a socket)" for each (see store_tools.cpp).
expected<std::vector<std::string>> left_out(const std::string& tree,
                                            std::vector<std::string>& shown);

/// What scan_source() refuses besides names mkfs.erofs cannot hold.
struct source_rules {
  /// Overlayfs whiteouts (0/0 character devices) and opaque or redirect
  /// directories: in a tool or workdir layer they would hide a lower layer's
  /// files (refused unless `layer build --whiteouts`).
  bool refuse_overlay_metadata = false;
};

/// What a walk of a layer source found: left_out()'s paths, and whether a
/// regular file has holes of at least 1 MiB.
struct source_scan {
  std::vector<std::string> exclude;
  bool sparse = false;
};

/// left_out(), with the checks of `rules` and the sparse-file note.
expected<source_scan> scan_source(const std::string& tree, std::vector<std::string>& shown,
                                  const source_rules& rules);

/// mkfs.erofs's argv for a deterministic image of `dir` in `out`; `sparse`
/// (uncompressed only) stores holes as holes.
std::vector<std::string> mkfs_argv(const std::string& compress, const std::string& out,
                                   const std::string& dir,
                                   const std::vector<std::string>& exclude = {},
                                   bool sparse = false);

// ---- names and refs (store_names.cpp) ---------------------------------------------

/// Library callers may build a layer_ref by hand; a '/' or ".." in it must never
/// reach a path, so every entry point re-validates it.
expected<void> check_ref(const layer_ref& ref);

/// not_found "unknown layer X@Y (see 'dsec layer ls')".
error unknown_layer(const layer_ref& ref);

/// "sha256:" and 64 lower-case hex digits.
bool valid_digest(std::string_view d);

/// STATE/blobs/sha256/<hex> of a valid digest.
std::string blob_path_of(const std::string& dir, std::string_view digest);

/// The text of a ref file, and back (a corrupt one is a system_error naming `path`).
std::string format_ref(const layer_info& info);
expected<layer_info> parse_ref(std::string_view text, const layer_ref& ref,
                               const std::string& path, const std::string& dir);

/// Reads refs/NAME@VERSION; not_found if there is no such layer.
expected<layer_info> read_ref(const std::string& dir, const layer_ref& ref);

/// Every ref in refs/ (names that are not NAME@VERSION are not ours and skipped).
/// The caller holds the store lock.
expected<std::vector<layer_info>> read_all_refs(const std::string& dir);

/// A value from a peer, fit for an error message: printable ASCII, at most 80
/// characters.
std::string printable(std::string_view s);

/// invalid_argument "malformed digest '...'WHAT (expected ...)".
error malformed_digest(std::string_view digest, std::string_view what);

// ---- committing a layer (store.cpp) -----------------------------------------------

/// Installs `image` as the blob of info.digest (info.blob_path) and writes the
/// ref file of info (through a temp file in `staging`). The caller holds the
/// store's LOCK_EX and checked that the ref does not exist. A failure leaves
/// nothing new: a blob this call added is removed again. Returns true when the
/// blob was already stored (then shared, and `image` left where it is).
/// Writes the ref file of info (through a temp file in `staging`), durably;
/// the caller holds LOCK_EX and checked that the ref does not exist.
expected<void> write_ref(const std::string& dir, const std::string& staging,
                         const layer_info& info);

expected<bool> commit_layer(const std::string& dir, const std::string& staging,
                            const std::string& image, const layer_info& info);

} // namespace dsec::store_detail
