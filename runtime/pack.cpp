#include "runtime/pack.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "runtime/fd.hpp"
#include "runtime/sha256.hpp"

namespace dsec {

namespace {

constexpr char magic[8] = {'D', 'S', 'E', 'C', 'P', 'K', '1', '\n'};
constexpr uint32_t unmapped = 0xFFFFFFFFu; // an owner outside the sandbox's range
constexpr const char* opaque_xattr = "trusted.overlay.opaque";
constexpr const char* redirect_xattr = "trusted.overlay.redirect";

enum kind : uint8_t { k_dir = 1, k_file = 2, k_symlink = 3, k_whiteout = 4, k_fifo = 5 };

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_str(std::string& out, std::string_view s) {
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

uint32_t rel_id(uint32_t id, uint32_t base) {
  if (base == 0)
    return id;
  return id >= base ? id - base : unmapped;
}

uint32_t host_id(uint32_t rel, uint32_t base) {
  if (rel == unmapped)
    return 0;
  return base + rel;
}

int64_t ns_of(const struct timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

std::string xattr_of(int fd, const char* name) {
  char buf[4096];
  ssize_t n = ::fgetxattr(fd, name, buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string{};
}

expected<void> fsync_dir(const std::string& dir) {
  unique_fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!d || ::fsync(d.get()) < 0)
    return sys_error("fsync of", dir);
  return {};
}

struct writer {
  pack_cache& cache;
  pack_cache next;
  std::string blob_dir;
  int blob_fd;
  uint32_t base;
  std::string out;
  pack_stats st;
  std::vector<char> buf = std::vector<char>(1 << 20);
  bool wrote_blob = false;

  void header(uint8_t k, const struct stat& s, uint8_t flags, const std::string& path) {
    put<uint8_t>(out, k);
    put<uint32_t>(out, s.st_mode & 07777);
    put<uint32_t>(out, rel_id(s.st_uid, base));
    put<uint32_t>(out, rel_id(s.st_gid, base));
    put<int64_t>(out, s.st_mtim.tv_sec);
    put<uint32_t>(out, static_cast<uint32_t>(s.st_mtim.tv_nsec));
    put<uint8_t>(out, flags);
    put_str(out, path);
    ++st.entries;
  }

  // The digest of a file, storing its content as a blob if it is new.
  expected<std::array<uint8_t, 32>> blob(int dirfd, const std::string& name,
                                         const std::string& path, const struct stat& s) {
    auto it = cache.files.find(path);
    if (it != cache.files.end() && it->second.ino == s.st_ino
        && it->second.size == static_cast<uint64_t>(s.st_size)
        && it->second.mtime_ns == ns_of(s.st_mtim) && it->second.ctime_ns == ns_of(s.st_ctim)) {
      next.files.emplace(path, it->second);
      return it->second.digest;
    }
    unique_fd f{::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC)};
    if (!f)
      return sys_error("opening for the pack", "/" + path);
    sha256 h;
    uint64_t total = 0;
    for (;;) {
      ssize_t n = ::read(f.get(), buf.data(), buf.size());
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return sys_error("reading for the pack", "/" + path);
      if (n == 0)
        break;
      h.update(buf.data(), static_cast<size_t>(n));
      total += static_cast<uint64_t>(n);
    }
    auto digest = h.finish();
    auto hex = to_hex(digest);
    if (::faccessat(blob_fd, hex.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) != 0) {
      // Unique among the sandboxes of this process packing the same content
      // at once; the last rename wins, with the same bytes.
      static std::atomic<uint64_t> seq{0};
      std::string tmp = hex + ".tmp" + std::to_string(::getpid()) + "-" + std::to_string(++seq);
      unique_fd t{::openat(blob_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
      if (!t)
        return sys_error("creating a blob in", blob_dir);
      off_t off = 0;
      while (static_cast<uint64_t>(off) < total) {
        ssize_t n = ::sendfile(t.get(), f.get(), &off, total - static_cast<uint64_t>(off));
        if (n < 0 && errno == EINTR)
          continue;
        if (n <= 0) {
          int err = n < 0 ? errno : EIO;
          (void) ::unlinkat(blob_fd, tmp.c_str(), 0);
          return sys_error("copying into a blob of", "/" + path, err);
        }
      }
      if (::fsync(t.get()) < 0 || ::renameat(blob_fd, tmp.c_str(), blob_fd, hex.c_str()) < 0) {
        int err = errno;
        (void) ::unlinkat(blob_fd, tmp.c_str(), 0);
        return sys_error("storing the blob of", "/" + path, err);
      }
      ++st.new_blobs;
      st.new_bytes += total;
      wrote_blob = true;
    }
    next.files.emplace(path, pack_cache::entry{s.st_ino, static_cast<uint64_t>(s.st_size),
                                               ns_of(s.st_mtim), ns_of(s.st_ctim), digest});
    return digest;
  }

  expected<void> walk(int dirfd, const std::string& rel) {
    std::vector<std::string> names;
    {
      int dup = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
      if (dup < 0)
        return sys_error("dup of a directory fd for", "/" + rel);
      DIR* d = ::fdopendir(dup);
      if (!d) {
        ::close(dup);
        return sys_error("listing for the pack", "/" + rel);
      }
      ::rewinddir(d);
      while (auto* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
          names.emplace_back(e->d_name);
      }
      ::closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      std::string path = rel.empty() ? name : rel + "/" + name;
      struct stat s {};
      if (::fstatat(dirfd, name.c_str(), &s, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno == ENOENT)
          continue; // removed while we looked
        return sys_error("stat for the pack", "/" + path);
      }
      if (S_ISDIR(s.st_mode)) {
        unique_fd sub{::openat(dirfd, name.c_str(),
                               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
        if (!sub)
          return sys_error("opening for the pack", "/" + path);
        bool opaque = xattr_of(sub.get(), opaque_xattr) == "y";
        header(k_dir, s, opaque ? 1 : 0, path);
        put_str(out, xattr_of(sub.get(), redirect_xattr));
        DSEC_TRY_VOID(walk(sub.get(), path));
      } else if (S_ISREG(s.st_mode)) {
        DSEC_TRY(digest, blob(dirfd, name, path, s));
        header(k_file, s, 0, path);
        put<uint64_t>(out, static_cast<uint64_t>(s.st_size));
        out.append(reinterpret_cast<const char*>(digest.data()), digest.size());
        ++st.files;
        st.bytes += static_cast<uint64_t>(s.st_size);
      } else if (S_ISLNK(s.st_mode)) {
        std::string target(static_cast<size_t>(s.st_size) + 1, '\0');
        ssize_t n = ::readlinkat(dirfd, name.c_str(), target.data(), target.size());
        if (n < 0)
          return sys_error("readlink for the pack", "/" + path);
        target.resize(static_cast<size_t>(n));
        header(k_symlink, s, 0, path);
        put_str(out, target);
      } else if (S_ISCHR(s.st_mode) && s.st_rdev == 0) {
        header(k_whiteout, s, 0, path);
      } else if (S_ISFIFO(s.st_mode)) {
        header(k_fifo, s, 0, path);
      }
      // sockets and device nodes are not kept
    }
    return {};
  }
};

// Opens `rel` under `root` without following any symbolic link.
int open_beneath(int root, const std::string& rel, uint64_t flags) {
  struct open_how how {};
  how.flags = flags | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, root, rel.empty() ? "." : rel.c_str(), &how,
                                    sizeof how));
}

struct reader {
  std::string_view data;
  const std::string& path;
  size_t off = sizeof magic;

  template <class T>
  expected<T> get() {
    if (data.size() - off < sizeof(T))
      return make_error(errc::malformed, "pack " + path + " ends in the middle of an entry");
    T v;
    std::memcpy(&v, data.data() + off, sizeof(T));
    off += sizeof(T);
    return v;
  }

  expected<std::string> get_str() {
    DSEC_TRY(n, get<uint32_t>());
    if (data.size() - off < n)
      return make_error(errc::malformed, "pack " + path + " ends in the middle of a name");
    std::string s{data.substr(off, n)};
    off += n;
    return s;
  }
};

bool safe_relative(const std::string& p) {
  if (p.empty() || p.front() == '/' || p.find('\0') != std::string::npos)
    return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos)
      end = p.size();
    auto part = std::string_view(p).substr(start, end - start);
    if (part.empty() || part == "." || part == "..")
      return false;
    start = end + 1;
  }
  return true;
}

} // namespace

expected<pack_stats> write_pack(int upper_fd, const std::string& pack_path,
                                const std::string& blob_dir, pack_cache& cache,
                                uint32_t uid_base, std::string* inline_manifest,
                                size_t inline_limit) {
  if (::mkdir(blob_dir.c_str(), 0700) < 0 && errno != EEXIST)
    return sys_error("creating the blob directory", blob_dir);
  unique_fd blobs{::open(blob_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!blobs)
    return sys_error("opening the blob directory", blob_dir);
  writer w{cache, {}, blob_dir, blobs.get(), uid_base, {}, {}};
  w.out.append(magic, sizeof magic);
  struct stat root {};
  if (::fstat(upper_fd, &root) < 0)
    return sys_error("stat of the writable layer for", pack_path);
  w.header(k_dir, root, 0, "");
  put_str(w.out, "");
  DSEC_TRY_VOID(w.walk(upper_fd, ""));
  if (w.wrote_blob)
    DSEC_TRY_VOID(fsync_dir(blob_dir));
  if (inline_manifest) {
    inline_manifest->clear();
    if (w.out.size() <= inline_limit) {
      *inline_manifest = std::move(w.out);
      cache = std::move(w.next);
      return w.st;
    }
  }
  std::string tmp = pack_path + ".tmp";
  {
    unique_fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
    if (!f)
      return sys_error("creating the pack", tmp);
    size_t done = 0;
    while (done < w.out.size()) {
      ssize_t n = ::write(f.get(), w.out.data() + done, w.out.size() - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0) {
        int err = errno;
        (void) ::unlink(tmp.c_str());
        return sys_error("writing the pack", tmp, err);
      }
      done += static_cast<size_t>(n);
    }
    if (::fsync(f.get()) < 0) {
      int err = errno;
      (void) ::unlink(tmp.c_str());
      return sys_error("fsync of the pack", tmp, err);
    }
  }
  if (::rename(tmp.c_str(), pack_path.c_str()) < 0) {
    int err = errno;
    (void) ::unlink(tmp.c_str());
    return sys_error("renaming the pack to", pack_path, err);
  }
  auto slash = pack_path.rfind('/');
  DSEC_TRY_VOID(fsync_dir(slash == std::string::npos ? "." : pack_path.substr(0, slash)));
  cache = std::move(w.next);
  return w.st;
}

expected<pack_stats> restore_pack(const std::string& pack_path, const std::string& blob_dir,
                                  int dest_fd, uint32_t uid_base) {
  std::string data;
  {
    unique_fd f{::open(pack_path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (!f)
      return sys_error("opening the pack", pack_path);
    char b[65536];
    for (;;) {
      ssize_t n = ::read(f.get(), b, sizeof b);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return sys_error("reading the pack", pack_path);
      if (n == 0)
        break;
      data.append(b, static_cast<size_t>(n));
    }
  }
  return restore_manifest(data, pack_path, blob_dir, dest_fd, uid_base);
}

expected<pack_stats> restore_manifest(std::string_view data, const std::string& pack_path,
                                      const std::string& blob_dir, int dest_fd,
                                      uint32_t uid_base) {
  if (data.size() < sizeof magic || std::memcmp(data.data(), magic, sizeof magic) != 0)
    return make_error(errc::malformed, "not a dsec pack (no DSECPK1 header): " + pack_path);
  unique_fd blobs{::open(blob_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!blobs)
    return sys_error("opening the blob directory", blob_dir);
  reader r{data, pack_path};
  pack_stats st;
  struct dir_time {
    std::string path;
    struct timespec mtime;
  };
  std::vector<dir_time> dirs;
  while (r.off < data.size()) {
    DSEC_TRY(k, r.get<uint8_t>());
    DSEC_TRY(mode, r.get<uint32_t>());
    DSEC_TRY(uid, r.get<uint32_t>());
    DSEC_TRY(gid, r.get<uint32_t>());
    DSEC_TRY(sec, r.get<int64_t>());
    DSEC_TRY(nsec, r.get<uint32_t>());
    DSEC_TRY(flags, r.get<uint8_t>());
    DSEC_TRY(path, r.get_str());
    mode &= 07777;
    uid_t hu = host_id(uid, uid_base);
    gid_t hg = host_id(gid, uid_base);
    struct timespec times[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(sec), static_cast<long>(nsec)}};
    ++st.entries;
    if (!path.empty() && !safe_relative(path))
      return make_error(errc::malformed, "pack " + pack_path + " names an unsafe path '"
                                           + path + "'");
    std::string parent, name;
    if (!path.empty()) {
      auto slash = path.rfind('/');
      parent = slash == std::string::npos ? "" : path.substr(0, slash);
      name = slash == std::string::npos ? path : path.substr(slash + 1);
    }
    unique_fd pfd;
    if (!path.empty()) {
      pfd.reset(open_beneath(dest_fd, parent, O_RDONLY | O_DIRECTORY));
      if (!pfd)
        return sys_error("opening (no links followed) in the new writable layer", "/" + parent);
    }
    const std::string shown = "/" + path;
    switch (k) {
      case k_dir: {
        DSEC_TRY(redirect, r.get_str());
        unique_fd d;
        if (path.empty()) {
          d.reset(::fcntl(dest_fd, F_DUPFD_CLOEXEC, 0));
        } else {
          if (::mkdirat(pfd.get(), name.c_str(), 0700) < 0 && errno != EEXIST)
            return sys_error("mkdir while restoring", shown);
          d.reset(::openat(pfd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        }
        if (!d)
          return sys_error("opening while restoring", shown);
        if (::fchown(d.get(), hu, hg) < 0 || ::fchmod(d.get(), mode) < 0)
          return sys_error("setting owner and mode while restoring", shown);
        if ((flags & 1) && ::fsetxattr(d.get(), opaque_xattr, "y", 1, 0) < 0)
          return sys_error("marking opaque while restoring", shown);
        if (!redirect.empty()
            && ::fsetxattr(d.get(), redirect_xattr, redirect.data(), redirect.size(), 0) < 0)
          return sys_error("setting the redirect while restoring", shown);
        dirs.push_back({path, times[1]});
        break;
      }
      case k_file: {
        DSEC_TRY(size, r.get<uint64_t>());
        if (data.size() - r.off < 32)
          return make_error(errc::malformed, "pack " + pack_path + " ends in a digest");
        std::array<uint8_t, 32> digest;
        std::memcpy(digest.data(), data.data() + r.off, 32);
        r.off += 32;
        auto hex = to_hex(digest);
        unique_fd src{::openat(blobs.get(), hex.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC)};
        if (!src)
          return sys_error("opening the blob of " + shown + " in", blob_dir);
        unique_fd dst{::openat(pfd.get(), name.c_str(),
                               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)};
        if (!dst)
          return sys_error("creating while restoring", shown);
        off_t off = 0;
        while (static_cast<uint64_t>(off) < size) {
          ssize_t n = ::sendfile(dst.get(), src.get(), &off, size - static_cast<uint64_t>(off));
          if (n < 0 && errno == EINTR)
            continue;
          if (n <= 0)
            return sys_error("copying while restoring", shown, n < 0 ? errno : EIO);
        }
        if (::fchown(dst.get(), hu, hg) < 0 || ::fchmod(dst.get(), mode) < 0
            || ::futimens(dst.get(), times) < 0)
          return sys_error("setting owner, mode and time while restoring", shown);
        ++st.files;
        st.bytes += size;
        break;
      }
      case k_symlink: {
        DSEC_TRY(target, r.get_str());
        if (::symlinkat(target.c_str(), pfd.get(), name.c_str()) < 0)
          return sys_error("symlink while restoring", shown);
        if (::fchownat(pfd.get(), name.c_str(), hu, hg, AT_SYMLINK_NOFOLLOW) < 0
            || ::utimensat(pfd.get(), name.c_str(), times, AT_SYMLINK_NOFOLLOW) < 0)
          return sys_error("setting owner and time while restoring", shown);
        break;
      }
      case k_whiteout:
      case k_fifo: {
        mode_t m = k == k_fifo ? (S_IFIFO | mode) : S_IFCHR;
        if (::mknodat(pfd.get(), name.c_str(), m, makedev(0, 0)) < 0)
          return sys_error(k == k_fifo ? "mkfifo while restoring" : "whiteout while restoring",
                           shown);
        if (::fchownat(pfd.get(), name.c_str(), hu, hg, AT_SYMLINK_NOFOLLOW) < 0)
          return sys_error("setting the owner while restoring", shown);
        break;
      }
      default:
        return make_error(errc::malformed, "pack " + pack_path + " has an entry of unknown kind "
                                             + std::to_string(k));
    }
  }
  // Directories' times last: creating their entries changed them.
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    unique_fd d{open_beneath(dest_fd, it->path, O_RDONLY | O_DIRECTORY)};
    struct timespec times[2] = {{0, UTIME_OMIT}, it->mtime};
    if (!d || ::futimens(d.get(), times) < 0)
      return sys_error("setting the time while restoring", "/" + it->path);
  }
  return st;
}

} // namespace dsec
