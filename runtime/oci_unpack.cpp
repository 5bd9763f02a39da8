// oci::unpack_layer (see oci.hpp): one image layer tar into an empty tree, with
// OCI whiteouts turned into overlayfs's. libarchive reads the tar and writes
// the ordinary entries (archive_write_disk with its secure flags: no "..", no
// write through a symbolic link); whiteouts and opaque markers are made here,
// through descriptors opened beneath the root with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS), so they can never land outside it.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/fd.hpp"
#include "runtime/hex.hpp"
#include "runtime/oci.hpp"
#include "runtime/sha256.hpp"
#include "runtime/sys.hpp"

namespace dsec::oci {

namespace {

constexpr std::string_view wh_prefix = ".wh.";
constexpr std::string_view wh_opaque = ".wh..wh..opq";

struct reader_state {
  int fd = -1;
  sha256 hash;
  std::vector<char> buf = std::vector<char>(1 << 20);
  int read_errno = 0;
};

la_ssize_t read_cb(struct archive*, void* data, const void** out) {
  auto* st = static_cast<reader_state*>(data);
  ssize_t n = sys::retry([&] { return ::read(st->fd, st->buf.data(), st->buf.size()); });
  if (n < 0) {
    st->read_errno = errno;
    return -1;
  }
  st->hash.update(st->buf.data(), static_cast<size_t>(n));
  *out = st->buf.data();
  return n;
}

struct read_deleter {
  void operator()(struct archive* a) const { archive_read_free(a); }
};
struct write_deleter {
  void operator()(struct archive* a) const { archive_write_free(a); }
};

// The name's components: leading '/' and "." dropped, ".." refused.
expected<std::vector<std::string>> components(const char* raw, const std::string& shown,
                                              const char* what) {
  if (raw == nullptr)
    return make_error(errc::invalid_argument,
                      "layer " + shown + ": an entry has no readable " + what);
  std::string_view s{raw};
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= s.size()) {
    size_t end = s.find('/', i);
    if (end == std::string_view::npos)
      end = s.size();
    auto part = s.substr(i, end - i);
    if (part == "..")
      return make_error(errc::invalid_argument,
                        "layer " + shown + ": entry '" + std::string{s}
                          + "' escapes the image's root (a '..' component in its " + what
                          + ")");
    if (!part.empty() && part != ".")
      parts.emplace_back(part);
    i = end + 1;
  }
  return parts;
}

std::string joined(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i)
      out += '/';
    out += parts[i];
  }
  return out;
}

// Opens (making it, mode 0755, when missing) the directory `rel` beneath
// `root_fd`, never through a symbolic link.
expected<unique_fd> open_dir_beneath(int root_fd, const std::vector<std::string>& parts,
                                     size_t n, const std::string& shown,
                                     std::set<std::string>& implied) {
  unique_fd cur{::fcntl(root_fd, F_DUPFD_CLOEXEC, 0)};
  std::string rel;
  for (size_t i = 0; i < n; ++i) {
    rel = joined(parts, i + 1);
    struct open_how how{};
    how.flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    long fd = ::syscall(SYS_openat2, cur.get(), parts[i].c_str(), &how, sizeof how);
    if (fd < 0 && errno == ENOENT) {
      if (::mkdirat(cur.get(), parts[i].c_str(), 0755) != 0 && errno != EEXIST)
        return sys_error("cannot make directory", rel);
      implied.insert(rel);
      fd = ::syscall(SYS_openat2, cur.get(), parts[i].c_str(), &how, sizeof how);
    }
    if (fd < 0) {
      if (errno == ELOOP || errno == EXDEV || errno == ENOTDIR)
        return make_error(errc::invalid_argument,
                          "layer " + shown + ": a whiteout under '" + rel
                            + "', which is not a directory of the layer (a symbolic link "
                              "or a file)");
      return sys_error("cannot open", rel);
    }
    cur.reset(static_cast<int>(fd));
  }
  return cur;
}

// nftw has no context argument: the walk below runs once at a time per thread.
thread_local const std::set<std::string>* walk_keep = nullptr;
thread_local size_t walk_root_len = 0;

int pin_implied(const char* path, const struct stat* st, int type, struct FTW*) {
  if (type != FTW_D && type != FTW_DP)
    return 0;
  std::string rel = std::string{path}.substr(std::min(std::strlen(path), walk_root_len));
  while (!rel.empty() && rel.front() == '/')
    rel.erase(0, 1);
  if (walk_keep->count(rel) != 0)
    return 0;
  (void) st;
  struct timespec epoch[2] = {{0, 0}, {0, 0}};
  ::utimensat(AT_FDCWD, path, epoch, AT_SYMLINK_NOFOLLOW);
  return 0;
}

} // namespace

expected<unpack_result> unpack_layer(int fd, const std::string& shown, const std::string& root) {
  unpack_result result;
  unique_fd root_fd{::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  if (!root_fd)
    return sys_error("cannot open", root);

  reader_state rs;
  rs.fd = fd;
  std::unique_ptr<struct archive, read_deleter> in{archive_read_new()};
  std::unique_ptr<struct archive, write_deleter> out{archive_write_disk_new()};
  if (!in || !out)
    return make_error(errc::system_error, "cannot allocate libarchive state");
  archive_read_support_filter_all(in.get());
  archive_read_support_format_tar(in.get());
  archive_write_disk_set_options(
    out.get(), ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME
                 | ARCHIVE_EXTRACT_XATTR | ARCHIVE_EXTRACT_SECURE_SYMLINKS
                 | ARCHIVE_EXTRACT_SECURE_NODOTDOT);
  // Numeric owners only: names in the tar mean nothing on this host.
  archive_write_disk_set_standard_lookup(out.get());
  archive_write_disk_set_user_lookup(out.get(), nullptr, nullptr, nullptr);
  archive_write_disk_set_group_lookup(out.get(), nullptr, nullptr, nullptr);

  auto bad_archive = [&](struct archive* a) {
    if (rs.read_errno != 0) {
      errno = rs.read_errno;
      return sys_error("cannot read layer", shown);
    }
    return make_error(errc::invalid_argument,
                      "layer " + shown + " is not a readable tar: "
                        + (archive_error_string(a) ? archive_error_string(a) : "?"));
  };
  if (archive_read_open(in.get(), &rs, nullptr, read_cb, nullptr) != ARCHIVE_OK)
    return bad_archive(in.get());

  std::set<std::string> with_entry; // directories (relative) the tar has entries for
  std::set<std::string> implied;    // made here for a whiteout
  std::vector<std::string> opaque;  // directories to mark opaque at the end
  bool root_entry = false;
  for (;;) {
    struct archive_entry* e = nullptr;
    int r = archive_read_next_header(in.get(), &e);
    if (r == ARCHIVE_EOF)
      break;
    if (r < ARCHIVE_WARN)
      return bad_archive(in.get());
    ++result.entries;
    DSEC_TRY(parts, components(archive_entry_pathname(e), shown, "name"));
    auto rel = joined(parts, parts.size());
    const std::string base = parts.empty() ? std::string{} : parts.back();

    // Whiteouts: made here, never by libarchive.
    if (base.rfind(wh_prefix, 0) == 0) {
      DSEC_TRY(dir, open_dir_beneath(root_fd.get(), parts, parts.size() - 1, shown, implied));
      if (base == wh_opaque) {
        opaque.push_back(joined(parts, parts.size() - 1));
        ++result.opaque_dirs;
      } else {
        auto name = base.substr(wh_prefix.size());
        if (name.empty() || name == "." || name == "..")
          return make_error(errc::invalid_argument,
                            "layer " + shown + ": bad whiteout '" + rel + "'");
        ::unlinkat(dir.get(), name.c_str(), 0);
        if (::mknodat(dir.get(), name.c_str(), S_IFCHR | 0, ::makedev(0, 0)) != 0)
          return sys_error("cannot make the whiteout", rel);
        struct timespec t[2] = {{archive_entry_mtime(e), 0}, {archive_entry_mtime(e), 0}};
        ::utimensat(dir.get(), name.c_str(), t, AT_SYMLINK_NOFOLLOW);
        ++result.whiteouts;
      }
      continue;
    }

    auto type = archive_entry_filetype(e);
    if (archive_entry_hardlink(e) == nullptr && (type == AE_IFCHR || type == AE_IFBLK)) {
      result.skipped.push_back("/" + rel + (type == AE_IFCHR ? " (a character device)"
                                                             : " (a block device)"));
      continue;
    }
    if (archive_entry_hardlink(e) == nullptr && type == AE_IFSOCK) {
      result.skipped.push_back("/" + rel + " (a socket)");
      continue;
    }

    // Names beneath the root; overlay's own xattrs come only from whiteouts.
    archive_entry_set_pathname(e, (root + "/" + rel).c_str());
    if (parts.empty())
      root_entry = true;
    if (type == AE_IFDIR)
      with_entry.insert(rel);
    if (const char* link = archive_entry_hardlink(e)) {
      DSEC_TRY(lparts, components(link, shown, "hard link target"));
      if (lparts.empty())
        return make_error(errc::invalid_argument,
                          "layer " + shown + ": '" + rel + "' is a hard link to the root");
      auto target = joined(lparts, lparts.size());
      // The target must be this layer's, reached without a symbolic link.
      struct open_how how{};
      how.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC;
      how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
      unique_fd tfd{static_cast<int>(
        ::syscall(SYS_openat2, root_fd.get(), target.c_str(), &how, sizeof how))};
      if (!tfd)
        return make_error(errc::invalid_argument,
                          "layer " + shown + ": '" + rel + "' is a hard link to '" + target
                            + "', which this layer does not have (hard links across "
                              "layers are not supported)");
      archive_entry_set_hardlink(e, (root + "/" + target).c_str());
    }
    {
      std::vector<std::pair<std::string, std::string>> keep;
      archive_entry_xattr_reset(e);
      const char* name = nullptr;
      const void* value = nullptr;
      size_t size = 0;
      bool drop = false;
      while (archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK) {
        if (std::string_view{name}.rfind("trusted.overlay.", 0) == 0) {
          drop = true;
          continue;
        }
        keep.emplace_back(name, std::string{static_cast<const char*>(value), size});
      }
      if (drop) {
        archive_entry_xattr_clear(e);
        for (auto& [n, v] : keep)
          archive_entry_xattr_add_entry(e, n.c_str(), v.data(), v.size());
      }
    }
    r = archive_write_header(out.get(), e);
    if (r < ARCHIVE_WARN)
      return make_error(errc::invalid_argument,
                        "layer " + shown + ": cannot unpack '" + rel + "': "
                          + (archive_error_string(out.get()) ? archive_error_string(out.get())
                                                             : "?"));
    if (archive_entry_size(e) > 0 && type == AE_IFREG) {
      const void* buf = nullptr;
      size_t size = 0;
      la_int64_t offset = 0;
      for (;;) {
        int rr = archive_read_data_block(in.get(), &buf, &size, &offset);
        if (rr == ARCHIVE_EOF)
          break;
        if (rr < ARCHIVE_WARN)
          return bad_archive(in.get());
        if (archive_write_data_block(out.get(), buf, size, offset) < ARCHIVE_WARN)
          return make_error(errc::system_error,
                            "layer " + shown + ": cannot write '" + rel + "': "
                              + (archive_error_string(out.get())
                                   ? archive_error_string(out.get())
                                   : "?"));
      }
    }
    if (archive_write_finish_entry(out.get()) < ARCHIVE_WARN)
      return make_error(errc::system_error,
                        "layer " + shown + ": cannot finish '" + rel + "': "
                          + (archive_error_string(out.get()) ? archive_error_string(out.get())
                                                             : "?"));
  }
  // Directory times and modes are fixed up here.
  if (archive_write_close(out.get()) != ARCHIVE_OK)
    return make_error(errc::system_error,
                      "layer " + shown + ": cannot finish unpacking: "
                        + (archive_error_string(out.get()) ? archive_error_string(out.get())
                                                           : "?"));
  // The rest of the stream (tar padding, compression trailer) is hashed too.
  for (;;) {
    ssize_t n = sys::retry([&] { return ::read(fd, rs.buf.data(), rs.buf.size()); });
    if (n < 0)
      return sys_error("cannot read layer", shown);
    if (n == 0)
      break;
    rs.hash.update(rs.buf.data(), static_cast<size_t>(n));
  }
  result.digest = "sha256:" + to_hex(rs.hash.finish());

  for (const auto& rel : opaque) {
    std::vector<std::string> parts;
    if (!rel.empty()) {
      DSEC_TRY(p, components(rel.c_str(), shown, "name"));
      parts = std::move(p);
    }
    DSEC_TRY(dir, open_dir_beneath(root_fd.get(), parts, parts.size(), shown, implied));
    if (::fsetxattr(dir.get(), "trusted.overlay.opaque", "y", 1, 0) != 0)
      return sys_error("cannot mark opaque", "/" + rel);
  }
  // Directories nobody dated (implied by a name or made for a whiteout) and a
  // root without a "./" entry get the epoch: the same tar, the same tree.
  walk_keep = &with_entry;
  walk_root_len = root.size();
  ::nftw(root.c_str(), pin_implied, 64, FTW_PHYS | FTW_DEPTH);
  walk_keep = nullptr;
  if (!root_entry) {
    struct timespec epoch[2] = {{0, 0}, {0, 0}};
    ::utimensat(AT_FDCWD, root.c_str(), epoch, AT_SYMLINK_NOFOLLOW);
  }
  return result;
}

} // namespace dsec::oci
