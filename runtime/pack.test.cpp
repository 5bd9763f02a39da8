// Tests of packs of a writable layer: a tree with every kind of entry the
// overlay's upper dir holds comes back the same (owners shifted to the new
// uid base), unchanged files are not stored again, and a pack cannot make
// restore_pack write outside its destination.
#include "runtime/pack.hpp"
#include "runtime/sha256.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <doctest/doctest.h>

#include "test/support/fixture.hpp"

namespace {

namespace fs = std::filesystem;

using dsec::test::temp_dir;

void write_file(const std::string& p, const std::string& data) {
  std::ofstream(p, std::ios::binary) << data;
}

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

int open_dir(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  return fd;
}

struct stat lstat_of(const std::string& p) {
  struct stat s {};
  REQUIRE(::lstat(p.c_str(), &s) == 0);
  return s;
}

size_t count_files(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir))
    ++n;
  return n;
}

} // namespace

TEST_CASE("a pack restores every kind of entry of an upper dir") {
  temp_dir t{"/tmp", "dsec-pack-test"};
  const uint32_t base = 200000, base2 = 300000;
  auto up = t.path() + "/upper";
  fs::create_directories(up + "/work/src");
  fs::create_directories(up + "/etc/opaque");
  write_file(up + "/work/src/main.c", "int main() { return 0; }\n");
  write_file(up + "/work/big", std::string(3 << 20, 'b'));
  write_file(up + "/work/same1", "same");
  write_file(up + "/work/same2", "same");
  REQUIRE(::symlink("../src/main.c", (up + "/work/link").c_str()) == 0);
  REQUIRE(::mkfifo((up + "/work/fifo").c_str(), 0640) == 0);
  REQUIRE(::mknod((up + "/etc/gone").c_str(), S_IFCHR, makedev(0, 0)) == 0); // whiteout
  REQUIRE(::setxattr((up + "/etc/opaque").c_str(), "trusted.overlay.opaque", "y", 1, 0) == 0);
  REQUIRE(::lchown((up + "/work/src/main.c").c_str(), base + 1000, base + 1001) == 0);
  REQUIRE(::chmod((up + "/work/src/main.c").c_str(), 04751) == 0); // after chown clears it
  REQUIRE(::lchown((up + "/work/link").c_str(), base + 5, base + 5) == 0);
  REQUIRE(::chown(up.c_str(), base, base) == 0);
  struct timespec old[2] = {{0, UTIME_OMIT}, {1'600'000'000, 123456789}};
  REQUIRE(::utimensat(AT_FDCWD, (up + "/work/big").c_str(), old, 0) == 0);
  REQUIRE(::utimensat(AT_FDCWD, (up + "/work/src").c_str(), old, 0) == 0);

  auto blobs = t.path() + "/blobs";
  dsec::pack_cache cache;
  int ufd = open_dir(up);
  auto st = dsec::write_pack(ufd, t.path() + "/p1", blobs, cache, base);
  REQUIRE(st);
  CHECK(st->files == 4);
  CHECK(st->new_blobs == 3); // same1 and same2 share one
  CHECK(count_files(blobs) == 3);

  auto dest = t.path() + "/dest";
  fs::create_directories(dest);
  int dfd = open_dir(dest);
  auto rs = dsec::restore_pack(t.path() + "/p1", blobs, dfd, base2);
  ::close(dfd);
  REQUIRE(rs);
  CHECK(rs->files == 4);
  CHECK(read_file(dest + "/work/src/main.c") == "int main() { return 0; }\n");
  CHECK(read_file(dest + "/work/big") == std::string(3 << 20, 'b'));
  CHECK(read_file(dest + "/work/same2") == "same");
  auto m = lstat_of(dest + "/work/src/main.c");
  CHECK((m.st_mode & 07777) == 04751); // set-uid survives the chown
  CHECK(m.st_uid == base2 + 1000);
  CHECK(m.st_gid == base2 + 1001);
  CHECK(lstat_of(dest).st_uid == base2);
  auto l = lstat_of(dest + "/work/link");
  CHECK(S_ISLNK(l.st_mode));
  CHECK(fs::read_symlink(dest + "/work/link") == "../src/main.c");
  CHECK(l.st_uid == base2 + 5);
  CHECK(S_ISFIFO(lstat_of(dest + "/work/fifo").st_mode));
  auto w = lstat_of(dest + "/etc/gone");
  CHECK(S_ISCHR(w.st_mode));
  CHECK(w.st_rdev == makedev(0, 0));
  char v[8] = {};
  CHECK(::getxattr((dest + "/etc/opaque").c_str(), "trusted.overlay.opaque", v, sizeof v) == 1);
  CHECK(v[0] == 'y');
  CHECK(lstat_of(dest + "/work/big").st_mtim.tv_sec == 1'600'000'000);
  CHECK(lstat_of(dest + "/work/big").st_mtim.tv_nsec == 123456789);
  CHECK(lstat_of(dest + "/work/src").st_mtim.tv_sec == 1'600'000'000);

  SUBCASE("a small manifest comes back instead of a file; a big one goes to the file") {
    std::string manifest;
    auto small = dsec::write_pack(ufd, t.path() + "/inline", blobs, cache, base, &manifest, 1 << 16);
    REQUIRE(small);
    CHECK_FALSE(fs::exists(t.path() + "/inline"));
    REQUIRE_FALSE(manifest.empty());
    CHECK(manifest.substr(0, 8) == "DSECPK1\n");
    write_file(t.path() + "/from-inline", manifest);
    auto d3 = t.path() + "/dest3";
    fs::create_directories(d3);
    int fd3 = open_dir(d3);
    REQUIRE(dsec::restore_pack(t.path() + "/from-inline", blobs, fd3, base2));
    ::close(fd3);
    CHECK(read_file(d3 + "/work/src/main.c") == "int main() { return 0; }\n");
    auto big = dsec::write_pack(ufd, t.path() + "/file", blobs, cache, base, &manifest, 16);
    REQUIRE(big);
    CHECK(manifest.empty());
    CHECK(fs::exists(t.path() + "/file"));
  }
  SUBCASE("unchanged files are neither read nor stored again") {
    auto again = dsec::write_pack(ufd, t.path() + "/p2", blobs, cache, base);
    REQUIRE(again);
    CHECK(again->new_blobs == 0);
    write_file(up + "/work/same1", "changed");
    auto third = dsec::write_pack(ufd, t.path() + "/p3", blobs, cache, base);
    REQUIRE(third);
    CHECK(third->new_blobs == 1);
    CHECK(third->new_bytes == 7);
    CHECK(count_files(blobs) == 4);
  }
  SUBCASE("a file removed since the last pack is not in the next one") {
    fs::remove(up + "/work/big");
    auto p = dsec::write_pack(ufd, t.path() + "/p4", blobs, cache, base);
    REQUIRE(p);
    CHECK(p->files == 3);
    auto d2 = t.path() + "/dest2";
    fs::create_directories(d2);
    int fd2 = open_dir(d2);
    REQUIRE(dsec::restore_pack(t.path() + "/p4", blobs, fd2, base2));
    ::close(fd2);
    CHECK_FALSE(fs::exists(d2 + "/work/big"));
    CHECK(fs::exists(d2 + "/work/same1"));
  }
  ::close(ufd);
}

TEST_CASE("a pack cannot make restore write outside its destination") {
  temp_dir t{"/tmp", "dsec-pack-test"};
  auto outside = t.path() + "/outside";
  fs::create_directories(outside);
  auto blobs = t.path() + "/blobs";
  fs::create_directories(blobs);
  // A hand-made pack: a symbolic link "a" to the outside dir, then a file
  // "a/owned" (which write_pack would never produce).
  std::string p("DSECPK1\n", 8);
  auto put32 = [&](uint32_t v) { p.append(reinterpret_cast<char*>(&v), 4); };
  auto put64 = [&](uint64_t v) { p.append(reinterpret_cast<char*>(&v), 8); };
  auto entry = [&](uint8_t kind, const std::string& path) {
    p.push_back(static_cast<char>(kind));
    put32(0755); put32(0); put32(0); put64(0); put32(0);
    p.push_back(0);
    put32(static_cast<uint32_t>(path.size()));
    p += path;
  };
  entry(1, ""); put32(0);
  entry(3, "a"); put32(static_cast<uint32_t>(outside.size())); p += outside;
  entry(2, "a/owned"); put64(0); p.append(32, '\0');
  write_file(blobs + "/" + std::string(64, '0'), "");
  write_file(t.path() + "/evil", p);
  auto dest = t.path() + "/dest";
  fs::create_directories(dest);
  int dfd = open_dir(dest);
  auto r = dsec::restore_pack(t.path() + "/evil", blobs, dfd, 0);
  ::close(dfd);
  REQUIRE_FALSE(r);
  CHECK(r.error_value().message.find("/a") != std::string::npos);
  CHECK_FALSE(fs::exists(outside + "/owned"));

  SUBCASE("nor name a path with ..") {
    std::string q("DSECPK1\n", 8);
    p.swap(q);
    entry(1, ""); put32(0);
    entry(1, "../escape"); put32(0);
    write_file(t.path() + "/evil2", p);
    int fd = open_dir(dest);
    auto r2 = dsec::restore_pack(t.path() + "/evil2", blobs, fd, 0);
    ::close(fd);
    REQUIRE_FALSE(r2);
    CHECK(r2.error_value().code == dsec::errc::malformed);
    CHECK(r2.error_value().message.find("../escape") != std::string::npos);
    CHECK_FALSE(fs::exists(t.path() + "/escape"));
  }
}

namespace {

// A unix socket bound at `path` (the file stays after the descriptor closes).
void make_socket_file(const std::string& path) {
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(s >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof a.sun_path);
  std::strcpy(a.sun_path, path.c_str());
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  ::close(s);
}

bool skipped(const dsec::pack_stats& st, const std::string& path, const std::string& why) {
  for (const auto& s : st.skipped)
    if (s.path == path && s.why.find(why) != std::string::npos)
      return true;
  return false;
}

} // namespace

TEST_CASE("a pack skips and records sockets and devices, keeps fifos without opening them") {
  temp_dir t{"/tmp", "dsec-pack-test"};
  auto up = t.path() + "/upper";
  fs::create_directories(up + "/run");
  write_file(up + "/keep", "kept");
  REQUIRE(::mkfifo((up + "/fifo").c_str(), 0600) == 0); // nobody ever writes it
  make_socket_file(up + "/run/sock");
  REQUIRE(::mknod((up + "/null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0);
  auto blobs = t.path() + "/blobs";
  dsec::pack_cache cache;
  int ufd = open_dir(up);
  std::string manifest;
  auto st = dsec::write_pack(ufd, t.path() + "/p", blobs, cache, 0, &manifest, 1 << 16);
  ::close(ufd);
  REQUIRE_MESSAGE(st, st.error_value().to_string());
  CHECK(st->files == 1);
  CHECK(st->skipped.size() == 2);
  CHECK(skipped(*st, "/run/sock", "a socket"));
  CHECK(skipped(*st, "/null", "a character device"));
  // The manifest says so too: what the trajectory log keeps.
  auto d = dsec::describe_pack(manifest, "inline");
  REQUIRE(d);
  CHECK(d->skipped.size() == 2);
  CHECK(skipped(*d, "/run/sock", "a socket"));
  CHECK(d->entries == st->entries);
  write_file(t.path() + "/p", manifest);
  auto dest = t.path() + "/dest";
  fs::create_directories(dest);
  int dfd = open_dir(dest);
  auto rs = dsec::restore_pack(t.path() + "/p", blobs, dfd, 0);
  ::close(dfd);
  REQUIRE(rs);
  CHECK(rs->skipped.size() == 2);
  CHECK(read_file(dest + "/keep") == "kept");
  CHECK(S_ISFIFO(lstat_of(dest + "/fifo").st_mode));
  CHECK(fs::exists(dest + "/run"));
  CHECK_FALSE(fs::exists(fs::symlink_status(dest + "/run/sock")));
  CHECK_FALSE(fs::exists(fs::symlink_status(dest + "/null")));
}

// The attack of issue 12 §3, at the source: the sandbox swaps a file for a
// fifo in a loop while it is packed. A pack that opened the name it had seen
// as a file without O_NONBLOCK would block in fifo_open for good (this test
// would then hang until meson's timeout fails it); each pack must end, with
// the name as a file, as a fifo, or recorded as skipped.
TEST_CASE("a file swapped for a fifo while it is packed: every pack ends, the swap is recorded") {
  temp_dir t{"/tmp", "dsec-pack-test"};
  auto up = t.path() + "/upper";
  fs::create_directories(up);
  write_file(up + "/x", "data");
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> swaps{0};
  std::thread swapper([&] {
    auto fifo = up + "/.f", file = up + "/.r";
    while (!stop.load()) {
      (void) ::mkfifo(fifo.c_str(), 0600);
      (void) ::rename(fifo.c_str(), (up + "/x").c_str());
      write_file(file, "data");
      (void) ::rename(file.c_str(), (up + "/x").c_str());
      swaps.fetch_add(1);
    }
  });
  auto blobs = t.path() + "/blobs";
  dsec::pack_cache cache;
  int ufd = open_dir(up);
  size_t as_file = 0, as_fifo = 0, as_skipped = 0, failed = 0, packs = 0;
  for (; packs < 300 || swaps.load() < 1000; ++packs) {
    std::string manifest;
    auto st = dsec::write_pack(ufd, t.path() + "/p", blobs, cache, 0, &manifest, 1 << 16);
    if (!st) {
      ++failed;
      MESSAGE(st.error_value().to_string());
      continue;
    }
    if (skipped(*st, "/x", "changed while packed"))
      ++as_skipped;
    else if (st->files >= 1)
      ++as_file;
    else
      ++as_fifo;
  }
  stop = true;
  swapper.join();
  ::close(ufd);
  MESSAGE(swaps.load() << " swaps; x packed as a file " << as_file << ", as a fifo " << as_fifo
                       << ", skipped " << as_skipped << " times");
  CHECK(failed == 0);
  CHECK(as_file + as_fifo + as_skipped == packs);
  // Every blob holds the bytes its name says.
  for (auto& e : fs::directory_iterator(blobs)) {
    auto bytes = read_file(e.path().string());
    dsec::sha256 h;
    h.update(bytes.data(), bytes.size());
    CHECK(dsec::to_hex(h.finish()) == e.path().filename().string());
  }
}

TEST_CASE("a pack is bounded: too deep is skipped, too many names or a cancel fail it") {
  temp_dir t{"/tmp", "dsec-pack-test"};
  auto up = t.path() + "/upper";
  fs::create_directories(up + "/a/b/c/d");
  write_file(up + "/a/b/c/d/deep", "deep");
  write_file(up + "/a/top", "top");
  auto blobs = t.path() + "/blobs";
  int ufd = open_dir(up);
  {
    dsec::pack_cache cache;
    dsec::pack_limits lim;
    lim.max_depth = 2; // a and a/b are listed; a/b/c is not
    auto st = dsec::write_pack(ufd, t.path() + "/p", blobs, cache, 0, nullptr, 0, lim);
    REQUIRE_MESSAGE(st, st.error_value().to_string());
    CHECK(skipped(*st, "/a/b/c", "deeper than 2 levels"));
    CHECK(st->files == 1);
  }
  {
    dsec::pack_cache cache;
    dsec::pack_limits lim;
    lim.max_entries = 3;
    auto st = dsec::write_pack(ufd, t.path() + "/p", blobs, cache, 0, nullptr, 0, lim);
    REQUIRE_FALSE(st);
    CHECK(st.error_value().code == dsec::errc::too_large);
    CHECK(st.error_value().message.find("more than 3 names") != std::string::npos);
  }
  {
    dsec::pack_cache cache;
    dsec::pack_limits lim;
    std::atomic<bool> cancel{true};
    lim.cancel = &cancel;
    auto st = dsec::write_pack(ufd, t.path() + "/p", blobs, cache, 0, nullptr, 0, lim);
    REQUIRE_FALSE(st);
    CHECK(st.error_value().code == dsec::errc::timeout);
    CHECK(st.error_value().message.find("cancelled") != std::string::npos);
  }
  ::close(ufd);
}

TEST_CASE("a pack stores at most max_new_bytes of new contents: beyond, it fails and writes no "
          "blob of the file that crosses it") {
  temp_dir t{"/tmp", "dsec-pack-test"};
  auto up = t.path() + "/upper";
  fs::create_directories(up);
  write_file(up + "/small", std::string(1000, 's'));
  write_file(up + "/big", std::string(5000, 'b'));
  auto blobs = t.path() + "/blobs";
  int ufd = open_dir(up);
  {
    dsec::pack_cache cache;
    dsec::pack_limits lim;
    lim.max_new_bytes = 4096; // small fits, big does not
    auto st = dsec::write_pack(ufd, t.path() + "/p", blobs, cache, 0, nullptr, 0, lim);
    REQUIRE_FALSE(st);
    CHECK(st.error_value().code == dsec::errc::too_large);
    CHECK_MESSAGE(st.error_value().message.find("/big has 5000 bytes") != std::string::npos,
                  st.error_value().message);
    CHECK(count_files(blobs) <= 1); // at most small's blob: never big's
  }
  {
    dsec::pack_cache cache;
    dsec::pack_limits lim;
    lim.max_new_bytes = 8192; // the control: both fit
    auto st = dsec::write_pack(ufd, t.path() + "/p2", blobs, cache, 0, nullptr, 0, lim);
    REQUIRE_MESSAGE(st, st.error_value().to_string());
    CHECK(count_files(blobs) == 2);
  }
  ::close(ufd);
}

TEST_CASE("restore opens only regular files: a fifo as the pack or as a blob is an error, not a wait") {
  temp_dir t{"/tmp", "dsec-pack-test"};
  auto up = t.path() + "/upper";
  fs::create_directories(up);
  write_file(up + "/f", "content");
  auto blobs = t.path() + "/blobs";
  dsec::pack_cache cache;
  int ufd = open_dir(up);
  REQUIRE(dsec::write_pack(ufd, t.path() + "/p", blobs, cache, 0));
  ::close(ufd);
  auto dest = t.path() + "/dest";
  fs::create_directories(dest);
  REQUIRE(::mkfifo((t.path() + "/fifo-pack").c_str(), 0600) == 0);
  int dfd = open_dir(dest);
  auto r = dsec::restore_pack(t.path() + "/fifo-pack", blobs, dfd, 0);
  REQUIRE_FALSE(r);
  CHECK(r.error_value().message.find("a fifo, not a regular file") != std::string::npos);
  // The blob of "content" replaced by a fifo, then by a file of another size.
  REQUIRE(count_files(blobs) == 1);
  auto blob = fs::directory_iterator(blobs)->path().string();
  fs::remove(blob);
  REQUIRE(::mkfifo(blob.c_str(), 0600) == 0);
  r = dsec::restore_pack(t.path() + "/p", blobs, dfd, 0);
  REQUIRE_FALSE(r);
  CHECK(r.error_value().message.find("is a fifo") != std::string::npos);
  fs::remove(blob);
  write_file(blob, "other size");
  fs::remove_all(dest + "/f");
  r = dsec::restore_pack(t.path() + "/p", blobs, dfd, 0);
  ::close(dfd);
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == dsec::errc::malformed);
  CHECK(r.error_value().message.find("the pack says 7") != std::string::npos);
}
