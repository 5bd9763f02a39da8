// The store's system layer (see store.hpp, store::system_layer): the tree every
// sandbox gets on top of its layers (/dev's nodes and links, the mount points
// the sandbox fills, /.dsec with the chronus client and a static busybox),
// built once per pair of those binaries into STATE/system/ with mkfs.erofs.
#include "runtime/store_detail.hpp"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "runtime/io.hpp"
#include "runtime/sha256.hpp"
#include "runtime/sys.hpp"

namespace dsec {

using namespace store_detail;

namespace {

// One entry of the system layer tree.
struct system_entry {
  enum kind_t { dir, chardev, symlink } kind;
  const char* path;
  mode_t mode;         // permission bits (dir, chardev)
  unsigned major = 0;  // chardev
  unsigned minor = 0;
  const char* target = nullptr; // symlink
};

// Mount points the sandbox fills at start (dev/pts, dev/shm, proc, sys, tmp, run)
// and the device nodes and /dev symlinks every program expects. Change this list
// => bump store::system_layer_version.
const system_entry system_entries[] = {
  {system_entry::dir, "dev", 0755},
  {system_entry::dir, "dev/pts", 0755},
  {system_entry::dir, "dev/shm", 01777},
  {system_entry::dir, "proc", 0555},
  {system_entry::dir, "sys", 0555},
  {system_entry::dir, "tmp", 01777},
  {system_entry::dir, "run", 0755},
  // dsec's own files (docs/chronus.md): bin/chronus, and agent/, where a pristine
  // command sees the agent's root. Mounted read-only over /.dsec in Chronus sandboxes.
  {system_entry::dir, ".dsec", 0755},
  {system_entry::dir, ".dsec/bin", 0755},
  {system_entry::dir, ".dsec/libexec", 0755},
  {system_entry::dir, ".dsec/agent", 0755},
  {system_entry::chardev, "dev/null", 0666, 1, 3},
  {system_entry::chardev, "dev/zero", 0666, 1, 5},
  {system_entry::chardev, "dev/full", 0666, 1, 7},
  {system_entry::chardev, "dev/random", 0666, 1, 8},
  {system_entry::chardev, "dev/urandom", 0666, 1, 9},
  {system_entry::chardev, "dev/tty", 0666, 5, 0},
  {system_entry::symlink, "dev/ptmx", 0, 0, 0, "pts/ptmx"},
  {system_entry::symlink, "dev/fd", 0, 0, 0, "/proc/self/fd"},
  {system_entry::symlink, "dev/stdin", 0, 0, 0, "/proc/self/fd/0"},
  {system_entry::symlink, "dev/stdout", 0, 0, 0, "/proc/self/fd/1"},
  {system_entry::symlink, "dev/stderr", 0, 0, 0, "/proc/self/fd/2"},
};

// Copies the program open at `fd` to `path` (in the tree), mode 0755.
expected<void> copy_program(int fd, const std::string& path, std::string_view what) {
  unique_fd out{::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755)};
  if (!out)
    return sys_error("cannot create", path);
  char buf[65536];
  off_t at = 0;
  for (;;) {
    auto n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0)
      return sys_error("cannot read " + std::string{what} + " for", path);
    if (n == 0)
      break;
    if (::write(out.get(), buf, static_cast<size_t>(n)) != n)
      return sys_error("cannot write", path);
    at += n;
  }
  if (::fchmod(out.get(), 0755) != 0)
    return sys_error("cannot set the mode of", path);
  return {};
}

// Copies the chronus client (from `fd`) to .dsec/bin/chronus, mode 0755, with a
// hard link at usr/local/bin/chronus (one file in the image).
expected<void> add_chronus(const std::string& root, int fd) {
  for (auto d : {"usr", "usr/local", "usr/local/bin"}) {
    auto path = join(root, d);
    if (::mkdir(path.c_str(), 0755) != 0 || ::chmod(path.c_str(), 0755) != 0)
      return sys_error("cannot create directory", path);
  }
  auto path = join(root, ".dsec/bin/chronus");
  DSEC_TRY_VOID(copy_program(fd, path, "the chronus client"));
  auto link = join(root, "usr/local/bin/chronus");
  if (::link(path.c_str(), link.c_str()) != 0)
    return sys_error("cannot link", link);
  return {};
}

// Copies the static busybox (from `fd`) to .dsec/libexec/busybox, with
// .dsec/libexec/tar a link to it: the tar that put and get fall back on when
// the image has none (the sandbox actor puts /.dsec/libexec last in their
// PATH). Not in .dsec/bin, which trusted commands find first in theirs: a
// grader's `tar` stays the image's.
expected<void> add_busybox(const std::string& root, int fd) {
  auto path = join(root, ".dsec/libexec/busybox");
  DSEC_TRY_VOID(copy_program(fd, path, "busybox"));
  auto link = join(root, ".dsec/libexec/tar");
  if (::symlink("busybox", link.c_str()) != 0)
    return sys_error("cannot create symlink", link);
  return {};
}

// Whether the ELF file open at `fd` is statically linked (has no program
// interpreter): only such a program runs in any image, libc or none.
expected<bool> is_static_elf(int fd, const std::string& path) {
  Elf64_Ehdr eh{};
  if (::pread(fd, &eh, sizeof eh, 0) != static_cast<ssize_t>(sizeof eh))
    return make_error(errc::invalid_argument, path + " is not an ELF program (too short)");
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64
      || eh.e_phentsize != sizeof(Elf64_Phdr))
    return make_error(errc::invalid_argument, path + " is not a 64-bit ELF program");
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    auto at = static_cast<off_t>(eh.e_phoff + i * sizeof ph);
    if (::pread(fd, &ph, sizeof ph, at) != static_cast<ssize_t>(sizeof ph))
      return make_error(errc::invalid_argument, path + ": its program headers are cut short");
    if (ph.p_type == PT_INTERP)
      return false;
  }
  return true;
}

// Copies dsec-watch (from `fd`) to .dsec/libexec/watch: what Sandbox.files.watch
// and dsec-e2b's WatchDir run in the sandbox (tools/watch/dsec_watch.c).
expected<void> add_watch(const std::string& root, int fd) {
  return copy_program(fd, join(root, ".dsec/libexec/watch"), "dsec-watch");
}

expected<void> make_system_tree(const std::string& root, int chronus_fd, int busybox_fd,
                                int watch_fd) {
  if (::mkdir(root.c_str(), 0755) != 0 || ::chmod(root.c_str(), 0755) != 0)
    return sys_error("cannot create", root);
  for (const auto& e : system_entries) {
    auto path = join(root, e.path);
    switch (e.kind) {
      case system_entry::dir:
        if (::mkdir(path.c_str(), 0700) != 0)
          return sys_error("cannot create directory", path);
        break;
      case system_entry::chardev:
        if (::mknod(path.c_str(), S_IFCHR | 0600, makedev(e.major, e.minor)) != 0) {
          auto err = sys_error("cannot create device node", path);
          if (err.sys_errno == EPERM)
            err.message += " (building the system layer needs root: CAP_MKNOD)";
          return err;
        }
        break;
      case system_entry::symlink:
        if (::symlink(e.target, path.c_str()) != 0)
          return sys_error("cannot create symlink", path);
        break;
    }
    // Set the mode explicitly: mkdir and mknod apply the umask.
    if (e.kind != system_entry::symlink && ::chmod(path.c_str(), e.mode) != 0)
      return sys_error("cannot set the mode of", path);
  }
  // None of these entries has a meaningful mtime; one fixed time (the epoch) keeps
  // the image identical wherever and whenever it is built. Done last: creating an
  // entry changes its directory's mtime. (mkfs.erofs -T0 would do it, but erofs-utils
  // 1.5 lets SOURCE_DATE_EPOCH override -T.)
  DSEC_TRY_VOID(add_chronus(root, chronus_fd));
  if (busybox_fd >= 0)
    DSEC_TRY_VOID(add_busybox(root, busybox_fd));
  DSEC_TRY_VOID(add_watch(root, watch_fd));
  const struct timespec epoch[2] = {{0, 0}, {0, 0}};
  for (const auto& e : system_entries) {
    auto path = join(root, e.path);
    if (::utimensat(AT_FDCWD, path.c_str(), epoch, AT_SYMLINK_NOFOLLOW) != 0)
      return sys_error("cannot set the mtime of", path);
  }
  std::vector<const char*> added = {".dsec/bin/chronus", ".dsec/libexec/watch"};
  if (busybox_fd >= 0)
    added.insert(added.end(), {".dsec/libexec/busybox", ".dsec/libexec/tar"});
  added.insert(added.end(), {"usr/local/bin", "usr/local", "usr", ".dsec/bin", ".dsec/libexec", ".dsec"});
  for (auto e : added) {
    auto path = join(root, e);
    if (::utimensat(AT_FDCWD, path.c_str(), epoch, AT_SYMLINK_NOFOLLOW) != 0)
      return sys_error("cannot set the mtime of", path);
  }
  if (::utimensat(AT_FDCWD, root.c_str(), epoch, 0) != 0)
    return sys_error("cannot set the mtime of", root);
  return {};
}

} // namespace

expected<std::string> store::find_chronus() {
  return sys::find_program("DSEC_CHRONUS", "chronus",
                           "the chronus client for the system layer");
}

expected<std::string> store::find_watch() {
  return sys::find_program("DSEC_WATCH", "dsec-watch",
                           "dsec-watch (the directory watcher) for the system layer");
}

expected<std::optional<std::string>> store::find_busybox() {
  std::vector<std::string> candidates;
  const char* env = std::getenv("DSEC_BUSYBOX");
  if (env && *env)
    candidates.emplace_back(env);
  else
    candidates = {"/bin/busybox", "/usr/bin/busybox"};
  for (const auto& c : candidates) {
    unique_fd fd{::open(c.c_str(), O_RDONLY | O_CLOEXEC)};
    if (!fd) {
      if (env && *env)
        return sys_error("DSEC_BUSYBOX: cannot open", c);
      continue;
    }
    DSEC_TRY(is_static, is_static_elf(fd.get(), c));
    if (is_static)
      return std::optional<std::string>{c};
    if (env && *env)
      return make_error(errc::invalid_argument,
                        "DSEC_BUSYBOX: " + c + " is dynamically linked; the system layer "
                          "needs a static busybox (Debian's busybox-static)");
  }
  return std::optional<std::string>{};
}

expected<std::string> store::system_layer() {
  // The image carries the chronus client, busybox and dsec-watch: its name
  // says which ones, so a new binary makes a new image beside the old.
  DSEC_TRY(chronus, find_chronus());
  unique_fd cfd{::open(chronus.c_str(), O_RDONLY | O_CLOEXEC)};
  if (!cfd)
    return sys_error("cannot open the chronus client", chronus);
  DSEC_TRY(chronus_digest, sha256_hex_of_file(cfd.get()));
  DSEC_TRY(busybox, find_busybox());
  unique_fd bfd;
  std::string busybox_digest = "none";
  if (busybox) {
    bfd.reset(::open(busybox->c_str(), O_RDONLY | O_CLOEXEC));
    if (!bfd)
      return sys_error("cannot open busybox", *busybox);
    DSEC_TRY(d, sha256_hex_of_file(bfd.get()));
    busybox_digest = std::move(d);
  }
  DSEC_TRY(watch, find_watch());
  unique_fd wfd{::open(watch.c_str(), O_RDONLY | O_CLOEXEC)};
  if (!wfd)
    return sys_error("cannot open dsec-watch", watch);
  DSEC_TRY(watch_digest, sha256_hex_of_file(wfd.get()));
  sha256 h;
  auto all = chronus_digest + "\n" + busybox_digest + "\n" + watch_digest + "\n";
  h.update(all.data(), all.size());
  auto digest = to_hex(h.finish());
  auto path = join(system_dir(dir_), "system-v" + std::to_string(system_layer_version) + "-" +
                                       digest.substr(0, 16) + ".erofs");
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
    return path;

  DSEC_TRY(staging, staging_dir::create(dir_, "system"));
  auto tree = join(staging.path(), "root");
  DSEC_TRY_VOID(make_system_tree(tree, cfd.get(), bfd ? bfd.get() : -1, wfd.get()));
  auto image = join(staging.path(), "system.erofs");
  // --all-root: the nodes must be root's whoever built them.
  auto argv = mkfs_argv("", image, tree);
  argv.insert(argv.begin() + 1, "--all-root");
  DSEC_TRY_VOID(run_tool(argv, tree));
  if (::chmod(image.c_str(), 0444) != 0)
    return sys_error("cannot seal", image);
  {
    unique_fd fd{::open(image.c_str(), O_RDONLY | O_CLOEXEC)};
    if (!fd || ::fsync(fd.get()) != 0)
      return sys_error("cannot sync", image);
  }
  DSEC_TRY(lock, lock_store(dir_, LOCK_EX));
  // EEXIST: another process built the same image meanwhile; use theirs.
  if (rename_noreplace(image, path) != 0 && errno != EEXIST)
    return sys_error("cannot store the system layer", path);
  DSEC_TRY_VOID(fsync_dir(system_dir(dir_)));
  return path;
}

} // namespace dsec
