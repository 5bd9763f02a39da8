// The mount mechanics of a sandbox root, all with the new mount API and all
// detached: nothing here is ever attached to the host's mount namespace.
//
//   layer_mount   one EROFS image, mounted once (file-backed, read-only) and shared
//                 by every sandbox that uses it; idmapped into the sandbox user
//                 namespace so that its root-owned files belong to the sandbox root.
//   make_upper    a private tmpfs holding the sandbox's writable upper and work dirs.
//   make_overlay  the overlay of the lower layers under that upper dir.
//   make_chronus_socket  a listening unix socket bound in that overlay, which
//                 the sandbox sees at /run/chronus.sock.
//   make_lower_view, make_scratch_tmpfs  what a Chronus sandbox's pristine
//                 root is made of (its /.dsec comes from that root).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

namespace dsec {

class layer_mount {
public:
  /// Mounts the EROFS image at `image` (a regular file: the kernel reads it
  /// directly, no loop device) as a detached read-only mount. With a user
  /// namespace fd, the mount is idmapped through it (MOUNT_ATTR_IDMAP).
  static expected<layer_mount> open(const std::string& image, int userns_fd);

  /// An O_DIRECTORY descriptor of the layer's root, as overlayfs' lowerdir+
  /// wants it (the fsmount fd itself is O_PATH and is refused).
  [[nodiscard]] int dir_fd() const { return dir_.get(); }
  [[nodiscard]] const std::string& image() const { return image_; }

private:
  unique_fd mnt_; // keeps the detached mount alive
  unique_fd dir_;
  std::string image_;
};

/// A sandbox's private writable layer: a detached tmpfs with `upper` and `work`.
struct upper_layer {
  unique_fd mnt;   ///< the tmpfs mount
  unique_fd upper; ///< O_DIRECTORY fd of upper/ (owned by the sandbox root)
  unique_fd work;  ///< O_DIRECTORY fd of work/
};

/// The names (inodes) a tmpfs of `size_bytes` may hold: one per 4 KiB of its
/// size, and at least 1024. A sandbox's upper and scratch tmpfs get this bound
/// with their size, so --disk bounds files as well as bytes.
inline constexpr uint64_t bytes_per_tmpfs_inode = 4096;
inline constexpr uint64_t min_tmpfs_inodes = 1024;
uint64_t tmpfs_inodes_for(uint64_t size_bytes);

/// Makes the tmpfs, of at most `size_bytes` and tmpfs_inodes_for(size_bytes)
/// names. `size_bytes` 0 leaves the kernel defaults (half of RAM);
/// `owner` is the host uid (and gid) that the sandbox's root maps to.
expected<upper_layer> make_upper(uint64_t size_bytes, uint32_t owner);

/// Where the sandbox sees its Chronus socket, and where it lies in the upper dir.
inline constexpr const char* chronus_socket_path = "/run/chronus.sock";

/// Binds a SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC unix socket at
/// run/chronus.sock in `overlay` (make_overlay's mount, before the sandbox gets
/// it), and listens with a backlog of `backlog`. The socket lands in the upper
/// tmpfs; it is bound through the overlay because a connect() through the
/// overlay finds only sockets bound on the overlay's own inodes (one bound in
/// the upper dir directly refuses connections: ECONNREFUSED). A /run of the
/// layers is kept (copied up, merged); else run/ is made, owned by `owner` and
/// mode 0755. The socket is mode 0666 and owned by `owner` (the host uid of the
/// sandbox's root) so that every uid of the sandbox can connect. Nothing is
/// created outside the sandbox's upper layer. The listening socket holds the
/// overlay mount (as any bound socket holds its file system) until it is closed.
expected<unique_fd> make_chronus_socket(int overlay, uint32_t owner, int backlog = 64);

/// Builds a detached overlay of `lowers` (directory fds, topmost first) under
/// `upper`, and returns its mount fd, ready for move_mount(2) in the sandbox.
expected<unique_fd> make_overlay(std::span<const int> lowers, const upper_layer& upper);

/// The layers alone, read-only and detached: an overlay of `lowers` without an
/// upper dir (a clone of the one layer's mount when there is just one). Nothing
/// written in a sandbox ever shows in it. The root of a pristine command.
expected<unique_fd> make_lower_view(std::span<const int> lowers);

/// A detached private tmpfs, mode 1777, owned by `owner` (the host uid of the
/// sandbox's root), nosuid and nodev; `size_bytes` 0: the kernel default.
expected<unique_fd> make_scratch_tmpfs(uint64_t size_bytes, uint32_t owner);

} // namespace dsec
