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
#include <climits>
#include <cstring>
#include <ctime>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/fd.hpp"
#include "runtime/io.hpp"
#include "runtime/sha256.hpp"

namespace dsec {

namespace {

constexpr char magic[8] = {'D', 'S', 'E', 'C', 'P', 'K', '1', '\n'};
constexpr uint32_t unmapped = 0xFFFFFFFFu; // an owner outside the sandbox's range
constexpr const char* opaque_xattr = "trusted.overlay.opaque";
constexpr const char* redirect_xattr = "trusted.overlay.redirect";

enum kind : uint8_t {
  k_dir = 1, k_file = 2, k_symlink = 3, k_whiteout = 4, k_fifo = 5, k_skipped = 6
};

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

const char* kind_name(mode_t m) {
  switch (m & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFLNK: return "a symbolic link";
    case S_IFIFO: return "a fifo";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
  }
  return "of an unknown kind";
}

int64_t now_ns() {
  struct timespec t {};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return ns_of(t);
}

int64_t realtime_ns() {
  struct timespec t {};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return ns_of(t);
}

// A file whose ctime is this close to the pack's start may still change within
// the same timestamp tick (tmpfs stamps with the coarse clock): its digest is
// used but not remembered, so the next pack reads it again.
constexpr int64_t racy_ns = 50'000'000;

// Reads up to `n` bytes at the file's offset, retrying EINTR: the count read
// (short only at end of file), or -1 with errno.
ssize_t read_some(int fd, char* buf, size_t n) {
  for (;;) {
    ssize_t r = ::read(fd, buf, n);
    if (r < 0 && errno == EINTR)
      continue;
    return r;
  }
}

struct writer {
  pack_cache& cache;
  pack_cache next;
  std::string blob_dir;
  int blob_fd;
  uint32_t base;
  pack_limits lim;
  int64_t deadline_ns;
  int64_t started_real_ns;
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

  void skip(const struct stat& s, const std::string& path, std::string why) {
    header(k_skipped, s, 0, path);
    put_str(out, why);
    st.skipped.push_back({"/" + path, std::move(why)});
  }

  // The pack's bounds: checked before every entry and every 1 MiB read.
  expected<void> check(const std::string& path) {
    if (lim.cancel && lim.cancel->load(std::memory_order_relaxed))
      return make_error(errc::timeout, "the pack was cancelled (its sandbox is going away) at /"
                                         + path);
    if (now_ns() > deadline_ns)
      return make_error(errc::timeout,
                        "the pack took longer than " + std::to_string(lim.time_limit_ms)
                          + " ms (stopped at /" + path
                          + "; is the sandbox changing its files while they are packed?)");
    if (st.entries >= lim.max_entries)
      return too_many();
    return {};
  }

  expected<void> too_many() const {
    return make_error(errc::too_large, "the writable layer holds more than "
                                         + std::to_string(lim.max_entries)
                                         + " names; a pack keeps at most that many");
  }

  // Hashes up to `size` bytes of `fd` from its start, copying them to `copy_fd`
  // when that is not -1. Returns the digest and the count read.
  expected<std::pair<std::array<uint8_t, 32>, uint64_t>>
  hash(int fd, uint64_t size, int copy_fd, const std::string& path) {
    if (::lseek(fd, 0, SEEK_SET) < 0)
      return sys_error("seeking for the pack", "/" + path);
    sha256 h;
    uint64_t total = 0;
    while (total < size) {
      DSEC_TRY_VOID(check(path));
      size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - total));
      ssize_t n = read_some(fd, buf.data(), want);
      if (n < 0)
        return sys_error("reading for the pack", "/" + path);
      if (n == 0)
        break; // it shrank: the pack keeps what there was
      h.update(buf.data(), static_cast<size_t>(n));
      if (copy_fd >= 0)
        DSEC_TRY_VOID(write_all(copy_fd, {buf.data(), static_cast<size_t>(n)}, "/" + path,
                                "copying into a blob of"));
      total += static_cast<uint64_t>(n);
    }
    return std::pair{h.finish(), total};
  }

  struct file_digest {
    std::array<uint8_t, 32> digest;
    uint64_t size;
  };

  // The digest and size of regular file `name` (whose lstat is `s`), storing
  // its content as a blob if it is new; nullopt (and `why`) if at open time it
  // was no longer a regular file, or had gone.
  expected<std::optional<file_digest>> blob(int dirfd, const std::string& name,
                                            const std::string& path, const struct stat& s,
                                            std::string& why) {
    auto it = cache.files.find(path);
    if (it != cache.files.end() && it->second.ino == s.st_ino
        && it->second.size == static_cast<uint64_t>(s.st_size)
        && it->second.mtime_ns == ns_of(s.st_mtim) && it->second.ctime_ns == ns_of(s.st_ctim)) {
      next.files.emplace(path, it->second);
      return std::optional{file_digest{it->second.digest, it->second.size}};
    }
    // Never waits: a fifo swapped in since the lstat opens at once (and is
    // then skipped), a symlink fails (ELOOP), a device opens no terminal.
    unique_fd f{::openat(dirfd, name.c_str(),
                         O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC)};
    if (!f) {
      if (errno == ENOENT)
        return std::optional<file_digest>{}; // removed while we looked: why stays empty
      if (errno == ELOOP) {
        why = "changed while packed: now a symbolic link";
        return std::optional<file_digest>{};
      }
      if (errno == ENXIO || errno == EACCES || errno == EPERM || errno == EWOULDBLOCK) {
        why = std::string{"changed while packed: cannot be opened ("} + std::strerror(errno) + ")";
        return std::optional<file_digest>{};
      }
      return sys_error("opening for the pack", "/" + path);
    }
    struct stat fs {};
    if (::fstat(f.get(), &fs) < 0)
      return sys_error("stat for the pack", "/" + path);
    if (!S_ISREG(fs.st_mode)) {
      why = std::string{"changed while packed: now "} + kind_name(fs.st_mode);
      return std::optional<file_digest>{};
    }
    // What fstat says now, not what a sandbox appending forever would make it.
    uint64_t size = static_cast<uint64_t>(fs.st_size);
    auto too_much = [&] {
      return make_error(errc::too_large,
                        "the pack would store more than " + std::to_string(lim.max_new_bytes >> 20)
                          + " MiB of new file contents (/" + path + " has "
                          + std::to_string(size) + " bytes): the trajectory log keeps no copy"
                          + " of them, so a resume cannot rebuild the sandbox past this step");
    };
    if (lim.max_new_bytes > 0 && size > lim.max_new_bytes)
      return too_much(); // not even read
    DSEC_TRY(first, hash(f.get(), size, -1, path));
    auto digest = first.first;
    uint64_t total = first.second;
    auto hex = to_hex(digest);
    if (::faccessat(blob_fd, hex.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) != 0) {
      if (lim.max_new_bytes > 0 && st.new_bytes + size > lim.max_new_bytes)
        return too_much();
      // Unique among the sandboxes of this process packing the same content
      // at once; the last rename wins, with the same bytes.
      static std::atomic<uint64_t> seq{0};
      std::string tmp = hex + ".tmp" + std::to_string(::getpid()) + "-" + std::to_string(++seq);
      unique_fd t{::openat(blob_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
      if (!t)
        return sys_error("creating a blob in", blob_dir);
      // Copied and hashed again: the blob is named by the bytes it holds,
      // even if the sandbox changed the file since the first read.
      auto copied = hash(f.get(), size, t.get(), path);
      if (!copied) {
        (void) ::unlinkat(blob_fd, tmp.c_str(), 0);
        return std::move(copied).error_value();
      }
      if (copied->first != digest) {
        digest = copied->first;
        hex = to_hex(digest);
      }
      total = copied->second;
      if (::fsync(t.get()) < 0 || ::renameat(blob_fd, tmp.c_str(), blob_fd, hex.c_str()) < 0) {
        int err = errno;
        (void) ::unlinkat(blob_fd, tmp.c_str(), 0);
        return sys_error("storing the blob of", "/" + path, err);
      }
      ++st.new_blobs;
      st.new_bytes += total;
      wrote_blob = true;
    }
    // Remembered only when nothing can have changed unseen: the file as read
    // is the file as lstat saw it, and its last change is not so recent that
    // another could follow within the same timestamp.
    if (fs.st_ino == s.st_ino && ns_of(fs.st_ctim) == ns_of(s.st_ctim)
        && ns_of(fs.st_mtim) == ns_of(s.st_mtim) && total == static_cast<uint64_t>(s.st_size)
        && ns_of(s.st_ctim) < started_real_ns - racy_ns)
      next.files.emplace(path, pack_cache::entry{s.st_ino, static_cast<uint64_t>(s.st_size),
                                                 ns_of(s.st_mtim), ns_of(s.st_ctim), digest});
    return std::optional{file_digest{digest, total}};
  }

  expected<void> walk(int dirfd, const std::string& rel, uint32_t depth) {
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
      // A sandbox adding names as fast as we list them cannot keep us here:
      // the listing stops at the pack's bounds.
      while (auto* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
          names.emplace_back(e->d_name);
        if (names.size() % 4096 == 0) {
          auto ok = names.size() + st.entries > lim.max_entries ? too_many() : check(rel);
          if (!ok) {
            ::closedir(d);
            return ok;
          }
        }
      }
      ::closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      std::string path = rel.empty() ? name : rel + "/" + name;
      DSEC_TRY_VOID(check(path));
      struct stat s {};
      if (::fstatat(dirfd, name.c_str(), &s, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno == ENOENT)
          continue; // removed while we looked
        return sys_error("stat for the pack", "/" + path);
      }
      if (S_ISDIR(s.st_mode)) {
        if (depth >= lim.max_depth) {
          skip(s, path, "a directory deeper than " + std::to_string(lim.max_depth) + " levels");
          continue;
        }
        // O_DIRECTORY fails on anything else before opening it.
        unique_fd sub{::openat(dirfd, name.c_str(),
                               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)};
        if (!sub) {
          if (errno == ENOENT)
            continue;
          if (errno == ENOTDIR || errno == ELOOP) {
            skip(s, path, "changed while packed: no longer a directory");
            continue;
          }
          return sys_error("opening for the pack", "/" + path);
        }
        struct stat ds {};
        if (::fstat(sub.get(), &ds) < 0)
          return sys_error("stat for the pack", "/" + path);
        bool opaque = xattr_of(sub.get(), opaque_xattr) == "y";
        header(k_dir, ds, opaque ? 1 : 0, path);
        put_str(out, xattr_of(sub.get(), redirect_xattr));
        DSEC_TRY_VOID(walk(sub.get(), path, depth + 1));
      } else if (S_ISREG(s.st_mode)) {
        std::string why;
        DSEC_TRY(d, blob(dirfd, name, path, s, why));
        if (!d) {
          if (!why.empty())
            skip(s, path, std::move(why));
          continue;
        }
        header(k_file, s, 0, path);
        put<uint64_t>(out, d->size);
        out.append(reinterpret_cast<const char*>(d->digest.data()), d->digest.size());
        ++st.files;
        st.bytes += d->size;
      } else if (S_ISLNK(s.st_mode)) {
        // PATH_MAX bounds a target whatever lstat said (it may be replaced
        // by a longer one in between).
        std::string target(PATH_MAX + 1, '\0');
        ssize_t n = ::readlinkat(dirfd, name.c_str(), target.data(), target.size());
        if (n < 0) {
          if (errno == ENOENT)
            continue;
          if (errno == EINVAL) {
            skip(s, path, "changed while packed: no longer a symbolic link");
            continue;
          }
          return sys_error("readlink for the pack", "/" + path);
        }
        if (static_cast<size_t>(n) > PATH_MAX) {
          skip(s, path, "a symbolic link with a target longer than PATH_MAX");
          continue;
        }
        target.resize(static_cast<size_t>(n));
        header(k_symlink, s, 0, path);
        put_str(out, target);
      } else if (S_ISCHR(s.st_mode) && s.st_rdev == 0) {
        header(k_whiteout, s, 0, path);
      } else if (S_ISFIFO(s.st_mode)) {
        header(k_fifo, s, 0, path); // from lstat: never opened
      } else {
        skip(s, path, kind_name(s.st_mode)); // a socket, a device node
      }
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

// One entry of a manifest, parsed.
struct entry {
  uint8_t kind = 0;
  uint32_t mode = 0, uid = 0, gid = 0;
  struct timespec mtime {};
  uint8_t flags = 0;
  std::string path;
  std::string text; // symlink target, dir redirect, skip reason
  uint64_t size = 0;
  std::array<uint8_t, 32> digest{};
};

// Calls `fn(const entry&)` for each entry of `data`, in order; stops at its
// first error.
template <class F>
expected<void> for_each_entry(std::string_view data, const std::string& shown, F&& fn) {
  if (data.size() < sizeof magic || std::memcmp(data.data(), magic, sizeof magic) != 0)
    return make_error(errc::malformed, "not a dsec pack (no DSECPK1 header): " + shown);
  reader r{data, shown};
  while (r.off < data.size()) {
    entry e;
    DSEC_TRY(k, r.get<uint8_t>());
    DSEC_TRY(mode, r.get<uint32_t>());
    DSEC_TRY(uid, r.get<uint32_t>());
    DSEC_TRY(gid, r.get<uint32_t>());
    DSEC_TRY(sec, r.get<int64_t>());
    DSEC_TRY(nsec, r.get<uint32_t>());
    DSEC_TRY(flags, r.get<uint8_t>());
    DSEC_TRY(path, r.get_str());
    e.kind = k;
    e.mode = mode & 07777;
    e.uid = uid;
    e.gid = gid;
    e.mtime = {static_cast<time_t>(sec), static_cast<long>(nsec)};
    e.flags = flags;
    e.path = std::move(path);
    if (!e.path.empty() && !safe_relative(e.path))
      return make_error(errc::malformed, "pack " + shown + " names an unsafe path '" + e.path
                                           + "'");
    switch (k) {
      case k_dir:
      case k_symlink:
      case k_skipped: {
        DSEC_TRY(text, r.get_str());
        e.text = std::move(text);
        break;
      }
      case k_file: {
        DSEC_TRY(size, r.get<uint64_t>());
        if (data.size() - r.off < 32)
          return make_error(errc::malformed, "pack " + shown + " ends in a digest");
        e.size = size;
        std::memcpy(e.digest.data(), data.data() + r.off, 32);
        r.off += 32;
        break;
      }
      case k_whiteout:
      case k_fifo: break;
      default:
        return make_error(errc::malformed, "pack " + shown + " has an entry of unknown kind "
                                             + std::to_string(k));
    }
    DSEC_TRY_VOID(fn(static_cast<const entry&>(e)));
  }
  return {};
}

// The bytes of the daemon's own file `path` (a pack), at most `limit` of them;
// never waits on something that is not a regular file.
expected<std::string> read_regular(const std::string& path, uint64_t limit) {
  unique_fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC)};
  if (!f)
    return sys_error("opening the pack", path);
  struct stat s {};
  if (::fstat(f.get(), &s) < 0)
    return sys_error("stat of the pack", path);
  if (!S_ISREG(s.st_mode))
    return make_error(errc::malformed, "the pack " + path + " is " + kind_name(s.st_mode)
                                         + ", not a regular file");
  if (static_cast<uint64_t>(s.st_size) > limit)
    return make_error(errc::too_large, "the pack " + path + " has "
                                         + std::to_string(s.st_size) + " bytes, more than "
                                         + std::to_string(limit));
  std::string data(static_cast<size_t>(s.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = read_some(f.get(), data.data() + done, data.size() - done);
    if (n < 0)
      return sys_error("reading the pack", path);
    if (n == 0)
      break;
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  return data;
}

// The largest pack restore_pack reads: far above what pack_limits lets
// write_pack make (a million names of PATH_MAX would not fit, but nothing near).
constexpr uint64_t max_pack_bytes = 1ull << 30;

} // namespace

expected<pack_stats> write_pack(int upper_fd, const std::string& pack_path,
                                const std::string& blob_dir, pack_cache& cache,
                                uint32_t uid_base, std::string* inline_manifest,
                                size_t inline_limit, const pack_limits& limits) {
  if (::mkdir(blob_dir.c_str(), 0700) < 0 && errno != EEXIST)
    return sys_error("creating the blob directory", blob_dir);
  unique_fd blobs{::open(blob_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (!blobs)
    return sys_error("opening the blob directory", blob_dir);
  writer w{cache, {}, blob_dir, blobs.get(), uid_base, limits,
           now_ns() + static_cast<int64_t>(limits.time_limit_ms) * 1'000'000, realtime_ns(),
           {}, {}};
  w.out.append(magic, sizeof magic);
  struct stat root {};
  if (::fstat(upper_fd, &root) < 0)
    return sys_error("stat of the writable layer for", pack_path);
  w.header(k_dir, root, 0, "");
  put_str(w.out, "");
  DSEC_TRY_VOID(w.walk(upper_fd, "", 0));
  if (w.wrote_blob)
    DSEC_TRY_VOID(fsync_dir(blob_dir, "fsync of"));
  if (inline_manifest) {
    inline_manifest->clear();
    if (w.out.size() <= inline_limit) {
      *inline_manifest = std::move(w.out);
      cache = std::move(w.next);
      return std::move(w.st);
    }
  }
  std::string tmp = pack_path + ".tmp";
  {
    unique_fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)};
    if (!f)
      return sys_error("creating the pack", tmp);
    if (auto r = write_all(f.get(), w.out, tmp, "writing the pack"); !r) {
      (void) ::unlink(tmp.c_str());
      return std::move(r).error_value();
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
  DSEC_TRY_VOID(
    fsync_dir(slash == std::string::npos ? "." : pack_path.substr(0, slash), "fsync of"));
  cache = std::move(w.next);
  return std::move(w.st);
}

expected<pack_stats> describe_pack(std::string_view data, const std::string& shown) {
  pack_stats st;
  DSEC_TRY_VOID(for_each_entry(data, shown, [&](const entry& e) -> expected<void> {
    ++st.entries;
    if (e.kind == k_file) {
      ++st.files;
      st.bytes += e.size;
    } else if (e.kind == k_skipped) {
      st.skipped.push_back({"/" + e.path, e.text});
    }
    return {};
  }));
  return st;
}

expected<pack_stats> restore_pack(const std::string& pack_path, const std::string& blob_dir,
                                  int dest_fd, uint32_t uid_base) {
  DSEC_TRY(data, read_regular(pack_path, max_pack_bytes));
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
  pack_stats st;
  struct dir_time {
    std::string path;
    struct timespec mtime;
  };
  std::vector<dir_time> dirs;
  auto one = [&](const entry& e) -> expected<void> {
    const auto& path = e.path;
    uid_t hu = host_id(e.uid, uid_base);
    gid_t hg = host_id(e.gid, uid_base);
    struct timespec times[2] = {{0, UTIME_OMIT}, e.mtime};
    ++st.entries;
    if (e.kind == k_skipped) {
      st.skipped.push_back({"/" + path, e.text});
      return {};
    }
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
    switch (e.kind) {
      case k_dir: {
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
        if (::fchown(d.get(), hu, hg) < 0 || ::fchmod(d.get(), e.mode) < 0)
          return sys_error("setting owner and mode while restoring", shown);
        if ((e.flags & 1) && ::fsetxattr(d.get(), opaque_xattr, "y", 1, 0) < 0)
          return sys_error("marking opaque while restoring", shown);
        if (!e.text.empty()
            && ::fsetxattr(d.get(), redirect_xattr, e.text.data(), e.text.size(), 0) < 0)
          return sys_error("setting the redirect while restoring", shown);
        dirs.push_back({path, e.mtime});
        break;
      }
      case k_file: {
        auto hex = to_hex(e.digest);
        unique_fd src{::openat(blobs.get(), hex.c_str(),
                               O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC)};
        if (!src)
          return sys_error("opening the blob of " + shown + " in", blob_dir);
        struct stat bs {};
        if (::fstat(src.get(), &bs) < 0)
          return sys_error("stat of the blob of " + shown + " in", blob_dir);
        if (!S_ISREG(bs.st_mode) || static_cast<uint64_t>(bs.st_size) != e.size)
          return make_error(errc::malformed,
                            "the blob " + hex + " of " + shown + " in " + blob_dir + " is "
                              + (S_ISREG(bs.st_mode)
                                   ? "of " + std::to_string(bs.st_size) + " bytes, the pack says "
                                       + std::to_string(e.size)
                                   : std::string{kind_name(bs.st_mode)}));
        unique_fd dst{::openat(pfd.get(), name.c_str(),
                               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)};
        if (!dst)
          return sys_error("creating while restoring", shown);
        off_t off = 0;
        while (static_cast<uint64_t>(off) < e.size) {
          ssize_t n = ::sendfile(dst.get(), src.get(), &off, e.size - static_cast<uint64_t>(off));
          if (n < 0 && errno == EINTR)
            continue;
          if (n <= 0)
            return sys_error("copying while restoring", shown, n < 0 ? errno : EIO);
        }
        if (::fchown(dst.get(), hu, hg) < 0 || ::fchmod(dst.get(), e.mode) < 0
            || ::futimens(dst.get(), times) < 0)
          return sys_error("setting owner, mode and time while restoring", shown);
        ++st.files;
        st.bytes += e.size;
        break;
      }
      case k_symlink: {
        if (::symlinkat(e.text.c_str(), pfd.get(), name.c_str()) < 0)
          return sys_error("symlink while restoring", shown);
        if (::fchownat(pfd.get(), name.c_str(), hu, hg, AT_SYMLINK_NOFOLLOW) < 0
            || ::utimensat(pfd.get(), name.c_str(), times, AT_SYMLINK_NOFOLLOW) < 0)
          return sys_error("setting owner and time while restoring", shown);
        break;
      }
      case k_whiteout:
      case k_fifo: {
        mode_t m = e.kind == k_fifo ? (S_IFIFO | e.mode) : S_IFCHR;
        if (::mknodat(pfd.get(), name.c_str(), m, makedev(0, 0)) < 0)
          return sys_error(e.kind == k_fifo ? "mkfifo while restoring" : "whiteout while restoring",
                           shown);
        if (::fchownat(pfd.get(), name.c_str(), hu, hg, AT_SYMLINK_NOFOLLOW) < 0)
          return sys_error("setting the owner while restoring", shown);
        break;
      }
    }
    return {};
  };
  DSEC_TRY_VOID(for_each_entry(data, pack_path, one));
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
