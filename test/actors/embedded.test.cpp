// The node's actors in this process (daemon::start over a temporary state dir),
// driven through dsec::client the way a trainer drives them: sessions, batches,
// exec, files, lifetimes, quotas, admission, errors, the layer cache, shutdown.
//
// Each test case starts its own daemon (test/actors/common.hpp: `embedded`) and
// shuts it down in every outcome. Waiting for something asynchronous (a TTL, a
// release) polls with a generous cap, never a timed assertion.
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <caf/event_based_actor.hpp>

#include "runtime/metrics.hpp"
#include "runtime/store.hpp"
#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"
#include "test/support/skip.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

std::unique_ptr<session> open(client& c, session_options o = {}, bool owned = true) {
  auto s = c.open_session(o, owned);
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

std::vector<std::string> make(session& s, const environment& env, uint32_t count) {
  std::vector<std::string> failures;
  auto ids = s.create(env, count, {}, [&](const error& e) { failures.push_back(describe(e)); });
  REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
  REQUIRE_MESSAGE(ids->size() == count,
                  "created " << ids->size() << " of " << count << "; first failure: "
                             << (failures.empty() ? "none" : failures.front()));
  return std::move(*ids);
}

exec_result run(session& s, const std::string& id, const exec_request& req) {
  auto r = s.exec(id, req);
  REQUIRE_MESSAGE(r, "exec " << req.argv.front() << ": " << describe(r.error_value()));
  return std::move(*r);
}

uint64_t layer_size(const std::string& ref) {
  auto st = store::open(actor_layers());
  REQUIRE(st);
  auto parsed = parse_layer_ref(ref);
  REQUIRE(parsed);
  auto info = st->find(*parsed);
  REQUIRE_MESSAGE(info, describe(info.error_value()));
  return info->size;
}

const sandbox_info* find_info(const std::vector<sandbox_info>& l, const std::string& id) {
  for (const auto& i : l)
    if (i.id == id)
      return &i;
  return nullptr;
}

} // namespace

TEST_CASE("a batch of 50 reports each sandbox once through on_ready and returns their ids") {
  embedded n;
  auto s = open(*n.c);
  std::vector<std::string> reported;
  std::vector<std::string> failures;
  auto ids = s->create(
    env_of(), 50, [&](const std::string& id) { reported.push_back(id); },
    [&](const error& e) { failures.push_back(describe(e)); });
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  CHECK_MESSAGE(failures.empty(), (failures.empty() ? "" : failures.front()));
  REQUIRE(ids->size() == 50);
  CHECK(reported == *ids); // each reported once, in the order it became ready
  std::set<std::string> distinct(ids->begin(), ids->end());
  CHECK(distinct.size() == 50);

  // Each id is a live sandbox of this session (its hostname is its id).
  CHECK(ids_of(node_list(*n.c)) == distinct);
  auto mine = s->list();
  REQUIRE(mine);
  CHECK(ids_of(*mine) == distinct);
  for (const auto& i : *mine)
    CHECK(i.session == s->id());
  for (const auto& id : *ids) {
    auto r = run(*s, id, cmd({"hostname"}));
    CHECK(r.out == id + "\n");
  }
  auto st = node_stats_of(*n.c);
  CHECK(st.live == 50);
  CHECK(st.created >= 50);
  CHECK(st.creating == 0);

  auto closed = s->close();
  REQUIRE(closed);
  CHECK(*closed == 50);
  CHECK(node_list(*n.c).empty());
}

TEST_CASE("exec collects stdout, stderr, the exit code and the signal") {
  embedded n;
  auto s = open(*n.c);
  auto id = make(*s, env_of(), 1).front();

  auto r = run(*s, id, cmd({"sh", "-c", "echo to-out; echo to-err >&2; exit 3"}));
  CHECK(r.out == "to-out\n");
  CHECK(r.err == "to-err\n");
  CHECK(r.exit_code == 3);
  CHECK(r.signal == 0);
  CHECK_FALSE(r.timed_out);
  CHECK_FALSE(r.truncated);

  r = run(*s, id, cmd({"probe", "kill-self", "TERM"}));
  CHECK(r.signal == SIGTERM);
  r = run(*s, id, cmd({"probe", "kill-self", "SEGV"}));
  CHECK(r.signal == SIGSEGV);

  SUBCASE("large output is collected whole; max_output truncates and says so") {
    r = run(*s, id, cmd({"sh", "-c", "seq 1 200000; seq 1 1000 >&2"}));
    auto lines = lines_of(r.out);
    REQUIRE(lines.size() == 200000);
    CHECK(lines.back() == "200000");
    CHECK(lines_of(r.err).size() == 1000);
    CHECK_FALSE(r.truncated);
    auto req = cmd({"seq", "1", "100000"});
    req.max_output = 1000;
    r = run(*s, id, req);
    CHECK(r.out.size() == 1000);
    CHECK(r.truncated);
    CHECK(r.exit_code == 0);
  }
  SUBCASE("env, cwd and uid shape the command") {
    auto req = cmd({"sh", "-c", "echo $FOO; pwd; id -u"});
    req.env = {"FOO=bar"};
    req.cwd = "/etc";
    req.uid = 1000;
    req.gid = 1000;
    r = run(*s, id, req);
    CHECK(r.out == "bar\n/etc\n1000\n");
  }
  SUBCASE("the same command by id, without the session") {
    auto rr = n.c->exec(id, cmd({"sh", "-c", "echo by-id; exit 7"}));
    REQUIRE(rr);
    CHECK(rr->out == "by-id\n");
    CHECK(rr->exit_code == 7);
  }
  SUBCASE("a detached command returns once it runs") {
    auto req = cmd({"sh", "-c", "echo started > /tmp/flag; sleep 1000"});
    req.detach = true;
    r = run(*s, id, req);
    CHECK(r.exit_code == 0);
    CHECK(eventually([&] { return run(*s, id, cmd({"cat", "/tmp/flag"})).out == "started\n"; }));
  }
}

TEST_CASE("exec with a timeout is killed and says timed_out; the sandbox stays usable") {
  embedded n;
  auto s = open(*n.c);
  auto id = make(*s, env_of(), 1).front();
  auto req = cmd({"sh", "-c", "echo before; exec sleep 1000"});
  req.timeout_ms = 300;
  auto r = run(*s, id, req);
  CHECK(r.timed_out);
  CHECK(r.signal == SIGKILL);
  CHECK(r.out == "before\n");

  // A command that ends on its own is not marked, whatever its timeout.
  req = cmd({"true"});
  req.timeout_ms = 600'000;
  r = run(*s, id, req);
  CHECK_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(run(*s, id, cmd({"echo", "still-here"})).out == "still-here\n");
}

TEST_CASE("streamed exec delivers the output in order, in pieces, before the result") {
  embedded n;
  auto s = open(*n.c);
  auto id = make(*s, env_of(), 1).front();
  // ~600 KB of stdout: more than one pipe buffer, so more than one chunk.
  auto req = cmd({"sh", "-c", "seq 1 100000; echo err-line >&2; exit 5"});
  std::string expected;
  for (int i = 1; i <= 100000; ++i)
    expected += std::to_string(i) + "\n";

  auto check_stream = [&](auto&& exec_fn) {
    std::string out, err;
    size_t chunks = 0;
    auto r = exec_fn([&](uint8_t stream, std::string_view data) {
      ++chunks;
      CHECK(!data.empty());
      (stream == 1 ? out : err) += data;
    });
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->exit_code == 5);
    CHECK(r->out.empty()); // streamed, not collected
    CHECK(r->err.empty());
    CHECK(out == expected); // every byte, in order
    CHECK(err == "err-line\n");
    CHECK(chunks > 2);
  };
  SUBCASE("through the session") {
    check_stream([&](const output_fn& f) { return s->exec(id, req, f); });
  }
  SUBCASE("by id") {
    check_stream([&](const output_fn& f) { return n.c->exec(id, req, f); });
  }
}

TEST_CASE("a command whose background child keeps its pipes open ends with all it wrote") {
  // The shell exits while `sleep` (in the background) holds stdout and
  // stderr: no end of file comes, so the command ends by the drain, which
  // first takes what the pipes still hold.
  embedded n;
  auto s = open(*n.c);
  auto id = make(*s, env_of(), 1).front();
  auto req = cmd({"sh", "-c", "seq 1 100000; echo err-line >&2; sleep 1000 & exit 3"});
  std::string expected;
  for (int i = 1; i <= 100000; ++i)
    expected += std::to_string(i) + "\n";
  auto collected = run(*s, id, req);
  CHECK(collected.exit_code == 3);
  CHECK(collected.out == expected);
  CHECK(collected.err == "err-line\n");
  std::string out, err;
  auto small = req;
  small.window = 4096; // flow-controlled, in small steps: parked on the way
  auto streamed = s->exec(id, small, [&](uint8_t stream, std::string_view data) {
    (stream == 1 ? out : err) += data;
  });
  REQUIRE_MESSAGE(streamed, describe(streamed.error_value()));
  CHECK(streamed->exit_code == 3);
  CHECK(out == expected);
  CHECK(err == "err-line\n");
}

TEST_CASE("a streamed command that exited waiting for credit ends when its requester goes") {
  // The requester takes one chunk, never credits it, and goes only once the
  // command has surely exited (its 48 KiB fit the pipe): the command, parked
  // for credit that will not come, must still end (it stayed forever).
  embedded n;
  auto s = open(*n.c);
  auto id = make(*s, env_of(), 1).front();
  auto req = cmd({"sh", "-c", "seq 1 10000"});
  req.stream = true;
  req.window = 4096;
  std::promise<void> took;
  auto taker = n.sys.spawn([&took, h = s->handle(), id, req](caf::event_based_actor* self)
                             -> caf::behavior {
    self->request(h, caf::infinite, exec_atom::value, id, req)
      .then([](exec_result&) {}, [](caf::error&) {});
    auto seen = std::make_shared<bool>(false);
    return {
      [self, &took, seen](output_chunk& c) {
        if (c.data.empty() || *seen)
          return;
        *seen = true;
        took.set_value();
        self->delayed_send(self, std::chrono::seconds(1), close_atom::value);
      },
      [self](close_atom) { self->quit(); },
    };
  });
  took.get_future().wait();
  auto running = [&] {
    for (const auto& b : node_list(*n.c))
      if (b.id == id)
        return b.running;
    return 0u;
  };
  CHECK(eventually([&] { return running() == 0; }));
  // The sandbox is still fine.
  auto r = s->exec(id, cmd({"echo", "after"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "after\n");
}

TEST_CASE("input reaches stdin") {
  embedded n;
  auto s = open(*n.c);
  auto id = make(*s, env_of(), 1).front();
  auto req = cmd({"cat"});
  req.input = "hello\nworld\n";
  CHECK(run(*s, id, req).out == "hello\nworld\n");

  std::string big(3 << 20, '\0');
  std::mt19937 rng(7);
  for (auto& ch : big)
    ch = static_cast<char>(rng());
  req = cmd({"sha256sum"});
  req.input = big;
  auto r = run(*s, id, req);
  auto host = suite::get().scratch();
  write_file(host / "big", big);
  CHECK(r.out.substr(0, 64) == sha256_of(host / "big"));

  // No input: stdin is empty, not the daemon's (a safety timeout, should it hang).
  req = cmd({"cat"});
  req.timeout_ms = 120'000;
  r = run(*s, id, req);
  CHECK_FALSE(r.timed_out);
  CHECK(r.out.empty());
  CHECK(r.exit_code == 0);
}

TEST_CASE("put then get round-trips a directory") {
  embedded n;
  auto s = open(*n.c);
  auto id = make(*s, env_of(), 1).front();
  auto src = suite::get().scratch();
  write_file(src / "a.txt", "alpha\n");
  write_file(src / "sub/b.txt", "beta\n");
  write_file(src / "sub/run.sh", "#!/bin/sh\necho ran\n", 0755);
  std::string blob(2 << 20, '\0');
  std::mt19937 rng(11);
  for (auto& ch : blob)
    ch = static_cast<char>(rng());
  write_file(src / "blob.bin", blob);
  auto tar = host_tar(src.path());

  REQUIRE(run(*s, id, cmd({"mkdir", "-p", "/tmp/in"})).exit_code == 0);
  auto put = s->put(id, "/tmp/in", tar);
  REQUIRE_MESSAGE(put, describe(put.error_value()));
  CHECK(*put == tar.size());
  CHECK(run(*s, id, cmd({"cat", "/tmp/in/sub/b.txt"})).out == "beta\n");
  CHECK(run(*s, id, cmd({"/tmp/in/sub/run.sh"})).out == "ran\n");

  auto got = s->get(id, "/tmp/in");
  REQUIRE_MESSAGE(got, describe(got.error_value()));
  auto dst = suite::get().scratch();
  host_untar(*got, dst.path());
  CHECK(read_file(dst / "in/a.txt") == "alpha\n");
  CHECK(read_file(dst / "in/sub/b.txt") == "beta\n");
  CHECK(read_file(dst / "in/sub/run.sh") == "#!/bin/sh\necho ran\n");
  CHECK(sha256_of(dst / "in/blob.bin") == sha256_of(src / "blob.bin"));

  SUBCASE("by id, a single file") {
    auto one = n.c->get(id, "/tmp/in/a.txt");
    REQUIRE(one);
    auto d2 = suite::get().scratch();
    host_untar(*one, d2.path());
    CHECK(read_file(d2 / "a.txt") == "alpha\n");
    REQUIRE(n.c->put(id, "/tmp", host_tar(src.path())));
    CHECK(run(*s, id, cmd({"cat", "/tmp/a.txt"})).out == "alpha\n");
  }
  SUBCASE("bad paths are refused and named") {
    check_error(s->put(id, "relative/dir", tar), errc::invalid_argument, "relative/dir");
    check_error(s->put(id, "/no/such/dir", tar), errc::not_found, "/no/such/dir");
    check_error(s->put(id, "/tmp", "not a tar archive"), errc::invalid_argument, "/tmp");
    check_error(s->get(id, "/no/such/file"), errc::not_found, "/no/such/file");
    check_error(s->get(id, "tmp/in"), errc::invalid_argument, "tmp/in");
    CHECK(run(*s, id, cmd({"echo", "ok"})).out == "ok\n");
  }
}

// Issue 12 §3 for put and get: they run the sandbox's own tar, in the
// sandbox; the daemon only feeds it a memfd and reads its pipes from the
// reactor. Fifos, sockets and device nodes where they read or write change
// nothing, and a tar that never ends (the agent's own, reading a fifo) holds
// only its request: the node answers meanwhile, and destroying the sandbox
// ends the request with an error.
// Issue 20: files without tar in the image. bb@1 has no tar: put and get
// fall back on the system layer's static busybox (/.dsec/libexec/tar).
namespace {
bool have_static_busybox() {
  auto bb = store::find_busybox();
  return bb && bb->has_value();
}
} // namespace

TEST_CASE("put and get work in an image without tar"
          * skip_unless(have_static_busybox(),
                        "no static busybox here (busybox-static) for the system layer's tar")) {
  embedded n;
  auto s = open(*n.c);
  environment env = env_of();
  env.base = "bb@1";
  auto id = make(*s, env, 1).front();
  // No tar of the image's own (busybox's sh would find its own applet, but
  // put and get run `tar` by PATH, which has none).
  CHECK(run(*s, id, cmd({"sh", "-c", "ls /bin/tar /usr/bin/tar /sbin/tar /usr/sbin/tar "
                                     "/usr/local/bin/tar 2>&1 | grep -c 'No such file'"}))
          .out == "5\n");
  auto src = suite::get().scratch();
  write_file(src / "a.txt", "alpha\n");
  write_file(src / "sub/run.sh", "#!/bin/sh\necho ran\n", 0755);
  auto put = s->put(id, "/tmp", host_tar(src.path()));
  REQUIRE_MESSAGE(put, describe(put.error_value()));
  CHECK(run(*s, id, cmd({"cat", "/tmp/a.txt"})).out == "alpha\n");
  CHECK(run(*s, id, cmd({"/tmp/sub/run.sh"})).out == "ran\n");
  auto got = s->get(id, "/tmp/sub");
  REQUIRE_MESSAGE(got, describe(got.error_value()));
  auto dst = suite::get().scratch();
  host_untar(*got, dst.path());
  CHECK(read_file(dst / "sub/run.sh") == "#!/bin/sh\necho ran\n");
  check_error(s->get(id, "/no/such/file"), errc::not_found, "/no/such/file");
}

TEST_CASE("put and get never wait on the sandbox's files: fifos, sockets, devices, a tar that never ends") {
  embedded n;
  auto s = open(*n.c);
  auto ids = make(*s, env_of(), 2);
  auto id = ids[0];
  auto bg = cmd({"probe", "seqpacket-listen", "/work/d/sock"});
  REQUIRE(run(*s, id, cmd({"sh", "-c",
                           "mkdir -p /work/d && cd /work/d && echo hi > f && mkfifo fifo"
                           " && busybox ln /dev/null null"})).exit_code == 0);
  bg.detach = true;
  run(*s, id, bg);
  REQUIRE(run(*s, id, cmd({"sh", "-c", "while [ ! -S /work/d/sock ]; do sleep 0.05; done"}))
            .exit_code == 0);
  auto got = s->get(id, "/work/d");
  REQUIRE_MESSAGE(got, describe(got.error_value()));
  auto listed = run_process({"/usr/bin/tar", "-tvf", "-"}, [&] {
    spawn_options o;
    o.input = *got;
    return o;
  }());
  REQUIRE_MESSAGE(listed.status == 0, listed.describe());
  CHECK_MESSAGE(listed.out.find("d/f\n") != std::string::npos, listed.out);
  CHECK_MESSAGE(listed.out.find("\np") != std::string::npos, listed.out); // the fifo, as a fifo
  CHECK_MESSAGE(listed.out.find("d/sock") == std::string::npos, listed.out);

  // A put whose names are a fifo and a device node in the sandbox: replaced.
  auto src = suite::get().scratch();
  write_file(src / "fifo", "was a fifo\n");
  write_file(src / "null", "was a device\n");
  auto put = s->put(id, "/work/d", host_tar(src.path()));
  REQUIRE_MESSAGE(put, describe(put.error_value()));
  CHECK(run(*s, id, cmd({"cat", "/work/d/fifo", "/work/d/null"})).out
        == "was a fifo\nwas a device\n");

  // The agent's tar now reads a fifo nobody writes: the get never ends by itself.
  REQUIRE(run(*s, id, cmd({"sh", "-c",
                           "mkfifo /tmp/block && mkdir -p /usr/local/bin && printf"
                           " '#!/bin/sh\\ncat /tmp/block\\n' > /usr/local/bin/tar"
                           " && chmod 755 /usr/local/bin/tar"})).exit_code == 0);
  auto stuck = std::async(std::launch::async, [&] { return n.c->get(id, "/work/d"); });
  auto puts = std::async(std::launch::async, [&] { return n.c->put(id, "/work", host_tar(src.path())); });
  // Meanwhile: the node, the same sandbox and the other one all answer.
  CHECK(node_stats_of(*n.c).live == 2);
  CHECK(run(*s, id, cmd({"echo", "same"})).out == "same\n");
  CHECK(run(*s, ids[1], cmd({"echo", "other"})).out == "other\n");
  CHECK(stuck.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  auto d = s->destroy(id);
  REQUIRE_MESSAGE(d, describe(d.error_value()));
  auto end = stuck.get();
  CHECK_FALSE(end.has_value());
  CHECK_FALSE(puts.get().has_value());
  CHECK(run(*s, ids[1], cmd({"echo", "other"})).out == "other\n");
}

TEST_CASE("list shows each sandbox's state: ready or running") {
  embedded n;
  auto s = open(*n.c, {.quota = 8, .default_ttl_ms = 3'600'000, .name = "lister"});
  auto ids = make(*s, env_of(workdir_layer, {tool_a}), 2);
  auto req = cmd({"sleep", "1000"});
  req.detach = true;
  run(*s, ids[0], req);

  for (auto l : {node_list(*n.c), [&] {
                   auto x = s->list();
                   REQUIRE(x);
                   return *x;
                 }()}) {
    REQUIRE(l.size() == 2);
    auto* busy = find_info(l, ids[0]);
    auto* idle = find_info(l, ids[1]);
    REQUIRE(busy);
    REQUIRE(idle);
    CHECK(busy->state == "running");
    CHECK(busy->running == 1);
    CHECK(idle->state == "ready");
    CHECK(idle->running == 0);
    for (auto* i : {busy, idle}) {
      CHECK(i->session == s->id());
      CHECK(i->env.base == tar_base);
      CHECK(i->env.workdir == workdir_layer);
      CHECK(i->env.tools == std::vector<std::string>{tool_a});
      CHECK(i->created_ms > 0);
      CHECK(i->ttl_left_ms <= 3'600'000);
      CHECK(i->ttl_left_ms > 0);
    }
  }
}

TEST_CASE("a destroyed sandbox is closed (its session says so) or not_found afterwards, and the "
          "daemon keeps serving") {
  embedded n;
  auto s = open(*n.c);
  auto ids = make(*s, env_of(), 2);
  REQUIRE(s->destroy(ids[0]));
  check_error(s->exec(ids[0], cmd({"true"})), errc::closed,
              "sandbox " + ids[0] + " was destroyed by its trainer");
  check_error(n.c->exec(ids[0], cmd({"true"})), errc::not_found, ids[0]);
  check_error(s->destroy(ids[0]), errc::closed, ids[0]);
  check_error(n.c->destroy(ids[0]), errc::not_found, ids[0]);
  check_error(n.c->get(ids[0], "/etc"), errc::not_found, ids[0]);
  CHECK(ids_of(node_list(*n.c)) == std::set<std::string>{ids[1]});

  // By id, without the session.
  REQUIRE(n.c->destroy(ids[1]));
  check_error(s->exec(ids[1], cmd({"true"})), errc::closed, ids[1]);
  CHECK(node_list(*n.c).empty());

  auto again = make(*s, env_of(), 1).front();
  CHECK(run(*s, again, cmd({"echo", "serving"})).out == "serving\n");
  auto st = node_stats_of(*n.c);
  CHECK(st.destroyed == 2);
  CHECK(st.live == 1);
}

TEST_CASE("a sandbox's TTL ends it by itself") {
  embedded n;
  auto s = open(*n.c); // default TTL: an hour
  auto keep = make(*s, env_of(), 1).front();
  auto env = env_of();
  env.ttl_ms = 300;
  auto brief = make(*s, env, 1).front();
  auto l = node_list(*n.c);
  if (auto* i = find_info(l, brief))
    CHECK(i->ttl_left_ms <= 300);
  CHECK(eventually_gone(*n.c, {brief}));
  check_error(s->exec(brief, cmd({"true"})), errc::closed, brief + " reached its TTL");

  // The session's default TTL applies when the environment has none.
  auto s2 = open(*n.c, {.quota = 4, .default_ttl_ms = 300, .name = "short"});
  auto brief2 = make(*s2, env_of(), 2);
  CHECK(eventually_gone(*n.c, brief2));

  // The one without a short TTL is still there and works.
  CHECK(ids_of(node_list(*n.c)) == std::set<std::string>{keep});
  CHECK(run(*s, keep, cmd({"echo", "alive"})).out == "alive\n");
  CHECK(node_stats_of(*n.c).destroyed == 3);
}

TEST_CASE("closing a session destroys its sandboxes, and only its own") {
  embedded n;
  auto s1 = open(*n.c);
  auto s2 = open(*n.c);
  auto ids1 = make(*s1, env_of(), 3);
  auto ids2 = make(*s2, env_of(), 1);
  auto sessions = node_stats_of(*n.c).sessions;
  auto closed = s1->close();
  REQUIRE(closed);
  CHECK(*closed == 3);
  CHECK(ids_of(node_list(*n.c)) == std::set<std::string>{ids2[0]});
  for (const auto& id : ids1)
    check_error(n.c->exec(id, cmd({"true"})), errc::not_found, id);
  // The session is gone from the scheduler too, as soon as close() returned.
  check_error(n.c->find_session(s1->id()), errc::not_found, s1->id());
  CHECK(node_stats_of(*n.c).sessions == sessions - 1);
  CHECK(run(*s2, ids2[0], cmd({"echo", "other"})).out == "other\n");

  SUBCASE("dropping the client closes its owned sessions, not the others") {
    auto loose = open(*n.c, {}, false);
    auto kept = make(*loose, env_of(), 1);
    auto loose_id = loose->id();
    loose.reset();
    s2.reset();
    n.c.reset(); // the trainer goes away
    n.c = client::attach(n.sys, n.d->scheduler());
    CHECK(eventually_gone(*n.c, ids2));
    CHECK(ids_of(node_list(*n.c)) == std::set<std::string>{kept[0]});
    auto f = n.c->find_session(loose_id);
    REQUIRE(f);
    auto c = (*f)->close();
    REQUIRE(c);
    CHECK(*c == 1);
    CHECK(node_list(*n.c).empty());
  }
}

TEST_CASE("a session's quota refuses a batch beyond it, and the session still serves") {
  embedded n;
  auto s = open(*n.c, {.quota = 3, .default_ttl_ms = 3'600'000, .name = "small"});
  auto over = s->create(env_of(), 4);
  check_error(over, errc::invalid_argument, "never fit its quota");
  CHECK(node_list(*n.c).empty()); // nothing was made of the refused batch

  auto ids = make(*s, env_of(), 3);
  check_error(s->create(env_of(), 1), errc::overloaded, s->id());
  CHECK(run(*s, ids[0], cmd({"echo", "fine"})).out == "fine\n");
  REQUIRE(s->destroy(ids[0]));
  auto more = make(*s, env_of(), 1);
  CHECK(run(*s, more[0], cmd({"echo", "room"})).out == "room\n");

  check_error(n.c->open_session({.quota = 0, .default_ttl_ms = 1000, .name = ""}),
              errc::invalid_argument, "quota");
}

TEST_CASE("bad requests give the right code and a message naming the bad thing") {
  embedded n;
  auto s = open(*n.c);
  auto with = [](auto f) {
    auto e = env_of();
    f(e);
    return e;
  };
  // Sandboxes that failed one by one (missing layers, layers of the wrong kind)
  // are each reported through on_failed; a batch the session refuses as a whole
  // (environment::validate: no base, a malformed name, limits out of range, an
  // unknown backend) is not: nothing of it was placed.
  size_t failed_sandboxes = 0;
  auto create_fails = [&](const environment& env, errc code, std::string_view names,
                          bool each = true) {
    std::vector<error> reported;
    auto r = s->create(env, 2, {}, [&](const error& e) { reported.push_back(e); });
    check_error(r, code, names);
    CHECK(reported.size() == (each ? 2u : 0u));
    for (const auto& e : reported)
      CHECK_MESSAGE(e.code == code, describe(e));
    failed_sandboxes += reported.size();
  };
  SUBCASE("layers") {
    create_fails(with([](auto& e) { e.base = "nosuch@1"; }), errc::not_found, "nosuch@1");
    create_fails(with([](auto& e) { e.workdir = "nowd@7"; }), errc::not_found, "nowd@7");
    create_fails(with([](auto& e) { e.tools = {tool_a, "notool@2"}; }), errc::not_found,
                 "notool@2");
    create_fails(with([](auto& e) { e.base = tool_a; }), errc::wrong_kind, tool_a);
    create_fails(with([](auto& e) { e.workdir = tar_base; }), errc::wrong_kind, tar_base);
    create_fails(with([](auto& e) { e.tools = {workdir_layer}; }), errc::wrong_kind,
                 workdir_layer);
    create_fails(with([](auto& e) { e.base = "bad ref"; }), errc::invalid_argument, "bad ref",
                 false);
    create_fails(with([](auto& e) { e.tools = {"noversion"}; }), errc::invalid_argument,
                 "noversion", false);
    create_fails(with([](auto& e) { e.base = ""; }), errc::invalid_argument, "base", false);
    create_fails(with([](auto& e) { e.backend = "nosuch"; }), errc::unsupported, "nosuch",
                 false);
    // A backend dsec knows that this node does not offer: the node refuses
    // each sandbox, naming it, before admitting any (none counts as failed).
    std::vector<error> refused;
    auto r = s->create(with([](auto& e) { e.backend = "microvm"; }), 2, {},
                       [&](const error& e) { refused.push_back(e); });
    check_error(r, errc::unsupported, "microvm");
    CHECK(refused.size() == 2);
  }
  SUBCASE("limits") {
    create_fails(with([](auto& e) { e.memory = 1024; }), errc::invalid_argument, "memory", false);
    create_fails(with([](auto& e) { e.pids = 1ull << 40; }), errc::invalid_argument, "pids",
                 false);
    create_fails(with([](auto& e) { e.cpus = 5000; }), errc::invalid_argument, "cpus", false);
    create_fails(with([](auto& e) { e.cpus = -1; }), errc::invalid_argument, "cpus", false);
    create_fails(with([](auto& e) { e.disk = 4096; }), errc::invalid_argument, "disk", false);
    create_fails(with([](auto& e) { e.tools.assign(environment::max_tools + 1, tool_a); }),
                 errc::invalid_argument, "tool layers", false);
  }
  SUBCASE("ids") {
    check_error(n.c->exec("sb-nosuch", cmd({"true"})), errc::not_found, "sb-nosuch");
    check_error(n.c->put("sb-nosuch", "/tmp", "x"), errc::not_found, "sb-nosuch");
    check_error(n.c->get("sb-nosuch", "/etc"), errc::not_found, "sb-nosuch");
    check_error(n.c->destroy("sb-nosuch"), errc::not_found, "sb-nosuch");
    check_error(s->exec("sb-nosuch", cmd({"true"})), errc::not_found, "sb-nosuch");
    check_error(n.c->find_session("s-nosuch"), errc::not_found, "s-nosuch");
  }
  SUBCASE("commands") {
    auto id = make(*s, env_of(), 1).front();
    check_error(s->exec(id, cmd({})), errc::invalid_argument, "command");
    check_error(s->exec(id, cmd({"/no/such/program"})), errc::not_found, "/no/such/program");
    auto req = cmd({"true"});
    req.env = {"NOEQUALS"};
    check_error(s->exec(id, req), errc::invalid_argument, "NOEQUALS");
    req = cmd({"true"});
    req.cwd = "/no/such/dir";
    check_error(s->exec(id, req), errc::not_found, "/no/such/dir");
    CHECK(run(*s, id, cmd({"echo", "fine"})).out == "fine\n");
  }
  // Whatever failed, nothing is left of it and the daemon keeps serving.
  auto live = node_list(*n.c).size();
  CHECK(live <= 1);
  auto id = make(*s, env_of(workdir_layer, {tool_a, tool_b}), 1).front();
  CHECK(run(*s, id, cmd({"cat", "/etc/layer-file"})).out == "tool-b\n");
  CHECK(node_stats_of(*n.c).failed == failed_sandboxes);
}

TEST_CASE("a full node fails the sandboxes beyond its slots with overloaded, creating the rest") {
  daemon_options o;
  o.slots = 3;
  embedded n(o);
  auto s = open(*n.c);
  std::vector<std::string> ready;
  std::vector<error> failed;
  auto ids = s->create(
    env_of(), 5, [&](const std::string& id) { ready.push_back(id); },
    [&](const error& e) { failed.push_back(e); });
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  CHECK(ids->size() == 3);
  CHECK(ready.size() == 3);
  REQUIRE(failed.size() == 2);
  for (const auto& e : failed) {
    CHECK_MESSAGE(e.code == errc::overloaded, describe(e));
    CHECK_MESSAGE(e.message.find("full") != std::string::npos, describe(e));
  }
  for (const auto& id : *ids)
    CHECK(run(*s, id, cmd({"hostname"})).out == id + "\n");
  auto st = node_stats_of(*n.c);
  CHECK(st.slots == 3);
  CHECK(st.live == 3);
  CHECK(st.failed == 2);

  // All refused: the create itself says why.
  check_error(s->create(env_of(), 2), errc::overloaded, "full");
  // A freed slot is used again.
  REQUIRE(s->destroy(ids->front()));
  auto again = make(*s, env_of(), 1);
  CHECK(run(*s, again[0], cmd({"echo", "again"})).out == "again\n");
}

TEST_CASE("a node admits by memory too: large sandboxes fill its memory before its slots") {
  constexpr uint64_t mib = 1ull << 20;
  daemon_options o;
  o.slots = 100;
  o.node_memory = 1024 * mib; // x oversubscribe 1.0
  embedded n(o);
  auto s = open(*n.c);
  auto st = node_stats_of(*n.c);
  CHECK(st.memory_capacity == 1024 * mib);
  CHECK(st.memory_admitted == 0);
  REQUIRE(st.backends.size() == 1);
  CHECK(st.backends[0].name == "container");
  CHECK(st.backends[0].slots == 100);

  // 300 MiB each: 3 fit in 1 GiB, the 4th and 5th are refused, naming memory.
  auto big = env_of();
  big.memory = 300 * mib;
  std::vector<error> failed;
  auto ids = s->create(big, 5, {}, [&](const error& e) { failed.push_back(e); });
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  CHECK(ids->size() == 3);
  REQUIRE(failed.size() == 2);
  for (const auto& e : failed) {
    CHECK_MESSAGE(e.code == errc::overloaded, describe(e));
    CHECK_MESSAGE(e.message.find("memory") != std::string::npos, describe(e));
  }
  st = node_stats_of(*n.c);
  CHECK(st.memory_admitted == 900 * mib);
  CHECK(st.backends[0].live == 3);

  // A default-sized sandbox counts with 1 GiB / 100 slots: 12 still fit in
  // the remaining 124 MiB (10.24 MiB each), though a 300 MiB one does not.
  check_error(s->create(big, 1), errc::overloaded, "memory");
  auto small = s->create(env_of(), 20);
  REQUIRE_MESSAGE(small, describe(small.error_value()));
  CHECK(small->size() == 12);

  // Memory comes back with the sandboxes that held it.
  REQUIRE(s->destroy(ids->front()));
  REQUIRE(eventually_gone(*n.c, {ids->front()}));
  auto again = s->create(big, 1);
  REQUIRE_MESSAGE(again, describe(again.error_value()));
  CHECK(again->size() == 1);
}

TEST_CASE("the layer cache mounts each layer once, holds it against rm while used") {
  auto& fx = suite::get();
  actor_layers();
  // A layer of this test's own, to remove.
  fx.build_layer("tool", "rmme@1", fx.make_tree("rmme", {{"opt/rmme/marker", "rm me\n"}}));
  fx.build_layer("tool", "rmfree@1", fx.make_tree("rmfree", {{"opt/rmfree/marker", "free\n"}}));
  auto st = store::open(fx.state());
  REQUIRE(st);

  embedded n;
  auto s = open(*n.c);
  auto env = env_of(workdir_layer, {tool_a});
  auto two = make(*s, env, 2);
  auto stats = node_stats_of(*n.c);
  CHECK(stats.layers_mounted == 3); // base, workdir, tool: once each for both sandboxes
  CHECK(stats.layer_bytes == layer_size(tar_base) + layer_size(workdir_layer) + layer_size(tool_a));
  CHECK(stats.evicted == 0);
  CHECK(stats.cache_budget == 0);

  auto rm_env = env_of({}, {"rmme@1"});
  auto user = make(*s, rm_env, 1).front();
  CHECK(node_stats_of(*n.c).layers_mounted == 4);
  CHECK(run(*s, user, cmd({"cat", "/opt/rmme/marker"})).out == "rm me\n");
  for (const auto& id : two)
    CHECK(run(*s, id, cmd({"cat", "/etc/layer-file"})).out == "tool-a\n");

  // `dsec layer rm` of a layer in use is refused; an unused one goes.
  auto rmme = parse_layer_ref("rmme@1");
  REQUIRE(rmme);
  check_error(st->remove(*rmme), errc::in_use, "rmme@1");
  auto rmfree = parse_layer_ref("rmfree@1");
  REQUIRE(rmfree);
  auto freed = st->remove(*rmfree);
  CHECK_MESSAGE(freed, describe(freed.error_value()));

  // Once its sandbox is gone, the layer can be removed (the cache lets go of it).
  REQUIRE(s->destroy(user));
  CHECK(eventually([&] { return static_cast<bool>(st->remove(*rmme)); }));
  CHECK_FALSE(st->find(*rmme));
  check_error(s->create(rm_env, 1), errc::not_found, "rmme@1");
  // The others still work.
  for (const auto& id : two)
    CHECK(run(*s, id, cmd({"cat", "/work/marker"})).out == "workdir marker\n");
}

TEST_CASE("with a tiny cache budget unused layers are evicted and mounted again later") {
  actor_layers();
  daemon_options o;
  o.cache_bytes = layer_size(tar_base) + 1; // room for the base alone
  embedded n(o);
  auto s = open(*n.c);
  auto keeper = make(*s, env_of(), 1).front(); // holds the base
  auto with_tool = env_of(workdir_layer, {tool_a});

  auto a = make(*s, with_tool, 1).front();
  auto stats = node_stats_of(*n.c);
  CHECK(stats.layers_mounted == 3); // over budget, but everything is in use
  CHECK(stats.evicted == 0);
  CHECK(stats.cache_budget == o.cache_bytes);

  REQUIRE(s->destroy(a));
  stats = node_stats_of(*n.c);
  CHECK(stats.evicted == 2); // the workdir and the tool; the base is in use
  CHECK(stats.layers_mounted == 1);
  CHECK(stats.layer_bytes <= o.cache_bytes);
  CHECK(run(*s, keeper, cmd({"cat", "/etc/layer-file"})).out == "base\n");

  auto b = make(*s, with_tool, 1).front();
  CHECK(run(*s, b, cmd({"cat", "/opt/ta/bin/ta"})).out == "tool a\n");
  CHECK(run(*s, b, cmd({"cat", "/work/marker"})).out == "workdir marker\n");
  CHECK(node_stats_of(*n.c).layers_mounted == 3);

  REQUIRE(s->close());
  stats = node_stats_of(*n.c);
  CHECK(stats.evicted >= 4);
  CHECK(stats.layer_bytes <= o.cache_bytes);
}

TEST_CASE("daemon shutdown destroys every sandbox and leaves the host as it was") {
  actor_layers();
  auto before = settled_snapshot();
  {
    embedded n;
    auto s = open(*n.c);
    auto loose = open(*n.c, {}, false);
    make(*s, env_of(), 3);
    auto net = env_of(workdir_layer, {tool_a});
    net.net = true;
    make(*s, net, 1);
    auto limited = env_of();
    limited.memory = 64ull << 20;
    limited.pids = 32;
    limited.cpus = 0.5;
    auto lim = make(*loose, limited, 2);
    auto req = cmd({"sh", "-c", "sleep 1000 & sleep 1000"});
    req.detach = true;
    run(*loose, lim[0], req);

    // The control: the snapshot sees them.
    auto during = host_snapshot::take();
    size_t inits = 0;
    for (pid_t p : during.dsec_inits)
      inits += before.dsec_inits.count(p) == 0;
    CHECK(inits == 6);
    CHECK(during.cgroup_dirs.size() > before.cgroup_dirs.size());

    // A command in flight when the daemon shuts down gets an answer.
    std::optional<expected<exec_result>> in_flight;
    std::thread t([&] { in_flight.emplace(loose->exec(lim[1], cmd({"sleep", "1000"}))); });
    CHECK(eventually([&] {
      auto l = loose->list();
      auto* i = l ? find_info(*l, lim[1]) : nullptr;
      return i && i->running == 1;
    }));

    auto destroyed = n.d->shutdown();
    REQUIRE_MESSAGE(destroyed, describe(destroyed.error_value()));
    CHECK(*destroyed == 6);
    t.join();
    REQUIRE(in_flight);
    REQUIRE_FALSE(in_flight->has_value());
    CHECK_MESSAGE(in_flight->error_value().code == errc::sandbox_failed,
                  describe(in_flight->error_value()));
    CHECK(in_flight->error_value().message.find(lim[1]) != std::string::npos);
    // Calls after the shutdown fail instead of hanging.
    check_error(n.c->list(), errc::disconnected, "daemon");
    check_error(s->exec(lim[0], cmd({"true"})), errc::disconnected, "daemon");
    check_error(n.c->open_session(), errc::disconnected, "daemon");
    auto again = n.d->shutdown();
    REQUIRE(again);
    CHECK(*again == 0);
  }
  check_nothing_left(before);
}

TEST_CASE("metrics: a session's mailbox depth shows in the process's registry, and goes with it") {
  embedded n;
  auto s = open(*n.c);
  auto id = make(*s, env_of(), 1).front();
  auto series = [](const std::string& name) {
    auto text = metrics::process_registry().expose();
    auto at = text.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::atof(text.c_str() + at + name.size() + 2);
  };
  const std::string sessions = "dsec_mailbox_messages{actor=\"sessions\"}";
  const std::string deepest = "dsec_session_mailbox_max_messages";
  CHECK(series(sessions) >= 0);
  CHECK(series(deepest) >= 0);
  // Execs sent at once wait in the session's mailbox, and it says so as it
  // takes them.
  CHECK(eventually([&] {
    std::atomic<int> left{200};
    for (int i = 0; i < 200; ++i)
      s->exec_async(id, cmd({"true"}), [&](expected<exec_result>) { --left; });
    bool deep = false;
    while (left > 0) {
      deep = deep || (series(deepest) > 0 && series(sessions) > 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return deep;
  }));
  // Once the session ends, its depth is gone from both.
  REQUIRE(s->close());
  CHECK(eventually([&] { return series(deepest) == 0 && series(sessions) == 0; }));
}
