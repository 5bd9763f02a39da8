// The remote verbs end to end: a real dsecd process ($DSECD_BIN --listen
// 127.0.0.1:0) and the real dsec ($DSEC_BIN --connect 127.0.0.1:PORT ...),
// which execs dsec-client. Each case checks exit statuses, what dsec printed on
// stdout and stderr, and that the daemon still serves afterwards; each ends by
// stopping its dsecd with SIGTERM, which must find no sandbox left to destroy.
//
// Layers: bbt@1 (busybox with tar, from test/actors/common.hpp) and the
// fixture's wd@1 (workdir) and ta@1 (tool), for the wrong-kind errors.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/sha256.hpp"
#include "runtime/store.hpp"
#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"
#include "test/support/tar_builder.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

namespace fs = std::filesystem;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A dsecd started by this test on a free port, and `dsec --connect` against it.
// Unless finish() stopped it, the destructor stops it with SIGTERM (every
// sandbox destroyed) and waits for it, whatever the test's outcome.
std::vector<std::string> dsecd_argv(const std::vector<std::string>& extra) {
  std::vector<std::string> v{env_path("DSECD_BIN"), "--listen", "127.0.0.1:0", "--state",
                             actor_layers()};
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

struct daemon_proc {
  explicit daemon_proc(const std::vector<std::string>& extra = {}) : bg(dsecd_argv(extra)) {
    const std::string mark = "listening on 127.0.0.1:";
    if (!bg.wait_for_output(" (state ")) {
      auto end = stop();
      FAIL("dsecd did not start: " << end.describe());
    }
    port = static_cast<uint16_t>(std::atoi(bg.out().c_str() + bg.out().find(mark) + mark.size()));
    where = "127.0.0.1:" + std::to_string(port);
    dsec_bin = env_path("DSEC_BIN");
  }
  ~daemon_proc() {
    if (stopped)
      return;
    auto end = stop();
    if (std::uncaught_exceptions() == 0)
      CHECK_MESSAGE(end.status == 0, "dsecd: " << end.describe());
  }

  proc_result stop() {
    stopped = true;
    bg.kill(SIGTERM);
    return bg.wait();
  }

  // Stops it with SIGTERM: it exits 0, and no sandbox was left for it to destroy.
  void finish() {
    auto end = stop();
    CHECK_MESSAGE(end.status == 0, end.describe());
    CHECK_MESSAGE(contains(end.out, "dsecd: 0 sandboxes destroyed"), end.describe());
  }

  // `dsec --connect 127.0.0.1:PORT ARGS...`, with `input` on its stdin.
  [[nodiscard]] proc_result dsec(const std::vector<std::string>& args,
                                 const std::string& input = {}) const {
    return dsec_at(where, args, input);
  }
  [[nodiscard]] proc_result dsec_at(const std::string& at, const std::vector<std::string>& args,
                                    const std::string& input = {}) const {
    std::vector<std::string> argv{dsec_bin, "--connect", at};
    argv.insert(argv.end(), args.begin(), args.end());
    spawn_options o;
    o.input = input;
    auto r = run_process(argv, o);
    CHECK_FALSE_MESSAGE(r.safety_killed, r.describe());
    CHECK_FALSE_MESSAGE(r.output_left_open, r.describe());
    return r;
  }
  // The argv of a dsec to run in the background.
  [[nodiscard]] std::vector<std::string> argv(const std::vector<std::string>& args) const {
    std::vector<std::string> v{dsec_bin, "--connect", where};
    v.insert(v.end(), args.begin(), args.end());
    return v;
  }

  // `run --base bbt@1 OPTIONS -- CMD...`.
  [[nodiscard]] proc_result run(const std::vector<std::string>& options,
                                const std::vector<std::string>& cmd,
                                const std::string& input = {}) const {
    std::vector<std::string> args{"run", "--base", tar_base};
    args.insert(args.end(), options.begin(), options.end());
    args.emplace_back("--");
    args.insert(args.end(), cmd.begin(), cmd.end());
    return dsec(args, input);
  }

  // `run --detach OPTIONS -- sleep 1000`: the id it printed.
  [[nodiscard]] std::string detached(const std::vector<std::string>& options = {}) const {
    std::vector<std::string> o{"--detach"};
    o.insert(o.end(), options.begin(), options.end());
    auto r = run(o, {"sleep", "1000"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    auto l = lines_of(r.out);
    REQUIRE_MESSAGE(l.size() == 1, r.describe());
    REQUIRE(!l[0].empty());
    CHECK(l[0].find_first_of(" \t/:") == std::string::npos);
    return l[0];
  }

  background bg;
  bool stopped = false;
  uint16_t port = 0;
  std::string where, dsec_bin;
};

// A row of `ps`.
struct ps_row {
  std::string id, name, session, state, env, age, ttl, running;
};

std::vector<ps_row> ps(const daemon_proc& d, const std::string& session = {}) {
  auto r = session.empty() ? d.dsec({"ps"}) : d.dsec({"ps", "--session", session});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(r.err.empty());
  if (r.out == "no sandboxes\n")
    return {};
  auto l = lines_of(r.out);
  REQUIRE_MESSAGE(l.size() >= 2, r.describe());
  CHECK(l[0].rfind("ID ", 0) == 0);
  std::vector<ps_row> rows;
  for (size_t i = 1; i < l.size(); ++i) {
    std::istringstream in{l[i]};
    ps_row row;
    in >> row.id >> row.name >> row.session >> row.state >> row.env >> row.age >> row.ttl >> row.running;
    REQUIRE_MESSAGE(!row.running.empty(), "a short ps row: " << l[i]);
    rows.push_back(row);
  }
  return rows;
}

std::vector<std::string> ids(const std::vector<ps_row>& rows) {
  std::vector<std::string> v;
  for (const auto& r : rows)
    v.push_back(r.id);
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// `node stats` as "node" -> "127.0.0.1:PORT", "live" -> "2", ...
std::map<std::string, std::string> stats(const daemon_proc& d) {
  auto r = d.dsec({"node", "stats"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  std::map<std::string, std::string> m;
  for (const auto& l : lines_of(r.out)) {
    auto gap = l.find("  ");
    if (gap == std::string::npos || l[0] == ' ')
      continue;
    auto v = l.find_first_not_of(' ', gap);
    m[l.substr(0, gap)] = v == std::string::npos ? "" : l.substr(v);
  }
  return m;
}

unsigned long long count(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  REQUIRE_MESSAGE(it != m.end(), "node stats has no '" << k << "'");
  return std::strtoull(it->second.c_str(), nullptr, 10);
}

// True once `node stats` shows these counts (polled with a generous cap: the
// node hears of a destroyed sandbox just after the one who destroyed it).
bool stats_reach(const daemon_proc& d, const std::map<std::string, unsigned long long>& want) {
  return eventually([&] {
    auto s = stats(d);
    for (const auto& [k, v] : want)
      if (count(s, k) != v)
        return false;
    return true;
  });
}

// The daemon still creates sandboxes and runs commands; none is left behind.
void check_serving(const daemon_proc& d) {
  auto before = ps(d);
  auto r = d.run({}, {"echo", "still serving"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "still serving\n");
  CHECK(ids(ps(d)) == ids(before));
}

// A tree below `root`, one sorted line per entry: path, type and content
// (sha256 of a file and whether its owner may execute it, a symlink's target).
std::string listing(const std::string& root) {
  std::vector<std::string> lines;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    auto rel = it->path().lexically_relative(root).string(); // no symlink resolution
    auto st = it->symlink_status();
    if (fs::is_symlink(st))
      lines.push_back(rel + " -> " + fs::read_symlink(it->path()).string());
    else if (fs::is_directory(st))
      lines.push_back(rel + " dir");
    else if (fs::is_regular_file(st))
      lines.push_back(rel + " file " + sha256_of(it->path().string())
                      + ((st.permissions() & fs::perms::owner_exec) != fs::perms::none ? " x"
                                                                                        : ""));
    else
      lines.push_back(rel + " other");
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& l : lines)
    out += l + "\n";
  return out;
}

// A local tree with what a copy must keep: nested and empty directories, text,
// binary and empty files, an executable, a symlink.
void make_tree(const std::string& dir) {
  write_file(dir + "/a.txt", "alpha\n");
  std::string bin;
  for (uint64_t i = 0; i < 300000; ++i)
    bin += static_cast<char>((i * 7919) % 251);
  write_file(dir + "/sub/data.bin", bin);
  write_file(dir + "/sub/deep/empty", "");
  write_file(dir + "/sub/run.sh", "#!/bin/sh\necho ran\n", 0755);
  fs::create_directories(dir + "/emptydir");
  fs::create_symlink("a.txt", dir + "/link");
}

// A TCP port on loopback that nothing listens on while this lives (bound, not
// listening: connecting is refused, and no one else can take the port).
struct dead_port {
  dead_port() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sin;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) == 0);
    port = ntohs(sin.sin_port);
  }
  ~dead_port() { ::close(fd); }
  int fd = -1;
  uint16_t port = 0;
};

// Waits until `file` exists in the sandbox, having printed "first"; then
// prints "second" and exits 7.
const std::vector<std::string> gated = {
  "sh", "-c", "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second; exit 7"};

// Needs more than 16 MiB (and less than 256 MiB).
const std::vector<std::string> hog = {
  "sh", "-c", "x=$(head -c 48000000 /dev/zero | tr '\\0' a); echo ${#x}"};

} // namespace

TEST_CASE("remote run: streamed output, exit statuses, stdin, environment, limits") {
  daemon_proc d;
  CHECK(ps(d).empty());

  SUBCASE("stdout and stderr apart, and the command's status") {
    auto r = d.run({}, {"sh", "-c", "echo out; echo err >&2; exit 3"});
    CHECK_MESSAGE(r.status == 3, r.describe());
    CHECK(r.out == "out\n");
    CHECK(r.err == "err\n");
    r = d.run({}, {"true"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out.empty());
    CHECK(r.err.empty());
  }
  SUBCASE("a signal: 128+N, named") {
    auto r = d.run({}, {"sh", "-c", "echo before; kill -TERM $$"});
    CHECK_MESSAGE(r.status == 128 + SIGTERM, r.describe());
    CHECK(r.out == "before\n");
    CHECK_MESSAGE(contains(r.err, "SIGTERM"), r.describe());
    CHECK_FALSE(contains(r.err, "out of memory"));
    r = d.run({}, {"sh", "-c", "kill -KILL $$"});
    CHECK_MESSAGE(r.status == 128 + SIGKILL, r.describe());
    CHECK_MESSAGE(contains(r.err, "SIGKILL"), r.describe());
    CHECK_MESSAGE(!contains(r.err, "out of memory"), r.describe());
  }
  SUBCASE("--timeout: 124") {
    auto r = d.run({"--timeout", "300ms"}, {"sleep", "1000"});
    CHECK_MESSAGE(r.status == 124, r.describe());
    CHECK_MESSAGE(contains(r.err, "timed out after 300ms"), r.describe());
  }
  SUBCASE("a missing program: 127 naming it; one that cannot be executed: 126") {
    auto r = d.run({}, {"no-such-program-x1"});
    CHECK_MESSAGE(r.status == 127, r.describe());
    CHECK_MESSAGE(contains(r.err, "no-such-program-x1"), r.describe());
    r = d.run({}, {"/etc/passwd"});
    CHECK_MESSAGE(r.status == 126, r.describe());
    CHECK_MESSAGE(contains(r.err, "/etc/passwd"), r.describe());
    r = d.run({"--cwd", "/no-such-dir"}, {"true"});
    CHECK_MESSAGE(r.status == 126, r.describe());
    CHECK_MESSAGE(contains(r.err, "/no-such-dir"), r.describe());
  }
  SUBCASE("-i sends stdin; without it the command's stdin is empty") {
    auto r = d.run({"-i"}, {"cat"}, "line one\nline two\n");
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "line one\nline two\n");
    // A larger binary input arrives whole.
    auto dir = suite::get().scratch();
    std::string data;
    for (int i = 0; i < 1'000'000; ++i)
      data += static_cast<char>((i * 131) % 256);
    write_file(dir / "in", data);
    r = d.run({"--stdin"}, {"sha256sum"}, data);
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == sha256_of(dir / "in") + "  -\n");
    r = d.run({}, {"cat"}, "not sent\n");
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out.empty());
    // Our stdin a file with data, and no -i: dsec says it is not sent.
    std::vector<std::string> argv{d.dsec_bin, "--connect", d.where, "run", "--base", tar_base,
                                  "--", "cat"};
    spawn_options o;
    auto in_path = dir / "in";
    o.in_child = [in_path] {
      int fd = ::open(in_path.c_str(), O_RDONLY);
      if (fd < 0 || ::dup2(fd, 0) < 0)
        ::_exit(99);
    };
    r = run_process(argv, o);
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out.empty());
    CHECK_MESSAGE(contains(r.err, "stdin is not sent to the command without -i"), r.describe());
  }
  SUBCASE("--env, --cwd, --user") {
    auto r = d.run({"--env", "FOO=bar baz", "--env", "HOME=/elsewhere", "--cwd", "/home/user",
                    "--user", "1000:1000"},
                   {"sh", "-c", "echo \"$FOO|$HOME\"; pwd; id -u; id -g; echo x > /root/f"});
    CHECK_MESSAGE(r.status == 1, r.describe()); // uid 1000 may not write in /root
    CHECK(r.out == "bar baz|/elsewhere\n/home/user\n1000\n1000\n");
    CHECK_MESSAGE(contains(r.err, "/root/f"), r.describe());
    r = d.run({}, {"sh", "-c", "id -u; pwd; echo $HOME"});
    CHECK(r.out == "0\n/\n/root\n");
  }
  SUBCASE("--memory is applied: the command is OOM-killed, and dsec says so") {
    // The control: with room enough the same command works.
    auto r = d.run({"--memory", "256m"}, hog);
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "48000000\n");
    r = d.run({"--memory", "16m"}, hog);
    CHECK_MESSAGE(r.status == 128 + SIGKILL, r.describe());
    CHECK(r.out.empty());
    CHECK_MESSAGE(contains(r.err, "out of memory: the --memory limit was reached"),
                  r.describe());
  }
  // Whatever ran, its sandbox is gone, and the daemon serves on.
  CHECK(ps(d).empty());
  check_serving(d);
  d.finish();
}

TEST_CASE("remote run: streaming, and SIGTERM destroys the sandbox") {
  daemon_proc d;
  auto argv = d.argv({"run", "--base", tar_base, "--"});
  argv.insert(argv.end(), gated.begin(), gated.end());

  SUBCASE("output arrives while the command still runs") {
    background run(argv);
    REQUIRE_MESSAGE(run.wait_for_output("first\n"), run.out() << run.err());
    CHECK_FALSE(contains(run.out(), "second"));
    // Its sandbox: in a session of its own, running one command.
    auto rows = ps(d);
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].session != "default");
    CHECK(rows[0].state == "running");
    CHECK(rows[0].env == tar_base);
    CHECK(rows[0].running == "1");
    // Detached: the gated command may end, and its run destroy the sandbox,
    // before the touch's own exit is reported (a race a loaded run once lost).
    auto go = d.dsec({"exec", "--detach", rows[0].id, "--", "touch", "/tmp/go"});
    CHECK_MESSAGE(go.status == 0, go.describe());
    auto end = run.wait();
    CHECK_MESSAGE(end.status == 7, end.describe());
    CHECK(end.out == "first\nsecond\n");
    CHECK(end.err.empty());
  }
  SUBCASE("SIGTERM to dsec: the sandbox is destroyed, status 143") {
    background run(argv);
    REQUIRE_MESSAGE(run.wait_for_output("first\n"), run.out() << run.err());
    REQUIRE(ps(d).size() == 1);
    run.kill(SIGTERM);
    auto end = run.wait();
    CHECK_MESSAGE(end.status == 128 + SIGTERM, end.describe());
    CHECK_MESSAGE(contains(end.err, "SIGTERM: destroying the sandbox"), end.describe());
  }
  CHECK(ps(d).empty());
  check_serving(d);
  d.finish();
}

TEST_CASE("remote run --detach, then ps, exec, cp and rm") {
  daemon_proc d;
  auto id = d.detached();
  {
    // inspect and ps --json: the same object, valid JSON (read by Python's own parser).
    auto r = d.dsec({"inspect", id});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    auto py = run_process({"/usr/bin/python3", "-c",
                           "import json,sys; d=json.load(sys.stdin); b=d[0]; e=b['environment'];"
                           "print(len(d), b['id'], b['session'], b['state'], e['base'], "
                           "e['workdir'], e['memory'] > 0, e['backend'], b['key'])"},
                          spawn_options{r.out});
    CHECK_MESSAGE(py.out == "1 " + id + " default running " + tar_base
                              + " None True container None\n", py.describe() << r.out);
    auto j = d.dsec({"ps", "--json"});
    REQUIRE_MESSAGE(j.status == 0, j.describe());
    py = run_process({"/usr/bin/python3", "-c",
                      "import json,sys; d=json.load(sys.stdin); print(len(d), d[0]['id'])"},
                     spawn_options{j.out});
    CHECK_MESSAGE(py.out == "1 " + id + "\n", py.describe() << j.out);
    r = d.dsec({"inspect", id, "sb-no-such"});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, "no sandbox sb-no-such"), r.describe());
  }
  auto rows = ps(d);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].id == id);
  CHECK(rows[0].session == "default");
  CHECK(rows[0].state == "running"); // its sleep
  CHECK(rows[0].env == tar_base);
  CHECK(rows[0].ttl != "-"); // the default session's TTL
  CHECK(rows[0].running == "1");

  SUBCASE("exec: status, output, and files that later commands see") {
    auto r = d.dsec({"exec", id, "--", "sh", "-c", "echo hi > /tmp/x; echo to-err >&2; exit 5"});
    CHECK_MESSAGE(r.status == 5, r.describe());
    CHECK(r.out.empty());
    CHECK(r.err == "to-err\n");
    r = d.dsec({"exec", id, "--", "cat", "/tmp/x"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "hi\n");
    r = d.dsec({"exec", "-i", "--env", "A=b", "--cwd", "/tmp", "--user", "1000", id, "--", "sh",
                "-c", "cat; echo $A; pwd; id -u; cat /tmp/x"},
               "from stdin\n");
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "from stdin\nb\n/tmp\n1000\nhi\n");
    r = d.dsec({"exec", "--timeout", "300ms", id, "--", "sleep", "1000"});
    CHECK_MESSAGE(r.status == 124, r.describe());
    CHECK_MESSAGE(contains(r.err, "timed out"), r.describe());
    r = d.dsec({"exec", id, "--", "sh", "-c", "kill -TERM $$"});
    CHECK_MESSAGE(r.status == 128 + SIGTERM, r.describe());
    CHECK_MESSAGE(contains(r.err, "SIGTERM"), r.describe());
    r = d.dsec({"exec", id, "--", "no-such-program-x2"});
    CHECK_MESSAGE(r.status == 127, r.describe());
    CHECK_MESSAGE(contains(r.err, "no-such-program-x2"), r.describe());
    // Still there, still usable.
    r = d.dsec({"exec", id, "--", "cat", "/tmp/x"});
    CHECK(r.out == "hi\n");
  }
  SUBCASE("exec streams its output while the command runs") {
    auto argv = d.argv({"exec", id, "--"});
    argv.insert(argv.end(), gated.begin(), gated.end());
    background ex(argv);
    REQUIRE_MESSAGE(ex.wait_for_output("first\n"), ex.out() << ex.err());
    CHECK_FALSE(contains(ex.out(), "second"));
    auto r = ps(d);
    REQUIRE(r.size() == 1);
    CHECK(r[0].running == "2"); // the sleep and the gated command
    auto go = d.dsec({"exec", id, "--", "touch", "/tmp/go"});
    CHECK_MESSAGE(go.status == 0, go.describe());
    auto end = ex.wait();
    CHECK_MESSAGE(end.status == 7, end.describe());
    CHECK(end.out == "first\nsecond\n");
  }
  SUBCASE("SIGINT to exec stops the command, says so, exits 130; the sandbox stays") {
    auto argv = d.argv({"exec", id, "--"});
    argv.insert(argv.end(), gated.begin(), gated.end());
    background ex(argv);
    REQUIRE_MESSAGE(ex.wait_for_output("first\n"), ex.out() << ex.err());
    REQUIRE(ps(d).at(0).running == "2");
    ex.kill(SIGINT);
    auto end = ex.wait();
    CHECK_MESSAGE(end.status == 128 + SIGINT, end.describe());
    CHECK_MESSAGE(contains(end.err, "SIGINT: stopping the command (the sandbox stays)"),
                  end.describe());
    // The gated command is gone; the sandbox and its sleep are not.
    CHECK(eventually([&] {
      auto r = ps(d);
      return r.size() == 1 && r[0].running == "1";
    }));
    auto r = d.dsec({"exec", id, "--", "touch", "/tmp/go"});
    CHECK_MESSAGE(r.status == 0, r.describe());
  }
  SUBCASE("cp a directory in and back out: the same tree") {
    auto local = suite::get().scratch();
    make_tree(local / "tree");
    auto r = d.dsec({"cp", local / "tree", id + ":/tmp"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out.empty());
    CHECK(r.err.empty());
    // Inside, as sent.
    r = d.dsec({"exec", id, "--", "sh", "-c",
                "sha256sum < /tmp/tree/sub/data.bin; /tmp/tree/sub/run.sh; cat /tmp/tree/link"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == sha256_of(local / "tree/sub/data.bin") + "  -\nran\nalpha\n");
    auto out = suite::get().scratch();
    r = d.dsec({"cp", id + ":/tmp/tree", out.path()});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.err.empty());
    CHECK(listing(out / "tree") == listing(local / "tree"));
    CHECK(listing(out.path()) != ""); // the control: listing sees files
    // ID:/dir/ copies the directory itself too, as ./dir/ does the other way.
    auto out2 = suite::get().scratch();
    r = d.dsec({"cp", id + ":/tmp/tree/", out2.path()});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(listing(out2.path()) == listing(out.path()));
    // A single file.
    auto out3 = suite::get().scratch();
    r = d.dsec({"cp", id + ":/tmp/tree/a.txt", out3.path()});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(read_file(out3 / "a.txt") == "alpha\n");
  }
  SUBCASE("cp errors name the side that failed") {
    auto out = suite::get().scratch();
    auto r = d.dsec({"cp", id + ":/tmp/not-there", out.path()});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, id + ":/tmp/not-there"), r.describe());
    CHECK(fs::is_empty(out.path()));
    write_file(out / "f", "f\n");
    r = d.dsec({"cp", out / "f", id + ":/no-such-dir/f"});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, id + ":/no-such-dir/f"), r.describe());
    CHECK_MESSAGE(contains(r.err, "no such file or directory"), r.describe());
    r = d.dsec({"cp", out / "missing", id + ":/tmp"});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, out / "missing"), r.describe());
    r = d.dsec({"cp", id + ":/", out.path()});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, "the whole root (/) cannot be copied"), r.describe());
    CHECK(std::distance(fs::directory_iterator(out.path()), fs::directory_iterator{}) == 1);
    r = d.dsec({"cp", id + ":/etc/passwd", out / "missing/passwd"});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, out / "missing"), r.describe());
    // A get of a missing path writes nothing to stdout: its error only.
    r = d.dsec({"cp", id + ":/tmp/not-there", "-"});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(r.out.empty(), r.describe());
    CHECK_MESSAGE(contains(r.err, "no such file or directory"), r.describe());
    r = d.dsec({"cp", "-", id + ":/no-such-dir"}, "not a tar");
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, id + ":/no-such-dir"), r.describe());
  }
  SUBCASE("cp - (tar streams on stdin and stdout) and cp renames, as docker cp") {
    auto local = suite::get().scratch();
    make_tree(local / "tree");
    // cp - ID:DIR: the tar stream on stdin unpacked in DIR.
    auto tar = host_tar(local / "tree");
    auto r = d.dsec({"cp", "-", id + ":/tmp"}, tar);
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    r = d.dsec({"exec", id, "--", "sh", "-c", "sha256sum < /tmp/sub/data.bin; cat /tmp/a.txt"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == sha256_of(local / "tree/sub/data.bin") + "  -\nalpha\n");
    // cp ID:PATH -: a tar stream of PATH on stdout.
    r = d.dsec({"cp", id + ":/tmp/sub", "-"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    auto out = suite::get().scratch();
    host_untar(r.out, out.path());
    CHECK(sha256_of(out / "sub/data.bin") == sha256_of(local / "tree/sub/data.bin"));
    // cp FILE ID:/dir/newname: not a directory there, so the new name.
    r = d.dsec({"cp", local / "tree/a.txt", id + ":/tmp/renamed.txt"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    r = d.dsec({"exec", id, "--", "cat", "/tmp/renamed.txt"});
    CHECK(r.out == "alpha\n");
    // ... and a directory into an existing directory keeps its name.
    r = d.dsec({"exec", id, "--", "mkdir", "/tmp/into"});
    r = d.dsec({"cp", local / "tree", id + ":/tmp/into"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    r = d.dsec({"exec", id, "--", "cat", "/tmp/into/tree/a.txt"});
    CHECK(r.out == "alpha\n");
    // A directory under a new name.
    r = d.dsec({"cp", local / "tree", id + ":/tmp/tree2"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    r = d.dsec({"exec", id, "--", "cat", "/tmp/tree2/a.txt"});
    CHECK(r.out == "alpha\n");
    // cp ID:/path/file LOCALNEW: the new name here.
    r = d.dsec({"cp", id + ":/tmp/renamed.txt", out / "local.txt"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    CHECK(read_file(out / "local.txt") == "alpha\n");
    CHECK_FALSE(fs::exists(out / "renamed.txt"));
    // ... and a directory under a new local name.
    r = d.dsec({"cp", id + ":/tmp/tree2", out / "tree3"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    CHECK(sha256_of(out / "tree3/sub/data.bin") == sha256_of(local / "tree/sub/data.bin"));
  }
  SUBCASE("a --memory limit applies to exec, which says OOM") {
    auto limited = d.detached({"--memory", "16m"});
    auto r = d.dsec({"exec", limited, "--", hog[0], hog[1], hog[2]});
    CHECK_MESSAGE(r.status == 128 + SIGKILL, r.describe());
    CHECK_MESSAGE(contains(r.err, "out of memory"), r.describe());
    r = d.dsec({"exec", limited, "--", "echo", "after"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "after\n");
    r = d.dsec({"rm", limited});
    CHECK_MESSAGE(r.status == 0, r.describe());
  }

  // rm: gone; a second rm of it fails, but the other ids of that rm still go.
  auto other = d.detached();
  CHECK(ids(ps(d)) == sorted({id, other}));
  auto r = d.dsec({"rm", id});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "removed " + id + "\n");
  CHECK(ids(ps(d)) == std::vector<std::string>{other});
  r = d.dsec({"rm", id, other});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK(r.out == "removed " + other + "\n");
  CHECK_MESSAGE(contains(r.err, "no sandbox " + id), r.describe());
  CHECK(ps(d).empty());
  r = d.dsec({"exec", id, "--", "true"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, id), r.describe());
  check_serving(d);
  d.finish();
}

TEST_CASE("remote names and labels: run --name --label, ps shows and filters, a name for an id") {
  daemon_proc d;
  auto web = d.detached({"--name", "web", "--label", "tier=front", "--label", "team=a"});
  auto db = d.detached({"--name", "db", "--tag", "tier=back"});
  auto plain = d.detached();
  auto rows = ps(d);
  REQUIRE(rows.size() == 3);
  std::map<std::string, std::string> name_of;
  for (const auto& r : rows)
    name_of[r.id] = r.name;
  CHECK(name_of[web] == "web");
  CHECK(name_of[db] == "db");
  CHECK(name_of[plain] == "-");
  auto only = [&](std::vector<std::string> filters) {
    std::vector<std::string> args{"ps"};
    for (auto& f : filters)
      args.insert(args.end(), {"--filter", f});
    auto r = d.dsec(args);
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    std::vector<std::string> got;
    auto l = lines_of(r.out);
    for (size_t i = 1; i < l.size(); ++i)
      got.push_back(l[i].substr(0, l[i].find(' ')));
    return sorted(got);
  };
  CHECK(only({"name=web"}) == std::vector<std::string>{web});
  CHECK(only({"label=tier"}) == sorted({web, db}));
  CHECK(only({"label=tier=back"}) == std::vector<std::string>{db});
  CHECK(only({"label=tier", "label=team=a"}) == std::vector<std::string>{web});
  CHECK(only({"session=default"}) == sorted({web, db, plain}));
  CHECK(only({"name=nobody"}).empty());
  // --format: docker's templates; `table` aligns and prints a header.
  auto r0 = d.dsec({"ps", "--format", "{{.ID}} {{ .Name }} {{.Label \"tier\"}}"});
  REQUIRE_MESSAGE(r0.status == 0, r0.describe());
  CHECK(lines_of(r0.out) == std::vector<std::string>{web + " web front", db + " db back",
                                                     plain + "  "});
  r0 = d.dsec({"ps", "--format", "table {{.Name}}\\t{{.Label \"team\"}}\\t{{.State}}"});
  REQUIRE_MESSAGE(r0.status == 0, r0.describe());
  CHECK(lines_of(r0.out) == std::vector<std::string>{"NAME  TEAM  STATE", "web   a     running",
                                                     "db    -     running", "-     -     running"});
  r0 = d.dsec({"ps", "--format", "{{.Labels}}", "--filter", "name=web"});
  CHECK(r0.out == "team=a,tier=front\n");
  // A session's list has dsec's own keys ("#N") for creates without a name:
  // shown as none there too.
  r0 = d.dsec({"ps", "--session", "default", "--format", "{{.ID}}={{.Name}}"});
  CHECK_MESSAGE(contains(r0.out, plain + "=\n"), r0.describe());
  CHECK_MESSAGE(contains(r0.out, web + "=web\n"), r0.describe());
  for (std::string f : {"{{.Colour}}", "{{.ID", "{{.Label tier}}"}) {
    r0 = d.dsec({"ps", "--format", f});
    CHECK_MESSAGE(r0.status == 2, r0.describe());
    CHECK_MESSAGE(contains(r0.err, "--format"), r0.describe());
  }
  r0 = d.dsec({"ps", "--format", "{{.Colour}}"});
  CHECK_MESSAGE(contains(r0.err, "{{.Colour}}"), r0.describe());
  auto bad = d.dsec({"ps", "--filter", "colour=red"});
  CHECK_MESSAGE(bad.status == 2, bad.describe());
  CHECK_MESSAGE(contains(bad.err, "colour=red"), bad.describe());
  // The name wherever an id goes: exec, cp, inspect, pause/resume, rm.
  auto r = d.dsec({"exec", "web", "--", "sh", "-c", "echo hi > /tmp/f"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  // A command line of 1 MB (over the 128 KiB a message to init holds) goes
  // whole through the daemon (issue 23).
  std::vector<std::string> long_cmd{"exec", "web", "--", "sh", "-c", "echo $#", "sh"};
  long_cmd.resize(long_cmd.size() + 10'000, std::string(99, 'l'));
  r = d.dsec(long_cmd);
  CHECK_MESSAGE(r.status == 0, r.status << " " << r.err);
  CHECK(r.out == "10000\n");
  auto local = suite::get().scratch();
  r = d.dsec({"cp", "web:/tmp/f", local.path()});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(read_file(local / "f") == "hi\n");
  r = d.dsec({"inspect", "db"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(contains(r.out, "\"id\": \"" + db + "\""), r.describe());
  r = d.dsec({"pause", "db"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "paused " + db + "\n");
  r = d.dsec({"resume", "db"});
  CHECK(r.out == "resumed " + db + "\n");
  // And in snapshot, fork and expose: each prints or acts on the id the name has.
  r = d.dsec({"snapshot", "web", "--as", "named-snap@1"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(contains(r.out, "named-snap@1 "), r.describe());
  r = d.dsec({"fork", "web"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  REQUIRE(lines_of(r.out).size() == 1);
  auto forked = lines_of(r.out)[0];
  r = d.dsec({"exec", forked, "--", "cat", "/tmp/f"});
  CHECK_MESSAGE(r.out == "hi\n", r.describe());
  auto srv = d.detached({"--name", "srv", "--net"});
  r = d.dsec({"expose", "srv", "8080"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(r.out.rfind(srv + " 8080 ", 0) == 0, r.describe());
  r = d.dsec({"feedback", "nobody", "1", "--reward", "1"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "no sandbox nobody"), r.describe());
  r = d.dsec({"rm", forked, "srv"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  // A name is unique in its session; one with an id's form is refused.
  r = d.run({"--detach", "--name", "web"}, {"true"});
  CHECK_MESSAGE(r.status != 0, r.describe());
  CHECK_MESSAGE(contains(r.err, "web"), r.describe());
  r = d.run({"--detach", "--name", "0123456789ab"}, {"true"});
  CHECK_MESSAGE(r.status == 2, r.describe());
  r = d.dsec({"exec", "nobody", "--", "true"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "no sandbox nobody"), r.describe());
  r = d.dsec({"rm", "web", "db", plain});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "removed " + web + "\nremoved " + db + "\nremoved " + plain + "\n");
  CHECK(ps(d).empty());
  check_serving(d);
  d.finish();
}

TEST_CASE("remote exec -u NAME: looked up in the sandbox's image; unknown names give 126") {
  daemon_proc d;
  auto box = d.detached();
  auto r = d.dsec({"exec", "-u", "user", box, "--", "sh", "-c", "id -u; id -G; echo $HOME $USER"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "1000\n1000 2000\n/home/user user\n");
  // A number of the image's passwd is that user too (docker's -u).
  r = d.dsec({"exec", "-u", "1000", box, "--", "sh", "-c", "id -G; echo $HOME $USER"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "1000 2000\n/home/user user\n");
  // What the agent writes is not where names come from.
  r = d.dsec({"exec", box, "--", "sh", "-c", "echo 'fake:x:0:0::/:/bin/sh' >> /etc/passwd"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  r = d.dsec({"exec", "-u", "fake", box, "--", "id", "-u"});
  CHECK_MESSAGE(r.status == 126, r.describe());
  CHECK_MESSAGE(contains(r.err, "no user 'fake'"), r.describe());
  r = d.run({"-u", "user:dev"}, {"sh", "-c", "id -u; id -g"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "1000\n2000\n");
  r = d.dsec({"rm", box});
  CHECK_MESSAGE(r.status == 0, r.describe());
  check_serving(d);
  d.finish();
}

// ---- host mounts (issue 23) -------------------------------------------------------

namespace {

// A tmpfs mounted nosuid at `dir` for as long as it lives (a writable host
// mount's directory must be on a nosuid mount).
struct nosuid_tmpfs {
  explicit nosuid_tmpfs(std::string d) : dir(std::move(d)) {
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    REQUIRE_MESSAGE(::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=4m") == 0,
                    std::strerror(errno));
  }
  ~nosuid_tmpfs() { CHECK(::umount2(dir.c_str(), MNT_DETACH) == 0); }
  std::string dir;
};

} // namespace

TEST_CASE("remote run -v: only beneath the node's --allow-host-mount, read-only unless DIR:rw") {
  temp_dir t{"/tmp", "dsec-host-mounts"};
  auto ro = t.path() + "/ro";
  REQUIRE(::mkdir(ro.c_str(), 0755) == 0);
  std::ofstream{ro + "/f"} << "from the host\n";
  REQUIRE(::chown((ro + "/f").c_str(), 1000, 1000) == 0);
  REQUIRE(::mkdir((t.path() + "/secret").c_str(), 0700) == 0);
  std::ofstream{t.path() + "/secret/key"} << "do not read\n";
  REQUIRE(::symlink((t.path() + "/secret").c_str(), (ro + "/escape").c_str()) == 0);
  nosuid_tmpfs rw{t.path() + "/rw"};

  SUBCASE("a node without --allow-host-mount refuses every one") {
    daemon_proc d;
    auto r = d.run({"-v", ro + ":/data"}, {"cat", "/data/f"});
    CHECK_MESSAGE(r.status == 125, r.describe());
    CHECK_MESSAGE(contains(r.err, "lets no sandbox mount host paths"), r.describe());
    check_serving(d);
    d.finish();
  }
  SUBCASE("allowed directories: read, owners kept, writes only where :rw is allowed") {
    daemon_proc d{{"--allow-host-mount", ro, "--allow-host-mount", rw.dir + ":rw"}};
    // Read-only by default; the owner is the host's (an idmapped mount).
    auto r = d.run({"-v", ro + ":/data"},
                   {"sh", "-c", "cat /data/f; stat -c %u /data/f; echo x > /data/g"});
    CHECK_MESSAGE(r.status != 0, r.describe());
    CHECK(r.out == "from the host\n1000\n");
    CHECK_MESSAGE(contains(r.err, "Read-only file system"), r.describe());
    CHECK(::access((ro + "/g").c_str(), F_OK) != 0);
    // A file, at a target whose directories are made.
    r = d.run({"-v", ro + "/f:/a/b/f.txt"}, {"cat", "/a/b/f.txt"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "from the host\n");
    // Writable where the node says :rw: what the sandbox's root writes is the
    // host's root's, and there is no set-user-ID program to be had.
    r = d.run({"-v", rw.dir + ":/out:rw"},
              {"sh", "-c", "echo made > /out/new && cp /bin/busybox /out/s && chmod 4755 /out/s"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    std::ifstream in{rw.dir + "/new"};
    std::string line;
    std::getline(in, line);
    CHECK(line == "made");
    struct stat st{};
    REQUIRE(::stat((rw.dir + "/new").c_str(), &st) == 0);
    CHECK(st.st_uid == 0);
    struct statvfs vfs{};
    REQUIRE(::statvfs(rw.dir.c_str(), &vfs) == 0);
    CHECK((vfs.f_flag & ST_NOSUID) != 0);

    // Refused, each naming the mount; nothing was made on the host.
    struct refused {
      std::vector<std::string> opts;
      const char* says;
    };
    for (const auto& c : {
           refused{{"-v", ro + ":/data:rw"}, "read-only only"},
           refused{{"-v", t.path() + "/secret:/data"}, "outside the directories"},
           refused{{"-v", ro + "/escape:/data"}, "through a symlink"},
           refused{{"-v", ro + "/none:/data"}, "does not exist"},
         }) {
      r = d.run(c.opts, {"true"});
      CHECK_MESSAGE(r.status == 125, r.describe());
      CHECK_MESSAGE(contains(r.err, c.says), r.describe());
      CHECK_MESSAGE(contains(r.err, c.opts[1].substr(0, c.opts[1].find(':'))), r.describe());
    }
    // Checked before anything is sent: a usage error.
    for (const auto& bad : {std::string{"data:/x"}, ro + ":/proc/x", ro + ":/", ro + ":/x:rx"}) {
      r = d.run({"-v", bad}, {"true"});
      CHECK_MESSAGE(r.status == 2, r.describe());
      CHECK_MESSAGE(contains(r.err, "-v"), r.describe());
    }
    // inspect lists them.
    auto box = d.detached({"-v", ro + ":/data"});
    r = d.dsec({"inspect", box});
    CHECK_MESSAGE(contains(r.out, "\"mounts\": [{\"host\": \"" + ro
                                    + "\", \"target\": \"/data\", \"read_only\": true, "
                                      "\"recursive\": false, \"idmap\": true}]"),
                  r.out);
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
    check_serving(d);
    d.finish();
  }
  SUBCASE("rbind carries the mounts beneath HOST; noidmap mounts a filesystem that cannot be "
          "idmapped") {
    auto nest = t.path() + "/nest";
    REQUIRE(::mkdir(nest.c_str(), 0755) == 0);
    nosuid_tmpfs inner{nest + "/inner"};
    std::ofstream{inner.dir + "/file"} << "beneath\n";
    REQUIRE(::chown((inner.dir + "/file").c_str(), 1000, 1000) == 0);
    auto ram = t.path() + "/ram"; // ramfs cannot be idmapped
    REQUIRE(::mkdir(ram.c_str(), 0755) == 0);
    REQUIRE(::mount("ramfs", ram.c_str(), "ramfs", MS_NOSUID | MS_NODEV, nullptr) == 0);
    struct unmount {
      std::string dir;
      ~unmount() { CHECK(::umount2(dir.c_str(), MNT_DETACH) == 0); }
    } ram_mount{ram};
    std::ofstream{ram + "/file"} << "in ramfs\n";
    daemon_proc d{{"--allow-host-mount", nest, "--allow-host-mount", ram}};
    // Without rbind the submount stays behind: an empty directory.
    auto r = d.run({"-v", nest + ":/n"}, {"ls", "-A", "/n/inner"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out.empty());
    // With it, the submount too, read-only and idmapped like the rest.
    r = d.run({"-v", nest + ":/n:rbind"},
              {"sh", "-c", "cat /n/inner/file; stat -c %u /n/inner/file; echo x > /n/inner/y"});
    CHECK_MESSAGE(r.status != 0, r.describe());
    CHECK(r.out == "beneath\n1000\n");
    CHECK_MESSAGE(contains(r.err, "Read-only file system"), r.describe());
    CHECK(::access((inner.dir + "/y").c_str(), F_OK) != 0);
    // ramfs: refused, pointing at noidmap; with it, owners show as nobody.
    r = d.run({"-v", ram + ":/r"}, {"true"});
    CHECK_MESSAGE(r.status == 125, r.describe());
    CHECK_MESSAGE(contains(r.err, "cannot be idmapped"), r.describe());
    CHECK_MESSAGE(contains(r.err, ",noidmap"), r.describe());
    r = d.run({"-v", ram + ":/r:noidmap"},
              {"sh", "-c", "cat /r/file; stat -c %u /r/file; echo x > /r/y"});
    CHECK_MESSAGE(r.status != 0, r.describe());
    CHECK(r.out == "in ramfs\n65534\n");
    CHECK_MESSAGE(contains(r.err, "Read-only file system"), r.describe());
    CHECK(::access((ram + "/y").c_str(), F_OK) != 0);
    // inspect shows the options.
    auto box = d.detached({"-v", nest + ":/n:rbind", "-v", ram + ":/r:noidmap"});
    r = d.dsec({"inspect", box});
    CHECK_MESSAGE(contains(r.out, "\"target\": \"/n\", \"read_only\": true, \"recursive\": "
                                  "true, \"idmap\": true}"),
                  r.out);
    CHECK_MESSAGE(contains(r.out, "\"target\": \"/r\", \"read_only\": true, \"recursive\": "
                                  "false, \"idmap\": false}"),
                  r.out);
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
    check_serving(d);
    d.finish();
  }
  SUBCASE("dsecd refuses a writable directory that is not on a nosuid mount") {
    struct statvfs vfs{};
    REQUIRE(::statvfs(ro.c_str(), &vfs) == 0);
    if (vfs.f_flag & ST_NOSUID) {
      MESSAGE("/tmp is a nosuid mount here: nothing to refuse");
      return;
    }
    auto r = run_process(dsecd_argv({"--allow-host-mount", ro + ":rw"}));
    CHECK_MESSAGE(r.status != 0, r.describe());
    CHECK_MESSAGE(contains(r.err, "nosuid"), r.describe());
  }
}

// ---- detached commands' output and ends (issue 23) ------------------------------

namespace {

// The id the first line of `r.out` is (run --detach prints it).
std::string first_line(const proc_result& r) {
  auto l = lines_of(r.out);
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  REQUIRE_MESSAGE(l.size() == 1, r.describe());
  return l[0];
}

// The exec id `inspect` gives the detached command whose command line is `cmd`.
std::string exec_id_of(const daemon_proc& d, const std::string& box, const std::string& cmd) {
  auto r = d.dsec({"inspect", box});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto at = r.out.find("\"command\": \"" + cmd + "\"");
  REQUIRE_MESSAGE(at != std::string::npos, r.out);
  auto e = r.out.rfind("\"exec\": ", at);
  REQUIRE(e != std::string::npos);
  e += 8;
  return r.out.substr(e, r.out.find(',', e) - e);
}

} // namespace

TEST_CASE("remote logs, wait, kill: a detached command's output is kept, bounded, after it ends") {
  daemon_proc d;
  SUBCASE("logs after the end, --tail, wait's code, and --exec for an exec --detach") {
    auto box = first_line(d.run({"--detach", "--name", "lg"},
                                {"sh", "-c", "echo a; echo b; echo err1 >&2; echo c; exit 3"}));
    auto r = d.dsec({"wait", "lg"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "3\n");
    r = d.dsec({"logs", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "a\nb\nc\n");
    CHECK(r.err == "err1\n");
    r = d.dsec({"logs", "--tail", "2", "lg"});
    CHECK(lines_of(r.out + r.err).size() == 2);
    CHECK(contains(r.out, "c\n"));
    CHECK_FALSE(contains(r.out, "a\n"));
    r = d.dsec({"logs", "--tail", "0", "lg"});
    CHECK(r.out.empty());
    // A second detached command: its own exec id, which --exec picks.
    r = d.dsec({"exec", "--detach", box, "--", "sh", "-c", "echo second; exit 4"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    auto second = exec_id_of(d, box, "sh -c echo second; exit 4");
    CHECK(r.out == second + "\n"); // the id it printed
    r = d.dsec({"wait", "--exec", second, box});
    CHECK(r.out == "4\n");
    r = d.dsec({"logs", "--exec", second, box});
    CHECK(r.out == "second\n");
    r = d.dsec({"logs", box});
    CHECK(r.out == "a\nb\nc\nsecond\n");
    r = d.dsec({"inspect", box});
    CHECK_MESSAGE(contains(r.out, "\"exit_code\": 3"), r.out);
    CHECK_MESSAGE(contains(r.out, "\"running\": false"), r.out);
    // The command outlives the dsec that started it (it is not its listener).
    r = d.dsec({"exec", "--detach", box, "--", "sh", "-c", "sleep 1; echo late"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    auto late = r.out.substr(0, r.out.find('\n'));
    CHECK(late == exec_id_of(d, box, "sh -c sleep 1; echo late"));
    r = d.dsec({"wait", "--exec", late, box});
    CHECK_MESSAGE(r.out == "0\n", r.describe());
    r = d.dsec({"logs", "--exec", late, box});
    CHECK(r.out == "late\n");
    // Unknown commands and signals; kill with nothing running.
    r = d.dsec({"logs", "--exec", "999", box});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, "no detached command 999"), r.describe());
    r = d.dsec({"kill", box});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, "runs no detached command"), r.describe());
    r = d.dsec({"kill", "-s", "NOPE", box});
    CHECK_MESSAGE(r.status == 2, r.describe());
    CHECK_MESSAGE(contains(r.err, "NOPE"), r.describe());
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
    r = d.dsec({"logs", box});
    CHECK_MESSAGE(r.status == 1, r.describe());
  }
  SUBCASE("-f follows until the command ends, and a background child's output too") {
    auto box = first_line(d.run({"--detach"}, {"sh", "-c",
      "echo one; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two; "
      "(while [ ! -e /tmp/go2 ]; do sleep 0.05; done; echo late) & exit 0"}));
    background follow(d.argv({"logs", "-f", box}));
    REQUIRE_MESSAGE(follow.wait_for_output("one\n"), follow.out() << follow.err());
    auto r = d.dsec({"exec", box, "--", "touch", "/tmp/go"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    REQUIRE_MESSAGE(follow.wait_for_output("two\n"), follow.out() << follow.err());
    // The command ended, but its background child holds its stdout: -f goes on.
    r = d.dsec({"wait", box});
    CHECK(r.out == "0\n");
    r = d.dsec({"exec", box, "--", "touch", "/tmp/go2"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    auto end = follow.wait();
    CHECK_MESSAGE(end.status == 0, end.describe());
    CHECK(end.out == "one\ntwo\nlate\n");
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
  }
  SUBCASE("kill signals the running detached command; -f and wait end with the sandbox") {
    auto box = d.detached();
    background follow(d.argv({"logs", "-f", box}));
    auto r = d.dsec({"kill", "-s", "TERM", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == box + ": signalled 1 command with SIGTERM\n");
    r = d.dsec({"wait", box});
    CHECK(r.out == "143\n");
    auto end = follow.wait();
    CHECK_MESSAGE(end.status == 0, end.describe());
    // A second one, ended by rm while `wait` and `logs -f` wait.
    auto other = d.detached();
    background waiting(d.argv({"wait", other}));
    background following(d.argv({"logs", "-f", other}));
    // Whether they were waiting already or connect after it went, both end,
    // neither hangs: `wait` with an error naming the sandbox (it ended while
    // the command ran, or is unknown), `logs -f` with 0 (or the unknown id).
    r = d.dsec({"rm", other});
    CHECK_MESSAGE(r.status == 0, r.describe());
    auto w = waiting.wait();
    CHECK_MESSAGE(w.status == 1, w.describe());
    CHECK_MESSAGE(contains(w.err, other), w.describe());
    auto f = following.wait();
    CHECK_MESSAGE((f.status == 0 || contains(f.err, other)), f.describe());
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
  }
  SUBCASE("the log keeps the latest 1 MiB and says what it dropped") {
    auto box = first_line(d.run({"--detach"}, {"sh", "-c",
      "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo end"}));
    auto r = d.dsec({"wait", box});
    CHECK(r.out == "0\n");
    r = d.dsec({"logs", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out.size() <= (1u << 20));
    CHECK(r.out.size() > (1u << 19));
    CHECK(r.out.substr(r.out.size() - 5) == "\nend\n");
    CHECK_MESSAGE(contains(r.err, "bytes are gone"), r.err);
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
  }
  CHECK(ps(d).empty());
  check_serving(d);
  d.finish();
}

TEST_CASE("remote attach: a detached command's output from now on, its status, our signals") {
  daemon_proc d;
  SUBCASE("--logs, then what it writes, and its exit status") {
    auto box = first_line(d.run({"--detach"}, {"sh", "-c",
      "echo one; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two >&2; echo three; exit 5"}));
    background at(d.argv({"attach", "--logs", box}));
    REQUIRE_MESSAGE(at.wait_for_output("one\n"), at.out() << at.err());
    auto r = d.dsec({"exec", box, "--", "touch", "/tmp/go"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    auto end = at.wait();
    CHECK_MESSAGE(end.status == 5, end.describe());
    CHECK(end.out == "one\nthree\n");
    CHECK(end.err == "two\n");
    // Ended already: its status at once; without --logs nothing is printed.
    r = d.dsec({"attach", box});
    CHECK_MESSAGE(r.status == 5, r.describe());
    CHECK(r.out.empty());
    r = d.dsec({"attach", "--exec", "999", box});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, "no detached command 999"), r.describe());
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
  }
  SUBCASE("our SIGINT reaches the command, which decides what to do with it") {
    auto box = first_line(d.run({"--detach"}, {"sh", "-c",
      "trap 'echo got INT; exit 7' INT; echo ready; while :; do sleep 0.05; done"}));
    background at(d.argv({"attach", "--logs", box}));
    REQUIRE_MESSAGE(at.wait_for_output("ready\n"), at.out() << at.err());
    at.kill(SIGINT);
    auto end = at.wait();
    CHECK_MESSAGE(end.status == 7, end.describe());
    CHECK(end.out == "ready\ngot INT\n");
    auto r = d.dsec({"wait", box});
    CHECK(r.out == "7\n");
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
  }
  SUBCASE("--no-sig-proxy: a signal detaches dsec, the command runs on") {
    auto box = first_line(d.run({"--detach"}, {"sh", "-c",
      "echo ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 3"}));
    background at(d.argv({"attach", "--logs", "--no-sig-proxy", box}));
    REQUIRE_MESSAGE(at.wait_for_output("ready\n"), at.out() << at.err());
    at.kill(SIGINT);
    auto end = at.wait();
    CHECK_MESSAGE(end.status == 130, end.describe());
    CHECK_MESSAGE(contains(end.err, "detached from command"), end.describe());
    auto r = d.dsec({"inspect", box});
    CHECK_MESSAGE(contains(r.out, "\"running\": true"), r.out);
    r = d.dsec({"exec", box, "--", "touch", "/tmp/go"});
    CHECK(r.status == 0);
    r = d.dsec({"attach", box});
    CHECK_MESSAGE(r.status == 3, r.describe());
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
  }
  SUBCASE("a sandbox without detached commands; usage errors") {
    auto box = first_line(d.run({"--detach"}, {"true"}));
    // run --detach's CMD is a detached command; exec'd commands are not
    auto r = d.dsec({"attach", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
    r = d.dsec({"attach"});
    CHECK(r.status == 2);
    r = d.dsec({"attach", "--bogus", box});
    CHECK(r.status == 2);
    r = d.dsec({"rm", box});
    CHECK_MESSAGE(r.status == 0, r.describe());
    r = d.dsec({"attach", box});
    CHECK_MESSAGE(r.status == 1, r.describe());
  }
  CHECK(ps(d).empty());
  check_serving(d);
  d.finish();
}

// ---- stats and top (issue 23) ---------------------------------------------------

TEST_CASE("remote stats and top: what a sandbox uses and its processes, read from the host") {
  daemon_proc d;
  // A busy loop (CPU time), 4 MiB and three files in the writable layer, a
  // background sleep and the shell exec'd into another: then /ready.
  auto box = first_line(d.run(
    {"--detach", "--name", "st", "--memory", "64m", "--pids", "50", "--disk", "16m"},
    {"sh", "-c",
     "i=0; while [ $i -lt 40000 ]; do i=$((i+1)); done; "
     "dd if=/dev/zero of=/big bs=1M count=4 2>/dev/null; touch /f1 /f2 /f3; "
     "sleep 1000 & touch /ready; exec sleep 1001"}));
  bool ready = false;
  for (int k = 0; k < 200 && !ready; ++k) {
    ready = d.dsec({"exec", box, "--", "test", "-e", "/ready"}).status == 0;
    if (!ready)
      ::usleep(50000);
  }
  REQUIRE(ready);

  auto r = d.dsec({"stats", "--json", "st"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto lines = lines_of(r.out);
  REQUIRE_MESSAGE(lines.size() == 1, r.describe());
  auto j = nlohmann::json::parse(lines[0]);
  CHECK(j["id"] == box);
  CHECK(j["memory_limit"].get<uint64_t>() == 64ull << 20);
  // the 4 MiB file is memory (tmpfs pages are charged to the writer's cgroup)
  CHECK_MESSAGE(j["memory_bytes"].get<uint64_t>() >= 4ull << 20, lines[0]);
  CHECK(j["tasks_limit"].get<uint64_t>() == 50);
  CHECK_MESSAGE(j["tasks"].get<uint64_t>() >= 3, lines[0]); // init, two sleeps
  CHECK_MESSAGE(j["processes"].get<uint64_t>() >= 3, lines[0]);
  CHECK_MESSAGE(j["cpu_ms"].get<uint64_t>() > 0, lines[0]);
  CHECK_MESSAGE(j["disk_bytes"].get<uint64_t>() >= 4ull << 20, lines[0]);
  CHECK_MESSAGE(j["disk_limit"].get<uint64_t>() == 16ull << 20, lines[0]);
  CHECK_MESSAGE(j["inodes"].get<uint64_t>() >= 5, lines[0]); // /big, /f1-3, /ready
  CHECK(j["inodes_limit"].get<uint64_t>() > j["inodes"].get<uint64_t>());
  CHECK_FALSE(j.contains("sent_bytes")); // no egress
  auto before = j["disk_bytes"].get<uint64_t>();
  // what the sandbox writes shows in the next sample
  REQUIRE(d.dsec({"exec", box, "--", "sh", "-c", "dd if=/dev/zero of=/big2 bs=1M count=3"})
            .status == 0);
  r = d.dsec({"stats", "--json", box});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(nlohmann::json::parse(lines_of(r.out).at(0))["disk_bytes"].get<uint64_t>() >=
        before + (3ull << 20));

  // The table, and --interval with a CPU share from the second sample on.
  r = d.dsec({"stats", box});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(contains(r.out, "MEMORY"), r.out);
  CHECK_MESSAGE((contains(r.out, " / 64.0 MiB") || contains(r.out, " / 64 MiB")), r.out);
  r = d.dsec({"stats", "--json", "--interval", "100ms", "--count", "2", box});
  CHECK_MESSAGE(r.status == 0, r.describe());
  lines = lines_of(r.out);
  REQUIRE(lines.size() == 2);
  CHECK_FALSE(nlohmann::json::parse(lines[0]).contains("cpu_percent"));
  CHECK(nlohmann::json::parse(lines[1]).contains("cpu_percent"));

  // top: the sandbox's pids and uids; sleep 1000's parent is the shell that
  // became sleep 1001; init is pid 1 with a parent outside (0).
  r = d.dsec({"top", "--json", "st"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto procs = nlohmann::json::parse(r.out);
  std::map<std::string, nlohmann::json> by_cmd;
  bool init_seen = false;
  for (auto& p : procs) {
    by_cmd[p["command"].get<std::string>()] = p;
    if (p["pid"] == 1) {
      init_seen = true;
      CHECK(p["ppid"] == 0);
    }
    CHECK(p["uid"] == 0); // root inside, whatever uid it maps to outside
  }
  CHECK_MESSAGE(init_seen, r.out);
  REQUIRE_MESSAGE(by_cmd.count("sleep 1000"), r.out);
  REQUIRE_MESSAGE(by_cmd.count("sleep 1001"), r.out);
  CHECK(by_cmd["sleep 1000"]["ppid"] == by_cmd["sleep 1001"]["pid"]);
  CHECK(by_cmd["sleep 1001"]["state"] == "S");
  CHECK(by_cmd["sleep 1001"]["pid"].get<int>() < 1000); // the sandbox's pid, not the host's
  CHECK(by_cmd["sleep 1001"]["cpu_ms"].get<uint64_t>() > 0); // the loop ran in that shell
  r = d.dsec({"top", box});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(contains(r.out, "COMMAND"), r.out);
  CHECK_MESSAGE(contains(r.out, "sleep 1000"), r.out);

  // Errors: an unknown sandbox (the others still shown), usage errors.
  r = d.dsec({"stats", "--json", "nosuch", box});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "nosuch"), r.describe());
  CHECK(lines_of(r.out).size() == 1);
  r = d.dsec({"top", "nosuch"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "nosuch"), r.describe());
  r = d.dsec({"stats", "--count", "2", box});
  CHECK_MESSAGE(r.status == 2, r.describe());
  CHECK_MESSAGE(contains(r.err, "--count needs --interval"), r.describe());
  r = d.dsec({"stats", "--interval", "1ms", box});
  CHECK(r.status == 2);
  r = d.dsec({"stats"});
  CHECK(r.status == 2);
  r = d.dsec({"top", box, box});
  CHECK(r.status == 2);
  r = d.dsec({"rm", box});
  CHECK_MESSAGE(r.status == 0, r.describe());
  r = d.dsec({"stats", box});
  CHECK(r.status == 1);
  check_serving(d);
  d.finish();
}

TEST_CASE("remote run --detach --ttl: the sandbox goes by itself") {
  daemon_proc d;
  auto keep = d.detached(); // the control: the default TTL (1h) keeps it
  auto brief = d.detached({"--ttl", "1s"});
  CHECK(eventually([&] { return ids(ps(d)) == std::vector<std::string>{keep}; }));
  CHECK(ids(ps(d)) == std::vector<std::string>{keep});
  auto r = d.dsec({"exec", brief, "--", "true"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, brief), r.describe());
  r = d.dsec({"rm", keep});
  CHECK_MESSAGE(r.status == 0, r.describe());
  check_serving(d);
  d.finish();
}

TEST_CASE("remote sessions: open, run in them, close") {
  daemon_proc d;
  auto in_default = d.detached();
  auto r = d.dsec({"session", "open", "--name", "cli-test", "--ttl", "10m", "--quota", "4"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  REQUIRE(lines_of(r.out).size() == 1);
  auto sid = lines_of(r.out)[0];
  CHECK(!sid.empty());
  CHECK(sid != "default");

  auto a = d.detached({"--session", sid});
  auto b = d.detached({"--session", sid});
  auto rows = ps(d, sid);
  CHECK(ids(rows) == sorted({a, b}));
  for (const auto& row : rows) {
    CHECK(row.session == sid);
    CHECK(row.ttl != "-");
  }
  CHECK(ids(ps(d)) == sorted({a, b, in_default}));
  CHECK(ids(ps(d, "default")) == std::vector<std::string>{in_default});
  // Its name stands for its id; a second session cannot take the name.
  CHECK(ids(ps(d, "cli-test")) == sorted({a, b}));
  r = d.dsec({"session", "open", "--name", "cli-test"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "a session named cli-test is open (" + sid + ")"), r.describe());
  // A foreground run in the session: its sandbox goes, the session stays.
  r = d.dsec({"run", "--session", sid, "--base", tar_base, "--", "echo", "in session"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "in session\n");
  CHECK(ids(ps(d, sid)) == sorted({a, b}));
  // session list: the default session (its one sandbox) and this one.
  r = d.dsec({"session", "list"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  {
    auto rows = lines_of(r.out);
    REQUIRE_MESSAGE(rows.size() == 3, r.describe());
    CHECK(contains(rows[0], "ID"));
    CHECK(contains(rows[0], "SANDBOXES"));
    std::string mine = rows[1].starts_with("default") ? rows[2] : rows[1];
    std::string dflt = rows[1].starts_with("default") ? rows[1] : rows[2];
    auto words = [](const std::string& l) {
      std::vector<std::string> w;
      std::istringstream in{l};
      for (std::string x; in >> x;)
        w.push_back(x);
      return w;
    };
    CHECK(words(mine) == std::vector<std::string>{sid, "cli-test", "live", "2", "4", "no", "-"});
    CHECK(words(dflt) == std::vector<std::string>{"default", "default", "live", "1", "1048576",
                                                  "no", "-"});
  }
  r = d.dsec({"session", "list", "--json"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(contains(r.out, "{\"id\":\"" + sid + "\",\"name\":\"cli-test\",\"state\":\"live\","
                                  "\"sandboxes\":2,\"quota\":4,\"owned\":false,"
                                  "\"trajectory\":false,\"log_ms\":0}"),
                r.describe());
  r = d.dsec({"session", "list", "extra"});
  CHECK_MESSAGE(r.status == 2, r.describe());
  CHECK_MESSAGE(contains(r.err, "extra"), r.describe());

  r = d.dsec({"session", "close", sid});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "closed session " + sid + ": 2 sandboxes destroyed\n");
  CHECK(ids(ps(d)) == std::vector<std::string>{in_default});
  r = d.dsec({"ps", "--session", "cli-test"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "no session cli-test"), r.describe());
  r = d.dsec({"session", "close", sid});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, sid), r.describe());
  r = d.dsec({"ps", "--session", sid});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, sid), r.describe());
  r = d.dsec({"run", "--detach", "--session", sid, "--base", tar_base, "--", "true"});
  CHECK_MESSAGE(r.status == 125, r.describe());
  CHECK_MESSAGE(contains(r.err, sid), r.describe());
  r = d.dsec({"session", "close", "s-no-such"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "s-no-such"), r.describe());
  r = d.dsec({"session", "close", "default"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "default session cannot be closed"), r.describe());
  CHECK(ids(ps(d)) == std::vector<std::string>{in_default});

  // An empty session closes with 0 and one sandbox says so in the singular.
  r = d.dsec({"session", "open"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto empty = lines_of(r.out).at(0);
  r = d.dsec({"session", "close", empty});
  CHECK(r.out == "closed session " + empty + ": 0 sandboxes destroyed\n");
  r = d.dsec({"session", "open"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto one = lines_of(r.out).at(0);
  (void) d.detached({"--session", one});
  r = d.dsec({"session", "close", one});
  CHECK(r.out == "closed session " + one + ": 1 sandbox destroyed\n");

  r = d.dsec({"rm", in_default});
  CHECK_MESSAGE(r.status == 0, r.describe());
  check_serving(d);
  d.finish();
}

TEST_CASE("remote session resume: a restarted dsecd answers from the trajectory log") {
  std::string sid, box, orphan;
  const std::vector<std::string> counted{"sh", "-c", "echo x >> /runs; wc -l < /runs"};
  auto exec = [&](daemon_proc& d, const std::vector<std::string>& argv) {
    std::vector<std::string> args{"exec", box, "--"};
    args.insert(args.end(), argv.begin(), argv.end());
    auto r = d.dsec(args);
    CHECK_MESSAGE(r.status == 0, r.describe());
    return r.out;
  };
  {
    daemon_proc d;
    auto r = d.dsec({"session", "open", "--trajectory"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    sid = lines_of(r.out).at(0);
    // A detached command in a logged session must say it is idempotent.
    r = d.dsec({"run", "--detach", "--session", sid, "--base", tar_base, "--", "sleep", "1000"});
    CHECK_MESSAGE(r.status == 125, r.describe());
    CHECK_MESSAGE(contains(r.err, "--idempotent"), r.describe());
    box = d.detached({"--session", sid, "--idempotent"});
    CHECK(exec(d, counted) == "1\n");
    CHECK(exec(d, counted) == "2\n");
    r = d.dsec({"session", "open", "--trajectory"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    orphan = lines_of(r.out).at(0);
    (void) d.detached({"--session", orphan, "--idempotent"});
    // SIGTERM: the daemon destroys its sandboxes but keeps the log.
    auto end = d.stop();
    CHECK_MESSAGE(end.status == 0, end.describe());
    CHECK_MESSAGE(contains(end.out, "dsecd: 2 sandboxes"), end.describe());
  }
  daemon_proc d;
  // Both logs are resumable after the restart, and only they are.
  auto listed = d.dsec({"session", "list", "--json"});
  CHECK_MESSAGE(listed.status == 0, listed.describe());
  for (const auto& id : {sid, orphan})
    CHECK_MESSAGE(contains(listed.out, "{\"id\":\"" + id + "\",\"name\":\"\",\"state\":"
                                         "\"resumable\",\"sandboxes\":0,\"quota\":0,"
                                         "\"owned\":false,\"trajectory\":true,\"log_ms\":"),
                  listed.describe());
  CHECK(lines_of(listed.out).size() == 5); // [, default, sid, orphan, ]
  auto r = d.dsec({"session", "resume", sid});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(lines_of(r.out).at(0) == "resumed session " + sid + ": 1 sandbox");
  listed = d.dsec({"session", "list", "--json"});
  CHECK_MESSAGE(contains(listed.out, "{\"id\":\"" + sid + "\",\"name\":\"\",\"state\":"
                                       "\"live\",\"sandboxes\":1,"),
                listed.describe());
  CHECK_MESSAGE(contains(r.out, box + "  replaying  " + std::string{tar_base}), r.describe());
  r = d.dsec({"session", "resume", sid});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "session " + sid + " is live"), r.describe());
  // The same commands: their logged results, nothing runs.
  r = d.dsec({"exec", "--detach", "--idempotent", box, "--", "sleep", "1000"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out.empty());
  CHECK(exec(d, counted) == "1\n");
  CHECK(exec(d, counted) == "2\n");
  auto rows = ps(d, sid);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].id == box);
  CHECK(rows[0].state == "replaying");
  // A new one: the sandbox is rebuilt from its last pack, and its detached
  // idempotent command runs again.
  CHECK(exec(d, {"cat", "/runs"}) == "x\nx\n");
  CHECK(exec(d, {"sh", "-c", "cat /proc/[0-9]*/comm | grep -qx sleep && echo running"}) == "running\n");
  CHECK(exec(d, counted) == "3\n");
  r = d.dsec({"session", "close", sid});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "closed session " + sid + ": 1 sandbox destroyed\n");
  r = d.dsec({"session", "resume", sid});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "no trajectory log for session " + sid), r.describe());
  // A log nobody will resume: `session close` deletes it without a resume.
  r = d.dsec({"session", "close", orphan});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "closed session " + orphan
                   + ": 0 sandboxes destroyed, its trajectory log deleted\n");
  r = d.dsec({"session", "resume", orphan});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "no trajectory log for session " + orphan), r.describe());
  r = d.dsec({"session", "resume"});
  CHECK_MESSAGE(r.status == 2, r.describe());
  CHECK_MESSAGE(contains(r.err, "no session id given"), r.describe());
  d.finish();
}

TEST_CASE("remote node stats: the node's name and counts that follow its sandboxes") {
  daemon_proc d;
  auto s0 = stats(d);
  CHECK(s0["node"] == d.where); // the port it really listens on, not 0
  CHECK(count(s0, "live") == 0);
  CHECK(count(s0, "creating") == 0);
  CHECK(count(s0, "failed") == 0);
  CHECK(s0.count("layers mounted"));
  auto created = count(s0, "created");
  auto destroyed = count(s0, "destroyed");
  auto sessions = count(s0, "sessions");

  auto a = d.detached();
  auto b = d.detached();
  CHECK(stats_reach(d, {{"live", 2}, {"created", created + 2}, {"destroyed", destroyed}}));
  auto r = d.run({}, {"true"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(stats_reach(d, {{"live", 2}, {"created", created + 3}, {"destroyed", destroyed + 1}}));
  r = d.dsec({"session", "open"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto sid = lines_of(r.out).at(0);
  CHECK(stats_reach(d, {{"sessions", sessions + 1}}));
  r = d.dsec({"rm", a});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(stats_reach(d, {{"live", 1}, {"destroyed", destroyed + 2}}));
  // A sandbox that cannot be made (unknown layer) creates nothing.
  r = d.dsec({"run", "--base", "nosuch@1", "--", "true"});
  CHECK(r.status == 125);
  r = d.dsec({"session", "close", sid});
  CHECK_MESSAGE(r.status == 0, r.describe());
  r = d.dsec({"rm", b});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(stats_reach(d, {{"live", 0},
                        {"created", created + 3},
                        {"destroyed", destroyed + 3},
                        {"sessions", sessions}}));
  auto last = stats(d);
  CHECK(count(last, "live") == 0);
  CHECK(count(last, "created") == created + 3);
  CHECK(count(last, "destroyed") == destroyed + 3);
  CHECK(count(last, "sessions") == sessions);
  check_serving(d);
  d.finish();
}

TEST_CASE("remote default limits: a sandbox that asks for none gets the node's, which node stats "
          "shows") {
  // Small defaults, so that the attack is quick: the pids a fork bomb gets,
  // the files a sandbox can write.
  daemon_proc d({"--default-pids", "100", "--default-disk", "8m", "--default-memory", "512m"});
  CHECK_MESSAGE(contains(d.bg.out(), "sandbox defaults: memory 512 MiB, pids 100, disk 8 MiB"),
                d.bg.out());
  auto st = stats(d);
  CHECK(st["defaults"] == "memory 512 MiB, pids 100, disk 8 MiB (a sandbox that asks for none)");
  auto r = d.run({}, {"sh", "-c", "probe fork-max 1000; probe fill /tmp/x 4; probe fill /tmp/y 8"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  // init, sh and the probe count too.
  CHECK(r.out == "forked=97 stopped=EAGAIN\nok\nENOSPC\n");
  // What the sandbox asks for wins over the defaults.
  r = d.run({"--pids", "200", "--disk", "64m"},
            {"sh", "-c", "probe fork-max 150; probe fill /tmp/x 16"});
  CHECK_MESSAGE(r.out == "forked=150 stopped=none\nok\n", r.describe());
  // A daemon's sandbox cannot opt out.
  r = d.run({"--pids", "none"}, {"true"});
  CHECK(r.status == 2);
  CHECK_MESSAGE(contains(r.err, "--pids none is for a local `dsec run`"), r.describe());
  // The node's cgroups come from its pool after the first ones.
  st = stats(d);
  CHECK_MESSAGE(contains(st["cgroups"], " from the pool, "), st["cgroups"]);
  CHECK(count(st, "cgroups") >= 1);
  check_serving(d);
  d.finish();
}

TEST_CASE("remote errors: status, message, and the daemon serves on") {
  daemon_proc d;
  auto created = count(stats(d), "created");

  SUBCASE("layers: unknown, of the wrong kind, malformed") {
    struct bad_layer {
      std::vector<std::string> opts;
      std::string names;
    };
    for (const auto& c : std::vector<bad_layer>{
           {{"--base", "nosuch@1"}, "unknown layer nosuch@1"},
           {{"--base", tar_base, "--tool", "nosuch@2"}, "unknown layer nosuch@2"},
           {{"--base", workdir_layer}, "base wd@1 is a workdir layer, not a base layer"},
           {{"--base", tar_base, "--workdir", tool_a}, "workdir ta@1 is a tool layer"},
           {{"--base", tar_base, "--tool", tar_base}, "tool bbt@1 is a base layer"}}) {
      for (bool detach : {false, true}) {
        std::vector<std::string> args{"run"};
        if (detach)
          args.emplace_back("--detach");
        args.insert(args.end(), c.opts.begin(), c.opts.end());
        args.insert(args.end(), {"--", "true"});
        auto r = d.dsec(args);
        CHECK_MESSAGE(r.status == 125, r.describe());
        CHECK_MESSAGE(contains(r.err, c.names), r.describe());
        CHECK(r.out.empty());
      }
    }
    for (const auto& [ref, names] : std::vector<std::pair<std::string, std::string>>{
           {"bbt@1/x", "malformed layer 'bbt@1/x'"},
           {"bbt", "malformed layer 'bbt'"},
           {"bbt@", "malformed layer 'bbt@'"}}) {
      auto r = d.dsec({"run", "--base", ref, "--", "true"});
      CHECK_MESSAGE(r.status == 2, r.describe());
      CHECK_MESSAGE(contains(r.err, names), r.describe());
    }
  }
  SUBCASE("sizes and durations") {
    for (const auto& [opt, value] : std::vector<std::pair<std::string, std::string>>{
           {"--memory", "12q"}, {"--memory", "0"}, {"--disk", "lots"}, {"--pids", "many"},
           {"--cpus", "-1"}, {"--timeout", "soon"}, {"--ttl", "0s"}}) {
      auto r = d.run({opt, value}, {"true"});
      CHECK_MESSAGE(r.status == 2, opt << " " << value << ": " << r.describe());
      CHECK_MESSAGE(contains(r.err, opt), r.describe());
      CHECK_MESSAGE(contains(r.err, "Try 'dsec --connect " + d.where + " run --help'"),
                    r.describe());
    }
  }
  SUBCASE("an unknown sandbox id: exec, cp both ways, rm") {
    auto local = suite::get().scratch();
    write_file(local / "f", "f\n");
    for (const auto& args : std::vector<std::vector<std::string>>{
           {"exec", "sb-nosuch", "--", "true"},
           {"cp", "sb-nosuch:/etc/passwd", local.path()},
           {"cp", local / "f", "sb-nosuch:/tmp"},
           {"rm", "sb-nosuch"}}) {
      auto r = d.dsec(args);
      CHECK_MESSAGE(r.status == 1, args[0] << ": " << r.describe());
      CHECK_MESSAGE(contains(r.err, "no sandbox sb-nosuch"), r.describe());
      CHECK(r.out.empty());
    }
    auto r = d.dsec({"cp", "sb-nosuch:/etc/passwd", local.path()});
    CHECK_MESSAGE(contains(r.err, "sb-nosuch:/etc/passwd"), r.describe());
  }
  SUBCASE("a daemon that cannot be reached is named by HOST:PORT") {
    dead_port dead;
    auto at = "127.0.0.1:" + std::to_string(dead.port);
    for (const auto& [args, status] : std::vector<std::pair<std::vector<std::string>, int>>{
           {{"ps"}, 1},
           {{"node", "stats"}, 1},
           {{"exec", "sb-x", "--", "true"}, 1},
           {{"rm", "sb-x"}, 1},
           {{"session", "open"}, 1},
           {{"run", "--base", tar_base, "--", "true"}, 125},
           {{"run", "--detach", "--base", tar_base, "--", "true"}, 125}}) {
      auto r = d.dsec_at(at, args);
      CHECK_MESSAGE(r.status == status, args[0] << ": " << r.describe());
      CHECK_MESSAGE(contains(r.err, "cannot reach a dsecd at " + at + ": nothing accepts"),
                    r.describe());
      CHECK_MESSAGE(!contains(r.err, "system_error"), r.describe()); // not CAF's rendering
    }
  }
  SUBCASE("usage errors: status 2, before any connection") {
    // Against a port nothing listens on: a usage error must not need the daemon.
    dead_port dead;
    auto at = "127.0.0.1:" + std::to_string(dead.port);
    for (const auto& [args, names] :
         std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{}, "usage: dsec --connect HOST:PORT VERB"},
           {{"frob"}, "unknown verb 'frob'"},
           {{"layer", "ls"}, "layer works on a local store"},
           {{"ps", "extra"}, "unexpected argument 'extra'"},
           {{"ps", "--frob"}, "unknown option '--frob'"},
           {{"rm"}, "no sandbox id given"},
           {{"exec"}, "no sandbox id given"},
           {{"exec", "sb-x"}, "no command given"},
           {{"exec", "sb-x", "extra", "--", "true"}, "unexpected argument 'extra'"},
           {{"cp", "a"}, "expected SRC DST, got 1 argument"},
           {{"cp", "a", "b"}, "neither SRC nor DST is in a sandbox"},
           {{"cp", "x:/a", "y:/b"}, "both SRC and DST are in a sandbox"},
           {{"session"}, "expected 'open', 'list', 'resume', 'pause', 'close' or 'watch'"},
           {{"session", "frob"}, "unknown sub-verb 'frob'"},
           {{"session", "close"}, "no session id given"},
           {{"session", "close", "a", "b"}, "one session id at a time"},
           {{"session", "open", "--quota", "0"}, "--quota"},
           {{"node"}, "expected 'stats'"},
           {{"node", "frob"}, "unknown sub-verb 'frob'"},
           {{"run", "--", "true"}, "--base NAME@VERSION is required"},
           {{"run", "--base", tar_base, "--hostname", "h", "--", "true"}, "--hostname"},
           {{"run", "--base", tar_base, "--frob", "--", "true"}, "unknown option '--frob'"},
           {{"run", "--base", tar_base, "--env", "=NOKEY", "--", "true"}, "--env"}}) {
      auto r = d.dsec_at(at, args);
      std::string what = args.empty() ? std::string{"(no verb)"} : args[0];
      CHECK_MESSAGE(r.status == 2, what << ": " << r.describe());
      CHECK_MESSAGE(contains(r.err, names), what << ": " << r.describe());
      CHECK_MESSAGE(!contains(r.err, "cannot reach"), r.describe());
    }
    auto r = d.dsec_at("127.0.0.1:99999", {"ps"});
    CHECK_MESSAGE(r.status == 2, r.describe());
    CHECK_MESSAGE(contains(r.err, "--connect: expected HOST:PORT"), r.describe());
    r = d.dsec_at(at, {"run", "--help"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(contains(r.out, "usage: dsec --connect HOST:PORT run"));
  }
  // Nothing was created by any of it, nothing is left, and it still serves.
  CHECK(count(stats(d), "created") == created);
  CHECK(ps(d).empty());
  check_serving(d);
  d.finish();
}

// The sandbox has no CAP_MKNOD, so it cannot make a device node; but it can
// hard-link the ones of its /dev (the same overlay as /tmp), and make fifos.
// Its own tar then packs them as device nodes and fifos, which cp must leave
// out (with a warning), with the hard links to them, and copy the rest.
TEST_CASE("remote cp out of a sandbox: device nodes and fifos are skipped, the rest arrives") {
  daemon_proc d;
  auto id = d.detached();
  auto r = d.dsec({"exec", id, "--", "sh", "-c",
                   "mkdir /tmp/mix && cd /tmp/mix && echo keep > file && ln -s file sym"
                   " && busybox ln file hard && busybox ln /dev/null null"
                   " && busybox ln /dev/null null2 && busybox mkfifo fifo"
                   " && busybox ln fifo fifo2 && ls -l"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  // The control: what the sandbox has is really a device node and a fifo.
  CHECK_MESSAGE(contains(r.out, "\ncrw-rw-rw-"), r.out);
  CHECK_MESSAGE(contains(r.out, "\nprw-"), r.out);
  r = d.dsec({"exec", id, "--", "busybox", "mknod", "/tmp/n", "c", "1", "3"});
  CHECK_MESSAGE(r.status != 0, "mknod works in the sandbox now: make the node directly");

  auto out = suite::get().scratch();
  r = d.dsec({"cp", id + ":/tmp/mix", out.path()});
  CHECK_MESSAGE(r.status == 0, r.describe());
  for (const auto& name : {"mix/null", "mix/null2", "mix/fifo", "mix/fifo2"})
    CHECK_MESSAGE(contains(r.err, std::string{"dsec: cp: skipped "} + name + " ("), r.describe());
  CHECK_MESSAGE(lines_of(r.err).size() == 4, r.describe());
  CHECK(listing(out / "mix") == "file file " + sha256_of(out / "mix/file") + "\n"
                                  "hard file " + sha256_of(out / "mix/file") + "\n"
                                  "sym -> file\n");
  CHECK(read_file(out / "mix/file") == "keep\n");
  struct stat f{}, h{};
  REQUIRE(::stat((out / "mix/file").c_str(), &f) == 0);
  REQUIRE(::stat((out / "mix/hard").c_str(), &h) == 0);
  CHECK(f.st_ino == h.st_ino); // still a hard link
  // /dev itself: its nodes are skipped, its symlinks and directories arrive.
  auto dev = suite::get().scratch();
  r = d.dsec({"cp", id + ":/dev", dev.path()});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(contains(r.err, "dsec: cp: skipped dev/null (a device node)"), r.describe());
  CHECK(fs::is_symlink(dev / "dev/stdout"));
  CHECK_FALSE(fs::exists(fs::symlink_status(dev / "dev/null")));

  r = d.dsec({"rm", id});
  CHECK_MESSAGE(r.status == 0, r.describe());
  check_serving(d);
  d.finish();
}

namespace {

// Every file below `dir` with its content, to show that nothing changed there.
std::string snapshot(const std::string& dir) {
  std::string out;
  for (auto& e : fs::recursive_directory_iterator(dir))
    out += e.path().string() + (e.is_regular_file() ? " " + read_file(e.path().string()) : "\n");
  return out;
}

} // namespace

// Issue 12 §4, the attack itself: the sandbox controls the archive `cp` out of
// it unpacks on the host, as root. A first cp leaves x -> HOSTDIR in DST; a
// second returns x/planted (its tar replaced by one that returns a crafted
// archive). Then archives made on the host with absolute names, "..", and
// hard links to host files, returned the same way. Nothing is ever written
// outside DST, and HOSTDIR stays as it was.
TEST_CASE("remote cp out of a sandbox never writes through a link or outside the destination") {
  daemon_proc d;
  auto id = d.detached();
  auto host = suite::get().scratch();
  write_file(host / "precious", "the host's\n");
  auto before = snapshot(host.path());
  auto dst = suite::get().scratch();

  // 1. A symbolic link to the host dir: copied as it is (a link, not followed).
  auto r = d.dsec({"exec", id, "--", "sh", "-c", "ln -s " + host.path() + " /tmp/x"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  r = d.dsec({"cp", id + ":/tmp/x", dst.path()});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  REQUIRE(fs::is_symlink(dst / "x"));
  CHECK(fs::read_symlink(dst / "x") == host.path());

  // 2. The sandbox's tar now returns whatever archive is at /tmp/evil.tar.
  r = d.dsec({"exec", id, "--", "sh", "-c",
              "mkdir -p /usr/local/bin /tmp/stage/x && echo owned > /tmp/stage/x/planted"
              " && cd /tmp/stage && tar -cf /tmp/evil.tar x/planted"
              " && printf '#!/bin/sh\\ncase \"$1\" in -c) cat /tmp/evil.tar;;"
              " *) exec /bin/tar \"$@\";; esac\\n' > /usr/local/bin/tar"
              " && chmod 755 /usr/local/bin/tar && tar -tvf /tmp/evil.tar"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(r.out.find("x/planted") != std::string::npos, r.describe());
  CHECK_MESSAGE(r.out.find("x/\n") == std::string::npos, "the archive has no x/: " << r.out);
  r = d.dsec({"cp", id + ":/tmp/x", dst.path()});
  CHECK_MESSAGE(r.status != 0, r.describe());
  CHECK_MESSAGE(contains(r.err, "'x/planted' goes through 'x'"), r.describe());
  CHECK_FALSE(fs::exists(host / "planted"));
  CHECK(snapshot(host.path()) == before);

  // 3. Archives made here, returned by the sandbox's tar.
  std::string suid_mode;
  auto returned = [&](const std::string& tar) {
    auto local = suite::get().scratch();
    write_file(local / "evil.tar", tar);
    auto put = d.dsec({"cp", local / "evil.tar", id + ":/tmp"});
    REQUIRE_MESSAGE(put.status == 0, put.describe());
    auto fresh = suite::get().scratch();
    auto got = d.dsec({"cp", id + ":/tmp/x", fresh.path()});
    CHECK(snapshot(host.path()) == before);
    struct stat st {};
    if (::lstat((fresh / "x/suid").c_str(), &st) == 0)
      suid_mode = std::to_string(st.st_mode & 07777);
    return std::pair{got, snapshot(fresh.path())};
  };
  {
    tar_builder b; // an absolute name lands below DST, not at the host's /
    b.file("/x/abs-" + std::to_string(::getpid()), "absolute\n");
    auto [got, tree] = returned(b.finish());
    CHECK_MESSAGE(got.status == 0, got.describe());
    CHECK_MESSAGE(contains(tree, "/x/abs-" + std::to_string(::getpid()) + " absolute"), tree);
    CHECK_FALSE(fs::exists("/x/abs-" + std::to_string(::getpid())));
  }
  {
    tar_builder b; // up and out with ".."
    b.file("x/../../" + fs::path(host.path()).filename().string() + "/dots", "owned\n");
    auto [got, tree] = returned(b.finish());
    CHECK_MESSAGE(got.status != 0, got.describe());
    CHECK_MESSAGE(contains(got.err, "'..'"), got.describe());
    CHECK(tree.empty());
  }
  {
    tar_builder b; // a hard link to a host file, then data written "into" it
    b.hardlink("x/h", host / "precious");
    b.file("x/h", "owned\n");
    auto [got, tree] = returned(b.finish());
    CHECK_MESSAGE(got.status != 0, got.describe());
    CHECK_MESSAGE(contains(got.err, "not a regular file of this archive"), got.describe());
    struct stat st {};
    REQUIRE(::stat((host / "precious").c_str(), &st) == 0);
    CHECK(st.st_nlink == 1);
  }
  {
    tar_builder b; // a link and an entry through it in one archive
    b.dir("x");
    b.symlink("x/out", host.path());
    b.file("x/out/planted", "owned\n");
    auto [got, tree] = returned(b.finish());
    CHECK_MESSAGE(got.status != 0, got.describe());
    CHECK_MESSAGE(contains(got.err, "goes through 'x/out'"), got.describe());
  }
  {
    tar_builder b; // set-uid root, a device node: dropped, skipped
    b.dir("x");
    b.file("x/suid", "#!/bin/sh\n", 04755);
    b.add("x/disk", AE_IFBLK, 0666, {}, {}, false, makedev(8, 0));
    auto [got, tree] = returned(b.finish());
    CHECK_MESSAGE(got.status == 0, got.describe());
    CHECK_MESSAGE(contains(got.err, "dsec: cp: skipped x/disk (a device node)"), got.describe());
    CHECK_MESSAGE(contains(tree, "/x/suid #!/bin/sh"), tree);
    CHECK(suid_mode == std::to_string(0755 & ~0022)); // the test runs with umask 022
  }
  CHECK(snapshot(host.path()) == before);
  r = d.dsec({"rm", id});
  CHECK_MESSAGE(r.status == 0, r.describe());
  check_serving(d);
  d.finish();
}

// Chronus from the command line: run --chronus, exec --trusted, session watch
// (JSON lines), feedback; and the errors of each.
TEST_CASE("remote Chronus: session watch shows a grader's events, feedback answers it") {
  daemon_proc d;
  auto r = d.dsec({"session", "open"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto sid = lines_of(r.out).at(0);
  auto id = d.detached({"--chronus", "--session", sid});
  // The grader: a stage, then it asks and prints the answer.
  background grader(d.argv({"exec", "--trusted", id, "--", "sh", "-c",
                            "chronus stage graded && chronus feedback 'is it right?'"}));
  background watch(d.argv({"session", "watch", sid, "--count", "2"}));
  REQUIRE_MESSAGE(watch.wait_for_output("\"kind\":\"feedback\""), watch.out() << watch.err());
  auto w = watch.wait();
  CHECK_MESSAGE(w.status == 0, w.describe());
  auto lines = lines_of(w.out);
  REQUIRE(lines.size() == 2);
  CHECK_MESSAGE(contains(lines[0], "\"sandbox\":\"" + id + "\""), lines[0]);
  CHECK_MESSAGE(contains(lines[0], "\"seq\":1"), lines[0]);
  CHECK_MESSAGE(contains(lines[0], "\"stage\":\"graded\""), lines[0]);
  CHECK_MESSAGE(contains(lines[1], "\"kind\":\"feedback\""), lines[1]);
  CHECK_MESSAGE(contains(lines[1], "\"id\":2"), lines[1]);
  // Wrong requests first: nothing is delivered.
  r = d.dsec({"feedback", id, "7", "--reward", "1"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "feedback request 7"), r.describe());
  r = d.dsec({"feedback", id, "2", "--reward", "lots"});
  CHECK_MESSAGE(r.status == 2, r.describe());
  CHECK_MESSAGE(contains(r.err, "--reward"), r.describe());
  r = d.dsec({"feedback", "no-such-box", "2"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "no-such-box"), r.describe());
  r = d.dsec({"feedback", id});
  CHECK_MESSAGE(r.status == 2, r.describe());
  // The answer.
  r = d.dsec({"feedback", id, "2", "--reward", "0.75", "--text", "yes", "--done"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  auto g = grader.wait();
  CHECK_MESSAGE(g.status == 0, g.describe());
  CHECK_MESSAGE(contains(g.out, "\"reward\":0.75"), g.out);
  CHECK_MESSAGE(contains(g.out, "\"text\":\"yes\""), g.out);
  CHECK_MESSAGE(contains(g.out, "\"done\":true"), g.out);
  // The agent's side: no channel, and a trusted exec on a sandbox without Chronus.
  r = d.dsec({"exec", id, "--", "chronus", "stage", "fake"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "CHRONUS_FD is not set"), r.describe());
  // --pristine: only with --trusted; with it, the command sees the agent's
  // files read-only at /.dsec/agent.
  r = d.dsec({"exec", "--pristine", id, "--", "true"});
  CHECK_MESSAGE(r.status == 2, r.describe());
  CHECK_MESSAGE(contains(r.err, "--pristine needs --trusted"), r.describe());
  r = d.dsec({"exec", id, "--", "sh", "-c", "echo mine > /tmp/agent-file"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  r = d.dsec({"exec", "--trusted", "--pristine", id, "--", "sh", "-c",
              "cat /.dsec/agent/tmp/agent-file; test ! -e /tmp/agent-file && echo clean"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(r.out == "mine\nclean\n", r.describe());
  auto plain = d.detached();
  r = d.dsec({"exec", "--trusted", plain, "--", "true"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "Chronus"), r.describe());
  // Watching an unknown session; the node's counters.
  r = d.dsec({"session", "watch", "s-no-such", "--for", "1s"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "s-no-such"), r.describe());
  r = d.dsec({"node", "stats"});
  CHECK_MESSAGE(contains(r.out, "chronus         1 sandboxes, 2 events, 1 answers"), r.out);
  r = d.dsec({"session", "close", sid});
  CHECK_MESSAGE(r.status == 0, r.describe());
  r = d.dsec({"rm", plain});
  CHECK_MESSAGE(r.status == 0, r.describe());
  d.finish();
}

// ---- snapshots (issue 16) --------------------------------------------------------

TEST_CASE("remote: pause, resume, snapshot, run --snapshot, fork and session pause|resume") {
  daemon_proc d;
  auto id = d.detached();
  auto r = d.dsec({"pause", id});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "paused " + id + "\n");
  r = d.dsec({"pause", id});
  CHECK(r.out == id + " was already paused\n");
  r = d.dsec({"ps"});
  CHECK_MESSAGE(contains(r.out, "paused"), r.describe());
  r = d.dsec({"exec", id, "--", "true"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "is paused"), r.describe());
  r = d.dsec({"resume", id});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "resumed " + id + "\n");
  r = d.dsec({"exec", id, "--", "sh", "-c", "echo kept > /kept"});
  CHECK_MESSAGE(r.status == 0, r.describe());

  r = d.dsec({"snapshot", id});
  CHECK_MESSAGE(r.status == 2, r.describe()); // --as is required
  CHECK(contains(r.err, "--as"));
  r = d.dsec({"snapshot", id, "--as", "cli-snap@1"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK_MESSAGE(contains(r.out, "cli-snap@1 sha256:"), r.describe());
  r = d.dsec({"run", "--snapshot", "cli-snap@1", "--", "cat", "/kept"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "kept\n");
  r = d.dsec({"run", "--snapshot", "cli-snap@1", "--base", tar_base, "--", "true"});
  CHECK_MESSAGE(r.status == 2, r.describe());
  CHECK(contains(r.err, "takes its base and workdir from the snapshot"));

  r = d.dsec({"fork", id, "-n", "3"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  auto forks = lines_of(r.out);
  REQUIRE(forks.size() == 3);
  for (const auto& f : forks) {
    auto c = d.dsec({"exec", f, "--", "cat", "/kept"});
    CHECK_MESSAGE(c.out == "kept\n", c.describe());
  }
  r = d.dsec({"session", "pause", "default"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "paused session default: 4 sandboxes\n");
  r = d.dsec({"session", "resume", "default"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "resumed session default: 4 paused sandboxes\n");
  std::vector<std::string> rm{"rm", id};
  rm.insert(rm.end(), forks.begin(), forks.end());
  r = d.dsec(rm);
  CHECK_MESSAGE(r.status == 0, r.describe());
  d.finish();
  auto st = store::open(actor_layers());
  REQUIRE(st);
  auto all = st->list();
  REQUIRE(all);
  for (const auto& l : *all)
    if (l.kind == layer_kind::diff)
      CHECK(st->remove(l.ref));
}

namespace {

// A process's resident set (VmRSS) or peak (VmHWM) in KiB, from
// /proc/PID/status; 0 if it cannot be read.
uint64_t proc_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0)
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
  return 0;
}

// `argv` with its stdin a pipe we write to, its stdout and stderr files.
struct fed_process {
  pid_t pid = -1;
  int in = -1;
  std::string out_path, err_path;

  fed_process(const std::vector<std::string>& argv, const std::string& dir) {
    out_path = dir + "/out";
    err_path = dir + "/err";
    // Our writes to a reader that went away fail with EPIPE, not SIGPIPE.
    ::signal(SIGPIPE, SIG_IGN);
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::signal(SIGPIPE, SIG_DFL);
      ::dup2(p[0], 0);
      int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(o, 1);
      ::dup2(e, 2);
      std::vector<char*> args;
      for (const auto& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(p[0]);
    in = p[1];
  }
  // Writes all of `data`; false if the reader went away.
  bool write(std::string_view data) const {
    while (!data.empty()) {
      auto n = ::write(in, data.data(), data.size());
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  int finish() {
    if (in >= 0)
      ::close(in);
    in = -1;
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~fed_process() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      finish();
    }
  }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

} // namespace

TEST_CASE("remote exec -i and run -i stream 100 MB of stdin with back-pressure: neither dsec "
          "nor dsecd holds it") {
  daemon_proc d;
  auto made = d.run({"--detach"}, {"sleep", "1000"});
  REQUIRE_MESSAGE(made.status == 0, made.describe());
  auto id = made.out.substr(0, made.out.find('\n'));
  auto scratch = suite::get().scratch();
  constexpr size_t total = 100u << 20;
  constexpr size_t piece = 1u << 20;
  // Bytes that differ per piece, so that order matters to the digest.
  auto piece_of = [](size_t i) {
    std::string s(piece, '\0');
    for (size_t k = 0; k < piece; ++k)
      s[k] = static_cast<char>((k * 131 + i * 7) & 0xff);
    return s;
  };
  auto feed = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv{d.dsec_bin, "--connect", d.where};
    argv.insert(argv.end(), args.begin(), args.end());
    fed_process p(argv, scratch.path());
    sha256 h;
    uint64_t dsecd_before = proc_kib(d.bg.pid(), "VmRSS");
    uint64_t dsec_peak = 0, dsecd_at = 0;
    for (size_t i = 0; i * piece < total; ++i) {
      auto s = piece_of(i);
      h.update(s.data(), s.size());
      REQUIRE_MESSAGE(p.write(s), "dsec stopped reading at piece " << i << ": "
                                                                   << slurp(p.err_path));
      if (i == 90) { // 90 MB taken by dsec (our pipe holds 64 KiB), the end not yet
        dsec_peak = proc_kib(p.pid, "VmHWM");
        dsecd_at = proc_kib(d.bg.pid(), "VmRSS");
      }
    }
    int status = p.finish();
    auto out = slurp(p.out_path);
    CHECK_MESSAGE(status == 0, slurp(p.err_path));
    CHECK(out.substr(0, 64) == to_hex(h.finish()));
    // Had either held the input, it would be more than 90 MB larger. The
    // bounds leave room for the processes' own size.
    MESSAGE("100 MiB through " << args.front() << " -i: dsec's peak RSS " << dsec_peak
                               << " KiB; dsecd's RSS " << dsecd_before << " -> " << dsecd_at
                               << " KiB at 90 MiB");
    REQUIRE(dsec_peak > 0);
    CHECK_MESSAGE(dsec_peak < 48u * 1024, "dsec's peak RSS " << dsec_peak << " KiB");
    REQUIRE(dsecd_at > 0);
    CHECK_MESSAGE(dsecd_at < dsecd_before + 48u * 1024,
                  "dsecd's RSS went from " << dsecd_before << " to " << dsecd_at << " KiB");
  };
  SUBCASE("exec -i") {
    feed({"exec", "-i", id, "--", "sha256sum"});
  }
  SUBCASE("run -i") {
    feed({"run", "-i", "--base", tar_base, "--", "sha256sum"});
  }
  SUBCASE("a command that stops reading ends the feed; dsec exits with its status") {
    std::vector<std::string> argv{d.dsec_bin, "--connect", d.where, "exec", "-i", id, "--",
                                  "sh", "-c", "head -c 1000 > /dev/null; exit 3"};
    fed_process p(argv, scratch.path());
    // It reads 1000 bytes and ends: the rest of ours is not read, and our
    // writes stop once dsec ends (EPIPE), never 100 MB later.
    bool all = true;
    for (size_t i = 0; i * piece < total && all; ++i)
      all = p.write(piece_of(i));
    CHECK_FALSE(all);
    CHECK_MESSAGE(p.finish() == 3, slurp(p.err_path));
  }
  SUBCASE("SIGINT to exec -i stops the command as without -i: says so, exits 130") {
    std::vector<std::string> argv{d.dsec_bin, "--connect", d.where, "exec", "-i", id, "--",
                                  "cat"};
    fed_process p(argv, scratch.path());
    REQUIRE(p.write("echoed\n"));
    // cat runs and copies what it reads (our stdin is still open).
    REQUIRE(eventually([&] { return slurp(p.out_path) == "echoed\n"; }));
    ::kill(p.pid, SIGINT);
    CHECK(p.finish() == 128 + SIGINT);
    CHECK_MESSAGE(contains(slurp(p.err_path), "SIGINT: stopping the command (the sandbox stays)"),
                  slurp(p.err_path));
    CHECK(eventually([&] {
      auto rows = ps(d);
      return rows.size() == 1 && rows[0].running == "1"; // its sleep only
    }));
  }
  auto r = d.dsec({"rm", id});
  CHECK_MESSAGE(r.status == 0, r.describe());
  d.finish();
}

// A real pseudo-terminal, made by Python's pty module, as dsec's terminal: it
// runs argv as a session leader with the pty as its controlling terminal (30
// rows, 90 columns), types into it, resizes it, and reports what it saw.
const char* pty_driver = R"PY(
import os, sys, pty, select, time, fcntl, termios, struct
argv = sys.argv[1:]
master, slave = pty.openpty()
fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 90, 0, 0))
before = termios.tcgetattr(slave)
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.close(master)
    os.close(slave)
    os.execv(argv[0], argv)
buf = b""
def wait_for(text, limit=120):  # a safety net, never a measure
    global buf
    end = time.monotonic() + limit
    while text not in buf:
        if time.monotonic() > end:
            sys.exit("no %r in %r" % (text, buf))
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                buf += os.read(master, 4096)
            except OSError:
                sys.exit("dsec ended before %r: %r" % (text, buf))
wait_for(b"30 90")
during = termios.tcgetattr(slave)
if os.environ.get("PTY_DRIVER_TERM"):  # dsec interrupted: its terminal restored all the same
    os.kill(pid, 15)
    _, st = os.waitpid(pid, 0)
    print("status", os.waitstatus_to_exitcode(st))
    print("raw", int(not (during[3] & termios.ECHO) and not (during[3] & termios.ICANON)))
    print("restored", int(termios.tcgetattr(slave) == before))
    sys.exit(0)
os.write(master, b"hi\r")
wait_for(b"got=hi")
wait_for(b"waiting")
fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
wait_for(b"winched")
os.write(master, b"\x03")
wait_for(b"interrupted")
_, st = os.waitpid(pid, 0)
after = termios.tcgetattr(slave)
print("status", os.waitstatus_to_exitcode(st))
print("raw", int(not (during[3] & termios.ECHO) and not (during[3] & termios.ICANON)))
print("restored", int(after == before))
print("resized", int(b"40 100" in buf))
print(repr(buf))
)PY";

// What the sandbox runs on its terminal for pty_driver.
const char* pty_script =
  "busybox stty size; read x; echo got=$x; "
  "trap 'busybox stty size; echo winched' WINCH; trap 'echo interrupted; exit 7' INT; "
  "echo waiting; while :; do sleep 0.05; done";

TEST_CASE("remote exec -it and run -it on a real terminal; -t without one") {
  daemon_proc d;
  auto id = d.detached();
  auto drive = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv{"/usr/bin/python3", "-c", pty_driver, d.dsec_bin, "--connect",
                                  d.where};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run_process(argv);
    CHECK_FALSE_MESSAGE(r.safety_killed, r.describe());
    INFO(r.describe());
    REQUIRE(r.status == 0);
    // Our terminal was raw while CMD ran (so ^C was a key for its terminal,
    // which made it SIGINT there) and is restored after; its size followed ours.
    CHECK(contains(r.out, "status 7\n"));
    CHECK(contains(r.out, "raw 1\n"));
    CHECK(contains(r.out, "restored 1\n"));
    CHECK(contains(r.out, "resized 1\n"));
  };
  SUBCASE("exec -it") {
    drive({"exec", "-it", id, "--", "sh", "-c", pty_script});
  }
  SUBCASE("run -i -t") {
    drive({"run", "-i", "-t", "--base", tar_base, "--", "sh", "-c", pty_script});
  }
  SUBCASE("exec -it stopped by SIGTERM: our terminal is restored") {
    spawn_options o;
    o.in_child = [] { ::setenv("PTY_DRIVER_TERM", "1", 1); };
    auto r = run_process({"/usr/bin/python3", "-c", pty_driver, d.dsec_bin, "--connect", d.where,
                          "exec", "-it", id, "--", "sh", "-c", pty_script},
                         o);
    INFO(r.describe());
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "status 143\n"));
    CHECK(contains(r.out, "raw 1\n"));
    CHECK(contains(r.out, "restored 1\n"));
  }
  SUBCASE("-t without a terminal of ours: 24x80, no raw mode, CMD's status") {
    auto r = d.dsec({"exec", "-t", id, "--", "sh", "-c",
                     "[ -t 0 ] && busybox stty size && echo TERM=$TERM; exit 4"});
    CHECK_MESSAGE(r.status == 4, r.describe());
    CHECK_MESSAGE(r.out == "24 80\r\nTERM=xterm-256color\r\n", r.describe());
    CHECK(r.err.empty());
    r = d.run({"-t"}, {"sh", "-c", "[ -t 1 ] && echo tty; cat; echo ended"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK_MESSAGE(r.out == "tty\r\nended\r\n", r.describe()); // its stdin: ^D at once
    r = d.dsec({"exec", "-t", "--detach", id, "--", "true"});
    CHECK_MESSAGE(r.status == 2, r.describe());
    CHECK_MESSAGE(contains(r.err, "--detach"), r.describe());
  }
  auto r = d.dsec({"rm", id});
  CHECK_MESSAGE(r.status == 0, r.describe());
  d.finish();
}
