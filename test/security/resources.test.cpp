// Resource limits hold, and a sandbox that hits one leaves nothing behind.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "test/support/fixture.hpp"
#include "test/support/host.hpp"

using namespace dsec::test;

namespace {


// Parses "forked=N stopped=ERR".
long forked(const std::string& out) {
  auto p = out.find("forked=");
  REQUIRE(p != std::string::npos);
  return std::atol(out.c_str() + p + 7);
}

} // namespace

TEST_CASE("--pids caps the processes of a sandbox") {
  auto& s = suite::get();
  auto r = s.run({"--pids", "64"}, {"probe", "fork-max", "1000"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(forked(r.out) < 64);
  CHECK(forked(r.out) > 0);
  CHECK(r.out.find("stopped=EAGAIN") != std::string::npos);
  // The control: without the limit the same probe gets what it asks for.
  r = s.run({}, {"probe", "fork-max", "100"});
  CHECK(r.out == "forked=100 stopped=none\n");
}

TEST_CASE("a fork bomb under --pids 64 is contained and leaves nothing") {
  auto& s = suite::get();
  auto before = settled_snapshot();
  auto r = s.run({"--pids", "64", "--timeout", "3s"}, {"probe", "forkbomb"});
  CHECK_MESSAGE(r.status == 124, r.describe());
  CHECK(r.err.find("timed out") != std::string::npos);
  check_nothing_left(before);
  // The host can still fork.
  pid_t p = ::fork();
  if (p == 0)
    ::_exit(7);
  REQUIRE(p > 0);
  int st = 0;
  REQUIRE(::waitpid(p, &st, 0) == p);
  CHECK(WEXITSTATUS(st) == 7);
  // And so can the next sandbox.
  r = s.run({"--pids", "64"}, {"probe", "fork-max", "10"});
  CHECK(r.out == "forked=10 stopped=none\n");
}

TEST_CASE("a memory hog under --memory 64m is OOM-killed") {
  auto& s = suite::get();
  auto before = settled_snapshot();
  auto r = s.run({"--memory", "64m"}, {"probe", "hog", "512"});
  CHECK_MESSAGE(r.status == 137, r.describe());
  CHECK(r.err.find("out of memory") != std::string::npos);
  CHECK(r.out.find("survived") == std::string::npos);
  check_nothing_left(before);
  // The control: under the limit it survives.
  r = s.run({"--memory", "64m"}, {"probe", "hog", "16"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "survived 16 MiB\n");
}

TEST_CASE("an endless loop under --timeout 1s ends with 124 and leaves nothing") {
  auto& s = suite::get();
  auto before = settled_snapshot();
  auto r = s.run({"--timeout", "1s"}, {"probe", "spin"});
  CHECK_MESSAGE(r.status == 124, r.describe());
  CHECK(r.err.find("timed out after 1s") != std::string::npos);
  check_nothing_left(before);

  // With helpers in the background and a cgroup: all of them go.
  r = s.run({"--timeout", "1s", "--pids", "100", "--memory", "128m"},
            {"sh", "-c", "probe spin & probe spin & probe sleep & exec probe spin"});
  CHECK_MESSAGE(r.status == 124, r.describe());
  check_nothing_left(before);
}
