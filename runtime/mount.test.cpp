// Tests of runtime/mount's Chronus socket: bound in a sandbox overlay (made here
// from a plain directory as its only layer), reachable through the overlay,
// stored in the upper tmpfs. Root needed (tmpfs and overlay mounts, all
// detached: nothing is mounted on the host).
#include "runtime/mount.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

using namespace dsec;

namespace {

// A lower layer: a temporary directory, removed with its contents.
struct lower_dir {
  std::string path;
  unique_fd fd;
  lower_dir() {
    char tmpl[] = "/tmp/dsec-mount-test.XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
    ::chmod(path.c_str(), 0755);
  }
  void open() {
    fd.reset(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    REQUIRE(fd);
  }
  ~lower_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

struct sandbox_root {
  upper_layer upper;
  unique_fd overlay;
};

sandbox_root make_root(lower_dir& lower, uint32_t owner) {
  lower.open();
  sandbox_root r;
  auto u = make_upper(0, owner);
  REQUIRE_MESSAGE(u, u.error_value().to_string());
  r.upper = std::move(*u);
  int lowers[] = {lower.fd.get()};
  auto o = make_overlay(lowers, r.upper);
  REQUIRE_MESSAGE(o, o.error_value().to_string());
  r.overlay = std::move(*o);
  return r;
}

// Connects to `dir_fd`/`name` (through /proc/self/fd) and sends `text`.
int send_to(int dir_fd, const char* name, const std::string& text) {
  unique_fd s{::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)};
  REQUIRE(s);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "/proc/self/fd/%d/%s", dir_fd, name);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    return errno;
  REQUIRE(::send(s.get(), text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()));
  return 0;
}

std::string accept_one(int listener) {
  pollfd p{listener, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 0) == 1); // the peer connected and sent before we look
  unique_fd c{::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)};
  REQUIRE(c);
  char buf[64];
  auto n = ::recv(c.get(), buf, sizeof buf, 0);
  REQUIRE(n >= 0);
  return std::string(buf, static_cast<size_t>(n));
}

} // namespace

TEST_CASE("make_chronus_socket: a listening socket at /run/chronus.sock, in the upper layer") {
  lower_dir lower;
  constexpr uint32_t owner = 1'000'000'000; // what the sandbox's root is on the host
  auto root = make_root(lower, owner);
  auto s = make_chronus_socket(root.overlay.get(), owner);
  REQUIRE_MESSAGE(s, s.error_value().to_string());
  int type = 0;
  socklen_t len = sizeof type;
  REQUIRE(::getsockopt(s->get(), SOL_SOCKET, SO_TYPE, &type, &len) == 0);
  CHECK(type == SOCK_SEQPACKET);
  CHECK((::fcntl(s->get(), F_GETFL) & O_NONBLOCK) != 0);
  CHECK((::fcntl(s->get(), F_GETFD) & FD_CLOEXEC) != 0);

  // What the sandbox will see: a socket anyone may connect to, in a /run of
  // its root's.
  struct stat st;
  REQUIRE(::fstatat(root.overlay.get(), "run/chronus.sock", &st, AT_SYMLINK_NOFOLLOW) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 07777) == 0666);
  CHECK(st.st_uid == owner);
  CHECK(st.st_gid == owner);
  REQUIRE(::fstatat(root.overlay.get(), "run", &st, AT_SYMLINK_NOFOLLOW) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK((st.st_mode & 07777) == 0755);
  CHECK(st.st_uid == owner);
  // It lives in the upper tmpfs, and nowhere in the layer.
  CHECK(::fstatat(root.upper.mnt.get(), "upper/run/chronus.sock", &st, AT_SYMLINK_NOFOLLOW) == 0);
  CHECK_FALSE(std::filesystem::exists(lower.path + "/run"));

  // Connections through the overlay arrive.
  unique_fd run{::openat(root.overlay.get(), "run", O_PATH | O_DIRECTORY | O_CLOEXEC)};
  REQUIRE(run);
  REQUIRE(send_to(run.get(), "chronus.sock", "frame-1") == 0);
  CHECK(accept_one(s->get()) == "frame-1");
}

TEST_CASE("make_chronus_socket: the layers' /run is kept, a file in the way is replaced") {
  lower_dir lower;
  std::filesystem::create_directories(lower.path + "/run");
  ::chmod((lower.path + "/run").c_str(), 0700);
  std::ofstream{lower.path + "/run/chronus.sock"} << "a regular file\n";
  std::ofstream{lower.path + "/run/other"} << "kept\n";
  auto root = make_root(lower, 0);
  auto s = make_chronus_socket(root.overlay.get(), 0);
  REQUIRE_MESSAGE(s, s.error_value().to_string());
  struct stat st;
  REQUIRE(::fstatat(root.overlay.get(), "run", &st, AT_SYMLINK_NOFOLLOW) == 0);
  CHECK((st.st_mode & 07777) == 0700); // the layer's, copied up
  CHECK(::fstatat(root.overlay.get(), "run/other", &st, AT_SYMLINK_NOFOLLOW) == 0);
  REQUIRE(::fstatat(root.overlay.get(), "run/chronus.sock", &st, AT_SYMLINK_NOFOLLOW) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  // The layer itself is untouched.
  CHECK(std::filesystem::is_regular_file(lower.path + "/run/chronus.sock"));
}

TEST_CASE("make_chronus_socket: a /run that is a link is refused, not followed") {
  lower_dir lower;
  // Followed from the host, it would bind on the host's file system.
  std::filesystem::create_directory_symlink(lower.path + "/elsewhere", lower.path + "/run");
  std::filesystem::create_directories(lower.path + "/elsewhere");
  auto root = make_root(lower, 0);
  auto s = make_chronus_socket(root.overlay.get(), 0);
  REQUIRE_FALSE(s);
  CHECK(s.error_value().path == "/run");
  CHECK((s.error_value().sys_errno == ENOTDIR || s.error_value().sys_errno == ELOOP));
  CHECK(std::filesystem::is_empty(lower.path + "/elsewhere"));
}
