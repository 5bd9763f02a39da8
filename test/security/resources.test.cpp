// Resource limits hold, and a sandbox that hits one leaves nothing behind.
#include <doctest/doctest.h>

#include <linux/capability.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "runtime/defaults.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/skip.hpp"

using namespace dsec::test;

namespace {


// What `dsec run` gives a sandbox that asks for nothing, on this machine.
dsec::sandbox_defaults run_defaults() {
  return dsec::derive_defaults(dsec::machine_resources::probe(), dsec::default_slots,
                               dsec::default_oversubscribe);
}

// Parses "key=N" out of a probe's answer.
long value_of(const std::string& out, const std::string& key) {
  auto p = out.find(key + "=");
  REQUIRE_MESSAGE(p != std::string::npos, out);
  return std::atol(out.c_str() + p + key.size() + 1);
}

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
  // No memory limit: the pids limit alone holds it (with one, the kernel
  // memory that a storm of failing forks charges may reach it first).
  auto r = s.run({"--pids", "64", "--memory", "none", "--timeout", "3s"}, {"probe", "forkbomb"});
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

TEST_CASE("a sandbox that asks for no limit still has a pids limit: a fork bomb stops there") {
  auto& s = suite::get();
  auto d = run_defaults();
  REQUIRE(d.pids);
  // Fewer than the host could give (pid_max), more than the defaults allow.
  auto r = s.run({}, {"probe", "fork-max", std::to_string(*d.pids + 100)});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  // init and the probe itself count too.
  CHECK(forked(r.out) == static_cast<long>(*d.pids) - 2);
  CHECK(r.out.find("stopped=EAGAIN") != std::string::npos);

  // Contained: by the pids limit until the timeout, or by the default memory
  // limit (a storm of forks that fail charges kernel memory fast) if the OOM
  // killer takes init and with it the sandbox.
  auto before = settled_snapshot();
  r = s.run({"--timeout", "3s"}, {"probe", "forkbomb"});
  CHECK_MESSAGE((r.status == 124 || r.status == 137), r.describe());
  check_nothing_left(before);
  // The explicit opt-out is the control: then nothing stops it.
  r = s.run({"--pids", "none"}, {"probe", "fork-max", std::to_string(*d.pids + 100)});
  CHECK(forked(r.out) == static_cast<long>(*d.pids) + 100);
}

TEST_CASE("a sandbox that asks for no limit has a bounded writable layer") {
  auto& s = suite::get();
  auto d = run_defaults();
  auto mb = static_cast<long>(d.disk_bytes >> 20);
  auto r = s.run({}, {"sh", "-c",
                      "probe fill /tmp/small " + std::to_string(mb / 2) + "; rm /tmp/small; "
                        "probe fill /tmp/big " + std::to_string(mb + 16)});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "ok\nENOSPC\n");
}

TEST_CASE("--disk bounds the number of files, not only their bytes") {
  // Empty files take no tmpfs pages, only the host kernel's inodes and
  // dentries: a 1 MiB disk made 300,000 of them (585 MB of host slab) before
  // the tmpfs got an inode bound scaled from its size (4 KiB each, >= 1024).
  auto& s = suite::get();
  auto r = s.run({"--disk", "1m"}, {"probe", "touch-many", "/tmp", "300000"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto nl = r.out.find('\n');
  REQUIRE(nl != std::string::npos);
  long made = std::stol(r.out.substr(0, nl));
  CHECK_MESSAGE(made <= 1024, r.describe());
  CHECK_MESSAGE(made >= 1000, r.describe());
  CHECK(r.out.substr(nl + 1) == "ENOSPC\n");
  // The bound grows with the size: 64 MiB holds 16384 names.
  r = s.run({"--disk", "64m"}, {"probe", "touch-many", "/tmp", "12000"});
  CHECK_MESSAGE(r.out == "12000\nok\n", r.describe());
}

TEST_CASE("the writable layer counts against --memory: files cannot take more than the limit") {
  // Its tmpfs pages are charged to the memory cgroup of the process that
  // writes them, so a --disk larger than --memory does not let files take the
  // node's memory: the sandbox is OOM-killed at its limit.
  auto& s = suite::get();
  auto before = settled_snapshot();
  auto r = s.run({"--memory", "64m", "--disk", "1g"}, {"probe", "fill", "/tmp/x", "256"});
  CHECK_MESSAGE(r.status == 137, r.describe());
  CHECK_MESSAGE(r.err.find("out of memory") != std::string::npos, r.describe());
  CHECK(r.out.find("ok") == std::string::npos);
  check_nothing_left(before);
  // The control: below the limit the same files fit.
  r = s.run({"--memory", "64m", "--disk", "1g"}, {"probe", "fill", "/tmp/x", "24"});
  CHECK_MESSAGE(r.out == "ok\n", r.describe());
  // And /dev/shm is the same writable layer.
  r = s.run({"--memory", "64m", "--disk", "1g"}, {"probe", "fill", "/dev/shm/x", "256"});
  CHECK_MESSAGE(r.status == 137, r.describe());
}

TEST_CASE("--cpus holds a spinning process to its share of CPU time") {
  // CPU time against wall-clock time, both measured in the sandbox over the
  // same interval: a ratio, not a deadline. The CFS quota of 0.1 CPU allows
  // 10 ms per 100 ms period (plus at most one period's burst at the start).
  auto& s = suite::get();
  auto r = s.run({"--cpus", "0.1"}, {"probe", "spin-for", "1000"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto cpu = value_of(r.out, "cpu_ms"), wall = value_of(r.out, "wall_ms");
  CHECK(wall >= 1000);
  CHECK_MESSAGE(cpu * 4 < wall, r.out);
  CHECK(cpu > 0);
}

TEST_CASE("a command over the memory limit is OOM-killed, not the sandbox's init") {
  // With CAP_SYS_RESOURCE the zygote lowers init to -999 and commands go back
  // to 0; without, init keeps 0 and its commands start at 500. The hogs are
  // anonymous memory, freed when the OOM killer takes them, so the shell that
  // started them goes on. (Files on the writable layer are not freed by a
  // kill: a full tmpfs makes the next allocation of any process in the
  // sandbox OOM again; that case is the test above.)
  const bool lowered = has_capability(CAP_SYS_RESOURCE);
  auto& s = suite::get();
  auto r = s.run({"--memory", "64m"},
                 {"sh", "-c",
                  "cat /proc/1/oom_score_adj /proc/self/oom_score_adj; "
                  "probe hog 256; echo \"hog $?\"; probe hog 256; echo \"hog $?\"; echo alive"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == std::string(lowered ? "-999\n0\n" : "0\n500\n") + "hog 137\nhog 137\nalive\n");
}
