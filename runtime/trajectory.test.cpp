// Tests of the trajectory log's file: records come back as written, a torn
// tail (a partial frame, a frame whose CRC does not match) is dropped and cut
// off, and what is not a log is refused by name.
#include "runtime/trajectory.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <doctest/doctest.h>

#include "test/support/fixture.hpp"

namespace {

namespace fs = std::filesystem;

using dsec::test::temp_dir;

void append_raw(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

} // namespace

TEST_CASE("crc32c matches the standard check value") {
  CHECK(dsec::crc32c("123456789", 9) == 0xE3069283u);
  CHECK(dsec::crc32c("", 0) == 0u);
}

TEST_CASE("records come back in order, across reopening") {
  temp_dir d{"/tmp", "dsec-trajectory-test"};
  auto path = d.path() + "/log";
  {
    auto f = dsec::trajectory_file::open(path, true);
    REQUIRE(f);
    CHECK(f->append("one"));
    CHECK(f->append(std::string(100000, 'x')));
    CHECK(f->append(""));
    CHECK(f->dirty());
    CHECK(f->sync());
    CHECK_FALSE(f->dirty());
  }
  std::vector<std::string> got;
  auto f = dsec::trajectory_file::open(path, false, &got);
  REQUIRE(f);
  REQUIRE(got.size() == 3);
  CHECK(got[0] == "one");
  CHECK(got[1] == std::string(100000, 'x'));
  CHECK(got[2].empty());
  CHECK(f->torn_bytes() == 0);
  CHECK(f->append("four"));
  auto again = dsec::trajectory_file::read(path);
  REQUIRE(again);
  CHECK(again->size() == 4);
  CHECK(again->back() == "four");
}

TEST_CASE("a torn tail is dropped, reported and cut off") {
  temp_dir d{"/tmp", "dsec-trajectory-test"};
  auto path = d.path() + "/log";
  {
    auto f = dsec::trajectory_file::open(path, true);
    REQUIRE(f);
    REQUIRE(f->append("kept"));
    REQUIRE(f->sync());
  }
  auto whole = fs::file_size(path);

  SUBCASE("a partial frame") {
    std::string frame;
    uint32_t len = 10, crc = dsec::crc32c("0123456789", 10);
    frame.append(reinterpret_cast<char*>(&len), 4);
    frame.append(reinterpret_cast<char*>(&crc), 4);
    frame += "01234"; // half the payload
    append_raw(path, frame);
  }
  SUBCASE("a frame whose CRC does not match") {
    std::string frame;
    uint32_t len = 4, crc = dsec::crc32c("abcd", 4);
    frame.append(reinterpret_cast<char*>(&len), 4);
    frame.append(reinterpret_cast<char*>(&crc), 4);
    frame += "abce";
    append_raw(path, frame);
  }
  SUBCASE("half a length") { append_raw(path, "\x05\x00"); }

  uint64_t torn = 0;
  auto ro = dsec::trajectory_file::read(path, &torn);
  REQUIRE(ro);
  CHECK(ro->size() == 1);
  CHECK(torn > 0);
  CHECK(fs::file_size(path) > whole); // read() changes nothing

  std::vector<std::string> got;
  auto f = dsec::trajectory_file::open(path, false, &got);
  REQUIRE(f);
  CHECK(got == std::vector<std::string>{"kept"});
  CHECK(f->torn_bytes() == torn);
  CHECK(fs::file_size(path) == whole);
  REQUIRE(f->append("after"));
  auto again = dsec::trajectory_file::read(path, &torn);
  REQUIRE(again);
  CHECK(*again == std::vector<std::string>{"kept", "after"});
  CHECK(torn == 0);
}

TEST_CASE("what is not a log is refused by name") {
  temp_dir d{"/tmp", "dsec-trajectory-test"};
  auto path = d.path() + "/notes.txt";
  append_raw((::close(::open(path.c_str(), O_CREAT | O_WRONLY, 0600)), path), "hello, world");
  auto f = dsec::trajectory_file::open(path, false);
  REQUIRE_FALSE(f);
  CHECK(f.error_value().code == dsec::errc::malformed);
  CHECK(f.error_value().message.find(path) != std::string::npos);
  auto missing = dsec::trajectory_file::read(d.path() + "/none");
  REQUIRE_FALSE(missing);
  CHECK(missing.error_value().code == dsec::errc::not_found);
}

TEST_CASE("the header names the payload format; a first-framing file reads as format 1") {
  temp_dir d{"/tmp", "dsec-trajectory-test"};
  auto path = d.path() + "/log";
  {
    auto f = dsec::trajectory_file::open(path, true, nullptr, 7);
    REQUIRE(f);
    CHECK(f->format() == 7);
    CHECK(f->append("r"));
    CHECK(f->sync());
  }
  uint32_t format = 0;
  auto got = dsec::trajectory_file::read(path, nullptr, &format);
  REQUIRE(got);
  CHECK(format == 7);
  CHECK(*got == std::vector<std::string>{"r"});
  auto again = dsec::trajectory_file::open(path, false, nullptr, 3); // keeps its own
  REQUIRE(again);
  CHECK(again->format() == 7);
  // "DSECTRJ1", then frames: the first framing, whose payloads are format 1.
  auto old = d.path() + "/old";
  {
    int fd = ::open(old.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  std::string frame = "DSECTRJ1";
  std::string payload = "abc";
  uint32_t len = 3, crc = dsec::crc32c(payload.data(), payload.size());
  for (uint32_t v : {len, crc})
    for (int i = 0; i < 4; ++i)
      frame += static_cast<char>((v >> (8 * i)) & 0xff);
  frame += payload;
  append_raw(old, frame);
  got = dsec::trajectory_file::read(old, nullptr, &format);
  REQUIRE(got);
  CHECK(format == 1);
  CHECK(*got == std::vector<std::string>{"abc"});
  auto appended = dsec::trajectory_file::open(old, false);
  REQUIRE(appended);
  CHECK(appended->format() == 1);
  CHECK(appended->append("def"));
  got = dsec::trajectory_file::read(old);
  REQUIRE(got);
  CHECK(got->size() == 2);
}
