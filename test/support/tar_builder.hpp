// tar_builder: a tar archive built entry by entry with libarchive's writer,
// which writes whatever names, types and links it is given, as a hostile tar
// would (absolute names, "..", links out, device nodes). For the tests of
// unpacking what a sandbox returns (runtime/untar.test.cpp, remote cp).
#pragma once

#include <archive.h>
#include <archive_entry.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include <doctest/doctest.h>

namespace dsec::test {

struct tar_builder {
  std::string out;
  std::unique_ptr<struct archive, int (*)(struct archive*)> a{archive_write_new(),
                                                              archive_write_free};
  tar_builder() {
    archive_write_set_format_pax_restricted(a.get());
    archive_write_set_bytes_in_last_block(a.get(), 1);
    archive_write_open(a.get(), this, nullptr, &tar_builder::write, nullptr);
  }
  static la_ssize_t write(struct archive*, void* self, const void* buf, size_t n) {
    static_cast<tar_builder*>(self)->out.append(static_cast<const char*>(buf), n);
    return static_cast<la_ssize_t>(n);
  }
  void add(const std::string& name, mode_t type, mode_t perm, const std::string& data = {},
           const std::string& link = {}, bool hard = false, dev_t rdev = 0) {
    auto* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, perm);
    archive_entry_set_mtime(e, 1'600'000'000, 0);
    archive_entry_set_uid(e, 4242);
    archive_entry_set_gid(e, 4242);
    if (hard)
      archive_entry_set_hardlink(e, link.c_str());
    else if (type == AE_IFLNK)
      archive_entry_set_symlink(e, link.c_str());
    if (rdev)
      archive_entry_set_rdev(e, rdev);
    archive_entry_set_size(e, type == AE_IFREG && !hard ? static_cast<la_int64_t>(data.size()) : 0);
    REQUIRE(archive_write_header(a.get(), e) == ARCHIVE_OK);
    if (!data.empty())
      REQUIRE(archive_write_data(a.get(), data.data(), data.size())
              == static_cast<la_ssize_t>(data.size()));
    archive_entry_free(e);
  }
  void file(const std::string& n, const std::string& d, mode_t perm = 0644) {
    add(n, AE_IFREG, perm, d);
  }
  void dir(const std::string& n, mode_t perm = 0755) { add(n, AE_IFDIR, perm); }
  void symlink(const std::string& n, const std::string& t) { add(n, AE_IFLNK, 0777, {}, t); }
  void hardlink(const std::string& n, const std::string& t) { add(n, AE_IFREG, 0644, {}, t, true); }
  std::string finish() {
    archive_write_close(a.get());
    return out;
  }
};

} // namespace dsec::test
