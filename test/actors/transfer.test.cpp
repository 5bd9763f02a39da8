// Streamed transfers (issue 20; actors/transfer.hpp, docs/actors.md
// "Transfers"): put_from and get_into through a dsecd process and through a
// coordinator relaying to a node; byte-exact round trips (sha256), dsecd's
// and the client's peak RSS (VmHWM, reset through clear_refs) bounded far
// below the transfer's size, a sink that stops reading does not make the
// daemon buffer, clear errors, and a cancelled transfer leaves no command.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "actors/transfer.hpp"
#include "runtime/fd.hpp"
#include "runtime/sha256.hpp"
#include "test/actors/common.hpp"
#include "test/support/host.hpp"

using namespace dsec;
using namespace dsec::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t MiB = 1ull << 20;

// VmHWM of `pid` in bytes.
uint64_t hwm(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0)
      return std::stoull(line.substr(6)) * 1024;
  FAIL("no VmHWM for " << pid);
  return 0;
}

// Resets VmHWM to the current RSS (proc(5), clear_refs "5").
void reset_hwm(pid_t pid) {
  std::ofstream f("/proc/" + std::to_string(pid) + "/clear_refs");
  f << "5";
}

uint64_t rss(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoull(line.substr(6)) * 1024;
  return 0;
}

std::string sha_of_file(const std::string& path) {
  unique_fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  REQUIRE(fd);
  auto h = sha256_hex_of_file(fd.get());
  REQUIRE(h);
  return *h;
}

// A directory holding data.bin: `size` random bytes; and a tar of it (host tar).
struct payload {
  explicit payload(uint64_t size) {
    REQUIRE(::mkdir((dir / "src").c_str(), 0700) == 0);
    auto r = run_process({"/bin/sh", "-c",
                          "head -c " + std::to_string(size) + " /dev/urandom > "
                            + (dir / "src/data.bin") + " && tar -c -f " + (dir / "in.tar")
                            + " -C " + (dir / "src") + " data.bin"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    sha = sha_of_file(dir / "src/data.bin");
  }
  temp_dir dir{"/tmp", "dsec-transfer-test"};
  std::string sha;
};

// A sandbox with room for `disk` bytes (and the memory its tmpfs takes).
environment big_env(uint64_t disk) {
  auto env = env_of();
  env.disk = disk;
  env.memory = disk + 256 * MiB;
  return env;
}

std::unique_ptr<session> open_session(client& c) {
  auto s = c.open_session({});
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

std::string make_one(session& s, const environment& env) {
  auto ids = s.create(env, 1);
  REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  return (*ids)[0];
}

// Puts the payload's tar into /tmp and gets it back into a file; the file
// unpacked by the host's tar has the same sha256.
void round_trip(session& s, const std::string& id, payload& p) {
  unique_fd in{::open((p.dir / "in.tar").c_str(), O_RDONLY | O_CLOEXEC)};
  REQUIRE(in);
  auto put = s.put_from(id, "/tmp", fd_source(in.get()));
  REQUIRE_MESSAGE(put, "put_from: " << describe(put.error_value()));
  struct stat st{};
  ::stat((p.dir / "in.tar").c_str(), &st);
  CHECK(*put == static_cast<uint64_t>(st.st_size));
  unique_fd out{::open((p.dir / "out.tar").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                       0600)};
  REQUIRE(out);
  auto got = s.get_into(id, "/tmp/data.bin", fd_sink(out.get()));
  REQUIRE_MESSAGE(got, "get_into: " << describe(got.error_value()));
  CHECK(*got > 0);
  REQUIRE(::mkdir((p.dir / "back").c_str(), 0700) == 0);
  auto r = run_process({"/bin/tar", "-x", "-f", p.dir / "out.tar", "-C", p.dir / "back"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  CHECK(sha_of_file(p.dir / "back/data.bin") == p.sha);
}

// The running commands of sandbox `id` (sandbox_info.running), once it is 0.
bool no_command_left(session& s, const std::string& id) {
  return eventually([&] {
    auto l = s.list();
    if (!l)
      return false;
    for (const auto& i : *l)
      if (i.id == id)
        return i.running == 0;
    return false;
  }, 30s);
}

} // namespace

TEST_CASE("transfer: 64 MiB round-trip byte-exact through a dsecd, with clear errors") {
  payload p{64 * MiB};
  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto s = open_session(*c);
  auto id = make_one(*s, big_env(256 * MiB));
  round_trip(*s, id, p);
  SUBCASE("the whole-buffer put and get are wrappers: the same bytes") {
    std::string tar;
    {
      std::ifstream f(p.dir / "in.tar", std::ios::binary);
      tar.assign(std::istreambuf_iterator<char>(f), {});
    }
    REQUIRE(s->exec(id, cmd({"mkdir", "/tmp/whole"})));
    auto put = c->put(id, "/tmp/whole", tar);
    REQUIRE_MESSAGE(put, describe(put.error_value()));
    CHECK(*put == tar.size());
    auto got = c->get(id, "/tmp/whole/data.bin");
    REQUIRE_MESSAGE(got, describe(got.error_value()));
    temp_dir back;
    host_untar(*got, back.path());
    CHECK(sha_of_file(back / "data.bin") == p.sha);
  }
  SUBCASE("errors name the path, never tar's raw words; a failed get sends no bytes") {
    uint64_t bytes = 0;
    auto got = s->get_into(id, "/tmp/not-there", [&](std::string_view d) -> expected<void> {
      bytes += d.size();
      return {};
    });
    check_error(got, errc::not_found, "get /tmp/not-there: no such file or directory");
    CHECK(bytes == 0);
    unique_fd in{::open((p.dir / "in.tar").c_str(), O_RDONLY | O_CLOEXEC)};
    auto put = s->put_from(id, "/no/such/dir", fd_source(in.get()));
    check_error(put, errc::not_found, "put into /no/such/dir: no such file or directory");
    check_error(s->put_from(id, "relative", fd_source(in.get())), errc::invalid_argument,
                "absolute");
    CHECK(no_command_left(*s, id));
  }
  SUBCASE("cancelling midway: the source or the sink fails, the sandbox's tar is gone") {
    uint64_t sent = 0;
    auto put = s->put_from(id, "/tmp/cancelled", [&](char* buf, size_t n) -> expected<size_t> {
      if (sent >= 8 * MiB)
        return make_error(errc::closed, "the source gave up");
      std::memset(buf, 0, n); // (a tar of zeros: its end, read as it comes)
      sent += n;
      return n;
    });
    // (zeros are the end of an archive: tar may finish first; either way no command stays)
    (void) put;
    CHECK(no_command_left(*s, id));
    uint64_t pieces = 0;
    auto got = s->get_into(id, "/tmp/data.bin", [&](std::string_view) -> expected<void> {
      if (++pieces == 2)
        return make_error(errc::closed, "the sink gave up");
      return {};
    });
    check_error(got, errc::closed, "the sink gave up");
    CHECK(pieces == 2);
    CHECK(no_command_left(*s, id));
    // The sandbox is still usable.
    auto r = s->exec(id, cmd({"true"}));
    REQUIRE(r);
    CHECK(r->exit_code == 0);
  }
}

TEST_CASE("transfer: dsecd's and the client's peak RSS grow far less than a 256 MiB put and get; "
          "a slow reader does not make dsecd buffer") {
  payload p{256 * MiB};
  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto s = open_session(*c);
  auto id = make_one(*s, big_env(700 * MiB));
  pid_t daemon = d.bg.pid();
  pid_t me = ::getpid();
  // The bound: a few windows and pieces, far below the 256 MiB moved.
  constexpr uint64_t bound = 48 * MiB;
  reset_hwm(daemon);
  reset_hwm(me);
  uint64_t d0 = hwm(daemon), c0 = hwm(me);
  round_trip(*s, id, p);
  uint64_t d1 = hwm(daemon), c1 = hwm(me);
  MESSAGE("dsecd VmHWM +" << (d1 - d0) / MiB << " MiB, client +" << (c1 - c0) / MiB
                          << " MiB for a 256 MiB put and get");
  CHECK(d1 - d0 < bound);
  CHECK(c1 - c0 < bound);
  // A reader that stops for 3 s after its first piece: the daemon's tar waits.
  reset_hwm(daemon);
  reset_hwm(me);
  d0 = hwm(daemon);
  c0 = hwm(me);
  uint64_t pieces = 0, bytes = 0, during = 0;
  auto got = s->get_into(id, "/tmp/data.bin", [&](std::string_view data) -> expected<void> {
    if (++pieces == 1) {
      std::this_thread::sleep_for(3s);
      during = rss(daemon);
    }
    bytes += data.size();
    return {};
  });
  REQUIRE_MESSAGE(got, describe(got.error_value()));
  CHECK(bytes > 256 * MiB);
  d1 = hwm(daemon);
  c1 = hwm(me);
  MESSAGE("slow reader: dsecd VmHWM +" << (d1 - d0) / MiB << " MiB, client +"
                                       << (c1 - c0) / MiB << " MiB");
  CHECK(d1 - d0 < bound);
  CHECK(c1 - c0 < bound);
  CHECK(during < d0 + bound);
}

TEST_CASE("a streamed exec whose on_output is slow: neither dsecd nor the client buffers the "
          "command's output (its window)") {
  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto s = open_session(*c);
  auto id = make_one(*s, big_env(700 * MiB));
  pid_t daemon = d.bg.pid();
  pid_t me = ::getpid();
  constexpr uint64_t bound = 48 * MiB;
  reset_hwm(daemon);
  reset_hwm(me);
  uint64_t d0 = hwm(daemon), c0 = hwm(me), during = 0;
  uint64_t chunks = 0, bytes = 0;
  auto r = s->exec(id, cmd({"sh", "-c", "dd if=/dev/zero bs=1048576 count=256 2>/dev/null"}),
                   [&](uint8_t stream, std::string_view data) {
                     if (stream != 1)
                       return;
                     if (++chunks == 1) {
                       std::this_thread::sleep_for(3s);
                       during = rss(daemon);
                     }
                     bytes += data.size();
                   });
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->exit_code == 0);
  CHECK(bytes == 256 * MiB);
  uint64_t d1 = hwm(daemon), c1 = hwm(me);
  MESSAGE("slow on_output: dsecd VmHWM +" << (d1 - d0) / MiB << " MiB, client +"
                                          << (c1 - c0) / MiB << " MiB for 256 MiB of output");
  CHECK(d1 - d0 < bound);
  CHECK(c1 - c0 < bound);
  CHECK(during < d0 + bound);
  // The output of a plain streamed exec is all there, in order, as before.
  std::string seq;
  r = s->exec(id, cmd({"seq", "1", "100000"}), [&](uint8_t stream, std::string_view data) {
    if (stream == 1)
      seq += data;
  });
  REQUIRE(r);
  auto lines = lines_of(seq);
  REQUIRE(lines.size() == 100000);
  CHECK(lines.front() == "1");
  CHECK(lines.back() == "100000");
}

TEST_CASE("transfer through a coordinator relaying to a node: 64 MiB round trip byte-exact, "
          "the coordinator's peak RSS bounded") {
  payload p{64 * MiB};
  temp_dir dir{"/tmp", "dsec-transfer-cluster"};
  // The coordinator places nothing on itself (--slots 0): the sandbox is
  // the node's, and every piece goes through the coordinator's relay.
  dsecd_proc coord{{"--coordinator", "--slots", "0"}};
  auto st = dir / "node";
  REQUIRE(::mkdir(st.c_str(), 0700) == 0);
  dsecd_proc node{{"--join", "127.0.0.1:" + std::to_string(coord.port), "--state", st, "--slots",
                   "4", "--cluster-key", actor_layers() + "/cluster.key", "--trajectories",
                   actor_layers() + "/trajectories"}};
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, coord.port);
  REQUIRE_MESSAGE(eventually([&] {
    auto m = c->cluster();
    if (!m)
      return false;
    size_t up = 0;
    for (const auto& x : *m)
      up += x.state == "up";
    return up == 2;
  }, 60s), "the node did not join: " << coord.bg.out());
  auto s = open_session(*c);
  auto id = make_one(*s, big_env(256 * MiB));
  auto l = s->list();
  REQUIRE(l);
  REQUIRE(l->size() == 1);
  CHECK((*l)[0].node == "127.0.0.1:" + std::to_string(node.port));
  reset_hwm(coord.bg.pid());
  uint64_t c0 = hwm(coord.bg.pid());
  round_trip(*s, id, p);
  uint64_t c1 = hwm(coord.bg.pid());
  MESSAGE("coordinator VmHWM +" << (c1 - c0) / MiB << " MiB relaying a 64 MiB put and get");
  CHECK(c1 - c0 < 32 * MiB);
  s->close();
}

TEST_CASE("transfer in a session with a trajectory log: a 96 MiB put leaves no copy of its bytes in "
          "the log (its pack is refused, logged why); a small one is packed") {
  payload p{96 * MiB};
  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  session_options o;
  o.trajectory = true;
  auto sr = c->open_session(o);
  REQUIRE_MESSAGE(sr, describe(sr.error_value()));
  auto& s = *sr;
  auto id = make_one(*s, big_env(256 * MiB));
  auto dir = actor_layers() + "/trajectories/" + s->id();
  auto du = [&] {
    auto r = run_process({"/usr/bin/du", "-sb", dir});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    return std::stoull(r.out);
  };
  unique_fd in{::open((p.dir / "in.tar").c_str(), O_RDONLY | O_CLOEXEC)};
  auto put = s->put_from(id, "/tmp", fd_source(in.get()));
  REQUIRE_MESSAGE(put, describe(put.error_value()));
  auto big = du();
  MESSAGE("the log after a 96 MiB put: " << big << " bytes");
  CHECK(big < 4 * MiB);
  // The control: a command that is not idempotent makes a pack, and a small
  // file it made is packed (its blob is in the log)... but the big file
  // still refuses the pack: so remove it first.
  auto r = s->exec(id, cmd({"sh", "-c", "rm /tmp/data.bin; head -c 300000 /dev/urandom > /tmp/small.bin"}));
  REQUIRE(r);
  CHECK(r->exit_code == 0);
  auto after = du();
  MESSAGE("the log after a 300 kB file too: " << after << " bytes");
  CHECK(after > big + 250000);
  s->close();
}
