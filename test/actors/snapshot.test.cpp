// Snapshots (issue 16), through dsec::client on an embedded daemon (and a
// dsecd process for the kill -9 case): pause/resume with the cgroup freezer,
// pack_diff into a diff layer and sandboxes started from it, diff chains, fork.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/store.hpp"
#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"

using namespace dsec;
using namespace dsec::test;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<session> open(client& c, session_options o = {}) {
  auto s = c.open_session(o);
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

std::string make_one(session& s, const environment& env) {
  auto ids = s.create(env, 1);
  REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
  REQUIRE(ids->size() == 1);
  return ids->front();
}

exec_result run(session& s, const std::string& id, std::vector<std::string> argv) {
  auto r = s.exec(id, cmd(std::move(argv)));
  REQUIRE_MESSAGE(r, "exec: " << describe(r.error_value()));
  return *r;
}

exec_result sh(session& s, const std::string& id, const std::string& script) {
  auto r = run(s, id, {"sh", "-c", script});
  CHECK_MESSAGE(r.exit_code == 0, script << ": " << r.out << r.err);
  return r;
}

// The pids of this process's descendants named `comm` (the embedded daemon's
// sandboxes are our children: the zygote clones with CLONE_PARENT).
std::set<pid_t> named(const std::string& comm, pid_t root = ::getpid()) {
  auto table = process_table();
  std::set<pid_t> out;
  for (pid_t p : descendants(table, root))
    if (table[p].comm == comm)
      out.insert(p);
  return out;
}

// utime + stime of a process, in clock ticks.
uint64_t cpu_ticks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  REQUIRE(close != std::string::npos);
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14)
      utime = std::stoull(field);
    if (i == 15)
      stime = std::stoull(field);
  }
  return utime + stime;
}

sandbox_info info_of(session& s, const std::string& id) {
  auto l = s.list();
  REQUIRE(l);
  for (auto& i : *l)
    if (i.id == id)
      return i;
  FAIL("no sandbox " << id << " in the session's list");
  return {};
}

// A pid that appears among `after` and not among `before`.
pid_t new_pid(const std::set<pid_t>& before, const std::set<pid_t>& after) {
  for (auto p : after)
    if (before.count(p) == 0)
      return p;
  return 0;
}

// The listing a snapshot must keep (probe snaptree), without the lines of
// paths a run changes on its own.
std::string listing(session& s, const std::string& id) {
  auto r = run(s, id, {"probe", "snaptree", "/"});
  REQUIRE(r.exit_code == 0);
  return r.out;
}

} // namespace

TEST_CASE("pause: a busy loop stops using CPU while paused, commands are refused, resume "
          "goes on, and the TTL clock stops") {
  auto before = settled_snapshot();
  {
    embedded e;
    auto s = open(*e.c);
    auto env = env_of();
    env.ttl_ms = 4000;
    auto id = make_one(*s, env);
    auto spinners = named("probe");
    auto req = cmd({"probe", "spin"});
    req.detach = true;
    REQUIRE(s->exec(id, req));
    pid_t spin = 0;
    REQUIRE(eventually([&] { return (spin = new_pid(spinners, named("probe"))) != 0; }));
    // The control: it spins.
    auto t0 = cpu_ticks(spin);
    REQUIRE(eventually([&] { return cpu_ticks(spin) > t0 + 5; }));

    auto p = s->pause(id);
    REQUIRE_MESSAGE(p, describe(p.error_value()));
    CHECK(*p);
    CHECK(info_of(*s, id).state == "paused");
    auto st = e.c->stats();
    REQUIRE(st);
    CHECK(st->paused == 1);
    auto again = s->pause(id);
    REQUIRE(again);
    CHECK_FALSE(*again); // paused already

    auto frozen = cpu_ticks(spin);
    auto left = info_of(*s, id).ttl_left_ms;
    // Longer than the TTL that was left: a running clock would have ended it.
    std::this_thread::sleep_for(std::chrono::milliseconds(left + 500));
    CHECK(cpu_ticks(spin) == frozen);
    CHECK(info_of(*s, id).ttl_left_ms == left);
    check_error(s->exec(id, cmd({"true"})), errc::paused, "is paused");
    check_error(s->put(id, "/tmp", host_tar(actor_layers() + "/refs")), errc::paused,
                "is paused");
    check_error(s->get(id, "/bin"), errc::paused, "is paused");

    auto r = s->resume(id);
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(*r);
    CHECK(info_of(*s, id).state != "paused");
    REQUIRE(eventually([&] { return cpu_ticks(spin) > frozen + 5; }));
    auto echo = run(*s, id, {"echo", "back"});
    CHECK(echo.out == "back\n");
    // The TTL runs again from where it stopped, and ends it.
    CHECK(eventually_gone(*e.c, {id}));
    st = e.c->stats();
    REQUIRE(st);
    CHECK(st->paused == 0);
  }
  check_nothing_left(before);
}

TEST_CASE("pause: a paused sandbox is destroyed (thawed, then killed) and a session pauses "
          "all of its sandboxes at once") {
  auto before = settled_snapshot();
  {
    embedded e;
    auto s = open(*e.c);
    auto ids = s->create(env_of(), 3);
    REQUIRE(ids);
    REQUIRE(ids->size() == 3);
    auto n = s->pause_all();
    REQUIRE_MESSAGE(n, describe(n.error_value()));
    CHECK(*n == 3);
    for (const auto& id : *ids)
      CHECK(info_of(*s, id).state == "paused");
    // Each sandbox has its own freezer cgroup while paused.
    bool any_freezer = false;
    for (const auto& d : host_snapshot::take().cgroup_dirs)
      any_freezer |= d.find("/freezer/") != std::string::npos
                     && d.find((*ids)[0]) != std::string::npos;
    CHECK(any_freezer);
    auto back = s->resume_all();
    REQUIRE(back);
    CHECK(*back == 3);
    CHECK(run(*s, (*ids)[1], {"true"}).exit_code == 0);
    REQUIRE(s->pause((*ids)[0]));
    REQUIRE(s->pause((*ids)[2]));
    // Destroyed while paused: thawed, killed, its freezer cgroup removed.
    REQUIRE(s->destroy((*ids)[0]));
    CHECK(eventually_gone(*e.c, {(*ids)[0]}));
    // Closing the session takes the other paused one along.
  }
  check_nothing_left(before);
}

TEST_CASE("pause: a dsecd killed with SIGKILL leaves paused sandboxes frozen; the next dsecd "
          "thaws, kills and removes them") {
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
      auto s = c->open_session({}, false);
      REQUIRE(s);
      auto ids = (*s)->create(env_of(), 2);
      REQUIRE(ids);
      REQUIRE(ids->size() == 2);
      for (const auto& id : *ids)
        REQUIRE((*s)->pause(id));
      auto end = first.stop(SIGKILL);
      CHECK(end.status == 128 + SIGKILL);
    }
    // Their freezer cgroups stay, owned by a dead process.
    std::string owner = "/dsec/" + std::to_string(first_pid) + "-";
    size_t frozen_left = 0;
    for (const auto& dir : host_snapshot::take().cgroup_dirs)
      frozen_left += dir.find("/freezer/") != std::string::npos
                     && dir.find(owner) != std::string::npos;
    CHECK(frozen_left >= 2);
    dsecd_proc second;
    auto c = connect(sys, second.port);
    for (const auto& dir : host_snapshot::take().cgroup_dirs)
      CHECK_MESSAGE(dir.find(owner) == std::string::npos, "still there: " << dir);
    auto end = second.stop(SIGTERM);
    CHECK_MESSAGE(end.status == 0, end.describe());
  }
  check_nothing_left(before);
}

TEST_CASE("snapshot: a sandbox started from a diff sees exactly the files the snapshot saw") {
  auto before = settled_snapshot();
  {
    embedded e;
    auto s = open(*e.c);
    auto id = make_one(*s, env_of());
    // Changes of every kind: new files and dirs, a file of a lower layer
    // changed and one deleted (whiteouts), a lower dir deleted and one
    // replaced (opaque), a hard link pair, xattrs, owners and modes, a socket
    // and a fifo.
    sh(*s, id,
       "set -e; mkdir -p /work/sub; echo one > /work/a; busybox ln /work/a /work/b;"
       " probe setxattr /work/a user.color blue; busybox chown 1000:1000 /work/a;"
       " echo two > /work/sub/c; chmod 0640 /work/sub/c; mkdir /work/u;"
       " busybox chown 1000:1000 /work/u; busybox mkfifo /work/fifo;"
       " probe bind-unix /work/sock; echo changed >> /etc/layer-file; rm /etc/base-only;"
       " rm /bin/seq; rm -r /root; rm -rf /home; mkdir /home; echo new > /home/only;"
       " busybox ln -s /work/a /work/link");
    auto want = listing(*s, id);
    // The control: the listing sees the changes.
    CHECK(want.find("/work/b f 644 1000 1000 2") != std::string::npos);
    CHECK(want.find("user.color=blue") != std::string::npos);
    CHECK(want.find("/work/sock s") != std::string::npos);
    CHECK(want.find("/work/fifo p") != std::string::npos);
    CHECK(want.find("/bin/seq ") == std::string::npos);
    CHECK(want.find("/home/user") == std::string::npos);
    CHECK(want.find("/etc/base-only") == std::string::npos);

    auto digest = s->snapshot(id, "snap-a@1");
    REQUIRE_MESSAGE(digest, describe(digest.error_value()));
    CHECK(digest->rfind("sha256:", 0) == 0);
    // Still running after it, unpaused.
    CHECK(info_of(*s, id).state == "ready");
    CHECK(run(*s, id, {"true"}).exit_code == 0);

    environment from;
    from.snapshot = "snap-a@1";
    auto copy = make_one(*s, from);
    CHECK(listing(*s, copy) == want);
    auto info = info_of(*s, copy);
    CHECK(info.env.snapshot == "snap-a@1");
    auto st = store::open(actor_layers());
    REQUIRE(st);
    auto l = st->find(layer_ref{"snap-a", "1"});
    REQUIRE(l);
    CHECK(l->kind == layer_kind::diff);
    CHECK(l->on == "base=" + std::string{tar_base});
    CHECK(l->digest == *digest);
    // Versions are immutable; a diff is not a base.
    check_error(s->snapshot(id, "snap-a@1"), errc::already_exists, "snap-a@1");
    environment wrong = env_of();
    wrong.base = "snap-a@1";
    check_error(s->create(wrong, 1), errc::wrong_kind, "diff");
    for (const auto& x : {id, copy})
      REQUIRE(s->destroy(x));
    REQUIRE(st->remove(layer_ref{"snap-a", "1"}));
  }
  check_nothing_left(before);
}

TEST_CASE("snapshot: diffs stack three deep, and a paused sandbox stays paused") {
  auto before = settled_snapshot();
  {
    embedded e;
    auto s = open(*e.c);
    auto a = make_one(*s, env_of());
    sh(*s, a, "echo 1 > /one; echo gone > /gone");
    REQUIRE(s->snapshot(a, "chain-a@1"));
    environment from;
    from.snapshot = "chain-a@1";
    auto b = make_one(*s, from);
    sh(*s, b, "echo 2 > /two; rm /gone; echo 1b > /one");
    // Snapshot of a paused sandbox: it stays paused.
    REQUIRE(s->pause(b));
    REQUIRE(s->snapshot(b, "chain-b@1"));
    CHECK(info_of(*s, b).state == "paused");
    REQUIRE(s->resume(b));
    from.snapshot = "chain-b@1";
    auto c = make_one(*s, from);
    sh(*s, c, "echo 3 > /three");
    REQUIRE(s->snapshot(c, "chain-c@1"));
    from.snapshot = "chain-c@1";
    auto d = make_one(*s, from);
    auto r = sh(*s, d, "cat /one /two /three; test ! -e /gone && echo no-gone");
    CHECK(r.out == "1b\n2\n3\nno-gone\n");
    CHECK(listing(*s, d) == listing(*s, c));
    auto st = store::open(actor_layers());
    REQUIRE(st);
    auto lc = st->find(layer_ref{"chain-c", "1"});
    REQUIRE(lc);
    CHECK(lc->on == "snapshot=chain-b@1");
    auto lb = st->find(layer_ref{"chain-b", "1"});
    REQUIRE(lb);
    CHECK(lb->on == "snapshot=chain-a@1");
    for (const auto& x : {a, b, c, d})
      REQUIRE(s->destroy(x));
    CHECK(eventually_gone(*e.c, {a, b, c, d}));
    for (const char* n : {"chain-c", "chain-b", "chain-a"})
      CHECK(st->remove(layer_ref{n, "1"}));
  }
  check_nothing_left(before);
}

TEST_CASE("fork: 100 forks of a sandbox that wrote 1,000 files all see them, from one diff "
          "mounted once; a write in one is seen by no other") {
  auto before = settled_snapshot();
  {
    embedded e;
    session_options o;
    o.quota = 200;
    auto s = open(*e.c, o);
    // Small, so that 101 fit the node's memory admission (forks take the source's limits).
    auto small = env_of();
    small.memory = 64ull << 20;
    auto src = make_one(*s, small);
    sh(*s, src, "mkdir /data; for i in $(seq 1000); do echo $i > /data/f$i; done");
    auto st = store::open(actor_layers());
    REQUIRE(st);
    auto layers_before = st->list();
    REQUIRE(layers_before);
    auto mounted = e.c->stats();
    REQUIRE(mounted);
    auto forks = s->fork(src, 100);
    REQUIRE_MESSAGE(forks, describe(forks.error_value()));
    REQUIRE(forks->size() == 100);
    // One new layer (the diff), mounted once.
    auto layers_after = st->list();
    REQUIRE(layers_after);
    CHECK(layers_after->size() == layers_before->size() + 1);
    std::string diff;
    for (const auto& l : *layers_after)
      if (l.kind == layer_kind::diff && l.ref.name == "fork-" + src)
        diff = l.ref.to_string();
    CHECK(!diff.empty());
    auto now = e.c->stats();
    REQUIRE(now);
    CHECK(now->layers_mounted == mounted->layers_mounted + 1);
    for (const auto& f : *forks) {
      auto r = run(*s, f, {"sh", "-c", "ls /data | wc -l; cat /data/f1000"});
      CHECK(r.out == "1000\n1000\n");
    }
    sh(*s, forks->front(), "echo mine > /data/f1");
    CHECK(run(*s, (*forks)[1], {"cat", "/data/f1"}).out == "1\n");
    CHECK(run(*s, src, {"cat", "/data/f1"}).out == "1\n");
    CHECK(run(*s, forks->front(), {"cat", "/data/f1"}).out == "mine\n");
    // The source goes on running.
    CHECK(info_of(*s, src).state == "ready");
    auto all = *forks;
    all.push_back(src);
    for (const auto& x : all)
      REQUIRE(s->destroy(x));
    CHECK(eventually_gone(*e.c, all));
    auto ref = parse_layer_ref(diff);
    REQUIRE(ref);
    CHECK(st->remove(*ref));
  }
  check_nothing_left(before);
}
