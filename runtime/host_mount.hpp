// host_mount: host directories and files bind-mounted into a sandbox
// (`dsec run -v HOST:SANDBOX[:ro|:rw]`, environment::mounts). The spec is
// checked by check_host_mount (no file is looked at); the node that builds the
// sandbox opens each one through its host_mount_policy: beneath a directory
// its configuration allows (dsecd --allow-host-mount DIR[:rw]), without
// leaving it through a symlink or "..", as a detached, idmapped clone of the
// one mount it is on (with its submounts: rbind), nosuid and nodev, read-only unless
// both the spec and the policy say rw. The sandbox's init then attaches each
// clone at its target inside the sandbox's root (runtime/zygote.cpp), before
// any process of the sandbox runs.
//
// Idmapped with the sandbox's user namespace, the files keep their host
// owners: a file of host uid 1000 is uid 1000 in the sandbox, root's is
// root's, and the sandbox's root is root over what a writable mount holds. So
// a writable directory must be on a nosuid filesystem (checked when the
// policy is made): a set-user-ID program a sandbox leaves there cannot give
// the host root.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

namespace dsec {

struct host_mount {
  std::string host;       ///< an absolute path on the node
  std::string target;     ///< an absolute path in the sandbox
  bool read_only = true;
  /// `rbind`: the mounts beneath HOST come along (each nosuid, nodev, ro
  /// unless writable, idmapped unless `noidmap`); else only the one mount
  /// HOST is on, from HOST down.
  bool recursive = false;
  /// false (`noidmap`): not idmapped, for a filesystem that cannot be (ramfs,
  /// procfs-like ones, some network filesystems): its files show owners the
  /// sandbox's user namespace does not map as nobody (65534), and the
  /// sandbox's root has no more right to them than its host uid has.
  bool idmap = true;

  /// "HOST:TARGET:ro" or ":rw", then ",rbind" and ",noidmap" when set
  [[nodiscard]] std::string to_string() const;
  friend bool operator==(const host_mount&, const host_mount&) = default;
};

/// The most host mounts one sandbox may have.
inline constexpr size_t max_host_mounts = 16;

/// "HOST:SANDBOX[:OPTIONS]" (or "HOST" alone: the same path in the sandbox),
/// OPTIONS a comma-separated list of ro or rw (without either,
/// `read_only_default` decides), rbind, noidmap. The error names the text.
expected<host_mount> parse_host_mount(std::string_view text, bool read_only_default);

/// Both paths absolute, without "." or ".." components or empty ones, at most
/// 1023 bytes; the target is not "/" and not in /proc, /dev, /sys or /.dsec
/// (dsec's own in a Chronus sandbox). The error (invalid_argument) names the
/// mount.
expected<void> check_host_mount(const host_mount& m);

/// A mount made ready for a sandbox: a detached mount (open_tree's clone,
/// attributes set), where it goes, and whether it is a directory.
struct prepared_mount {
  unique_fd tree;
  std::string target;
  bool directory = true;
};

/// The directories whose content sandboxes may mount, each held open from the
/// start (so a path is resolved beneath the directory that was allowed, not
/// beneath whatever has its name later).
class host_mount_policy {
public:
  /// No host mount allowed (a node without --allow-host-mount).
  host_mount_policy() = default;
  /// "DIR" (read-only mounts of what is beneath) or "DIR:rw" (writable ones
  /// too; DIR must then be on a nosuid mount). Each DIR absolute and an
  /// existing directory, opened now. The error names the bad one.
  static expected<host_mount_policy> open(const std::vector<std::string>& dirs);
  /// Every path, writable: `dsec run`, whose user is root on this host
  /// already (docker's rule for its own root).
  static expected<host_mount_policy> anything();

  [[nodiscard]] bool empty() const { return roots_.empty(); }
  /// "DIR, DIR:rw" as configured.
  [[nodiscard]] std::string describe() const;

  /// Opens each of `mounts` (environment::mounts) for a sandbox whose user
  /// namespace is `userns_fd`: invalid_argument for a path outside every
  /// allowed directory or a writable mount of a read-only one, not_found for
  /// a missing path, wrong_kind for what is neither a directory nor a regular
  /// file; each error names the mount.
  expected<std::vector<prepared_mount>> prepare(const std::vector<host_mount>& mounts,
                                                int userns_fd) const;

private:
  struct root {
    std::string path; // normalised, no trailing slash ("/" for the root)
    bool writable = false;
    unique_fd fd;     // O_PATH | O_DIRECTORY
  };
  std::vector<root> roots_;
  bool anything_ = false;
};

} // namespace dsec
