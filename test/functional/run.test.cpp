// `dsec run` end to end: what goes in and out of a sandbox, and the options that
// shape the command's environment.
#include <doctest/doctest.h>

#include <unistd.h>

#include <string>
#include <vector>

#include "test/support/fixture.hpp"

using namespace dsec::test;

TEST_CASE("stdout, stderr and the exit status pass through") {
  auto& s = suite::get();
  auto r = s.run({}, {"sh", "-c", "echo to-out; echo to-err >&2; exit 3"});
  CHECK(r.status == 3);
  CHECK(r.out == "to-out\n");
  CHECK(r.err == "to-err\n");

  r = s.run({}, {"probe", "exit", "0"});
  CHECK(r.status == 0);
  CHECK(r.err == "");
  r = s.run({}, {"probe", "exit", "42"});
  CHECK(r.status == 42);

  SUBCASE("a command killed by a signal gives 128 + N") {
    r = s.run({}, {"probe", "kill-self", "TERM"});
    CHECK(r.status == 143);
    CHECK(r.err.find("SIGTERM") != std::string::npos);
    r = s.run({}, {"probe", "kill-self", "KILL"});
    CHECK(r.status == 137);
    r = s.run({}, {"probe", "kill-self", "SEGV"});
    CHECK(r.status == 128 + 11);
  }
  SUBCASE("large outputs are not truncated") {
    r = s.run({}, {"sh", "-c", "seq 1 200000; seq 1 1000 >&2"});
    REQUIRE(r.status == 0);
    auto lines = lines_of(r.out);
    REQUIRE(lines.size() == 200000);
    CHECK(lines.front() == "1");
    CHECK(lines.back() == "200000");
    CHECK(lines_of(r.err).size() == 1000);
  }
}

TEST_CASE("stdin passes through") {
  auto& s = suite::get();
  spawn_options o;
  o.input = "hello\nsandbox\n";
  auto r = s.run({}, {"cat"}, o);
  CHECK(r.status == 0);
  CHECK(r.out == o.input);

  // More than a pipe buffer, both ways at once.
  o.input.clear();
  for (int i = 0; i < 100000; ++i)
    o.input += "line " + std::to_string(i) + "\n";
  r = s.run({}, {"cat"}, o);
  CHECK(r.status == 0);
  CHECK(r.out.size() == o.input.size());
  CHECK(r.out == o.input);

  // No input: the command sees EOF.
  r = s.run({}, {"sh", "-c", "cat; echo done"});
  CHECK(r.out == "done\n");
}

TEST_CASE("a program that cannot be run gives 127 or 126 and names it") {
  auto& s = suite::get();
  auto r = s.run({}, {"no-such-program", "arg"});
  CHECK(r.status == 127);
  CHECK(r.err.find("no-such-program") != std::string::npos);
  CHECK(r.out == "");

  r = s.run({}, {"/usr/bin/not-there"});
  CHECK(r.status == 127);
  CHECK(r.err.find("/usr/bin/not-there") != std::string::npos);

  // A directory and a file without the execute bit.
  r = s.run({}, {"/etc"});
  CHECK(r.status == 126);
  CHECK(r.err.find("/etc") != std::string::npos);
  r = s.run({}, {"/etc/layer-file"});
  CHECK(r.status == 126);
  CHECK(r.err.find("/etc/layer-file") != std::string::npos);

  // A shell reports its own 127 the usual way.
  r = s.run({}, {"sh", "-c", "no-such-program"});
  CHECK(r.status == 127);
}

TEST_CASE("--env, --cwd, --user and --hostname shape the command") {
  auto& s = suite::get();
  SUBCASE("--env adds and replaces variables; defaults are there") {
    auto r = s.run({"--env", "FOO=bar baz", "--env", "HOME=/elsewhere", "--env", "EMPTY="},
                   {"sh", "-c", "probe env FOO; probe env HOME; probe env EMPTY; probe env PATH; "
                                "probe env LANG; probe env DSEC_BIN"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    auto l = lines_of(r.out);
    REQUIRE(l.size() == 6);
    CHECK(l[0] == "bar baz");
    CHECK(l[1] == "/elsewhere");
    CHECK(l[2] == "");
    CHECK(l[3].find("/usr/bin") != std::string::npos);
    CHECK(l[4] == "C.UTF-8");
    CHECK(l[5] == "(unset)"); // the host's environment does not leak in
  }
  SUBCASE("--cwd sets the working directory") {
    auto r = s.run({"--workdir", workdir_layer, "--cwd", "/work/src"},
                   {"sh", "-c", "probe cwd; ls"});
    CHECK(r.status == 0);
    CHECK(r.out == "/work/src\nmain.c\n");
    r = s.run({}, {"probe", "cwd"});
    CHECK(r.out == "/\n");
    // A directory that is not there: the command cannot start (126), and the
    // message names the directory.
    r = s.run({"--cwd", "/no/such/dir"}, {"probe", "cwd"});
    CHECK(r.status == 126);
    CHECK(r.err.find("/no/such/dir") != std::string::npos);
    CHECK(r.out == "");
  }
  SUBCASE("--user runs as that uid and gid, without privileges") {
    auto r = s.run({"--user", "1000:1000", "--cwd", "/home/user"},
                   {"sh", "-c", "probe uid; probe status CapEff; probe write /etc/layer-file x; "
                                "probe write /home/user/mine x; probe write /root/x x"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "uid=1000 euid=1000 gid=1000 egid=1000\n0000000000000000\nEACCES\nok\nEACCES\n");
    r = s.run({"--user", "1234"}, {"probe", "uid"});
    CHECK(r.out == "uid=1234 euid=1234 gid=1234 egid=1234\n");
    r = s.run({}, {"probe", "uid"});
    CHECK(r.out == "uid=0 euid=0 gid=0 egid=0\n");
  }
  SUBCASE("--hostname sets the hostname; by default it is the sandbox's own") {
    auto r = s.run({"--hostname", "box-1"}, {"probe", "hostname"});
    CHECK(r.status == 0);
    CHECK(r.out == "box-1\n");
    char host[256] = "";
    ::gethostname(host, sizeof host);
    auto a = s.run({}, {"probe", "hostname"});
    auto b = s.run({}, {"probe", "hostname"});
    CHECK(a.status == 0);
    CHECK(a.out != std::string{host} + "\n");
    CHECK(a.out.size() > 1);
    CHECK(a.out != b.out); // each sandbox gets its own
  }
}

TEST_CASE("--net gives a private working loopback; without it there is no network") {
  auto& s = suite::get();
  const std::vector<std::string> listen_and_connect = {
    "sh", "-c", "probe tcp-listen 8080 && probe tcp-connect 8080"};
  auto r = s.run({"--net"}, listen_and_connect);
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "listening\nok hello\n");

  r = s.run({}, listen_and_connect);
  CHECK(r.out.find("ok hello") == std::string::npos);
  r = s.run({}, {"probe", "tcp-connect", "8080"});
  CHECK(r.out == "ENETUNREACH\n");

  // The loopback of --net is up, and it is the only interface.
  r = s.run({"--net"}, {"probe", "cat", "/proc/net/dev"});
  REQUIRE(r.status == 0);
  auto l = lines_of(r.out);
  CHECK(l.size() == 3); // two header lines and lo
  CHECK(r.out.find("lo:") != std::string::npos);
}

TEST_CASE("--disk limits the writable layer") {
  auto& s = suite::get();
  auto r = s.run({"--disk", "2m"}, {"sh", "-c", "probe fill /tmp/a 1; probe fill /tmp/b 4"});
  CHECK_MESSAGE(r.out == "ok\nENOSPC\n", r.describe());
  // The control: the default is far larger.
  r = s.run({}, {"probe", "fill", "/tmp/b", "4"});
  CHECK(r.out == "ok\n");
}

TEST_CASE("a closed stdin or stderr of dsec reaches the command as /dev/null") {
  // Not as whatever dsec opened first in its place (its spawner's socket: a
  // control channel to the zygote inside the sandbox).
  spawn_options o;
  o.in_child = [] {
    ::close(0);
    ::close(2);
  };
  auto r = suite::get().run({}, {"sh", "-c", "readlink /proc/self/fd/0; readlink /proc/self/fd/2"}, o);
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "/dev/null\n/dev/null\n");
}
