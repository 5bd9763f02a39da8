// Warm pools and the function backend (actors/warm_pool.hpp), through an
// embedded daemon and dsec::client, over the real runtime: pools refill after
// claims, a claimed sandbox never held anyone's state, pools end with their
// session, a full node evicts pooled sandboxes for real creates, and memory
// pressure (a PSI-format file the test writes, node_config.pool_pressure_file)
// shrinks pools first. Waits poll the node's stats with a generous cap; no
// test asserts a duration.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <sys/stat.h>
#include <unistd.h>
#include <string>
#include <thread>
#include <vector>

#include "actors/warm_pool.hpp"
#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"

using namespace dsec;
using namespace dsec::test;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<session> open(client& c) {
  auto s = c.open_session({});
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

// The node's stats until `ok` holds (test/actors/common.hpp, 120 s cap).
bool until(client& c, const std::function<bool(const node_stats&)>& ok) {
  return until_stats(c, ok);
}

uint32_t ready_of(const node_stats& s) {
  uint32_t n = 0;
  for (const auto& p : s.pools)
    n += p.ready;
  return n;
}

exec_request sh(const std::string& script) { return cmd({"sh", "-c", script}); }

std::string temp_file(const std::string& text) {
  char name[] = "/tmp/dsec-psi-XXXXXX";
  int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(name) << text;
  return name;
}

const char* calm = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
const char* pressed = "some avg10=95.00 avg60=60.00 avg300=10.00 total=123456\n"
                      "full avg10=80.00 avg60=40.00 avg300=5.00 total=99999\n";

} // namespace

TEST_CASE("pool: a session's pool fills, creates claim from it, and it refills") {
  auto before = settled_snapshot();
  {
    embedded e;
    auto s = open(*e.c);
    auto n = s->pool(env_of(), 3);
    REQUIRE_MESSAGE(n, describe(n.error_value()));
    CHECK(*n == 3);
    REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 3; }));
    // Pooled sandboxes are nobody's: not in the node's list.
    CHECK(node_list(*e.c).empty());
    for (int round = 0; round < 3; ++round) {
      auto ids = s->create(env_of(), 2);
      REQUIRE_MESSAGE(ids, describe(ids.error_value()));
      REQUIRE(ids->size() == 2);
      auto r = s->exec(ids->front(), cmd({"true"}));
      REQUIRE_MESSAGE(r, describe(r.error_value()));
      for (auto& id : *ids)
        REQUIRE(s->destroy(id));
      REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 3; }));
    }
    auto st = node_stats_of(*e.c);
    REQUIRE(st.pools.size() == 1);
    CHECK(st.pools[0].claimed == 6);
    CHECK(st.pools[0].refills >= 9);
    CHECK(st.pools[0].owner == s->id());
    // The session ends: its pool and every pooled sandbox go.
    REQUIRE(s->close());
    REQUIRE(until(*e.c, [](const node_stats& st) { return st.pools.empty() && st.live == 0; }));
  }
  check_nothing_left(before); // the daemon stopped: nothing of its pools is left
}

TEST_CASE("pool: a call runs in a fresh sandbox that ran nothing before, destroyed after") {
  embedded e;
  auto s = open(*e.c);
  environment fn = env_of();
  fn.backend = "function";
  REQUIRE(s->pool(fn, 2));
  REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 2; }));
  std::set<std::string> hosts;
  for (int i = 0; i < 4; ++i) {
    // Each call: nothing of the one before (the file), no process but ours.
    auto r = s->call(fn, sh("test ! -e /tmp/mark || echo STALE; echo x > /tmp/mark; hostname;"
                            " ls /proc | grep -c '^[0-9]'"));
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->exit_code == 0);
    CHECK(r->out.find("STALE") == std::string::npos);
    auto nl = r->out.find('\n');
    hosts.insert(r->out.substr(0, nl));
  }
  CHECK(hosts.size() == 4); // never reused
  auto r = s->call(fn, sh("exit 7"));
  REQUIRE(r);
  CHECK(r->exit_code == 7);
  r = s->call(fn, sh("kill -9 $$"));
  REQUIRE(r);
  CHECK(r->exit_code == 128 + 9);
  auto st = node_stats_of(*e.c);
  REQUIRE(st.pools.size() == 1);
  CHECK(st.pools[0].claimed >= 1);
  // Every call's sandbox is gone.
  auto left = s->list();
  REQUIRE(left);
  CHECK(left->empty());
  // Bad input: a create cannot ask for the function backend.
  auto c = s->create(fn, 1);
  REQUIRE(!c);
  CHECK(c.error_value().code == errc::invalid_argument);
  auto bad = s->call(env_of(), cmd({}));
  REQUIRE(!bad);
  CHECK(bad.error_value().code == errc::invalid_argument);
}

TEST_CASE("pool: a full node destroys pooled sandboxes for real creates") {
  daemon_options o;
  o.slots = 3;
  embedded e(o);
  auto s = open(*e.c);
  environment other = env_of("wd@1");
  REQUIRE(s->pool(other, 3));
  REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 3; }));
  auto ids = s->create(env_of(), 3);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  CHECK(ids->size() == 3);
  // The evicted pooled sandboxes are being destroyed: once they are gone the
  // node holds the 3 real ones only.
  REQUIRE(until(*e.c, [](const node_stats& st) { return st.live == 3; }));
  auto st = node_stats_of(*e.c);
  REQUIRE(st.pools.size() == 1);
  CHECK(st.pools[0].evicted == 3);
  CHECK(st.live == 3);
  // No room left: the pool waits.
  CHECK(ready_of(st) == 0);
  for (auto& id : *ids)
    REQUIRE(s->destroy(id));
  REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 3; }));
}

TEST_CASE("pool: pooled sandboxes count against the node's memory, and give it up to creates") {
  constexpr uint64_t mib = 1ull << 20;
  daemon_options o;
  o.slots = 100;
  o.node_memory = 1024 * mib; // x oversubscribe 1.0
  embedded e(o);
  auto s = open(*e.c);
  // A pool of 4 of 300 MiB: 3 fit in 1 GiB, and only 3 are made.
  environment big = env_of("wd@1");
  big.memory = 300 * mib;
  REQUIRE(s->pool(big, 4));
  REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 3; }));
  auto st = node_stats_of(*e.c);
  CHECK(st.memory_admitted == 900 * mib);
  REQUIRE(st.pools.size() == 1);
  CHECK(st.pools[0].warming == 0); // the 4th waits for memory
  // A claim keeps its memory: still 900 MiB, and no 4th pooled sandbox.
  auto claimed = s->create(big, 1);
  REQUIRE_MESSAGE(claimed, describe(claimed.error_value()));
  REQUIRE(claimed->size() == 1);
  st = node_stats_of(*e.c);
  CHECK(st.pools[0].claimed == 1);
  CHECK(st.memory_admitted == 900 * mib);
  // Another environment's create of 300 MiB: an idle pooled sandbox gives
  // its memory up for it (a node without the eviction would refuse it,
  // naming memory).
  environment other = env_of();
  other.memory = 300 * mib;
  auto ids = s->create(other, 1);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  CHECK(ids->size() == 1);
  REQUIRE(until(*e.c, [](const node_stats& st) { return st.live == 3; }));
  st = node_stats_of(*e.c);
  CHECK(st.pools[0].evicted == 1);
  CHECK(st.memory_admitted == 900 * mib);
  CHECK(ready_of(st) == 1);
  // Nothing left to give: a further one is refused by memory.
  auto more = s->create(other, 2);
  REQUIRE_MESSAGE(more, describe(more.error_value()));
  CHECK(more->size() == 1); // the last pooled one gave way for the first
  check_error(s->create(other, 1), errc::overloaded, "memory");
  // Memory freed by creates goes back to the pool.
  for (auto& id : *ids)
    REQUIRE(s->destroy(id));
  REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 1; }));
  CHECK(node_stats_of(*e.c).memory_admitted == 900 * mib);
}

TEST_CASE("pool: memory pressure shrinks the node's pools first, and they refill after") {
  auto psi = temp_file(calm);
  daemon_options o;
  o.pool_pressure_file = psi;
  o.pools.push_back({env_of(), 2});
  {
    embedded e(o);
    REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 2; }));
    auto s = open(*e.c);
    auto ids = s->create(env_of("wd@1"), 1); // a caller's: never touched by pressure
    REQUIRE(ids);
    std::ofstream(psi) << pressed;
    // The evicted pooled sandboxes are destroyed asynchronously: once they are
    // gone the node holds the caller's one only.
    REQUIRE(until(*e.c, [](const node_stats& st) {
      return st.memory_pressure && st.pooled == 0 && st.live == 1;
    }));
    auto st = node_stats_of(*e.c);
    CHECK(st.live == 1);
    CHECK(st.pools.at(0).owner == "node");
    CHECK(st.pools.at(0).evicted == 2);
    auto r = s->exec(ids->front(), cmd({"true"}));
    CHECK_MESSAGE(r, describe(r.error_value()));
    std::ofstream(psi) << calm;
    REQUIRE(until(*e.c, [](const node_stats& st) {
      return !st.memory_pressure && ready_of(st) == 2;
    }));
  }
  std::remove(psi.c_str());
}

TEST_CASE("pool: two environments share a pool only when every field but the TTL is equal (the function backend's is the container's)") {
  auto base = env_of("wd@1");
  base.memory = 64ull << 20;
  auto key = pool_key(base);
  auto same = base;
  same.ttl_ms = 5000;
  same.backend = "function";
  CHECK(pool_key(same) == key);
  std::vector<std::pair<const char*, std::function<void(environment&)>>> changes{
    {"workdir", [](environment& e) { e.workdir = "wd@2"; }},
    {"tool", [](environment& e) { e.tools.push_back("t@1"); }},
    {"memory", [](environment& e) { e.memory *= 2; }},
    {"pids", [](environment& e) { e.pids = 99; }},
    {"cpus", [](environment& e) { e.cpus = 0.5; }},
    {"disk", [](environment& e) { e.disk = 8ull << 20; }},
    {"loopback", [](environment& e) { e.net = true; }},
    {"egress", [](environment& e) { e.net = e.egress = true; }},
    {"allow", [](environment& e) { e.net = e.egress = true; e.allow = {"198.18.0.2:80"}; }},
    {"deny", [](environment& e) { e.net = e.egress = true; e.deny = {"198.18.0.2"}; }},
    {"expose", [](environment& e) { e.net = true; e.expose = {8080}; }},
    {"mount", [](environment& e) { e.mounts.push_back({"/srv", "/data", true}); }},
    {"chronus", [](environment& e) { e.chronus = true; }},
    {"snapshot", [](environment& e) { e.snapshot = "snap@1"; }},
  };
  for (auto& [what, change] : changes) {
    auto other = base;
    change(other);
    CHECK_MESSAGE(pool_key(other) != key, what);
  }
  // A policy with other rules is another pool.
  auto a = base, b = base;
  a.net = a.egress = b.net = b.egress = true;
  a.allow = {"198.18.0.2:80"};
  b.allow = {"198.18.0.3:80"};
  CHECK(pool_key(a) != pool_key(b));
  CHECK(poolable(base));
  CHECK(poolable(same));
  auto vm = base;
  vm.backend = "microvm";
  CHECK(poolable(vm));
  CHECK(pool_key(vm) != key); // a pool of microVMs is not one of containers
  // dsecd --pool: ",microvm" makes it a pool of microVMs; an unknown part is named.
  auto spec = parse_pool_spec("bb@1=2,memory=128m,microvm");
  REQUIRE_MESSAGE(spec, describe(spec.error_value()));
  CHECK(spec->size == 2);
  CHECK(spec->env.backend == "microvm");
  CHECK(spec->env.memory == 128ull << 20);
  CHECK(parse_pool_spec("bb@1=2")->env.backend == "container");
  check_error(parse_pool_spec("bb@1=2,kvm"), errc::invalid_argument, "unknown part 'kvm'");
}

TEST_CASE("pool: a create gets a pooled sandbox of its own environment only, never one with "
          "another's host mounts; a microVM pool is refused by a node without microVMs") {
  temp_dir t{"/tmp", "dsec-pool-mount"};
  auto shared = t / "shared";
  REQUIRE(::mkdir(shared.c_str(), 0755) == 0);
  std::ofstream(shared + "/secret") << "s3cret\n";
  daemon_options o;
  o.host_mounts = {shared};
  embedded e(o);
  auto s = open(*e.c);
  environment mounted = env_of();
  mounted.mounts.push_back({shared, "/data", true});
  REQUIRE(s->pool(mounted, 2));
  REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 2; }));
  // The same layers without the mount: made fresh, and the mount is not there.
  auto plain = s->create(env_of(), 1);
  REQUIRE_MESSAGE(plain, describe(plain.error_value()));
  auto st = node_stats_of(*e.c);
  REQUIRE(st.pools.size() == 1);
  CHECK(st.pools[0].claimed == 0);
  auto r = s->exec(plain->front(), sh("cat /data/secret 2>/dev/null || echo absent"));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "absent\n");
  // The pool's own environment claims, and has it.
  auto with = s->create(mounted, 1);
  REQUIRE_MESSAGE(with, describe(with.error_value()));
  CHECK(node_stats_of(*e.c).pools.at(0).claimed == 1);
  r = s->exec(with->front(), sh("cat /data/secret"));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "s3cret\n");
  // This node offers no microVMs: a pool of them is refused, naming the backend.
  environment vm = env_of();
  vm.backend = "microvm";
  check_error(s->pool(vm, 1), errc::unsupported, "offers no backend 'microvm'");
}

TEST_CASE("pool: a session's pooled sandboxes count against its quota") {
  embedded e;
  session_options so;
  so.quota = 4;
  auto sr = e.c->open_session(so);
  REQUIRE_MESSAGE(sr, describe(sr.error_value()));
  auto& s = *sr;
  REQUIRE(s->pool(env_of(), 3));
  REQUIRE(until(*e.c, [](const node_stats& st) { return ready_of(st) == 3; }));
  // 3 held by the pool: 1 more fits, 2 do not, and the refusal names the pool.
  check_error(s->create(env_of("wd@1"), 2), errc::overloaded, "warm pools");
  auto one = s->create(env_of(), 1);
  REQUIRE_MESSAGE(one, describe(one.error_value()));
  CHECK(node_stats_of(*e.c).pools.at(0).claimed == 1);
  // 1 live + a pool of 3: growing the pool to 4 does not fit.
  check_error(s->pool(env_of(), 4), errc::overloaded, "quota");
  check_error(s->create(env_of(), 1), errc::overloaded, "warm pools");
  // Shrunk to 0, its room is the session's again.
  REQUIRE(s->pool(env_of(), 0));
  auto three = s->create(env_of("wd@1"), 3);
  REQUIRE_MESSAGE(three, describe(three.error_value()));
  CHECK(three->size() == 3);
  check_error(s->pool(env_of(), 1), errc::overloaded, "quota");
}
