#include "runtime/spawner.hpp"

#include <sys/wait.h>

#include <doctest/doctest.h>

using namespace dsec;

// Needs root and $DSEC_SPAWNER (meson's test environment sets it).

TEST_CASE("spawners in one process start and stop independently") {
  // Each spawner has a helper process that shares our memory but not our
  // descriptor table: a helper must not keep another spawner's pipes or
  // sockets open, or stopping that one would wait forever.
  auto a = spawner::start({});
  REQUIRE(a);
  REQUIRE((*a)->ready());
  auto b = spawner::start({}); // its helper lives until b is ready
  REQUIRE(b);
  pid_t zygote_a = (*a)->pid();
  a->reset(); // closes its socket; its zygote exits and is reaped
  REQUIRE((*b)->ready());
  CHECK(::waitpid(zygote_a, nullptr, WNOHANG) == -1); // already reaped
  auto c = spawner::start({});
  REQUIRE(c);
  b->reset();
  REQUIRE((*c)->ready());
}

TEST_CASE("a spawner that cannot exec its binary says so") {
  spawner::options o;
  o.binary = "/nonexistent/dsec-spawner";
  auto s = spawner::start(o);
  REQUIRE(s);
  auto r = (*s)->ready();
  REQUIRE_FALSE(r);
  CHECK(r.error_value().message.find("/nonexistent/dsec-spawner") != std::string::npos);
}
