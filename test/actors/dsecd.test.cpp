// dsecd as a process ($DSECD_BIN --listen 127.0.0.1:0 --state DIR), reached
// over CAF's network layer by dsec::client: a trainer that goes away (its client
// object, or its whole process) takes its owned sandboxes with it; SIGTERM
// destroys everything and exits 0; after a SIGKILL the sandboxes die with the
// daemon and the next dsecd on the same state collects what was left and says so.
//
// Trainer processes are this executable run again as `--trainer PORT COUNT MODE`
// (see dsecd_main.cpp): a fresh process with its own actor system.
#include <doctest/doctest.h>

#include <caf/logger.hpp>

#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

std::unique_ptr<session> open(client& c, bool owned = true) {
  auto s = c.open_session({}, owned);
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

std::vector<std::string> make(session& s, const environment& env, uint32_t count) {
  auto ids = s.create(env, count);
  REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
  REQUIRE(ids->size() == count);
  return std::move(*ids);
}

// The ids a trainer process printed ("id X" lines).
std::vector<std::string> trainer_ids(const std::string& out) {
  std::vector<std::string> ids;
  for (const auto& l : lines_of(out))
    if (l.rfind("id ", 0) == 0)
      ids.push_back(l.substr(3));
  return ids;
}

// Sandboxes of this process's dsec-init processes that `before` did not have.
size_t new_inits(const host_snapshot& before) {
  size_t n = 0;
  for (pid_t p : host_snapshot::take().dsec_inits)
    n += before.dsec_inits.count(p) == 0;
  return n;
}

} // namespace

TEST_CASE("dsecd: a client connects and runs a sandbox") {
  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto s = open(*c);
  auto id = make(*s, env_of(workdir_layer, {tool_a}), 1).front();
  auto r = s->exec(id, cmd({"sh", "-c", "cat /etc/layer-file; echo err >&2; exit 4"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "tool-a\n");
  CHECK(r->err == "err\n");
  CHECK(r->exit_code == 4);
  // Streamed over the network, in order.
  std::string streamed;
  r = c->exec(id, cmd({"seq", "1", "50000"}),
              [&](uint8_t stream, std::string_view data) {
                if (stream == 1)
                  streamed += data;
              });
  REQUIRE(r);
  CHECK(lines_of(streamed).size() == 50000);
  CHECK(lines_of(streamed).back() == "50000");
  auto st = c->stats();
  REQUIRE(st);
  CHECK(st->live == 1);
  check_error(c->exec("sb-nosuch", cmd({"true"})), errc::not_found, "sb-nosuch");
  check_error(s->create(env_of({}, {"nosuch@3"}), 1), errc::not_found, "nosuch@3");
  auto closed = s->close();
  REQUIRE(closed);
  CHECK(*closed == 1);
  auto end = d.stop(SIGTERM);
  CHECK_MESSAGE(end.status == 0, end.describe());
}

// CAF 0.17 pins the actor system's logger in a thread-local reference of each
// thread that spawns an actor, and ~actor_system waits for the logger to go:
// a trainer's thread that made calls and lived on kept the trainer's actor
// system from ending, forever (actors/thread_guard.hpp). Should that come back,
// this test hangs until meson's timeout fails it.
TEST_CASE("dsecd: a trainer's thread that made calls and lives on lets its actor system end") {
  dsecd_proc d;
  std::mutex mu;
  std::condition_variable cv;
  bool called = false, system_gone = false;
  bool pinned = true;
  std::string failure;
  std::thread t;
  {
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, d.port);
    t = std::thread([&] {
      auto fail = [&](std::string what) {
        if (failure.empty())
          failure = std::move(what);
      };
      // Each kind of call: the scheduler's, a session's, a process handle's,
      // a connect of its own.
      if (auto l = c->list(); !l)
        fail("list: " + describe(l.error_value()));
      if (auto s = c->open_session({}, true); !s) {
        fail("open_session: " + describe(s.error_value()));
      } else {
        auto ids = (*s)->create(env_of(workdir_layer, {}), 1);
        if (!ids) {
          fail("create: " + describe(ids.error_value()));
        } else {
          if (auto r = (*s)->exec(ids->front(), cmd({"true"})); !r)
            fail("exec: " + describe(r.error_value()));
          auto req = cmd({"cat"});
          req.handle = true;
          req.open_stdin = true;
          auto p = c->start(ids->front(), req);
          (void) p->write("x");
          (void) p->close_stdin();
          if (auto r = p->wait(); !r || r->out != "x")
            fail("cat through a process handle");
        }
        (void) (*s)->close();
      }
      if (auto c2 = client::connect(sys, "127.0.0.1", d.port); !c2)
        fail("connect: " + describe(c2.error_value()));
      pinned = caf::logger::current_logger() != nullptr;
      std::unique_lock<std::mutex> g{mu};
      called = true;
      cv.notify_all();
      cv.wait(g, [&] { return system_gone; }); // lives on past the actor system
    });
    std::unique_lock<std::mutex> g{mu};
    cv.wait(g, [&] { return called; });
    g.unlock();
    c.reset();
  } // ~actor_system, with the thread alive
  {
    std::lock_guard<std::mutex> g{mu};
    system_gone = true;
  }
  cv.notify_all();
  t.join();
  CHECK_MESSAGE(failure.empty(), failure);
  CHECK_FALSE_MESSAGE(pinned, "the thread still holds CAF's logger after its calls");
}

TEST_CASE("dsecd: when a client object goes away, its owned sessions' sandboxes go too") {
  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto watcher = connect(sys, d.port);
  auto sessions = watcher->stats()->sessions;

  auto trainer = connect(sys, d.port);
  auto owned = open(*trainer);
  auto loose = open(*trainer, false);
  auto owned_ids = make(*owned, env_of(), 2);
  auto loose_ids = make(*loose, env_of(), 1);
  auto loose_id = loose->id();
  CHECK(watcher->stats()->sessions == sessions + 2);
  CHECK(node_list(*watcher).size() == 3);
  owned.reset();
  loose.reset();
  trainer.reset(); // the trainer is gone; its connection stays (same actor system)

  CHECK(eventually_gone(*watcher, owned_ids));
  // The session it did not own stays, with its sandbox.
  CHECK(ids_of(node_list(*watcher)) == std::set<std::string>(loose_ids.begin(), loose_ids.end()));
  CHECK(watcher->stats()->sessions == sessions + 1);
  auto f = watcher->find_session(loose_id);
  REQUIRE(f);
  auto n = (*f)->close();
  REQUIRE(n);
  CHECK(*n == 1);
  CHECK(node_list(*watcher).empty());
}

TEST_CASE("dsecd: when a trainer process dies, the daemon destroys its sandboxes") {
  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto watcher = connect(sys, d.port);
  auto sessions = watcher->stats()->sessions;
  std::string mode;
  SUBCASE("it exits without closing anything") { mode = "exit"; }
  SUBCASE("it is killed with SIGKILL") { mode = "hang"; }

  background trainer({self_exe(), "--trainer", std::to_string(d.port), "3", mode});
  REQUIRE_MESSAGE(trainer.wait_for_output("created\n"),
                  "trainer: " << trainer.out() << trainer.err());
  auto ids = trainer_ids(trainer.out());
  REQUIRE(ids.size() == 3);
  // The control: they are there while the trainer lives (or just after it exited).
  if (mode == "hang") {
    CHECK(ids_of(node_list(*watcher)) == std::set<std::string>(ids.begin(), ids.end()));
    trainer.kill(SIGKILL);
  }
  auto end = trainer.wait();
  CHECK(end.status == (mode == "hang" ? 128 + SIGKILL : 0));

  CHECK(eventually_gone(*watcher, ids));
  CHECK(eventually([&] {
    auto st = watcher->stats();
    return st && st->sessions == sessions;
  }));
  // And it keeps serving.
  auto s = open(*watcher);
  auto id = make(*s, env_of(), 1).front();
  auto r = s->exec(id, cmd({"echo", "next"}));
  REQUIRE(r);
  CHECK(r->out == "next\n");
}

TEST_CASE("dsecd: a trainer killed in the middle of a batch leaves no sandbox behind") {
  auto before = settled_snapshot();
  {
    dsecd_proc d;
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto watcher = connect(sys, d.port);
    auto st0 = watcher->stats();
    REQUIRE(st0);
    auto sessions = st0->sessions;
    // The trainer asks for 400 and is killed when the first one is ready: the
    // rest are still being created or queued on the node.
    background trainer({self_exe(), "--trainer", std::to_string(d.port), "400", "midbatch"});
    REQUIRE_MESSAGE(trainer.wait_for_output("first "),
                    "trainer: " << trainer.out() << trainer.err());
    trainer.kill(SIGKILL);
    auto end = trainer.wait();
    CHECK(end.status == 128 + SIGKILL);
    auto st = watcher->stats();
    REQUIRE(st);
    // The control: the batch was cut short, not finished before the kill.
    CHECK_MESSAGE(st->created - st0->created < 400,
                  "the batch finished before the kill: " << st->created - st0->created);
    // Every sandbox the batch made, and those it was still making, go.
    CHECK(eventually([&] {
      auto l = watcher->list();
      return l && l->empty();
    }));
    CHECK(eventually([&] {
      auto s2 = watcher->stats();
      return s2 && s2->sessions == sessions && s2->live == 0 && s2->creating == 0;
    }));
    CHECK(eventually([&] { return new_inits(before) == 0; }));
    // And it keeps serving.
    auto s = open(*watcher);
    auto id = make(*s, env_of(), 1).front();
    auto r = s->exec(id, cmd({"echo", "next"}));
    REQUIRE(r);
    CHECK(r->out == "next\n");
  }
  check_nothing_left(before);
}

TEST_CASE("dsecd: SIGTERM destroys every sandbox, exits 0 and leaves nothing") {
  actor_layers();
  auto before = settled_snapshot();
  {
    dsecd_proc d;
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, d.port);
    auto s = open(*c);
    auto loose = open(*c, false);
    make(*s, env_of(), 2);
    auto net = env_of();
    net.net = true;
    make(*s, net, 1);
    auto limited = env_of(workdir_layer);
    limited.memory = 64ull << 20;
    limited.pids = 32;
    auto ids = make(*loose, limited, 2);
    auto req = cmd({"sh", "-c", "sleep 1000 & sleep 1000"});
    req.detach = true;
    REQUIRE(loose->exec(ids[0], req));
    CHECK(new_inits(before) == 5); // the control: the snapshot sees them

    auto end = d.stop(SIGTERM);
    CHECK_MESSAGE(end.status == 0, end.describe());
    CHECK_MESSAGE(end.out.find("5 sandboxes destroyed") != std::string::npos, end.describe());
    // The client sees the daemon gone, without hanging.
    check_error(c->list(), errc::disconnected, "daemon");
    check_error(s->exec("sb-any", cmd({"true"})), errc::disconnected, "daemon");
  }
  check_nothing_left(before);
}

TEST_CASE("dsecd: after a SIGKILL its sandboxes die and the next dsecd collects what was left") {
  actor_layers();
  auto before = settled_snapshot();
  {
    test_system ts;
    caf::actor_system sys{ts.cfg};
    pid_t first_pid = 0;
    {
      dsecd_proc first;
      first_pid = first.bg.pid();
      auto c = connect(sys, first.port);
      auto s = open(*c);
      auto limited = env_of();
      limited.memory = 64ull << 20;
      limited.pids = 32;
      // 100 live sandboxes: 50 with limits of their own, 50 with the node's
      // defaults (cgroups for all).
      auto ids = make(*s, limited, 50);
      make(*s, env_of(), 50);
      auto req = cmd({"sh", "-c", "sleep 1000 & sleep 1000"});
      req.detach = true;
      REQUIRE(s->exec(ids[0], req));
      CHECK(new_inits(before) == 100);
      // A command in flight when the daemon dies: its call returns disconnected.
      struct in_flight {
        std::mutex mu;
        std::optional<expected<exec_result>> r;
      };
      auto fl = std::make_shared<in_flight>();
      std::thread t([&s, fl, id = ids[1]] {
        auto r = s->exec(id, cmd({"sleep", "1000"}));
        std::lock_guard<std::mutex> g{fl->mu};
        fl->r.emplace(std::move(r));
      });
      CHECK(eventually([&] {
        auto l = c->list();
        for (const auto& i : l ? *l : std::vector<sandbox_info>{})
          if (i.id == ids[1] && i.running == 1)
            return true;
        return false;
      }));
      auto end = first.stop(SIGKILL);
      CHECK(end.status == 128 + SIGKILL);
      bool answered = eventually([&] {
        std::lock_guard<std::mutex> g{fl->mu};
        return fl->r.has_value();
      });
      // Without an answer the thread cannot be joined: the suite then hangs
      // until meson's timeout, which is a failure too.
      REQUIRE_MESSAGE(answered, "exec did not return after its dsecd was killed");
      t.join();
      REQUIRE_FALSE(fl->r->has_value());
      CHECK_MESSAGE(fl->r->error_value().code == errc::disconnected,
                    describe(fl->r->error_value()));
      check_error(c->list(), errc::disconnected, "daemon");
    }
    // Its sandboxes die with it (PR_SET_PDEATHSIG)...
    CHECK(eventually([&] { return new_inits(before) == 0; }));
    // ...and leave their cgroups, owned by a dead process.
    std::string owner = "/dsec/" + std::to_string(first_pid) + "-";
    auto left = host_snapshot::take().cgroup_dirs;
    size_t leftovers = 0;
    for (const auto& dir : left)
      leftovers += dir.find(owner) != std::string::npos;
    REQUIRE_MESSAGE(leftovers > 0, "no cgroup of the killed dsecd was left to collect");

    dsecd_proc second;
    // Lines before "listening on": what garbage collection removed.
    auto out = second.bg.out();
    auto head = out.substr(0, out.find("listening on"));
    CHECK_MESSAGE(head.find("dsecd: removed cgroup ") != std::string::npos, out);
    CHECK_MESSAGE(head.find(owner) != std::string::npos, out);
    auto c = connect(sys, second.port);
    auto st = c->stats();
    REQUIRE(st);
    bool in_stats = false;
    for (const auto& g : st->gc)
      in_stats |= g.find(owner) != std::string::npos;
    CHECK(in_stats);
    for (const auto& dir : host_snapshot::take().cgroup_dirs)
      CHECK_MESSAGE(dir.find(owner) == std::string::npos, "still there: " << dir);

    // The new one serves (with limits too) and ends cleanly.
    auto s = open(*c);
    auto limited = env_of();
    limited.memory = 64ull << 20;
    auto id = make(*s, limited, 1).front();
    auto r = s->exec(id, cmd({"echo", "again"}));
    REQUIRE(r);
    CHECK(r->out == "again\n");
    auto end = second.stop(SIGTERM);
    CHECK_MESSAGE(end.status == 0, end.describe());
  }
  check_nothing_left(before);
}

TEST_CASE("dsecd: bad options are refused with status 2 and a reason") {
  auto bin = env_path("DSECD_BIN");
  auto r = run_process({bin, "--listen", "10.1.2.3:7070", "--state", actor_layers()});
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.err.find("10.1.2.3") != std::string::npos, r.describe());
  r = run_process({bin, "--slots", "0"});
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.err.find("--slots") != std::string::npos, r.describe());
  r = run_process({bin, "--help"});
  CHECK(r.status == 0);
  CHECK(r.out.find("--listen") != std::string::npos);
}

// With `--listen HOST:0` the node is named by the port it got, not "HOST:0"
// (stats, "node HOST:PORT is full" messages, `cluster status`).
TEST_CASE("dsecd: the node is named by the address it listens on") {
  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto st = c->stats();
  REQUIRE(st);
  CHECK(st->node == "127.0.0.1:" + std::to_string(d.port));
}
