#include "runtime/peer.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/fd.hpp"

using namespace dsec;

namespace {

// A listening socket on 127.0.0.1 and its port.
unique_fd listener(uint16_t& port) {
  unique_fd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  REQUIRE(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd.get(), 4) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  port = ntohs(a.sin_port);
  return fd;
}

// Connects to 127.0.0.1:port as `uid` (in a child that drops to it) and
// keeps the connection open until the returned pipe is closed.
pid_t connect_as(uid_t uid, uint16_t port, int& release) {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(p[1]);
    if (uid != 0 && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(uid) != 0))
      ::_exit(2);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      ::_exit(3);
    char c;
    (void) ::read(p[0], &c, 1); // until the parent is done
    ::_exit(0);
  }
  ::close(p[0]);
  release = p[1];
  return pid;
}

} // namespace

TEST_CASE("tcp_peer_of finds the owner of a loopback peer's socket") {
  REQUIRE_MESSAGE(::geteuid() == 0, "the unit suite runs as root (tools/test)");
  uint16_t port = 0;
  auto l = listener(port);
  for (uid_t uid : {uid_t{0}, uid_t{65534}}) {
    int release = -1;
    pid_t pid = connect_as(uid, port, release);
    unique_fd c{::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC)};
    REQUIRE(c);
    auto p = tcp_peer_of(c.get());
    REQUIRE_MESSAGE(p, p.error_value().to_string());
    CHECK(p->loopback);
    CHECK(p->uid == uid);
    CHECK(p->address.rfind("127.0.0.1:", 0) == 0);
    ::close(release);
    int st = 0;
    ::waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
}

TEST_CASE("uid_in_group: root always, others by their groups") {
  CHECK(uid_in_group(0, static_cast<gid_t>(-1)));
  CHECK_FALSE(uid_in_group(65534, static_cast<gid_t>(-1)));
  CHECK(group_id("no-such-group-of-dsec") == static_cast<gid_t>(-1));
  auto root_group = group_id("root");
  CHECK(root_group == 0);
  CHECK_FALSE(uid_in_group(65534, root_group)); // nobody is not in group root
}
