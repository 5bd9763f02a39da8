// `dsec run` end to end: what goes in and out of a sandbox, and the options that
// shape the command's environment. Then, through the runtime API, what a
// Chronus sandbox adds: its socket, and trusted commands (their isolation from
// the agent is in test/security/isolation.test.cpp).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/security.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/sandbox.hpp"
#include "test/support/skip.hpp"

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

TEST_CASE("-t: the command on a terminal of the sandbox, our stdin typed into it") {
  auto& s = suite::get();
  auto r = s.run({"-t"}, {"sh", "-c",
                          "[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && busybox stty size && "
                          "echo TERM=$TERM && echo err >&2; exit 6"});
  CHECK_MESSAGE(r.status == 6, r.out << r.err);
  // Without a terminal of ours: 24x80; one stream (stderr is the terminal).
  CHECK(r.out == "24 80\r\nTERM=xterm-256color\r\nerr\r\n");
  CHECK(r.err == "");
  spawn_options o;
  o.input = "typed\n";
  r = s.run({"-t"}, {"sh", "-c", "cat; echo cat-ended"}, o);
  CHECK(r.status == 0);
  // The terminal's echo, cat's copy, then our end of file as ^D.
  CHECK(r.out == "typed\r\ntyped\r\ncat-ended\r\n");
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
  SUBCASE("-e KEY takes our value, --env-file reads a file, -w and -u are --cwd and --user") {
    auto file = s.root() + "/src/vars.env";
    {
      std::FILE* f = std::fopen(file.c_str(), "w");
      REQUIRE(f);
      std::fputs("# a comment\n\nA=from file\n  B=two words\r\nDSEC_PROBE\n", f);
      std::fclose(f);
    }
    auto r = s.run({"-e", "DSEC_BIN", "-e", "DSEC_NO_SUCH_VAR_X", "--env-file", file, "-w",
                    "/home/user", "-u", "1000"},
                   {"sh", "-c", "probe env DSEC_BIN; probe env DSEC_NO_SUCH_VAR_X; probe env A; "
                                "probe env B; probe env DSEC_PROBE; probe cwd; id -u"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    auto l = lines_of(r.out);
    REQUIRE(l.size() == 7);
    CHECK(l[0] == std::getenv("DSEC_BIN"));
    CHECK(l[1] == "(unset)");
    CHECK(l[2] == "from file");
    CHECK(l[3] == "two words");
    CHECK(l[4] == std::getenv("DSEC_PROBE"));
    CHECK(l[5] == "/home/user");
    CHECK(l[6] == "1000");
    r = s.run({"--env-file", s.root() + "/src/no-such.env"}, {"true"});
    CHECK(r.status == 2);
    CHECK(r.err.find("no-such.env") != std::string::npos);
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
  SUBCASE("--user by name: the image's passwd and group give ids, groups, HOME and USER") {
    auto r = s.run({"--user", "user"}, {"sh", "-c", "probe uid; id -G; echo $HOME $USER"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "uid=1000 euid=1000 gid=1000 egid=1000\n1000 2000\n/home/user user\n");
    r = s.run({"--user", "user:dev", "--env", "HOME=/elsewhere"},
              {"sh", "-c", "probe uid; id -G; echo $HOME"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "uid=1000 euid=1000 gid=2000 egid=2000\n2000\n/elsewhere\n");
    r = s.run({"--user", "1000:dev"}, {"sh", "-c", "probe uid; echo $USER"});
    CHECK(r.out == "uid=1000 euid=1000 gid=2000 egid=2000\nuser\n");
    // A number of the image's passwd is that user, as docker's -u: its gid,
    // groups, HOME and USER; one of no entry is only itself, its HOME /
    // (docker's too).
    r = s.run({"--user", "1000"}, {"sh", "-c", "probe uid; id -G; echo $HOME $USER"});
    CHECK_MESSAGE(r.out == "uid=1000 euid=1000 gid=1000 egid=1000\n1000 2000\n/home/user user\n",
                  r.describe());
    r = s.run({"--user", "1000:0"}, {"sh", "-c", "id -g; id -G"});
    CHECK_MESSAGE(r.out == "0\n0 2000\n", r.describe());
    r = s.run({"--user", "4321"}, {"sh", "-c", "probe uid; id -G; echo $HOME"});
    CHECK_MESSAGE(r.out == "uid=4321 euid=4321 gid=4321 egid=4321\n4321\n/\n", r.describe());
    for (std::string bad : {"nobody-here", "user:nogroup"}) {
      r = s.run({"--user", bad}, {"true"});
      CHECK_MESSAGE(r.status == 126, r.describe());
      CHECK_MESSAGE(r.err.find(bad.substr(bad.find(':') + 1)) != std::string::npos, r.describe());
    }
    r = s.run({"--user", "a:b:c"}, {"true"});
    CHECK_MESSAGE(r.status == 2, r.describe());
    r = s.run({"--user", "bad name"}, {"true"});
    CHECK_MESSAGE(r.status == 2, r.describe());
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

TEST_CASE("-v: host directories and files in the sandbox, owners kept, read-only with :ro") {
  auto& s = suite::get();
  temp_dir t{"/tmp", "dsec-run-v"};
  auto dir = t.path() + "/dir";
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  {
    std::ofstream f{dir + "/f"};
    f << "host text\n";
  }
  REQUIRE(::chown((dir + "/f").c_str(), 1000, 1000) == 0);
  // Writable by default here (the user is root on this host already); what
  // the sandbox's root makes is owned by the host's root.
  auto r = s.run({"-v", dir + ":/data"},
                 {"sh", "-c", "cat /data/f; stat -c %u:%g /data/f; echo new > /data/made"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "host text\n1000:1000\n");
  struct stat st{};
  REQUIRE(::stat((dir + "/made").c_str(), &st) == 0);
  CHECK(st.st_uid == 0);
  // :ro: nothing can be written through it.
  r = s.run({"-v", dir + ":/data:ro"}, {"sh", "-c", "echo x > /data/g"});
  CHECK(r.status != 0);
  CHECK_MESSAGE(r.err.find("Read-only file system") != std::string::npos, r.describe());
  CHECK(::access((dir + "/g").c_str(), F_OK) != 0);
  // A file over a file of the image, and one at a path whose directories are made;
  // the sandbox's own files stay where they are.
  r = s.run({"-v", dir + "/f:/etc/passwd:ro", "-v", dir + "/f:/x/y/z"},
            {"sh", "-c", "cat /etc/passwd /x/y/z; ls /bin/busybox"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "host text\nhost text\n/bin/busybox\n");
  // A directory where the image has a file, and bad specs.
  r = s.run({"-v", dir + ":/etc/passwd"}, {"true"});
  CHECK(r.status == 125);
  CHECK_MESSAGE(r.err.find("host_mounts") != std::string::npos, r.describe());
  r = s.run({"-v", t.path() + "/missing:/data"}, {"true"});
  CHECK(r.status == 125);
  CHECK_MESSAGE(r.err.find("does not exist") != std::string::npos, r.describe());
  for (const char* bad : {"rel:/x", "/a:/proc/self", "/a:/", "/a:/x:wr"}) {
    r = s.run({"-v", bad}, {"true"});
    CHECK_MESSAGE(r.status == 2, r.describe());
  }
  // Nothing of it is left on the host's mount table.
  std::ifstream mi{"/proc/self/mountinfo"};
  std::string text{std::istreambuf_iterator<char>{mi}, {}};
  CHECK(text.find(dir) == std::string::npos);
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

// ---- Chronus: the socket and trusted commands (runtime API) -------------------

namespace {

// A deadline for waits that should end: a safety net against a hung suite,
// never a pass/fail threshold.
std::chrono::steady_clock::time_point safety() {
  return std::chrono::steady_clock::now() + std::chrono::seconds(120);
}

// Runs `cmd` in `c` with `input` on its stdin and its stdout and stderr in one
// pipe, and waits for it (a safety deadline only: the test fails past it).
exec_result run_command(dsec::container& c, const dsec::command& cmd,
                        const std::string& input = {}) {
  int in[2], out[2];
  REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(input.size() < 4096); // fits the pipe: written before the command runs
  REQUIRE(::write(in[1], input.data(), input.size()) == static_cast<ssize_t>(input.size()));
  ::close(in[1]);
  auto id = c.exec(cmd, dsec::stdio{in[0], out[1], out[1]});
  ::close(in[0]);
  ::close(out[1]);
  if (!id)
    ::close(out[0]);
  REQUIRE_MESSAGE(id, id.error_value().to_string());
  exec_result res;
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  char buf[4096];
  auto drain = [&] {
    ssize_t n;
    while ((n = ::read(out[0], buf, sizeof buf)) > 0)
      res.out.append(buf, static_cast<size_t>(n));
  };
  for (;;) {
    drain();
    auto st = c.wait(*id, std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
    if (st) {
      res.status = *st;
      break;
    }
    if (st.error_value().code != dsec::errc::timeout
        || std::chrono::steady_clock::now() > deadline) {
      ::close(out[0]);
      FAIL("waiting for " << cmd.argv[0] << ": " << st.error_value().to_string());
    }
  }
  drain();
  ::close(out[0]);
  return res;
}

dsec::command make_command(std::vector<std::string> argv, bool trusted = false) {
  dsec::command cmd;
  cmd.argv = std::move(argv);
  cmd.env = dsec::command::default_env();
  cmd.trusted = trusted;
  return cmd;
}

constexpr const char* no_chronus = "Chronus sandboxes: no Landlock ABI 6 on this kernel";

dsec::container_options chronus_options() {
  dsec::container_options o;
  o.chronus = true;
  return o;
}

// Accepts one connection on a listening Chronus socket and reads one packet.
std::string accept_and_read(int listener) {
  pollfd p{listener, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 60'000) == 1); // safety only: a connection is queued already
  dsec::unique_fd conn{::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)};
  REQUIRE(conn);
  char buf[256];
  auto n = ::recv(conn.get(), buf, sizeof buf, 0);
  REQUIRE(n >= 0);
  return std::string(buf, static_cast<size_t>(n));
}

// `probe pids` lists by name ("10" before "2"): whether a line is there.
bool has_line(const std::string& text, const std::string& line) {
  for (const auto& l : lines_of(text))
    if (l == line)
      return true;
  return false;
}

bool has_step(const dsec::container& c, const char* name) {
  for (const auto& t : c.timings())
    if (std::string{t.name} == name)
      return true;
  return false;
}

} // namespace

TEST_CASE("a command line longer than a message arrives whole; the kernel's execve limit decides"
          " (issue 23)") {
  api_env env({base_layer});
  auto c = env.create({});
  SUBCASE("1.5 MB of arguments (the host allows 2 MiB)") {
    std::vector<std::string> argv{"sh", "-c", "echo $#; printf %s \"$1\" | wc -c; "
                                              "printf %s \"${15000}\" | head -c 3", "sh"};
    for (int i = 0; i < 15000; ++i)
      argv.push_back(std::to_string(i + 1) + std::string(95, static_cast<char>('a' + i % 26)));
    auto r = run_command(*c, make_command(argv));
    CHECK(r.status.code == 0);
    CHECK(r.out == "15000\n96\n150");
  }
  SUBCASE("many short arguments: more than 65,536") {
    std::vector<std::string> argv{"sh", "-c", "echo $#", "sh"};
    argv.resize(4 + 100'000, "z");
    auto r = run_command(*c, make_command(argv));
    CHECK(r.status.code == 0);
    CHECK(r.out == "100000\n");
  }
  SUBCASE("one argument over the kernel's 128 KiB per string: E2BIG, named") {
    auto cmd = make_command({"sh", "-c", "true", std::string(200'000, 'x')});
    dsec::unique_fd null{::open("/dev/null", O_RDWR | O_CLOEXEC)};
    // exec reports it, having waited for init's word that the command runs.
    auto id = c->exec(cmd, dsec::stdio{null.get(), null.get(), null.get()});
    REQUIRE_FALSE(id);
    CHECK(id.error_value().sys_errno == E2BIG);
    CHECK(id.error_value().message.find("execve limit") != std::string::npos);
    // The sandbox is still usable.
    auto r = run_command(*c, make_command({"sh", "-c", "echo ok"}));
    CHECK(r.out == "ok\n");
  }
  SUBCASE("more than dsec's own bound is refused before anything is sent") {
    auto cmd = make_command({"sh", "-c", "true"});
    for (int i = 0; i < 40; ++i)
      cmd.argv.push_back(std::string(110'000, 'q'));
    dsec::unique_fd null{::open("/dev/null", O_RDWR | O_CLOEXEC)};
    auto id = c->exec(cmd, dsec::stdio{null.get(), null.get(), null.get()});
    REQUIRE_FALSE(id);
    CHECK(id.error_value().code == dsec::errc::invalid_argument);
    CHECK(id.error_value().message.find("too long") != std::string::npos);
  }
}

TEST_CASE("Chronus: the sandbox connects to /run/chronus.sock and the host reads its packets"
          * skip_unless(landlock_scoping(), no_chronus)) {
  api_env env({base_layer});
  auto c = env.create(chronus_options());
  CHECK(c->chronus());
  REQUIRE(c->chronus_fd() >= 0);
  CHECK(has_step(*c, "make_chronus"));
  CHECK(has_step(*c, "chronus_mounts"));
  CHECK(has_step(*c, "trusted_helper"));

  // Any uid may connect: the socket is 0666, /run the sandbox root's.
  auto cmd = make_command({"sh", "-c",
                           "stat -c '%A %u %g' /run/chronus.sock /run; "
                           "probe seqpacket-send /run/chronus.sock hello-from-1000"});
  cmd.uid = 1000;
  auto r = run_command(*c, cmd);
  CHECK_MESSAGE(r.status.code == 0, r.out);
  CHECK(r.out == "srw-rw-rw- 0 0\ndrwxr-xr-x 0 0\nok\n");
  CHECK(accept_and_read(c->chronus_fd()) == "hello-from-1000");

  // A trusted command reaches it the same way.
  r = run_command(*c, make_command({"probe", "seqpacket-send", "/run/chronus.sock", "hi"}, true));
  CHECK(r.out == "ok\n");
  CHECK(accept_and_read(c->chronus_fd()) == "hi");

  // The caller can take the socket over; it keeps working.
  auto fd = c->release_chronus_fd();
  CHECK(c->chronus_fd() == -1);
  REQUIRE(fd);
  r = run_command(*c, make_command({"probe", "seqpacket-send", "/run/chronus.sock", "again"}));
  CHECK(r.out == "ok\n");
  CHECK(accept_and_read(fd.get()) == "again");

  // Without the option there is no socket, and no helper among the processes.
  auto plain = env.create();
  CHECK_FALSE(plain->chronus());
  CHECK(plain->chronus_fd() == -1);
  CHECK_FALSE(has_step(*plain, "make_chronus")); // its steps are as they were
  CHECK_FALSE(has_step(*plain, "trusted_helper"));
  CHECK_FALSE(has_step(*plain, "chronus_mounts"));
  CHECK(has_step(*plain, "make_cgroup"));
  r = run_command(*plain, make_command({"sh", "-c",
                                        "probe seqpacket-send /run/chronus.sock x; probe pids"}));
  CHECK(r.out == "ENOENT\n1 dsec-init\n2 probe\n"); // sh execs its last command
}

TEST_CASE("Chronus: the trusted helper is init's child and dies with the sandbox"
          * skip_unless(landlock_scoping(), no_chronus)) {
  api_env env({base_layer});
  REQUIRE(env.sp().ready()); // its start-up helper is gone: not our doing below
  auto before = host_snapshot::take();
  for (bool by_kill : {false, true}) {
    CAPTURE(by_kill);
    auto c = env.create(chronus_options());
    std::vector<pid_t> helpers;
    // The helper names itself just after init forked it, which may be just
    // after the sandbox was reported ready.
    CHECK(eventually([&] {
      helpers.clear();
      for (const auto& [pid, e] : process_table())
        if (e.ppid == c->pid() && e.comm == "dsec-trusted")
          helpers.push_back(pid);
      return helpers.size() == 1;
    }));
    REQUIRE(helpers.size() == 1);
    if (by_kill) {
      c->kill();
      CHECK(eventually([&] {
        auto reaped = c->reap();
        return !reaped || *reaped;
      }));
    } else {
      REQUIRE(c->destroy());
    }
    // init's end ended the pid namespace, the helper with it.
    CHECK_FALSE(pid_exists(helpers[0]));
  }
  // Nor is anything else left: descriptors (the socket), mounts, processes.
  check_nothing_left(before);
}

TEST_CASE("Chronus: a Chronus sandbox has the layers' /run under the socket"
          * skip_unless(landlock_scoping(), no_chronus)) {
  // A base layer with a /run of its own: the overlay merges it with ours.
  auto& s = suite::get();
  static bool built = false;
  if (!built) {
    auto src = s.make_tree("run-base", {{"run/existing", "from the layer\n"}});
    s.build_layer("workdir", "runwd@1", src);
    built = true;
  }
  api_env env({"runwd@1", base_layer});
  auto c = env.create(chronus_options());
  auto r = run_command(*c, make_command({"sh", "-c", "ls /run; cat /run/existing; "
                                                     "echo x > /run/new && echo written"}));
  CHECK(r.out == "chronus.sock\nexisting\nfrom the layer\nwritten\n");
}

TEST_CASE("Chronus: /.dsec and the pristine root, and the system layer they need"
          * skip_unless(landlock_scoping(), no_chronus)) {
  api_env env({base_layer});
  // Without dsec's system layer on top there is no /.dsec to mount: refused,
  // saying so, before anything is spawned.
  auto bare = dsec::container::create(env.sp(), env.lowers_without_system(), chronus_options(),
                                      nullptr);
  REQUIRE_FALSE(bare);
  CHECK(bare.error_value().code == dsec::errc::not_found);
  CHECK(bare.error_value().step == "make_chronus");
  CHECK_MESSAGE(bare.error_value().message.find("system layer") != std::string::npos,
                bare.error_value().message);
  auto c = env.create(chronus_options());
  // Every command sees dsec's client at /.dsec/bin, on a read-only mount.
  auto r = run_command(*c, make_command({"sh", "-c", "cmp /.dsec/bin/chronus "
                                                     "/usr/local/bin/chronus && echo same;"
                                                     " touch /.dsec/x || echo read-only"}));
  CHECK(r.out.find("same\n") == 0);
  CHECK(r.out.find("read-only\n") != std::string::npos);
  // A pristine command: the layers' root, read-only, with /tmp, /proc and the
  // agent's root; an untrusted one cannot ask for it.
  REQUIRE(run_command(*c, make_command({"sh", "-c", "echo agent > /agent-file"})).status.code
          == 0);
  auto p = make_command({"sh", "-c", "ls /agent-file 2>/dev/null; cat /.dsec/agent/agent-file;"
                                     " touch /x 2>/dev/null || echo ro; touch /tmp/x && echo tmp;"
                                     " test -e /proc/self/status && echo proc"},
                        true);
  p.pristine = true;
  r = run_command(*c, p);
  CHECK(r.status.code == 0);
  CHECK(r.out == "agent\nro\ntmp\nproc\n");
  auto untrusted = make_command({"true"});
  untrusted.pristine = true;
  auto id = c->exec(untrusted, dsec::stdio{});
  REQUIRE_FALSE(id);
  CHECK(id.error_value().code == dsec::errc::invalid_argument);
  // The pristine /tmp is not the agent's.
  r = run_command(*c, make_command({"sh", "-c", "ls /tmp/x 2>/dev/null || echo none"}));
  CHECK(r.out == "none\n");
}

TEST_CASE("Chronus: a trusted command is refused in a sandbox made without Chronus") {
  api_env env({base_layer});
  auto plain = env.create();
  auto id = plain->exec(make_command({"true"}, true), dsec::stdio{});
  REQUIRE_FALSE(id);
  CHECK(id.error_value().code == dsec::errc::invalid_argument);
  CHECK(id.error_value().message.find("Chronus") != std::string::npos);
  // The sandbox is unharmed.
  CHECK(run_command(*plain, make_command({"probe", "exit", "0"})).status.code == 0);
}

TEST_CASE("Chronus: without Landlock ABI 6 a Chronus sandbox is refused as unsupported"
          * skip_unless(!landlock_scoping(), "the refusal of Chronus without Landlock ABI 6: "
                                             "this kernel has it")) {
  api_env env({base_layer});
  auto c = dsec::container::create(env.sp(), env.lowers(), chronus_options(), nullptr);
  REQUIRE_FALSE(c);
  CHECK(c.error_value().code == dsec::errc::unsupported);
  CHECK(c.error_value().step == "make_chronus");
  CHECK(c.error_value().message.find("Landlock ABI 6") != std::string::npos);
}

TEST_CASE("Chronus: trusted commands run, end and fail like any other command"
          * skip_unless(landlock_scoping(), no_chronus)) {
  api_env env({base_layer});
  auto c = env.create(chronus_options());

  SUBCASE("uid, gid, cwd, environment and stdio are the command's") {
    for (bool trusted : {false, true}) {
      CAPTURE(trusted);
      auto cmd = make_command({"sh", "-c", "probe uid; probe cwd; probe env FOO; cat"}, trusted);
      cmd.uid = 1000;
      cmd.gid = 1000;
      cmd.cwd = "/home/user";
      cmd.env.push_back("FOO=bar");
      auto r = run_command(*c, cmd, "from stdin\n");
      CHECK(r.status.code == 0);
      CHECK(r.out == "uid=1000 euid=1000 gid=1000 egid=1000\n/home/user\nbar\nfrom stdin\n");
    }
    // A command line near the size limit goes through the helper whole.
    auto cmd = make_command({"sh", "-c", "probe env BIG | wc -c"}, true);
    cmd.env.push_back("BIG=" + std::string(100'000, 'x'));
    auto r = run_command(*c, cmd);
    CHECK(r.out == "100001\n");
    // A longer one comes in a memfd, which init hands to the helper.
    cmd = make_command({"sh", "-c", "probe env BIG | wc -c; probe env BIG2 | wc -c"}, true);
    cmd.env.push_back("BIG=" + std::string(120'000, 'x'));
    cmd.env.push_back("BIG2=" + std::string(120'000, 'y'));
    r = run_command(*c, cmd);
    CHECK(r.status.code == 0);
    CHECK(r.out == "120001\n120001\n");
  }

  SUBCASE("exit codes and signals are reported, and the command is reaped") {
    auto r = run_command(*c, make_command({"sh", "-c", "echo $$; exit 7"}, true));
    CHECK(r.status.code == 7);
    CHECK(r.status.signal == 0);
    auto pid = r.out.substr(0, r.out.size() - 1);
    REQUIRE_FALSE(pid.empty());
    // Reaped by init before it reported the exit: no zombie left.
    r = run_command(*c, make_command({"probe", "cat", "/proc/" + pid + "/stat"}));
    CHECK(r.out == "ENOENT\n");

    r = run_command(*c, make_command({"probe", "kill-self", "TERM"}, true));
    CHECK(r.status.signal == SIGTERM);
    CHECK(r.status.shell_code() == 143);
  }

  SUBCASE("signal() reaches a trusted command's whole process group") {
    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    auto id = c->exec(make_command({"sh", "-c", "probe sleep & echo started; wait"}, true),
                      dsec::stdio{-1, out[1], -1});
    ::close(out[1]);
    REQUIRE_MESSAGE(id, id.error_value().to_string());
    char buf[16] = {};
    pollfd p{out[0], POLLIN, 0};
    REQUIRE(::poll(&p, 1, 60'000) == 1); // safety only
    CHECK(::read(out[0], buf, sizeof buf - 1) > 0);
    ::close(out[0]);
    CHECK(std::string{buf} == "started\n");
    REQUIRE(c->signal(*id, SIGTERM));
    auto st = c->wait(*id, safety());
    REQUIRE_MESSAGE(st, st.error_value().to_string());
    CHECK(st->signal == SIGTERM);
    // The background probe went with its group: only init, the helper and the
    // lister are left.
    std::string pids;
    CHECK(eventually([&] {
      pids = run_command(*c, make_command({"probe", "pids"})).out;
      return lines_of(pids).size() == 3;
    }));
    CHECK(has_line(pids, "1 dsec-init"));
    CHECK(has_line(pids, "2 dsec-trusted"));
  }

  SUBCASE("a command that cannot start fails as it does untrusted") {
    auto missing = make_command({"no-such-program"});
    auto bad_cwd = make_command({"true"});
    bad_cwd.cwd = "/no/such/dir";
    auto bad_uid = make_command({"true"});
    bad_uid.uid = 70000; // outside the sandbox's 65536 ids
    for (auto* base : {&missing, &bad_cwd, &bad_uid}) {
      CAPTURE(base->argv[0]);
      auto trusted = *base;
      trusted.trusted = true;
      auto u = c->exec(*base, dsec::stdio{});
      auto t = c->exec(trusted, dsec::stdio{});
      REQUIRE_FALSE(u);
      REQUIRE_FALSE(t);
      CHECK(t.error_value().code == u.error_value().code);
      CHECK(t.error_value().message == u.error_value().message);
      CHECK(t.error_value().step == u.error_value().step);
      CHECK(t.error_value().sys_errno == u.error_value().sys_errno);
    }
    auto t = c->exec(make_command({"no-such-program"}, true), dsec::stdio{});
    REQUIRE_FALSE(t);
    CHECK(t.error_value().code == dsec::errc::not_found);
    CHECK(t.error_value().message.find("'no-such-program'") != std::string::npos);
    // The children that failed were reaped: init, the helper and the lister.
    auto r = run_command(*c, make_command({"probe", "pids"}));
    CHECK(has_line(r.out, "1 dsec-init"));
    CHECK(has_line(r.out, "2 dsec-trusted"));
    CHECK_MESSAGE(lines_of(r.out).size() == 3, r.out);
    // And trusted commands still start.
    CHECK(run_command(*c, make_command({"probe", "exit", "5"}, true)).status.code == 5);
  }
}
