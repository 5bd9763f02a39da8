#include "runtime/proc_mask.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace dsec {

namespace {

constexpr unsigned long locked = MS_NOSUID | MS_NODEV | MS_NOEXEC;

// "<a>/<b>" into buf; false if it does not fit.
bool join(char* buf, size_t cap, const char* a, const char* b) {
  int n = std::snprintf(buf, cap, "%s/%s", a, b);
  return n > 0 && static_cast<size_t>(n) < cap;
}

} // namespace

int prepare_proc_masks(const char* dir) {
  if (::mount("dsec-mask", dir, "tmpfs", locked, "size=4k,nr_inodes=4,mode=0555") < 0)
    return -errno;
  char path[256];
  if (!join(path, sizeof path, dir, "file"))
    return -ENAMETOOLONG;
  int fd = ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
  if (fd < 0)
    return -errno;
  ::close(fd);
  if (!join(path, sizeof path, dir, "dir"))
    return -ENAMETOOLONG;
  if (::mkdir(path, 0555) < 0)
    return -errno;
  // Read-only at the superblock: every bind of it is read-only too, whatever
  // its mount flags.
  if (::mount(nullptr, dir, nullptr, MS_REMOUNT | MS_RDONLY | locked, nullptr) < 0)
    return -errno;
  return 0;
}

uint32_t proc_masks_to_apply(const char* proc) {
  uint32_t which = 0;
  char path[256];
  for (size_t i = 0; i < proc_mask_count; ++i)
    if (proc_masks[i].by_module
        || (join(path, sizeof path, proc, proc_masks[i].name)
            && ::faccessat(AT_FDCWD, path, F_OK, AT_SYMLINK_NOFOLLOW) == 0))
      which |= 1u << i;
  return which;
}

int mask_proc(const char* proc, const char* masks, uint32_t which, const char** failed) {
  char file[256], dir[256], target[256];
  if (!join(file, sizeof file, masks, "file") || !join(dir, sizeof dir, masks, "dir"))
    return -ENAMETOOLONG;
  for (size_t i = 0; i < proc_mask_count; ++i) {
    if (!(which & (1u << i)))
      continue;
    const auto& m = proc_masks[i];
    *failed = m.name;
    if (!join(target, sizeof target, proc, m.name))
      return -ENAMETOOLONG;
    const char* source = m.kind == proc_mask_kind::empty_file  ? file
                         : m.kind == proc_mask_kind::empty_dir ? dir
                                                               : target;
    if (::mount(source, target, nullptr, MS_BIND, nullptr) < 0) {
      if (errno == ENOENT)
        continue;
      return -errno;
    }
    if (m.kind == proc_mask_kind::read_only
        && ::mount(nullptr, target, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | locked, nullptr) < 0)
      return -errno;
  }
  *failed = "";
  return 0;
}

} // namespace dsec
