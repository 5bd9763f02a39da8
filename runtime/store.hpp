// dsec::store: the local content-addressed layer store under the state directory.
//
//   STATE/lock                 flock(2): LOCK_EX while the store changes (commit of a
//                              build, rm), LOCK_SH while a lease is taken or refs are read
//   STATE/blobs/sha256/<hex>   EROFS images, mode 0444, named by the digest of their bytes
//   STATE/refs/NAME@VERSION    one small text file per layer (kind=, digest=, size=,
//                              created=, source=; an OCI image adds lower=, one per
//                              image layer, config= and manifest=); a lease is a
//                              LOCK_SH on this file
//   STATE/tmp/                 staging; each build (and each import being fetched) owns
//                              one locked entry, entries whose owner died are removed
//                              by open()
//   STATE/system/              the dsec system layer image (system-vN.erofs)
//   STATE/oci/tars/<hex>       OCI images: which stored lower a layer tar became
//   STATE/oci/downloads/       OCI images: layer tars a pull fetched, until it commits
//                              (docs/images.md; store_image.cpp, runtime/oci.hpp)
//
// Layers are immutable: a NAME@VERSION is built once and only ever removed. Two layers
// with the same bytes share one blob. Every operation either completes or leaves the
// store as it was (no temp files, no partial refs or blobs).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"
#include "runtime/layer.hpp"

namespace dsec {

/// What the store knows about one layer (the parsed ref file).
struct layer_info {
  layer_ref ref;
  layer_kind kind = layer_kind::base;
  std::string digest;    ///< "sha256:<64 hex>", the digest of the image bytes
  uint64_t size = 0;     ///< image size in bytes
  int64_t created = 0;   ///< unix seconds when the ref was committed
  std::string source;    ///< the absolute SRC path the layer was built from
  std::string blob_path; ///< STATE/blobs/sha256/<hex>: the EROFS image to mount

  // ---- an OCI image (runtime/oci.hpp; empty for every other layer) ----
  /// The image's layers as EROFS blob digests, topmost first (lowers[0] ==
  /// digest): a base made of several lowers. Empty: the one image `digest`.
  std::vector<std::string> lowers;
  /// blob_path of each of digests(), topmost first.
  std::vector<std::string> blob_paths;
  /// The image config dsec keeps (runtime/oci.hpp image_config::to_json):
  /// one line of JSON, or empty.
  std::string config;
  /// The image's manifest digest ("sha256:..."), or empty.
  std::string manifest;

  /// Every blob this layer is made of, topmost first: `lowers`, else {digest}.
  [[nodiscard]] std::vector<std::string> digests() const {
    return lowers.empty() ? std::vector<std::string>{digest} : lowers;
  }
  /// A diff layer's record of the environment it sits on (runtime/snapshot.hpp
  /// format_on: "base=B workdir=W tool=T... snapshot=S"); empty otherwise.
  std::string on;
};

/// How build() makes the image.
struct build_options {
  std::string compress; ///< "" (uncompressed, fastest to read), "lz4" or "lz4hc"
  /// Keep overlayfs whiteouts (0/0 character devices) and opaque or redirect
  /// directories in a tool or workdir layer, where they hide or rename the
  /// files of the layers below: refused (invalid_argument, naming the file)
  /// unless this is set. A base layer keeps them always (nothing is below it).
  bool whiteouts = false;
};

/// What build() did.
struct build_result {
  layer_info info;
  bool deduplicated = false; ///< the same image was already stored; no new blob
  /// The ref already named this image, as this kind: nothing changed (info is
  /// the stored layer's, with its own creation time).
  bool existed = false;
  double seconds = 0;        ///< wall time of the whole build
  /// What the image leaves out of the source, sorted: "/dev/sda (a block
  /// device)". Device nodes (but overlayfs whiteouts) and sockets.
  std::vector<std::string> skipped;
};

/// A shared hold on one layer while a sandbox uses it: an O_RDONLY descriptor of
/// the ref file with flock(LOCK_SH). store::remove() refuses (in_use) while any
/// lease on the ref exists, in this process or another. Released on destruction.
class layer_lease {
public:
  layer_lease(layer_lease&&) noexcept = default;
  layer_lease& operator=(layer_lease&&) noexcept = default;
  layer_lease(const layer_lease&) = delete;
  layer_lease& operator=(const layer_lease&) = delete;
  ~layer_lease() = default;

  /// The layer as it was when the lease was taken (refs are immutable).
  [[nodiscard]] const layer_info& info() const noexcept { return info_; }
  /// The EROFS image to mount.
  [[nodiscard]] const std::string& blob_path() const noexcept { return info_.blob_path; }
  /// Every EROFS image to mount, topmost first (more than one for an OCI image).
  [[nodiscard]] const std::vector<std::string>& blob_paths() const noexcept {
    return info_.blob_paths;
  }
  /// False only for a moved-from lease.
  explicit operator bool() const noexcept { return static_cast<bool>(fd_); }

private:
  friend class store;
  layer_lease(unique_fd fd, layer_info info) noexcept
    : fd_(std::move(fd)), info_(std::move(info)) {}

  unique_fd fd_; ///< the ref file, flock(LOCK_SH) held until close
  layer_info info_;
};

/// What import() did.
struct import_result {
  layer_info info;
  bool deduplicated = false; ///< the blob was already stored (another ref has it)
  bool existed = false;      ///< the ref already existed with this digest: nothing done
};

/// A file being written in STATE/tmp for store::import(): a layer image that
/// comes from elsewhere (a peer's store). It lives in a staging directory of its
/// own, locked for its whole life like a build's, so if the process dies the
/// next store::open() removes it. Bytes go in only through append(), in order,
/// and are hashed on the way: digest() is the sha256 of exactly what the file
/// holds. Removed with its directory on destruction unless import() took it.
class staged_file {
public:
  staged_file(staged_file&&) noexcept;
  staged_file& operator=(staged_file&&) noexcept;
  staged_file(const staged_file&) = delete;
  staged_file& operator=(const staged_file&) = delete;
  ~staged_file();

  /// Writes `size` more bytes at the end and hashes them. Refused once
  /// digest() was taken.
  expected<void> append(const void* data, size_t size);

  /// Bytes appended so far.
  [[nodiscard]] uint64_t size() const noexcept;

  /// "sha256:<64 hex>" of the bytes appended; ends the appending.
  [[nodiscard]] const std::string& digest();

  /// For an image an external tool wrote at path() (pack_diff's mkfs.erofs)
  /// instead of append(): hashes what the file holds now; ends the appending.
  expected<void> rehash();

  /// STATE/tmp/<prefix>-XXXXXX/image.
  [[nodiscard]] const std::string& path() const noexcept;

  /// False only for a moved-from file.
  explicit operator bool() const noexcept { return static_cast<bool>(impl_); }

private:
  friend class store;
  struct impl;
  explicit staged_file(std::unique_ptr<impl> i) noexcept;
  std::unique_ptr<impl> impl_;
};

// ---- OCI images (store_image.cpp; runtime/oci.hpp makes them) ----------------

/// A private working directory in STATE/tmp, locked like a build's staging
/// dir: removed with its contents on destruction, or by the next
/// store::open() when its process died.
class scratch_dir {
public:
  scratch_dir(scratch_dir&&) noexcept;
  scratch_dir& operator=(scratch_dir&&) noexcept;
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir();

  [[nodiscard]] const std::string& path() const noexcept;

private:
  friend class store;
  struct impl;
  explicit scratch_dir(std::unique_ptr<impl> i) noexcept;
  std::unique_ptr<impl> impl_;
};

/// One lower of an image for store::commit_image().
struct image_lower {
  std::string digest;   ///< sha256 of the EROFS image
  uint64_t size = 0;    ///< its bytes
  /// The new image (store::make_image's output, in a scratch_dir), or empty
  /// when the blob is already stored.
  std::string image;
  /// The digests of the layer tars this lower was made from (the registry's
  /// blob digest, the config's diff_id): store::image_lower_for() finds it
  /// by them afterwards. Empty for a flattened lower.
  std::vector<std::string> tar_digests;
};

/// How store::pack_diff makes a diff layer (snapshots, issue 16).
struct diff_options {
  /// The sandbox's id range: its upper's owners are host ids uid_base + n,
  /// which the image records as n (as `layer build` records a tree's).
  uint32_t uid_base = 1'000'000'000;
  uint32_t id_count = 65536;
  std::string on;           ///< the record of what it sits on (snapshot.hpp format_on)
  std::string source;       ///< what `layer ls` says it came from
  uint64_t max_bytes = 0;   ///< the image may not grow past this (0: 64 GiB)
  uint64_t timeout_ms = 0;  ///< mkfs.erofs is killed after this (0: 5 minutes)
  /// Paths relative to the upper dir left out of the image.
  std::vector<std::string> exclude;
  /// Where the upper dir is in the mount given to pack_diff.
  std::string upper_subdir = "upper";
};

/// A handle on a store directory. Cheap to copy: all state lives on disk, and
/// every method is safe to call from several threads and processes at once.
class store {
public:
  /// Opens the store at `state_dir` (made absolute), creating the layout if
  /// missing (mkdir -p), and removes what crashed builds left in tmp/.
  static expected<store> open(std::string state_dir);

  /// Builds layer `ref` of `kind` from `src`: a directory (used as is) or a regular
  /// file holding a tar archive (plain or compressed; extracted with owners,
  /// permissions and xattrs kept, so `docker export` output works). Device
  /// nodes and sockets of the tree are left out (build_result::skipped): the
  /// system layer provides /dev; fifos are kept; nothing but directories and
  /// the archive is opened, so a fifo in the source never blocks a build. Errors:
  /// not_found (no SRC), invalid_argument (SRC is another file type, bad ref or
  /// options), already_exists (the ref names another image or kind, both
  /// named in the message; the same image and kind is build_result::existed),
  /// tool_failed (tar or mkfs.erofs failed; the message carries its stderr).
  /// The image is deterministic: the same tree gives the same digest, stored once.
  expected<build_result> build(layer_kind kind, const layer_ref& ref,
                               const std::string& src,
                               const build_options& options = {});

  /// A new, empty staged_file in STATE/tmp for import(); `prefix` names its
  /// staging directory (letters, digits, '-' and '_').
  [[nodiscard]] expected<staged_file> stage(std::string_view prefix = "import") const;

  /// Installs layer `ref` whose image was made elsewhere and written to `file`.
  /// Checks the image: its size must be `size` and its sha256 `digest`
  /// ("sha256:" and 64 lower-case hex digits), else invalid_argument naming
  /// both values, and the store stays as it was (the staged file goes in every
  /// outcome). Then commits like build(): under the store lock, the blob
  /// (shared when one with this digest exists) and the ref, recording
  /// `created` and `source` as given (they describe the layer where it was
  /// built). The ref existing with another digest is already_exists; with the
  /// same digest nothing is done (import_result::existed).
  expected<import_result> import(layer_kind kind, const layer_ref& ref,
                                 const std::string& digest, uint64_t size, int64_t created,
                                 const std::string& source, staged_file file,
                                 const std::string& on = {});

  /// pack_diff (snapshots, issue 16): makes the writable layer in the
  /// mount `mount_fd` (container::upper_mount_fd(); options.upper_subdir is
  /// the overlay upper dir in it, with its whiteouts, opaque dirs, xattrs, owners,
  /// modes and hard links) the layer `ref` of kind diff recording options.on.
  /// The upper dir is untrusted: mkfs.erofs reads it in a process of its own,
  /// in a private mount namespace, through a read-only idmapped clone of the
  /// mount (owners shifted back by uid_base), bounded in time and in output
  /// size. The caller keeps the upper still (the sandbox frozen) meanwhile.
  /// Errors: already_exists, tool_failed (mkfs.erofs's stderr), timeout,
  /// too_large.
  expected<import_result> pack_diff(const layer_ref& ref, int mount_fd,
                                    const diff_options& options);

  /// Opens the blob (image) with this digest read-only. invalid_argument unless
  /// `digest` is "sha256:" and 64 lower-case hex digits (nothing else reaches a
  /// path); not_found when no such blob is stored.
  [[nodiscard]] expected<unique_fd> open_blob(std::string_view digest) const;

  /// True when `digest` is "sha256:" and 64 lower-case hex digits.
  [[nodiscard]] static bool is_digest(std::string_view digest) noexcept;

  /// Every layer, sorted by name then version, each compared in natural order
  /// (digit runs as numbers, so python@9 comes before python@10).
  [[nodiscard]] expected<std::vector<layer_info>> list() const;

  /// One layer; not_found "unknown layer X@Y (see 'dsec layer ls')".
  [[nodiscard]] expected<layer_info> find(const layer_ref& ref) const;

  /// Takes a lease on `ref` (see layer_lease). Taken under the store lock
  /// (LOCK_SH) so that a concurrent remove() cannot delete the layer under it.
  [[nodiscard]] expected<layer_lease> lease(const layer_ref& ref) const;

  /// Removes `ref`; the blob goes too unless another ref names the same digest.
  /// not_found if unknown, in_use while any lease on it is held.
  expected<void> remove(const layer_ref& ref);

  /// The path of the dsec system layer image (device nodes, /proc, /sys, /tmp
  /// mount points, /dev symlinks, and the Chronus client at
  /// /.dsec/bin/chronus, linked at /usr/local/bin/chronus, and a static
  /// busybox at /.dsec/libexec/busybox with /.dsec/libexec/tar, put's and get's tar
  /// when the image has none), and dsec-watch at /.dsec/libexec/watch,
  /// that goes on top of every sandbox's layers.
  /// Built on first use (needs CAP_MKNOD), then reused; named
  /// system-vN-<digest of the chronus, busybox and dsec-watch binaries>.erofs.
  expected<std::string> system_layer();

  /// The static busybox that goes into the system layer: $DSEC_BUSYBOX (an
  /// error when it is not a static ELF program), else /bin/busybox or
  /// /usr/bin/busybox when statically linked (Debian's busybox-static), else
  /// none: the system layer then has no tar of its own.
  static expected<std::optional<std::string>> find_busybox();

  /// The static chronus client that goes into the system layer: $DSEC_CHRONUS,
  /// else `chronus` beside this program (or ../tools/, ../libexec/dsec/), else
  /// the installed one.
  static expected<std::string> find_chronus();

  /// dsec-watch, the directory watcher that goes into the system layer at
  /// /.dsec/libexec/watch: $DSEC_WATCH, else beside this program (as
  /// find_chronus looks).
  static expected<std::string> find_watch();

  // ---- OCI images (store_image.cpp) ----

  /// A new scratch_dir in STATE/tmp (`prefix`: letters, digits, '-', '_').
  [[nodiscard]] expected<scratch_dir> scratch(std::string_view prefix) const;

  /// Makes the deterministic EROFS image of the directory `tree` at `out` as
  /// build() does (same mkfs.erofs options; device nodes but whiteouts and
  /// sockets left out, named in `skipped`); `subject` names the source in
  /// errors. Returns its digest and size (image_lower::image is `out`).
  [[nodiscard]] expected<image_lower> make_image(const std::string& tree,
                                                 const std::string& out,
                                                 const std::string& subject,
                                                 std::vector<std::string>& skipped) const;
  /// Makes one EROFS image, at `out`, of the images `blobs_lowest_first`
  /// merged as overlayfs merges them (whiteouts and opaque directories
  /// applied): their read-only overlay, read by mkfs.erofs in a child process
  /// that attaches it in a mount namespace of its own (nothing is ever
  /// attached where anyone else sees it). `shown` names them in errors. For
  /// an image with too many layers (runtime/oci.hpp), and a microVM with more
  /// disks than it has slots (docs/microvm.md).
  [[nodiscard]] expected<image_lower> flatten(const std::vector<std::string>& blobs_lowest_first,
                                              const std::string& out,
                                              const std::string& shown) const;

  /// The stored lower made from the layer tar with digest `tar_digest`
  /// (STATE/oci/tars/<hex>, written by commit_image), when its blob is still
  /// stored; nothing otherwise.
  [[nodiscard]] std::optional<image_lower> image_lower_for(std::string_view tar_digest) const;

  /// Commits base layer `ref` made of `lowers` (topmost first): each new
  /// image becomes a blob (shared when one with its digest is stored), then
  /// the ref names them all (layer_info::lowers), with `config` (one line of
  /// JSON), `manifest` and `source`; then the tar index. Under LOCK_EX; the
  /// ref existing is already_exists; a failure leaves the store as it was.
  expected<import_result> commit_image(const layer_ref& ref, std::vector<image_lower> lowers,
                                       const std::string& config, const std::string& manifest,
                                       const std::string& source);

  /// The absolute state directory.
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

  /// Bumped whenever the system layer's contents change, so a new dsec builds a
  /// new image next to the old one instead of using a stale one.
  static constexpr int system_layer_version = 4;

private:
  explicit store(std::string dir) : dir_(std::move(dir)) {}

  std::string dir_;
};

} // namespace dsec
