#include "runtime/sha256.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>

#include "runtime/fd.hpp"

namespace {

std::string hex_of(std::string_view s) {
  dsec::sha256 h;
  h.update(s.data(), s.size());
  return dsec::to_hex(h.finish());
}

// The same message fed in pieces of `step` bytes, to exercise the partial-block path.
std::string hex_of_pieces(std::string_view s, size_t step) {
  dsec::sha256 h;
  for (size_t i = 0; i < s.size(); i += step)
    h.update(s.data() + i, std::min(step, s.size() - i));
  return dsec::to_hex(h.finish());
}

constexpr const char* nist_448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
constexpr const char* million_a_hex =
  "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";

} // namespace

TEST_CASE("sha256: NIST test vectors") {
  CHECK(hex_of("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex_of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex_of(nist_448)
        == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex_of(std::string(1000000, 'a')) == million_a_hex);
}

TEST_CASE("sha256: the result does not depend on how the input is split") {
  std::string msg(1000, 'x');
  for (size_t i = 0; i < msg.size(); ++i)
    msg[i] = static_cast<char>(i * 7 + 3);
  auto whole = hex_of(msg);
  for (size_t step : {1, 3, 55, 56, 63, 64, 65, 127, 999})
    CHECK(hex_of_pieces(msg, step) == whole);
  CHECK(hex_of_pieces(nist_448, 5) == hex_of(nist_448));
}

TEST_CASE("sha256_hex_of_file hashes the whole file whatever the fd offset") {
  char path[] = "/tmp/dsec-sha256-test-XXXXXX";
  dsec::unique_fd fd{::mkstemp(path)};
  REQUIRE(fd);
  ::unlink(path); // the descriptor keeps the file alive; nothing is left behind
  // A bit over 2 MiB so the 1 MiB read buffer is refilled and the tail is partial.
  std::string content(2 * 1024 * 1024 + 17, 'a');
  REQUIRE(::write(fd.get(), content.data(), content.size())
          == static_cast<ssize_t>(content.size()));
  auto hex = dsec::sha256_hex_of_file(fd.get());
  REQUIRE(hex);
  CHECK(*hex == hex_of(content));

  std::string million(1000000, 'a');
  REQUIRE(::ftruncate(fd.get(), 0) == 0);
  REQUIRE(::pwrite(fd.get(), million.data(), million.size(), 0)
          == static_cast<ssize_t>(million.size()));
  auto hex2 = dsec::sha256_hex_of_file(fd.get());
  REQUIRE(hex2);
  CHECK(*hex2 == million_a_hex);
}

TEST_CASE("sha256_hex_of_file reports a bad descriptor") {
  auto hex = dsec::sha256_hex_of_file(-1);
  REQUIRE_FALSE(hex);
  CHECK(hex.error_value().code == dsec::errc::system_error);
  CHECK(hex.error_value().sys_errno == EBADF);
}

TEST_CASE("sha256: random messages of every length around the block size agree with sha256sum") {
  const std::string how = dsec::sha256::accelerated() ? "used" : "not used (portable code)";
  MESSAGE("this CPU's SHA extensions are " << how);
  char path[] = "/tmp/dsec-sha256-test-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  dsec::unique_fd owner{fd};
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  std::string data(3 * 64 + 5 + (1u << 20), '\0');
  for (auto& c : data) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 3 * 64 + 5; ++n)
    lengths.push_back(n);
  lengths.push_back(data.size());
  for (size_t n : lengths) {
    REQUIRE(::ftruncate(fd, 0) == 0);
    REQUIRE(::pwrite(fd, data.data(), n, 0) == static_cast<ssize_t>(n));
    std::string cmd = std::string{"sha256sum "} + path;
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    char line[128] = {};
    REQUIRE(std::fgets(line, sizeof line, p) != nullptr);
    ::pclose(p);
    auto want = std::string{line}.substr(0, 64);
    auto got = hex_of(std::string_view{data.data(), n});
    CHECK_MESSAGE(got == want, "length " << n);
    CHECK_MESSAGE(hex_of_pieces(std::string_view{data.data(), n}, 63) == want, "length " << n);
    auto file = dsec::sha256_hex_of_file(fd);
    REQUIRE(file);
    CHECK(*file == want);
  }
  ::unlink(path);
}
