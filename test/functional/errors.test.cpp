// Bad input to the CLI: each error has an exit status and a message naming the
// bad thing, and leaves the store exactly as it was.
#include <doctest/doctest.h>

#include <sched.h>
#include <signal.h>
#include <grp.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test/support/fixture.hpp"

using namespace dsec::test;

namespace {

// Runs a failing command and checks its status, that its message names
// `named`, and that the store did not change.
void expect_failure(const std::vector<std::string>& args, int status, const std::string& named,
                    const spawn_options& opts = {}) {
  auto& s = suite::get();
  auto before = s.store_snapshot();
  auto r = s.dsec(args, opts);
  INFO("dsec " << [&] {
    std::string a;
    for (const auto& x : args)
      a += x + " ";
    return a;
  }());
  CHECK_MESSAGE(r.status == status, r.describe());
  CHECK_MESSAGE(r.err.find(named) != std::string::npos, r.describe());
  CHECK(r.out == "");
  CHECK(s.store_snapshot() == before);
}

// `run OPTIONS -- true`, with `--base bb@1` unless OPTIONS name a base.
std::vector<std::string> run_args(std::vector<std::string> options) {
  if (std::find(options.begin(), options.end(), "--base") == options.end())
    options.insert(options.begin(), {"--base", base_layer});
  options.insert(options.begin(), "run");
  options.emplace_back("--");
  options.emplace_back("true");
  return options;
}

} // namespace

TEST_CASE("run: unknown layers and layers in the wrong slot") {
  expect_failure(run_args({"--base", "nosuch@1"}), 125, "nosuch@1");
  expect_failure(run_args({"--base", "bb@999"}), 125, "bb@999");
  expect_failure(run_args({"--base", base_layer, "--tool", "nosuch@2"}), 125, "nosuch@2");
  // A tool as the base, a base as a tool, a tool as the workdir.
  expect_failure(run_args({"--base", tool_a}), 125, "--base ta@1 is a tool layer");
  expect_failure(run_args({"--base", base_layer, "--tool", base_layer}), 125,
                 "--tool bb@1 is a base layer");
  expect_failure(run_args({"--base", base_layer, "--workdir", tool_b}), 125,
                 "--workdir tb@1 is a tool layer");
}

TEST_CASE("run: malformed options are usage errors (status 2)") {
  expect_failure(run_args({"--base", "bb@"}), 2, "--base");
  expect_failure(run_args({"--base", "bb"}), 2, "--base");
  expect_failure(run_args({"--base", "bb@1!"}), 2, "'!'");
  expect_failure(run_args({"--memory", "lots"}), 2, "'lots'");
  expect_failure(run_args({"--memory", "1k"}), 2, "--memory");
  expect_failure(run_args({"--disk", "huge"}), 2, "'huge'");
  expect_failure(run_args({"--pids", "0"}), 2, "--pids");
  expect_failure(run_args({"--cpus", "-1"}), 2, "--cpus");
  expect_failure(run_args({"--timeout", "soon"}), 2, "'soon'");
  expect_failure(run_args({"--user", "no user"}), 2, "'no user'"); // not a name: a space
  expect_failure(run_args({"--user", "a:b:c"}), 2, "'a:b:c'");
  expect_failure(run_args({"--cwd", "relative"}), 2, "'relative'");
  expect_failure(run_args({"--env", "=NOKEY"}), 2, "'=NOKEY'");
  expect_failure(run_args({"--frobnicate"}), 2, "'--frobnicate'");
  expect_failure({"run", "--base", base_layer}, 2, "no command given");
  expect_failure({"run", "--", "true"}, 2, "--base");
}

TEST_CASE("layer build: bad names, kinds and sources") {
  auto& s = suite::get();
  auto src = s.make_tree("errors-src", {{"file", "x\n"}});
  expect_failure({"layer", "build", "--kind", "base", "x@1.0!", src}, 2, "'!'");
  expect_failure({"layer", "build", "--kind", "base", "x", src}, 2, "'x'");
  expect_failure({"layer", "build", "--kind", "base", "@1", src}, 2, "'@1'");
  expect_failure({"layer", "build", "--kind", "kernel", "x@1", src}, 2, "kernel");
  expect_failure({"layer", "build", "x@1", src}, 2, "--kind");
  expect_failure({"layer", "build", "--kind", "base", "x@1"}, 2, "missing SRC");
  expect_failure({"layer", "build", "--kind", "base", "x@1", s.root() + "/no/such/src"}, 1,
                 s.root() + "/no/such/src");
  expect_failure({"layer", "build", "--kind", "base", "x@1", "/dev/null"}, 1, "/dev/null");
  // Versions are immutable.
  expect_failure({"layer", "build", "--kind", "base", base_layer, src}, 1, "bb@1 already exists");

  SUBCASE("a regular file that is not a tar archive: tar fails") {
    auto notar = s.root() + "/src/not-a-tar";
    write_file(notar, "this is not a tar archive\n");
    expect_failure({"layer", "build", "--kind", "base", "x@1", notar}, 1, "tar failed on " + notar);
  }
  SUBCASE("mkfs.erofs fails (no space left for the image)") {
    // Only this dsec sees a 64 KiB tmpfs over STATE/tmp, where the image is
    // staged: it lives in a private mount namespace that dies with it.
    auto staging = s.state() + "/tmp";
    spawn_options o;
    o.in_child = [staging] {
      if (::unshare(CLONE_NEWNS) != 0
          || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0
          || ::mount("dsec-test", staging.c_str(), "tmpfs", 0, "size=64k") != 0)
        ::_exit(99);
    };
    expect_failure({"layer", "build", "--kind", "base", "big@1", s.root() + "/src/base"}, 1,
                   "mkfs.erofs failed on " + s.root() + "/src/base", o);
  }
}

TEST_CASE("layer rm: unknown layers, and layers in use are refused") {
  auto& s = suite::get();
  expect_failure({"layer", "rm", "nosuch@1"}, 1, "nosuch@1");
  expect_failure({"layer", "rm", "bad name"}, 2, "bad name");
  expect_failure({"layer", "rm"}, 2, "NAME@VERSION");

  // A layer of its own, so that removing it cannot disturb other tests.
  s.build_layer("tool", "busy@1", s.make_tree("busy", {{"opt/busy", "busy\n"}}));
  {
    background sandbox(s.run_argv({"--tool", "busy@1"},
                                  {"sh", "-c", "probe cat /opt/busy && exec sleep 1000"}));
    REQUIRE_MESSAGE(sandbox.wait_for_output("busy\n"), sandbox.err());
    expect_failure({"layer", "rm", "busy@1"}, 1, "busy@1");
    auto rm = s.dsec({"layer", "rm", "busy@1"});
    CHECK(rm.err.find("in use") != std::string::npos);
    sandbox.kill(SIGTERM);
    auto end = sandbox.wait();
    CHECK(end.status == 143);
  }
  // Once the sandbox is gone, the layer can go.
  auto rm = s.dsec({"layer", "rm", "busy@1"});
  CHECK_MESSAGE(rm.status == 0, rm.describe());
  CHECK(rm.out == "removed busy@1\n");
  auto ls = s.dsec({"layer", "ls"});
  CHECK(ls.out.find("busy@1") == std::string::npos);
  CHECK(s.dsec({"run", "--base", base_layer, "--tool", "busy@1", "--", "true"}).status == 125);
}

TEST_CASE("the verbs and options of a daemon, without --connect, say that they need it") {
  for (const char* verb : {"ps", "exec", "cp", "session", "node", "cluster", "pool", "logs", "wait",
                           "kill"})
    expect_failure({verb}, 2, std::string{"'"} + verb + "' is a verb of a daemon: give --connect");
  expect_failure(run_args({"--detach"}), 2, "--detach is an option of a daemon's run");
  expect_failure(run_args({"--session=s-1"}), 2, "--session is an option of a daemon's run");
  expect_failure({"frobnicate"}, 2, "unknown verb 'frobnicate'");
}

TEST_CASE("layer ls and rm name a state directory that does not exist, and make none") {
  auto& s = suite::get();
  auto missing = s.state() + "-does-not-exist";
  for (const std::vector<std::string>& verb :
       {std::vector<std::string>{"ls"}, std::vector<std::string>{"rm", "bb@1"}}) {
    std::vector<std::string> argv{s.dsec_bin(), "--state", missing, "layer"};
    argv.insert(argv.end(), verb.begin(), verb.end());
    auto r = dsec::test::run_process(argv);
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(r.err.find("no layer store at " + missing) != std::string::npos, r.describe());
    CHECK(::access(missing.c_str(), F_OK) != 0);
  }
}

TEST_CASE("a local run as a user other than root says that it needs root") {
  auto& s = suite::get();
  spawn_options o;
  o.in_child = [] {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)
      ::_exit(99);
  };
  auto argv = s.run_argv({}, {"true"});
  auto r = dsec::test::run_process(argv, o);
  CHECK_MESSAGE(r.status == 125, r.describe());
  CHECK_MESSAGE(r.err.find("a local run needs root") != std::string::npos, r.describe());
}
