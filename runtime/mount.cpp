#include "runtime/mount.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cstdio>

#include "runtime/sys.hpp"

namespace dsec {

expected<layer_mount> layer_mount::open(const std::string& image, int userns_fd) {
  unique_fd fs{sys::fsopen("erofs", FSOPEN_CLOEXEC)};
  if (!fs)
    return sys_error("fsopen(erofs) for", image);
  if (sys::fsconfig(fs.get(), FSCONFIG_SET_STRING, "source", image.c_str(), 0) < 0)
    return sys::fs_error(fs.get(), "cannot use EROFS image", image);
  if (sys::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return sys::fs_error(fs.get(), "cannot mount EROFS image", image);
  layer_mount m;
  m.image_ = image;
  m.mnt_.reset(sys::fsmount(fs.get(), FSMOUNT_CLOEXEC,
                            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID));
  if (!m.mnt_)
    return sys::fs_error(fs.get(), "fsmount of EROFS image", image);
  if (userns_fd >= 0) {
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
    if (sys::mount_setattr(m.mnt_.get(), "", AT_EMPTY_PATH, &attr) < 0)
      return sys_error("idmapping the mount of", image);
  }
  // fsmount() returns an O_PATH-like fd that FSCONFIG_SET_FD refuses (EBADF).
  m.dir_.reset(::openat(m.mnt_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!m.dir_)
    return sys_error("opening the root of the mounted image", image);
  return m;
}

uint64_t tmpfs_inodes_for(uint64_t size_bytes) {
  return std::max<uint64_t>(min_tmpfs_inodes, size_bytes / bytes_per_tmpfs_inode);
}

// A tmpfs being configured (fsopen), of at most `size_bytes` (0: tmpfs's default)
// and at most tmpfs_inodes_for(size_bytes) names: without that bound a sandbox
// with a 1 MiB disk could make hundreds of thousands of empty files, each
// costing the host kernel memory that the size limit does not count.
static expected<unique_fd> open_tmpfs(uint64_t size_bytes) {
  unique_fd fs{sys::fsopen("tmpfs", FSOPEN_CLOEXEC)};
  if (!fs)
    return sys_error("fsopen(tmpfs)");
  if (size_bytes > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(size_bytes));
    if (sys::fsconfig(fs.get(), FSCONFIG_SET_STRING, "size", buf, 0) < 0)
      return sys::fs_error(fs.get(), "tmpfs size", buf);
    std::snprintf(buf, sizeof buf, "%llu",
                  static_cast<unsigned long long>(tmpfs_inodes_for(size_bytes)));
    if (sys::fsconfig(fs.get(), FSCONFIG_SET_STRING, "nr_inodes", buf, 0) < 0)
      return sys::fs_error(fs.get(), "tmpfs nr_inodes", buf);
  }
  return fs;
}

expected<upper_layer> make_upper(uint64_t size_bytes, uint32_t owner) {
  DSEC_TRY(fs, open_tmpfs(size_bytes));
  if (sys::fsconfig(fs.get(), FSCONFIG_SET_STRING, "mode", "0755", 0) < 0
      || sys::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return sys::fs_error(fs.get(), "creating the upper tmpfs", "");
  upper_layer u;
  u.mnt.reset(sys::fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV));
  if (!u.mnt)
    return sys::fs_error(fs.get(), "fsmount of the upper tmpfs", "");
  if (::mkdirat(u.mnt.get(), "upper", 0755) < 0 || ::mkdirat(u.mnt.get(), "work", 0700) < 0)
    return sys_error("mkdir in the upper tmpfs");
  // The upper dir's owner becomes the owner of the sandbox's "/".
  if (owner != 0 && ::fchownat(u.mnt.get(), "upper", owner, owner, 0) < 0)
    return sys_error("chown of the upper dir");
  u.upper.reset(::openat(u.mnt.get(), "upper", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  u.work.reset(::openat(u.mnt.get(), "work", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!u.upper || !u.work)
    return sys_error("opening upper/work dirs");
  return u;
}

expected<unique_fd> make_chronus_socket(int overlay, uint32_t owner, int backlog) {
  const char* shown = chronus_socket_path;
  if (::mkdirat(overlay, "run", 0755) == 0) {
    // Like the sandbox's own directories: its root owns it, whatever our umask.
    if (::fchmodat(overlay, "run", 0755, 0) < 0
        || (owner != 0 && ::fchownat(overlay, "run", owner, owner, AT_SYMLINK_NOFOLLOW) < 0))
      return sys_error("setting the owner and mode of", "/run");
  } else if (errno != EEXIST) {
    return sys_error("mkdir in the sandbox root", "/run");
  }
  // Never through a symbolic link of the layers: it would resolve on the host.
  unique_fd run{::openat(overlay, "run", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  if (!run)
    return sys_error("opening the sandbox directory (links not followed)", "/run");
  // Whatever the layers have there gives way (a whiteout in the upper dir).
  if (::unlinkat(run.get(), "chronus.sock", 0) < 0 && errno != ENOENT)
    return sys_error("removing the layers' file at", shown);
  unique_fd sock{::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  if (!sock)
    return sys_error("socket(AF_UNIX, SOCK_SEQPACKET) for", shown);
  // sun_path holds 108 bytes: bind through our descriptor of run/, not a path.
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/chronus.sock", run.get());
  if (::bind(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) < 0)
    return sys_error("bind of the Chronus socket at", shown);
  if (::fchmodat(run.get(), "chronus.sock", 0666, 0) < 0
      || (owner != 0
          && ::fchownat(run.get(), "chronus.sock", owner, owner, AT_SYMLINK_NOFOLLOW) < 0))
    return sys_error("setting the owner and mode of", shown);
  if (::listen(sock.get(), backlog) < 0)
    return sys_error("listen on", shown);
  return sock;
}

expected<unique_fd> make_overlay(std::span<const int> lowers, const upper_layer& upper) {
  unique_fd fs{sys::fsopen("overlay", FSOPEN_CLOEXEC)};
  if (!fs)
    return sys_error("fsopen(overlay)");
  // lowerdir+ appends: the first one given is the topmost lower layer.
  for (int fd : lowers)
    if (sys::fsconfig(fs.get(), FSCONFIG_SET_FD, "lowerdir+", nullptr, fd) < 0)
      return sys::fs_error(fs.get(), "adding a lower layer to the overlay", "");
  if (sys::fsconfig(fs.get(), FSCONFIG_SET_FD, "upperdir", nullptr, upper.upper.get()) < 0)
    return sys::fs_error(fs.get(), "setting the overlay upper dir", "");
  if (sys::fsconfig(fs.get(), FSCONFIG_SET_FD, "workdir", nullptr, upper.work.get()) < 0)
    return sys::fs_error(fs.get(), "setting the overlay work dir", "");
  if (sys::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return sys::fs_error(fs.get(), "creating the overlay", "");
  unique_fd mnt{sys::fsmount(fs.get(), FSMOUNT_CLOEXEC, 0)};
  if (!mnt)
    return sys::fs_error(fs.get(), "fsmount of the overlay", "");
  return mnt;
}

expected<unique_fd> make_lower_view(std::span<const int> lowers) {
  if (lowers.empty())
    return make_error(errc::invalid_argument, "a view of the layers needs at least one layer");
  if (lowers.size() == 1) {
    // An overlay without an upper dir needs two lower layers.
    unique_fd t{sys::open_tree(lowers[0], "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH)};
    if (!t)
      return sys_error("cloning the mount of the one layer");
    mount_attr ro{};
    ro.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID;
    if (sys::mount_setattr(t.get(), "", AT_EMPTY_PATH, &ro) < 0)
      return sys_error("making the view of the layers read-only");
    return t;
  }
  unique_fd fs{sys::fsopen("overlay", FSOPEN_CLOEXEC)};
  if (!fs)
    return sys_error("fsopen(overlay)");
  for (int fd : lowers)
    if (sys::fsconfig(fs.get(), FSCONFIG_SET_FD, "lowerdir+", nullptr, fd) < 0)
      return sys::fs_error(fs.get(), "adding a lower layer to the view of the layers", "");
  if (sys::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return sys::fs_error(fs.get(), "creating the view of the layers", "");
  unique_fd mnt{sys::fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID)};
  if (!mnt)
    return sys::fs_error(fs.get(), "fsmount of the view of the layers", "");
  return mnt;
}

expected<unique_fd> make_scratch_tmpfs(uint64_t size_bytes, uint32_t owner) {
  DSEC_TRY(fs, open_tmpfs(size_bytes));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%u", owner);
  if (sys::fsconfig(fs.get(), FSCONFIG_SET_STRING, "mode", "1777", 0) < 0
      || sys::fsconfig(fs.get(), FSCONFIG_SET_STRING, "uid", buf, 0) < 0
      || sys::fsconfig(fs.get(), FSCONFIG_SET_STRING, "gid", buf, 0) < 0
      || sys::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return sys::fs_error(fs.get(), "creating a scratch tmpfs", "");
  unique_fd mnt{sys::fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)};
  if (!mnt)
    return sys::fs_error(fs.get(), "fsmount of a scratch tmpfs", "");
  return mnt;
}

} // namespace dsec
