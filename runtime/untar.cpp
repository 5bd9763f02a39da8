#include "runtime/untar.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "runtime/fd.hpp"

namespace dsec {

namespace {

error refuse(const std::string& why) {
  return make_error(errc::invalid_argument, "refused the archive from the sandbox: " + why);
}

std::string join(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i)
      out += '/';
    out += parts[i];
  }
  return out;
}

// The components of an archive name, relative to the destination: leading
// '/' and "." components dropped; ".." refuses it.
expected<std::vector<std::string>> components(const char* raw, const char* what) {
  if (!raw)
    return refuse(std::string{"an entry has no readable "} + what);
  std::string_view s{raw};
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= s.size()) {
    size_t end = s.find('/', i);
    if (end == std::string_view::npos)
      end = s.size();
    auto part = s.substr(i, end - i);
    if (part == "..")
      return refuse("'" + std::string{s} + "' has a '..' component (" + what + ")");
    if (!part.empty() && part != ".")
      parts.emplace_back(part);
    i = end + 1;
  }
  return parts;
}

struct archive_deleter {
  void operator()(struct archive* a) const { archive_read_free(a); }
};

struct extractor {
  int dest;
  const std::string& shown;
  mode_t umask;
  const std::string& top;
  const std::string& rename; // with `top`: the name `top` gets here
  untar_result res;
  std::set<std::string> files;   // regular files this archive made: hard link targets
  std::set<std::string> dropped; // fifos and devices left out
  struct dir_fix {
    std::vector<std::string> path;
    mode_t mode;
    struct timespec mtime;
  };
  std::vector<dir_fix> dirs; // directories the archive made: mode and time last
  std::string cached;        // the last parent opened, and its descriptor
  unique_fd cached_fd;

  // The directory `parts[0..n)` beneath the destination, opened O_PATH,
  // each component from the one before without following a link; missing
  // ones are made (with `create`). `name` is the entry, for messages.
  expected<int> open_dir(const std::vector<std::string>& parts, size_t n, const std::string& name,
                         bool create) {
    auto key = join(parts, n);
    if (cached_fd && key == cached)
      return cached_fd.get();
    unique_fd cur{::fcntl(dest, F_DUPFD_CLOEXEC, 0)};
    if (!cur)
      return sys_error("dup of the destination", shown);
    for (size_t i = 0; i < n; ++i) {
      const auto& c = parts[i];
      int fd = ::openat(cur.get(), c.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT && create) {
        if (::mkdirat(cur.get(), c.c_str(), 0777) < 0 && errno != EEXIST)
          return sys_error("mkdir in " + shown + " for '" + name + "':", join(parts, i + 1));
        fd = ::openat(cur.get(), c.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      }
      if (fd < 0) {
        if (errno == ELOOP || errno == ENOTDIR)
          return refuse("'" + name + "' goes through '" + join(parts, i + 1)
                        + "', which is a symbolic link or not a directory in " + shown
                        + " (nothing is written through a link)");
        return sys_error("opening in " + shown + " for '" + name + "':", join(parts, i + 1));
      }
      cur.reset(fd);
    }
    cached = key;
    cached_fd = std::move(cur);
    return cached_fd.get();
  }

  // Makes room for a non-directory at `name` in `dir`: whatever non-directory
  // is there goes (unlinked, never written through); a directory refuses it.
  expected<void> clear(int dir, const std::string& base, const std::string& name) {
    struct stat st {};
    if (::fstatat(dir, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
      if (errno == ENOENT)
        return {};
      return sys_error("stat in " + shown + " of", name);
    }
    if (S_ISDIR(st.st_mode))
      return refuse("'" + name + "' is a directory in " + shown
                    + "; the archive has something else there");
    if (::unlinkat(dir, base.c_str(), 0) < 0)
      return sys_error("replacing in " + shown, name);
    files.erase(name);
    dropped.erase(name);
    return {};
  }

  expected<void> write_data(struct archive* a, int fd, const std::string& name, int64_t size) {
    for (;;) {
      const void* buf = nullptr;
      size_t len = 0;
      la_int64_t off = 0;
      int r = archive_read_data_block(a, &buf, &len, &off);
      if (r == ARCHIVE_EOF)
        break;
      if (r < ARCHIVE_WARN)
        return refuse("reading '" + name + "': " + archive_error_string(a));
      const char* p = static_cast<const char*>(buf);
      while (len > 0) {
        ssize_t w = ::pwrite(fd, p, len, off);
        if (w < 0 && errno == EINTR)
          continue;
        if (w <= 0)
          return sys_error("writing in " + shown, name);
        p += w;
        off += w;
        len -= static_cast<size_t>(w);
      }
    }
    if (size >= 0 && ::ftruncate(fd, size) < 0) // a sparse file's hole at the end
      return sys_error("setting the size in " + shown + " of", name);
    return {};
  }

  expected<void> entry(struct archive* a, struct archive_entry* e) {
    ++res.entries;
    DSEC_TRY(parts, components(archive_entry_pathname(e), "its name"));
    if (parts.empty())
      return {}; // "./": the destination itself, left as it is
    auto name = join(parts, parts.size());
    if (!top.empty() && parts[0] != top)
      return refuse("'" + name + "' is not inside '" + top + "', the copied name");
    if (!rename.empty()) {
      parts[0] = rename;
      name = join(parts, parts.size());
    }
    const auto& base = parts.back();
    struct timespec times[2] = {
      {0, UTIME_OMIT},
      {static_cast<time_t>(archive_entry_mtime(e)), archive_entry_mtime_nsec(e)}};
    if (!archive_entry_mtime_is_set(e))
      times[1] = {0, UTIME_OMIT};
    if (times[1].tv_nsec != UTIME_OMIT && (times[1].tv_nsec < 0 || times[1].tv_nsec > 999999999))
      times[1].tv_nsec = 0;
    mode_t mode = archive_entry_perm(e) & 0777 & ~umask;
    if (const char* link = archive_entry_hardlink(e)) {
      DSEC_TRY(target, components(link, "its hard link's target"));
      if (!rename.empty() && !target.empty() && target[0] == top)
        target[0] = rename;
      auto tname = join(target, target.size());
      if (dropped.count(tname)) {
        res.skipped.push_back(name + " (a hard link to a device node or fifo)");
        dropped.insert(name);
        return {};
      }
      if (target.empty() || !files.count(tname))
        return refuse("'" + name + "' is a hard link to '" + tname
                      + "', which is not a regular file of this archive");
      DSEC_TRY(tdir, open_dir(target, target.size() - 1, name, false));
      unique_fd tparent{::fcntl(tdir, F_DUPFD_CLOEXEC, 0)};
      if (!tparent)
        return sys_error("dup of a directory of", shown);
      DSEC_TRY(dir, open_dir(parts, parts.size() - 1, name, true));
      if (tname == name)
        return {}; // a link to itself: already there
      DSEC_TRY_VOID(clear(dir, base, name));
      // Flags 0: the target's last component is not followed either.
      if (::linkat(tparent.get(), target.back().c_str(), dir, base.c_str(), 0) < 0)
        return sys_error("hard link in " + shown + " of", name);
      files.insert(name);
      return {};
    }
    switch (archive_entry_filetype(e)) {
      case AE_IFIFO:
      case AE_IFCHR:
      case AE_IFBLK:
      case AE_IFSOCK:
        res.skipped.push_back(name + (archive_entry_filetype(e) == AE_IFIFO   ? " (a fifo)"
                                      : archive_entry_filetype(e) == AE_IFSOCK ? " (a socket)"
                                                                               : " (a device node)"));
        dropped.insert(name);
        return {};
      case AE_IFDIR: {
        DSEC_TRY(dir, open_dir(parts, parts.size() - 1, name, true));
        struct stat st {};
        if (::fstatat(dir, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
          if (S_ISDIR(st.st_mode))
            return {}; // an existing directory keeps its owner, mode and time
          // A file or symlink where the archive has a directory: replaced, as
          // tar does; the link is removed, not followed.
          if (::unlinkat(dir, base.c_str(), 0) < 0)
            return sys_error("replacing in " + shown, name);
          files.erase(name);
          dropped.erase(name);
        }
        if (::mkdirat(dir, base.c_str(), 0700) < 0)
          return sys_error("mkdir in " + shown, name);
        dirs.push_back({parts, mode, times[1]});
        return {};
      }
      case AE_IFREG: {
        DSEC_TRY(dir, open_dir(parts, parts.size() - 1, name, true));
        DSEC_TRY_VOID(clear(dir, base, name));
        unique_fd f{::openat(dir, base.c_str(),
                             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0600)};
        if (!f)
          return sys_error("creating in " + shown, name);
        int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : -1;
        DSEC_TRY_VOID(write_data(a, f.get(), name, size));
        struct stat st {};
        if (::fchmod(f.get(), mode) < 0 || ::futimens(f.get(), times) < 0
            || ::fstat(f.get(), &st) < 0)
          return sys_error("setting the mode and time in " + shown + " of", name);
        files.insert(name);
        ++res.files;
        res.bytes += static_cast<uint64_t>(st.st_size);
        return {};
      }
      case AE_IFLNK: {
        const char* target = archive_entry_symlink(e);
        if (!target)
          return refuse("the symbolic link '" + name + "' has no readable target");
        DSEC_TRY(dir, open_dir(parts, parts.size() - 1, name, true));
        DSEC_TRY_VOID(clear(dir, base, name));
        // Made as it is: nothing here resolves it, and no later entry goes
        // through it (open_dir never follows a link).
        if (::symlinkat(target, dir, base.c_str()) < 0)
          return sys_error("symlink in " + shown, name);
        if (::utimensat(dir, base.c_str(), times, AT_SYMLINK_NOFOLLOW) < 0)
          return sys_error("setting the time in " + shown + " of", name);
        return {};
      }
      default:
        return refuse("'" + name + "' is of a kind dsec does not copy out (mode "
                      + std::to_string(archive_entry_filetype(e)) + ")");
    }
  }

  // The directories the archive made get their mode and time, deepest first.
  expected<void> finish() {
    cached_fd.reset();
    cached.clear();
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
      auto name = join(it->path, it->path.size());
      DSEC_TRY(parent, open_dir(it->path, it->path.size() - 1, name, false));
      unique_fd d{::openat(parent, it->path.back().c_str(),
                           O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
      struct timespec times[2] = {{0, UTIME_OMIT}, it->mtime};
      if (!d || ::fchmod(d.get(), it->mode) < 0 || ::futimens(d.get(), times) < 0)
        return sys_error("setting the mode and time in " + shown + " of", name);
    }
    return {};
  }
};

} // namespace

namespace {

// untar_stream's reader, as libarchive's read callback; its error is kept.
struct stream_source {
  const untar_reader* read;
  std::optional<error> failed;
};

la_ssize_t read_piece(struct archive* a, void* data, const void** buf) {
  auto* src = static_cast<stream_source*>(data);
  auto piece = (*src->read)();
  if (!piece) {
    src->failed = piece.error_value();
    archive_set_error(a, EIO, "%s", piece.error_value().message.c_str());
    return -1;
  }
  *buf = piece->data();
  return static_cast<la_ssize_t>(piece->size());
}

expected<untar_result> unpack(struct archive* a, int dest_fd, const std::string& dest_shown,
                              mode_t umask, const std::string& top, const std::string& rename,
                              const stream_source* src) {
  extractor x{dest_fd, dest_shown, umask, top, rename, {}, {}, {}, {}, {}, {}};
  for (;;) {
    struct archive_entry* e = nullptr;
    int r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF)
      break;
    if (src && src->failed)
      return *src->failed;
    if (r == ARCHIVE_WARN)
      x.res.warnings.emplace_back(archive_error_string(a));
    else if (r != ARCHIVE_OK)
      return refuse(std::string{"it does not read as tar after "} + std::to_string(x.res.entries)
                    + " entries: " + archive_error_string(a));
    DSEC_TRY_VOID(x.entry(a, e));
    if (src && src->failed)
      return *src->failed;
  }
  if (src && src->failed)
    return *src->failed;
  DSEC_TRY_VOID(x.finish());
  return std::move(x.res);
}

} // namespace

expected<untar_result> untar_stream(int dest_fd, const std::string& dest_shown,
                                    const untar_reader& read, mode_t umask,
                                    const std::string& top, const std::string& rename) {
  std::unique_ptr<struct archive, archive_deleter> a{archive_read_new()};
  if (!a)
    return make_error(errc::system_error, "libarchive: out of memory");
  archive_read_support_format_tar(a.get());
  archive_read_support_filter_none(a.get());
  stream_source src{&read, {}};
  if (archive_read_open(a.get(), &src, nullptr, read_piece, nullptr) != ARCHIVE_OK) {
    if (src.failed)
      return *src.failed;
    return refuse(std::string{"it does not read as tar: "} + archive_error_string(a.get()));
  }
  return unpack(a.get(), dest_fd, dest_shown, umask, top, rename, &src);
}

expected<untar_result> untar_beneath(int dest_fd, const std::string& dest_shown,
                                     std::string_view archive, mode_t umask,
                                     const std::string& top) {
  std::unique_ptr<struct archive, archive_deleter> a{archive_read_new()};
  if (!a)
    return make_error(errc::system_error, "libarchive: out of memory");
  // tar only (ustar, pax, GNU), uncompressed: what a sandbox's tar makes.
  archive_read_support_format_tar(a.get());
  archive_read_support_filter_none(a.get());
  if (archive_read_open_memory(a.get(), archive.data(), archive.size()) != ARCHIVE_OK)
    return refuse(std::string{"it does not read as tar: "} + archive_error_string(a.get()));
  return unpack(a.get(), dest_fd, dest_shown, umask, top, {}, nullptr);
}

} // namespace dsec
