// Tests of untar_beneath, written as the attacks of issue 12 §4: a sandbox
// controls the archive `dsec cp ID:/x DST` unpacks on the host, as root.
// Archives are made with libarchive's writer (test/support/tar_builder.hpp),
// which writes whatever names and types it is given, as a hostile tar would.
#include "runtime/untar.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <doctest/doctest.h>

#include "test/support/fixture.hpp"
#include "test/support/tar_builder.hpp"

namespace {

using dsec::test::tar_builder;

namespace fs = std::filesystem;

using dsec::test::temp_dir;

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_file(const std::string& p, const std::string& data) {
  std::ofstream(p, std::ios::binary) << data;
}

struct fixture {
  temp_dir t{"/tmp", "dsec-untar-test"};
  std::string dest = t.path() + "/dest", outside = t.path() + "/outside";
  fixture() {
    fs::create_directories(dest);
    fs::create_directories(outside);
    write_file(outside + "/target", "host file\n");
  }
  dsec::expected<dsec::untar_result> untar(const std::string& tar, const std::string& top = {}) {
    int fd = ::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    auto r = dsec::untar_beneath(fd, dest, tar, 022, top);
    ::close(fd);
    return r;
  }
  // The outside dir holds exactly what it held.
  void outside_untouched() {
    size_t n = 0;
    for ([[maybe_unused]] auto& e : fs::recursive_directory_iterator(outside))
      ++n;
    CHECK(n == 1);
    CHECK(read_file(outside + "/target") == "host file\n");
  }
};

void check_refused(const dsec::expected<dsec::untar_result>& r, const std::string& names) {
  REQUIRE_FALSE_MESSAGE(r.has_value(), "the archive was unpacked; it should be refused");
  CHECK(r.error_value().code == dsec::errc::invalid_argument);
  CHECK_MESSAGE(r.error_value().message.find(names) != std::string::npos,
                r.error_value().message);
}

} // namespace

TEST_CASE("untar: a tree arrives with its files, links and times; no owner, no set-uid") {
  fixture f;
  tar_builder b;
  b.dir("x");
  b.file("x/a", "alpha\n", 04755);
  b.dir("x/sub", 02775);
  b.file("x/sub/b", "beta\n");
  b.symlink("x/link", "/etc/passwd"); // made as it is, never resolved
  b.hardlink("x/hard", "x/a");
  b.add("x/fifo", AE_IFIFO, 0644);
  b.add("x/null", AE_IFCHR, 0666, {}, {}, false, makedev(1, 3));
  b.hardlink("x/null2", "x/null");
  auto r = f.untar(b.finish(), "x");
  REQUIRE_MESSAGE(r, r.error_value().to_string());
  CHECK(r->files == 2);
  CHECK(r->skipped == std::vector<std::string>{"x/fifo (a fifo)", "x/null (a device node)",
                                               "x/null2 (a hard link to a device node or fifo)"});
  CHECK(read_file(f.dest + "/x/a") == "alpha\n");
  struct stat a {}, h {}, sub {};
  REQUIRE(::lstat((f.dest + "/x/a").c_str(), &a) == 0);
  REQUIRE(::lstat((f.dest + "/x/hard").c_str(), &h) == 0);
  REQUIRE(::lstat((f.dest + "/x/sub").c_str(), &sub) == 0);
  CHECK((a.st_mode & 07777) == 0755); // set-uid dropped
  CHECK((sub.st_mode & 07777) == 0755); // set-gid dropped, umask 022 applied
  CHECK(a.st_uid == ::getuid());
  CHECK(a.st_mtim.tv_sec == 1'600'000'000);
  CHECK(sub.st_mtim.tv_sec == 1'600'000'000);
  CHECK(a.st_ino == h.st_ino);
  CHECK(fs::read_symlink(f.dest + "/x/link") == "/etc/passwd");
  CHECK_FALSE(fs::exists(fs::symlink_status(f.dest + "/x/fifo")));
  CHECK_FALSE(fs::exists(fs::symlink_status(f.dest + "/x/null")));
}

TEST_CASE("untar: a link left by a first copy is never written through by a second") {
  fixture f;
  // The first copy: x is a symbolic link to a host directory.
  tar_builder first;
  first.symlink("x", f.outside);
  REQUIRE(f.untar(first.finish(), "x"));
  REQUIRE(fs::is_symlink(f.dest + "/x"));
  // The second: a file through it.
  tar_builder second;
  second.file("x/planted", "owned\n");
  check_refused(f.untar(second.finish(), "x"), "'x/planted' goes through 'x'");
  f.outside_untouched();
  SUBCASE("nor a deeper one, nor one that makes the missing directories on the way") {
    tar_builder third;
    third.file("x/new/dir/planted", "owned\n");
    check_refused(f.untar(third.finish(), "x"), "goes through 'x'");
    f.outside_untouched();
  }
  SUBCASE("a directory entry replaces the link instead of following it") {
    tar_builder third;
    third.dir("x");
    third.file("x/planted", "inside\n");
    auto r = f.untar(third.finish(), "x");
    REQUIRE_MESSAGE(r, r.error_value().to_string());
    CHECK_FALSE(fs::is_symlink(f.dest + "/x"));
    CHECK(read_file(f.dest + "/x/planted") == "inside\n");
    f.outside_untouched();
  }
  SUBCASE("a file entry at the link's name replaces the link, the target stays") {
    auto link = f.dest + "/y";
    fs::create_symlink(f.outside + "/target", link);
    tar_builder third;
    third.file("y", "new\n");
    REQUIRE(f.untar(third.finish(), "y"));
    CHECK_FALSE(fs::is_symlink(link));
    CHECK(read_file(link) == "new\n");
    f.outside_untouched();
  }
}

TEST_CASE("untar: a link and an entry through it in one archive") {
  fixture f;
  tar_builder b;
  b.dir("x");
  b.symlink("x/esc", f.outside);
  b.file("x/esc/planted", "owned\n");
  check_refused(f.untar(b.finish(), "x"), "'x/esc/planted' goes through 'x/esc'");
  f.outside_untouched();
  SUBCASE("a relative link up and out, then through it") {
    tar_builder c;
    c.symlink("x/up", "../../outside");
    c.file("x/up/planted", "owned\n");
    check_refused(f.untar(c.finish(), "x"), "goes through 'x/up'");
    f.outside_untouched();
  }
}

TEST_CASE("untar: absolute names stay inside, '..' is refused, names outside the copy too") {
  fixture f;
  tar_builder b;
  b.file(f.outside + "/abs", "absolute\n"); // "/tmp/.../outside/abs"
  auto r = f.untar(b.finish());
  REQUIRE_MESSAGE(r, r.error_value().to_string());
  CHECK(read_file(f.dest + f.outside + "/abs") == "absolute\n");
  f.outside_untouched();
  tar_builder c;
  c.file("x/../../outside/dots", "owned\n");
  check_refused(f.untar(c.finish()), "'..'");
  f.outside_untouched();
  tar_builder d;
  d.file("x/ok", "fine\n");
  d.file(".bashrc", "owned\n");
  check_refused(f.untar(d.finish(), "x"), "'.bashrc' is not inside 'x'");
  CHECK_FALSE(fs::exists(f.dest + "/.bashrc"));
}

TEST_CASE("untar: hard links only to regular files of the same archive") {
  fixture f;
  tar_builder b;
  b.hardlink("x/h", f.outside + "/target"); // a host file by its absolute name
  check_refused(f.untar(b.finish(), "x"), "not a regular file of this archive");
  tar_builder c;
  c.hardlink("x/h", "../outside/target");
  check_refused(f.untar(c.finish(), "x"), "'..'");
  // A file that was in DST before is not this archive's either.
  write_file(f.dest + "/mine", "the user's\n");
  tar_builder d;
  d.hardlink("x/h", "mine");
  check_refused(f.untar(d.finish(), "x"), "not a regular file of this archive");
  // A hard link whose target went through a link: refused like the target.
  tar_builder e;
  e.dir("x");
  e.symlink("x/l", f.outside);
  e.hardlink("x/h", "x/l/target");
  check_refused(f.untar(e.finish(), "x"), "not a regular file of this archive");
  CHECK_FALSE(fs::exists(f.dest + "/x/h"));
  struct stat st {};
  REQUIRE(::stat((f.outside + "/target").c_str(), &st) == 0);
  CHECK(st.st_nlink == 1);
  f.outside_untouched();
}

TEST_CASE("untar: what does not read as tar is refused") {
  fixture f;
  check_refused(f.untar(std::string(1024, 'z')), "does not read as tar");
}
