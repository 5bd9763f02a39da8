// Tests of the whole-file helpers: read_all reads a file (small, empty, larger
// than one buffer), a procfs file and a pipe to the end; write_all writes all;
// failures name the path and keep errno.
#include "runtime/io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>

#include <doctest/doctest.h>

#include "runtime/fd.hpp"
#include "test/support/fixture.hpp"

using namespace dsec;

namespace {

using dsec::test::temp_dir;

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i)
    s[i] = static_cast<char>('a' + i * 7 % 26);
  return s;
}

void write_file(const std::string& path, const std::string& data) {
  unique_fd fd{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
  REQUIRE(fd);
  REQUIRE(write_all(fd.get(), data, path));
}

std::string read_path(const std::string& path) {
  unique_fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  REQUIRE(fd);
  auto r = read_all(fd.get(), path);
  REQUIRE(r);
  return *r;
}

} // namespace

TEST_CASE("read_all: a file comes back byte for byte, whatever its size") {
  temp_dir t{"/tmp", "dsec-io-test"};
  for (size_t n : {size_t{1}, size_t{100}, size_t{8191}, size_t{8192}, size_t{8193},
                   size_t{1} << 20}) {
    CAPTURE(n);
    auto data = pattern(n);
    write_file(t.path() + "/f", data);
    CHECK(read_path(t.path() + "/f") == data);
  }
  std::string binary("a\0b\xff", 4);
  write_file(t.path() + "/b", binary);
  CHECK(read_path(t.path() + "/b") == binary);
}

TEST_CASE("read_all: an empty file is an empty string") {
  temp_dir t{"/tmp", "dsec-io-test"};
  write_file(t.path() + "/empty", "");
  CHECK(read_path(t.path() + "/empty").empty());
}

TEST_CASE("read_all: reads from the current position") {
  temp_dir t{"/tmp", "dsec-io-test"};
  write_file(t.path() + "/f", "0123456789");
  unique_fd fd{::open((t.path() + "/f").c_str(), O_RDONLY | O_CLOEXEC)};
  REQUIRE(::lseek(fd.get(), 4, SEEK_SET) == 4);
  auto r = read_all(fd.get(), t.path() + "/f");
  REQUIRE(r);
  CHECK(*r == "456789");
}

TEST_CASE("read_all: a procfs file (size 0 in stat) is read whole") {
  auto r = read_file(AT_FDCWD, "/proc/self/status");
  REQUIRE(r);
  CHECK(r->find("Name:") == 0);
  CHECK(r->find("VmRSS:") != std::string::npos); // well past the first line
  CHECK(r->back() == '\n');
}

TEST_CASE("read_all: a pipe is read until its writer closes it") {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  unique_fd rd{p[0]}, wr{p[1]};
  // More than a pipe buffer (64 KiB), written in pieces by another thread.
  auto data = pattern(300'000);
  std::thread writer{[&] {
    for (size_t off = 0; off < data.size(); off += 10'000)
      REQUIRE(write_all(wr.get(), std::string_view{data}.substr(off, 10'000), "the pipe"));
    wr.reset();
  }};
  auto r = read_all(rd.get(), "the pipe");
  writer.join();
  REQUIRE(r);
  CHECK(r->size() == data.size());
  CHECK(*r == data);
}

TEST_CASE("read_all: an empty pipe is an empty string") {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  unique_fd rd{p[0]};
  ::close(p[1]);
  auto r = read_all(rd.get(), "the pipe");
  REQUIRE(r);
  CHECK(r->empty());
}

TEST_CASE("read_all and read_file: failures name the path and keep errno") {
  temp_dir t{"/tmp", "dsec-io-test"};
  write_file(t.path() + "/f", "x");
  unique_fd wo{::open((t.path() + "/f").c_str(), O_WRONLY | O_CLOEXEC)};
  auto r = read_all(wo.get(), t.path() + "/f", "reading the thing");
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == errc::system_error);
  CHECK(r.error_value().sys_errno == EBADF);
  CHECK(r.error_value().message.find("reading the thing " + t.path() + "/f") == 0);

  auto missing = read_file(AT_FDCWD, t.path() + "/nothing");
  REQUIRE_FALSE(missing);
  CHECK(missing.error_value().code == errc::not_found);
  CHECK(missing.error_value().sys_errno == ENOENT);
  CHECK(missing.error_value().message.find(t.path() + "/nothing") != std::string::npos);

  // read_file relative to a directory descriptor.
  unique_fd dir{::open(t.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  auto rel = read_file(dir.get(), "f");
  REQUIRE(rel);
  CHECK(*rel == "x");
}

TEST_CASE("write_all: a failed write names the path and keeps errno") {
  temp_dir t{"/tmp", "dsec-io-test"};
  write_file(t.path() + "/f", "x");
  unique_fd ro{::open((t.path() + "/f").c_str(), O_RDONLY | O_CLOEXEC)};
  auto r = write_all(ro.get(), "data", t.path() + "/f", "writing the thing");
  REQUIRE_FALSE(r);
  CHECK(r.error_value().sys_errno == EBADF);
  CHECK(r.error_value().message.find("writing the thing " + t.path() + "/f") == 0);
  CHECK(write_all(ro.get(), "", t.path() + "/f")); // nothing to write: no write at all
}

TEST_CASE("fsync_dir: a directory syncs; a file or a missing path is an error naming it") {
  temp_dir t{"/tmp", "dsec-io-test"};
  CHECK(fsync_dir(t.path()));
  write_file(t.path() + "/f", "x");
  auto file = fsync_dir(t.path() + "/f", "syncing");
  REQUIRE_FALSE(file);
  CHECK(file.error_value().sys_errno == ENOTDIR);
  CHECK(file.error_value().message.find("syncing " + t.path() + "/f") == 0);
  auto missing = fsync_dir(t.path() + "/gone");
  REQUIRE_FALSE(missing);
  CHECK(missing.error_value().code == errc::not_found);
}
