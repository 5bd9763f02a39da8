// The dsecd suite's main: doctest, or, run as `--trainer PORT COUNT MODE`, a
// trainer process for the tests that kill one. It connects to the dsecd on
// 127.0.0.1:PORT, opens an owned session, creates COUNT sandboxes of bbt@1,
// prints "id ID" for each and then "created", and then, with MODE "exit",
// _exits at once (no destructor runs, nothing is closed) or, with "hang",
// waits to be killed. With "midbatch" it prints "first ID" when the first
// sandbox is ready and then waits to be killed, the batch still going. Any
// failure: "error ..." and status 1.
//
// Run as `--intruder PORT UID GID`, it is a local user who tries to use the
// dsecd on 127.0.0.1:PORT (test/actors/door.test.cpp): it drops to UID:GID
// with no other groups, connects a plain TCP socket and reads what the daemon
// sends before it closes ("raw N bytes, closed" or "raw N bytes, open"), then
// connects as a dsec client ("refused MESSAGE", or "connected" and, if it can
// open a session, "session ID").
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "actors/client.hpp"
#include "test/actors/common.hpp"

namespace {

[[noreturn]] void fail(const char* what, const dsec::error& e) {
  std::printf("error %s: %s\n", what, dsec::test::describe(e).c_str());
  std::fflush(stdout);
  ::_exit(1);
}

int trainer(int argc, char** argv) {
  if (argc != 5)
    return 2;
  auto port = static_cast<uint16_t>(std::atoi(argv[2]));
  auto count = static_cast<uint32_t>(std::atoi(argv[3]));
  std::string mode = argv[4];
  caf::actor_system_config cfg;
  dsec::test::configure_system(cfg);
  caf::actor_system sys{cfg};
  auto c = dsec::client::connect(sys, "127.0.0.1", port);
  if (!c)
    fail("connect", c.error_value());
  auto s = (*c)->open_session();
  if (!s)
    fail("open_session", s.error_value());
  dsec::environment env;
  env.base = dsec::test::tar_base;
  if (mode == "midbatch") {
    auto r = (*s)->create(env, count, [](const std::string& id) {
      std::printf("first %s\n", id.c_str());
      std::fflush(stdout);
      for (;;)
        ::pause();
    });
    fail("create", r ? dsec::make_error(dsec::errc::sandbox_failed, "the batch returned before the kill")
           : r.error_value());
  }
  auto ids = (*s)->create(env, count);
  if (!ids)
    fail("create", ids.error_value());
  for (const auto& id : *ids)
    std::printf("id %s\n", id.c_str());
  std::printf("created\n");
  std::fflush(stdout);
  if (mode == "exit")
    ::_exit(0);
  for (;;)
    ::pause();
}

int intruder(int argc, char** argv) {
  if (argc != 5)
    return 2;
  auto port = static_cast<uint16_t>(std::atoi(argv[2]));
  auto uid = static_cast<uid_t>(std::atoi(argv[3]));
  auto gid = static_cast<gid_t>(std::atoi(argv[4]));
  if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0)
    return 3;
  {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return 4;
    size_t got = 0;
    bool closed = false;
    char buf[4096];
    // A daemon that lets us in sends its handshake at once; one that refuses
    // closes. The poll's bound only keeps a broken daemon from hanging us.
    while (!closed) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0)
        break;
      auto n = ::read(fd, buf, sizeof buf);
      if (n <= 0)
        closed = true;
      else
        got += static_cast<size_t>(n);
    }
    std::printf("raw %zu bytes, %s\n", got, closed ? "closed" : "open");
    ::close(fd);
  }
  caf::actor_system_config cfg;
  dsec::test::configure_system(cfg);
  caf::actor_system sys{cfg};
  auto c = dsec::client::connect(sys, "127.0.0.1", port);
  if (!c) {
    std::printf("refused %s\n", dsec::test::describe(c.error_value()).c_str());
    std::fflush(stdout);
    return 0;
  }
  std::printf("connected\n");
  auto s = (*c)->open_session();
  if (s)
    std::printf("session %s\n", (*s)->id().c_str());
  std::fflush(stdout);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--trainer") == 0)
    return trainer(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "--intruder") == 0)
    return intruder(argc, argv);
  return doctest::Context(argc, argv).run();
}
