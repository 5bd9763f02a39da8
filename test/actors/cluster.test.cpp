// The cluster (docs/cluster.md): a coordinator and nodes, each a real dsecd
// process with its own state dir and port on loopback; a trainer (this
// process) connected to the coordinator. Placement spreads and honours
// locality; a layer built on the coordinator runs on every node; a node
// killed, hung or restarted, and the coordinator killed, are handled without
// leaks. Also cluster_map's placement rules, without any process.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <future>
#include <thread>
#include <vector>

#include "actors/cluster_map.hpp"
#include "actors/sandbox_id.hpp"
#include "test/actors/common.hpp"
#include "test/support/host.hpp"

namespace dsec::test {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A coordinator (over the suite's layer store, which holds bbt@1) and `n`
// nodes, each with an empty store of its own.
struct cluster {
  explicit cluster(size_t n, const std::vector<std::string>& coord_extra = {},
                   const std::vector<std::string>& node_extra = {})
    : node_extra_(node_extra) {
    coord = std::make_unique<dsecd_proc>(std::vector<std::string>{"--coordinator", "--slots",
                                                                  "200"}
                                         + coord_extra);
    for (size_t i = 0; i < n; ++i) {
      auto st = dir / ("node-" + std::to_string(i + 1));
      REQUIRE(::mkdir(st.c_str(), 0700) == 0);
      states.push_back(st);
      nodes.push_back(start_node(i, 0));
    }
    c = connect(sys, coord->port);
    REQUIRE_MESSAGE(eventually([&] { return up() == n + 1; }, 60s),
                    "the nodes did not all join: " << coord->bg.out());
  }

  std::unique_ptr<dsecd_proc> start_node(size_t i, uint16_t port) {
    // The coordinator's key (it made it in its state dir), and its trajectory
    // dir: the daemons of one machine share it, as tools/cluster's do.
    std::vector<std::string> argv{"--join", "127.0.0.1:" + std::to_string(coord->port),
                                  "--state", states[i], "--slots", "200",
                                  "--cluster-key", actor_layers() + "/cluster.key",
                                  "--trajectories", actor_layers() + "/trajectories"};
    if (port)
      argv = argv + std::vector<std::string>{"--listen", "127.0.0.1:" + std::to_string(port)};
    return std::make_unique<dsecd_proc>(argv + node_extra_);
  }

  std::vector<member_info> members() {
    auto m = c->cluster();
    REQUIRE_MESSAGE(m, "cluster status: " << describe(m.error_value()));
    return *m;
  }

  size_t up() {
    auto m = c->cluster();
    if (!m)
      return 0;
    size_t k = 0;
    for (const auto& x : *m)
      k += x.state == "up";
    return k;
  }

  std::optional<member_info> member(const std::string& name) {
    for (auto& m : members())
      if (m.name == name && m.state == "up")
        return m;
    return std::nullopt;
  }

  std::string coord_name() const { return "127.0.0.1:" + std::to_string(coord->port); }
  std::string node_name(size_t i) const { return "127.0.0.1:" + std::to_string(nodes[i]->port); }

  temp_dir dir{"/tmp", "dsec-cluster-test"}; // destroyed last: after every dsecd stopped
  std::vector<std::string> states;
  std::vector<std::string> node_extra_;
  std::unique_ptr<dsecd_proc> coord;
  std::vector<std::unique_ptr<dsecd_proc>> nodes;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  std::unique_ptr<client> c;
};

// tools/cluster, with this build's dsecd and dsec and no TLS from the
// environment: its path.
std::string cluster_script() {
  ::setenv("DSECD", env_path("DSECD_BIN").c_str(), 1);
  ::setenv("DSEC", suite::get().dsec_bin().c_str(), 1);
  ::unsetenv("DSEC_TLS");
  return env_path("DSEC_CLUSTER_SCRIPT");
}

// The pid in DIR/NAME/pid (tools/cluster's), 0 when there is none.
pid_t daemon_pid(const std::string& dir, const std::string& name) {
  std::ifstream f(dir + "/" + name + "/pid");
  pid_t pid = 0;
  f >> pid;
  return pid;
}

std::map<std::string, std::vector<std::string>> by_node(session& s) {
  auto l = s.list();
  REQUIRE_MESSAGE(l, "list: " << describe(l.error_value()));
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& i : *l)
    out[i.node].push_back(i.id);
  return out;
}

std::string spread_text(const std::map<std::string, std::vector<std::string>>& m) {
  std::string out;
  for (const auto& [node, ids] : m)
    out += node + ": " + std::to_string(ids.size()) + "  ";
  return out;
}

// Whether a message for people shows CAF's internals: an actor or node id
// ("actor 7 on node BFFADF3...#6727", "7@BFFADF3...#6727") or an enum name
// ("exit_reason(remote_link_unreachable)").
bool shows_caf_internals(const std::string& msg) {
  static const std::regex ids{"[0-9A-Fa-f]{16,}#[0-9]+"};
  return std::regex_search(msg, ids) || msg.find("exit_reason(") != std::string::npos
         || msg.find("actor system:") != std::string::npos
         || msg.find(" on node ") != std::string::npos;
}

} // namespace

TEST_CASE("cluster: links of idle trainers and of commands longer than --beat-timeout live") {
  // The node heartbeat's --beat-timeout (1.5 s) once dropped every quiet
  // client link too (issue 19). Now a trainer that idles, and commands that
  // run past it, through the coordinator and directly on a node, all live.
  cluster cl(1);
  auto s = cl.c->open_session();
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 2); // one on each node
  REQUIRE(ids);
  REQUIRE(by_node(**s).size() == 2);
  std::this_thread::sleep_for(5s); // idle: over three --beat-timeouts
  for (const auto& id : *ids) {
    auto r = (*s)->exec(id, cmd({"sh", "-c", "sleep 5; echo done"}));
    REQUIRE_MESSAGE(r, id << ": " << describe(r.error_value()));
    CHECK(r->out == "done\n");
  }
  // By id, straight to the node that runs it (the command line's way).
  auto direct = connect(cl.sys, cl.nodes[0]->port);
  for (const auto& id : *ids) {
    auto info = by_node(**s);
    if (info[cl.node_name(0)].empty() || info[cl.node_name(0)].front() != id)
      continue;
    auto r = direct->exec(id, cmd({"sh", "-c", "sleep 5; echo direct"}));
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->out == "direct\n");
  }
  auto st = cl.c->stats();
  REQUIRE(st);
  CHECK(cl.up() == 2);
}

TEST_CASE("cluster_map: a sandbox goes only to a node that offers its backend") {
  cluster_map m{11};
  auto a = m.add("a", 100, 0, {"base@1"});
  auto b = m.add("b", 100, 0, {});
  CHECK(m.offered("container")); // what a node offers until it reports
  CHECK_FALSE(m.offered("microvm"));
  m.offers(a, {"container", "microvm"});
  CHECK(m.offered("microvm"));
  for (int i = 0; i < 20; ++i) {
    auto vm = cluster_map::make_batch("base@1", "", {}, "microvm");
    auto id = m.pick(vm);
    CHECK(id == a);
    m.placed(id, 1, vm.refs);
  }
  // Both offer containers: both get them.
  std::set<uint32_t> got;
  for (int i = 0; i < 20; ++i) {
    auto c = cluster_map::make_batch("base@1", "", {});
    auto id = m.pick(c);
    REQUIRE(id != 0);
    m.placed(id, 1, c.refs);
    got.insert(id);
  }
  CHECK(got == std::set<uint32_t>{a, b});
  // The only node offering it is full: nowhere to go, though b has room.
  m.full(a);
  auto vm = cluster_map::make_batch("base@1", "", {}, "microvm");
  CHECK(m.pick(vm) == 0);
  m.remove(a);
  CHECK_FALSE(m.offered("microvm"));
}

TEST_CASE("cluster_map: under churn a node whose count since its report is used up still "
          "gets sandboxes until it refuses one") {
  // Sandboxes placed and destroyed again between two reports still count as
  // placed: with creates and destroys faster than the reports (a trainer's
  // short episodes), the count says full while the nodes have room. The
  // chaos run met it: "no free slot" with 96 slots and 14 sandboxes live.
  cluster_map m{1};
  auto a = m.add("a", 10, 2, {"base@1"});
  auto b = m.add("b", 10, 10, {"base@1"}); // reported full
  auto one = [] { return cluster_map::make_batch("base@1", "", {}); };
  for (int i = 0; i < 8; ++i) {
    auto batch = one();
    auto id = m.pick(batch);
    REQUIRE(id == a);
    m.placed(id, 1, batch.refs);
  }
  CHECK(m.find(a)->free() == 0);
  // Used up by the count, but its report had room: the node decides.
  for (int i = 0; i < 5; ++i) {
    auto batch = one();
    CHECK(m.pick(batch) == a);
    m.placed(a, 1, batch.refs);
  }
  // Once it refused, it is full until its next report; b, reported full, is
  // never tried.
  m.full(a);
  auto none = one();
  CHECK(m.pick(none) == 0);
  m.report(a, 10, 3, nullptr);
  auto again = one();
  CHECK(m.pick(again) == a);
  m.report(b, 10, 9, nullptr);
  m.full(a);
  auto other = one();
  CHECK(m.pick(other) == b);
}

TEST_CASE("cluster_map: a create goes where a ready pooled sandbox of its environment is, "
          "the session's own or the nodes', while the report's count lasts") {
  cluster_map m{5};
  auto a = m.add("a", 100, 0, {"base@1"});
  auto b = m.add("b", 100, 0, {"base@1"});
  auto c = m.add("c", 100, 0, {"base@1"});
  auto batch = [](const std::string& session) {
    auto x = cluster_map::make_batch("base@1", "", {});
    x.own_pool = session + "\nK";
    x.node_pool = "node\nK";
    return x;
  };
  // One create of `session`, placed as the scheduler does: where it went.
  auto place = [&](const std::string& session) {
    auto x = batch(session);
    auto id = m.pick(x);
    m.placed(id, 1, x.refs);
    m.claimed(id, x, 1);
    return id;
  };
  // b has 3 ready of session s1's pool: s1's single creates go there, 3 of them.
  m.pools(b, {{"s1\nK", 3}, {"s1\nOTHER", 5}});
  for (int i = 0; i < 3; ++i) {
    CHECK(place("s1") == b);
  }
  CHECK(m.pooled_for(*m.find(b), batch("s1")) == 0);
  // Used up until the next report: spread as ever (not all on b).
  std::set<uint32_t> got;
  for (int i = 0; i < 6; ++i) {
    auto id = place("s1");
    REQUIRE(id != 0);
    got.insert(id);
  }
  CHECK(got.size() >= 2);
  // Another session's pool is not s1's; the nodes' own pool is everyone's.
  m.pools(b, {{"s2\nK", 4}});
  m.pools(c, {{"node\nK", 2}});
  for (int i = 0; i < 2; ++i) {
    CHECK(place("s1") == c);
  }
  auto x = batch("s2");
  CHECK(m.pick(x) == b);
  // Another environment's create gets no bonus from them.
  auto plain = cluster_map::make_batch("base@1", "", {});
  CHECK(m.pooled_for(*m.find(b), plain) == 0);
  // A node that goes takes its pools with it.
  m.remove(b);
  auto y = batch("s2");
  CHECK(m.pick(y) != b);
  (void) a;
}

TEST_CASE("cluster_map: pieces, spread over every node, locality, full nodes") {
  cluster_map m{42};
  auto a = m.add("a", 100, 0, {"base@1"});
  auto b = m.add("b", 100, 0, {});
  auto c = m.add("c", 100, 0, {});
  CHECK(m.piece_size(300) == 64);
  CHECK(m.piece_size(30) == 10);
  CHECK(m.piece_size(1) == 1);

  // A batch of 30 in pieces of 10: every node gets one.
  auto batch = cluster_map::make_batch("base@1", "", {});
  std::map<uint32_t, int> got;
  for (int i = 0; i < 3; ++i) {
    auto id = m.pick(batch);
    REQUIRE(id != 0);
    m.placed(id, 10, batch.refs);
    ++got[id];
  }
  CHECK(got.size() == 3);

  // A zero-slot node (a coordinator that runs nothing) is never picked, and a
  // batch of 3 reaches the node that lacks the layers too.
  {
    cluster_map z{3};
    z.add("coordinator", 0, 0, {"base@1"});
    auto h1 = z.add("h1", 100, 0, {"base@1"});
    auto h2 = z.add("h2", 100, 0, {"base@1"});
    auto fresh = z.add("fresh", 100, 0, {});
    for (int round = 0; round < 20; ++round) {
      auto three = cluster_map::make_batch("base@1", "", {});
      std::set<uint32_t> got3;
      for (int i = 0; i < 3; ++i) {
        auto id = z.pick(three);
        REQUIRE(id != 0);
        got3.insert(id);
      }
      CHECK(got3 == std::set<uint32_t>{h1, h2, fresh});
    }
  }

  // Free capacity leads; locality breaks near ties: among empty nodes the
  // one that holds the layers gets the first single create, then they spread
  // (a node that got one holds the layers too).
  cluster_map l{7};
  auto la = l.add("a", 100, 0, {"base@1"});
  auto lb = l.add("b", 100, 0, {});
  auto lc = l.add("c", 100, 0, {});
  std::map<uint32_t, int> singles;
  for (int i = 0; i < 30; ++i) {
    auto one = cluster_map::make_batch("base@1", "", {});
    auto id = l.pick(one);
    REQUIRE(id != 0);
    if (i == 0)
      CHECK(id == la);
    l.placed(id, 1, one.refs);
    ++singles[id];
  }
  for (auto id : {la, lb, lc})
    CHECK_MESSAGE(singles[id] >= 7, "node " << id << " got " << singles[id] << " of 30");
  // The coordinator's own node (fill_last, the layers' source) is chosen
  // last: single creates go to the other nodes, though only it holds the
  // layer, until they are 5% fuller than it.
  {
    cluster_map f{5};
    auto co = f.add("coordinator", 100, 0, {"base@1"}, true);
    auto n1 = f.add("n1", 100, 0, {});
    auto n2 = f.add("n2", 100, 0, {});
    std::map<uint32_t, int> got1;
    for (int i = 0; i < 10; ++i) {
      auto one = cluster_map::make_batch("base@1", "", {});
      auto id = f.pick(one);
      REQUIRE(id != 0);
      f.placed(id, 1, one.refs);
      ++got1[id];
    }
    CHECK(got1[co] == 0);
    CHECK(got1[n1] + got1[n2] == 10);
    // Then it takes its share, staying the emptiest.
    for (int i = 0; i < 60; ++i) {
      auto one = cluster_map::make_batch("base@1", "", {});
      auto id = f.pick(one);
      REQUIRE(id != 0);
      f.placed(id, 1, one.refs);
      ++got1[id];
    }
    CHECK(got1[co] > 10);
    CHECK(got1[co] < got1[n1]);
    CHECK(got1[co] < got1[n2]);
  }
  // A layer that only one node holds and the source lacks cannot be fetched
  // by the others: that node gets it, however full it is.
  {
    cluster_map u{11};
    u.add("coordinator", 100, 0, {"base@1"}, true);
    auto only = u.add("n1", 100, 80, {"base@1", "wd@1"});
    u.add("n2", 100, 0, {"base@1"});
    for (int i = 0; i < 15; ++i) {
      auto one = cluster_map::make_batch("base@1", "wd@1", {});
      auto id = u.pick(one);
      CHECK(id == only);
      u.placed(id, 1, one.refs);
    }
    auto one = cluster_map::make_batch("base@1", "wd@1", {});
    u.placed(only, 5, one.refs); // full by the count: only its own refusal says so for sure
    CHECK(u.pick(one) == only);
    u.full(only); // it refused: nobody else can run it
    CHECK(u.pick(one) == 0);
  }
  // The most specific layer weighs more than the base.
  cluster_map w{9};
  w.add("has-base", 100, 0, {"base@1"});
  auto wb = w.add("has-workdir", 100, 0, {"wd@1"});
  for (int i = 0; i < 10; ++i) {
    auto one = cluster_map::make_batch("base@1", "wd@1", {});
    CHECK(w.pick(one) == wb);
  }

  // Full nodes are not picked; with every node full, nothing is.
  m.full(a);
  m.full(b);
  for (int i = 0; i < 10; ++i) {
    auto one = cluster_map::make_batch("base@1", "", {});
    CHECK(m.pick(one) == c);
  }
  m.full(c);
  auto none = cluster_map::make_batch("base@1", "", {});
  CHECK(m.pick(none) == 0);
  // A heartbeat makes room again; a removed node is never picked.
  m.report(b, 100, 0, nullptr);
  m.remove(a);
  m.remove(c);
  auto again = cluster_map::make_batch("base@1", "", {});
  CHECK(m.pick(again) == b);
  CHECK(m.holders("base@1") == 1); // b got pieces of a batch of it
}

TEST_CASE("a batch of 300 spreads over all three nodes; a layer built on the coordinator runs on "
          "each; nodes refuse sessions of their own") {
  auto before = settled_snapshot();
  {
    cluster cl(2);
    auto s = cl.c->open_session({.quota = 400});
    REQUIRE_MESSAGE(s, describe(s.error_value()));
    auto ids = (*s)->create(env_of(), 300);
    REQUIRE_MESSAGE(ids, describe(ids.error_value()));
    CHECK(ids->size() == 300);
    auto spread = by_node(**s);
    MESSAGE("300 sandboxes: " << spread_text(spread));
    CHECK(spread.size() == 3);
    for (const auto& name : {cl.coord_name(), cl.node_name(0), cl.node_name(1)}) {
      CHECK_MESSAGE(spread[name].size() >= 10, name << " got " << spread[name].size());
      // bbt@1 was built on the coordinator only: each node fetched it and runs it.
      auto r = (*s)->exec(spread[name].front(), cmd({"/bin/sh", "-c", "echo hi from $0", "x"}));
      REQUIRE_MESSAGE(r, name << ": " << describe(r.error_value()));
      CHECK(r->out == "hi from x\n");
    }
    // The nodes say so in their heartbeats.
    CHECK(eventually([&] {
      for (size_t i = 0; i < 2; ++i) {
        auto m = cl.member(cl.node_name(i));
        if (!m || m->last.fetched_layers < 1 || m->last.live == 0)
          return false;
      }
      return true;
    }, 30s));
    // ps through the coordinator shows every node's.
    auto all = cl.c->list();
    REQUIRE(all);
    CHECK(all->size() >= 300);

    // A node serves its own sandboxes by id but opens no sessions.
    auto direct = connect(cl.sys, cl.nodes[0]->port);
    auto refused = direct->open_session({});
    check_error(refused, errc::unsupported, "belongs to the cluster of " + cl.coord_name());
    auto st = direct->stats();
    REQUIRE(st);
    CHECK(st->live == spread[cl.node_name(0)].size());
    // By id through the coordinator, wherever it lives.
    auto r = cl.c->exec(spread[cl.node_name(1)].back(), cmd({"/bin/echo", "by id"}));
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->out == "by id\n");

    auto n = (*s)->close();
    REQUIRE(n);
    CHECK(*n == 300);
  }
  check_nothing_left(before);
}

TEST_CASE("a node that refuses (full, unknown to the coordinator) gets its share placed elsewhere; "
          "a full cluster says so") {
  // Slow heartbeats: the coordinator's picture of node 1 stays stale.
  cluster cl(2, {"--beat-interval", "10s", "--beat-timeout", "60s", "--slots", "10"},
             {"--beat-interval", "10s", "--beat-timeout", "60s", "--slots", "10"});
  // Node 1 fills up behind the coordinator's back (its own default session).
  auto direct = connect(cl.sys, cl.nodes[0]->port);
  auto ds = direct->find_session("default");
  REQUIRE(ds);
  // (its layer cache fetches bbt@1 from the coordinator, as for any sandbox)
  auto mine = (*ds)->create(env_of(), 10);
  REQUIRE_MESSAGE(mine, describe(mine.error_value()));
  REQUIRE(mine->size() == 10);
  auto st = direct->stats();
  REQUIRE(st);
  REQUIRE(st->live == 10);
  auto s = cl.c->open_session({.quota = 100});
  REQUIRE(s);
  std::vector<error> failures;
  auto ids = (*s)->create(env_of(), 25, {}, [&](const error& e) { failures.push_back(e); });
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  auto spread = by_node(**s);
  MESSAGE("25 asked, node 1 full of its own: " << spread_text(spread) << ", "
          << failures.size() << " failed");
  CHECK(ids->size() == 20); // 10 slots on the coordinator's node, 10 on node 2
  CHECK(failures.size() == 5);
  CHECK(spread.count(cl.node_name(0)) == 0);
  for (const auto& e : failures) {
    CHECK(e.code == errc::overloaded);
    CHECK(e.message.find("the cluster has no free slot") != std::string::npos);
  }
}

TEST_CASE("placement: free capacity leads, the coordinator's own node fills last, locality breaks "
          "ties; a layer only one node has goes there") {
  cluster cl(2);
  auto s = cl.c->open_session({.quota = 100});
  REQUIRE(s);
  // Only the coordinator's store holds bbt@1: one at a time, they still go
  // to the other nodes (each fetches it once), the coordinator's filling last.
  for (int i = 0; i < 20; ++i) {
    auto ids = (*s)->create(env_of(), 1);
    REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  }
  auto spread = by_node(**s);
  MESSAGE("20 single creates of bbt@1: " << spread_text(spread));
  CHECK(spread[cl.node_name(0)].size() >= 5);
  CHECK(spread[cl.node_name(1)].size() >= 5);
  CHECK(spread[cl.coord_name()].size() < spread[cl.node_name(0)].size());
  CHECK(spread[cl.coord_name()].size() < spread[cl.node_name(1)].size());

  // A workdir layer that only node 1 has (built in its store): the
  // coordinator's store, where the others fetch from, lacks it.
  temp_dir src;
  {
    std::ofstream f(src / "only-here.txt");
    f << "node one's layer\n";
  }
  auto built = run_process({suite::get().dsec_bin(), "--state", cl.states[0], "layer", "build",
                            "--kind", "workdir", "onlyone@1", src.path()});
  REQUIRE_MESSAGE(built.status == 0, built.describe());
  REQUIRE_MESSAGE(eventually([&] {
    auto m = cl.member(cl.node_name(0));
    return m && std::find(m->last.layers.begin(), m->last.layers.end(), "onlyone@1")
                  != m->last.layers.end();
  }, 30s), "node 1's heartbeat did not report onlyone@1");
  std::set<std::string> mine;
  for (int i = 0; i < 10; ++i) {
    auto ids = (*s)->create(env_of("onlyone@1"), 1);
    REQUIRE_MESSAGE(ids, describe(ids.error_value()));
    REQUIRE(ids->size() == 1);
    mine.insert(ids->front());
    auto r = (*s)->exec(ids->front(), cmd({"/bin/cat", "/only-here.txt"}));
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->out == "node one's layer\n");
  }
  spread = by_node(**s);
  MESSAGE("then 10 of bbt@1 + onlyone@1: " << spread_text(spread));
  size_t on_one = 0;
  for (const auto& id : spread[cl.node_name(0)])
    on_one += mine.count(id);
  CHECK(on_one == 10);
}

TEST_CASE("node cordon, drain, uncordon: a cordoned node gets no new sandbox, its own go on; "
          "drain answers once they are gone") {
  cluster cl(2);
  auto s = cl.c->open_session({.quota = 200});
  REQUIRE(s);
  auto n1 = cl.node_name(0);
  REQUIRE((*s)->create(env_of(), 30));
  auto mine = by_node(**s)[n1];
  REQUIRE_MESSAGE(!mine.empty(), spread_text(by_node(**s)));

  auto live = cl.c->cordon(n1, true);
  REQUIRE_MESSAGE(live, describe(live.error_value()));
  CHECK(*live == mine.size());
  bool shown = false;
  for (const auto& m : cl.members())
    if (m.name == n1)
      shown = m.state == "cordoned";
  CHECK(shown);
  // New creates go to the others; n1's own sandboxes still work.
  REQUIRE((*s)->create(env_of(), 20));
  CHECK(by_node(**s)[n1].size() == mine.size());
  auto still = (*s)->exec(mine.front(), cmd({"echo", "still here"}));
  REQUIRE_MESSAGE(still, describe(still.error_value()));
  CHECK(still->out == "still here\n");
  // The node itself refuses, naming the cordon (its own default session).
  auto direct = connect(cl.sys, cl.nodes[0]->port);
  auto ds = direct->find_session("default");
  REQUIRE(ds);
  check_error((*ds)->create(env_of(), 1), errc::overloaded, "cordoned");

  // A drain that runs out of time says how many are left; the node stays cordoned.
  check_error(cl.c->drain(n1, 200ms), errc::timeout,
              "still has " + std::to_string(mine.size()));
  // A drain waits until the last one is gone, and says how many there were.
  auto drained = std::async(std::launch::async, [&] { return cl.c->drain(n1, 60s); });
  for (const auto& id : mine)
    REQUIRE((*s)->destroy(id));
  auto d = drained.get();
  REQUIRE_MESSAGE(d, describe(d.error_value()));
  CHECK(*d == mine.size());
  auto empty = cl.c->drain(n1, 1s); // empty already
  REQUIRE_MESSAGE(empty, describe(empty.error_value()));
  CHECK(*empty == 0);

  // Uncordoned, it takes sandboxes again (it is the emptiest node now).
  REQUIRE(cl.c->cordon(n1, false));
  REQUIRE((*s)->create(env_of(), 10));
  CHECK_FALSE(by_node(**s)[n1].empty());
  check_error(cl.c->cordon("127.0.0.1:1", true), errc::not_found, "no node 127.0.0.1:1");

  // A daemon that is not a coordinator operates its own node.
  dsecd_proc solo({"--slots", "4"});
  auto sc = connect(cl.sys, solo.port);
  auto me = "127.0.0.1:" + std::to_string(solo.port);
  REQUIRE(sc->cordon(me, true));
  auto ss = sc->open_session({});
  REQUIRE(ss);
  check_error((*ss)->create(env_of(), 1), errc::overloaded, "cordoned");
  auto st = sc->stats();
  REQUIRE(st);
  CHECK(st->cordoned);
  auto solo_drained = sc->drain(me, 1s);
  REQUIRE_MESSAGE(solo_drained, describe(solo_drained.error_value()));
  CHECK(*solo_drained == 0);
  REQUIRE(sc->cordon(me, false));
  CHECK((*ss)->create(env_of(), 1));
  check_error(sc->cordon("127.0.0.1:2", true), errc::not_found, me);
}

TEST_CASE("fork in a cluster: the diff of a sandbox on another node than the coordinator's is "
          "copied to the coordinator, so the forks spread over the nodes and each fetches it; "
          "all see the source's files; a snapshot by name runs anywhere later") {
  cluster cl(2);
  auto s = cl.c->open_session({.quota = 40});
  REQUIRE(s);
  auto n1 = cl.node_name(0);
  REQUIRE((*s)->create(env_of(), 9));
  auto on_n1 = by_node(**s)[n1];
  REQUIRE_MESSAGE(!on_n1.empty(), spread_text(by_node(**s)));
  auto src = on_n1.front();
  auto w = (*s)->exec(src, cmd({"sh", "-c", "echo made on n1 > /tmp/state"}));
  REQUIRE_MESSAGE(w, describe(w.error_value()));

  // (before: the forks placed on other nodes than n1 failed, 2 of 6 made)
  auto forks = (*s)->fork(src, 6);
  REQUIRE_MESSAGE(forks, describe(forks.error_value()));
  CHECK(forks->size() == 6);
  std::set<std::string> nodes;
  auto l = (*s)->list();
  REQUIRE(l);
  for (const auto& i : *l)
    if (std::find(forks->begin(), forks->end(), i.id) != forks->end())
      nodes.insert(i.node);
  CHECK_MESSAGE(nodes.size() >= 2, "the forks are on " << nodes.size() << " node(s)");
  for (const auto& id : *forks) {
    auto r = (*s)->exec(id, cmd({"cat", "/tmp/state"}));
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->out == "made on n1\n");
  }
  // A snapshot by name, run later, on every node.
  auto snap = (*s)->snapshot(src, "n1snap@1");
  REQUIRE_MESSAGE(snap, describe(snap.error_value()));
  auto w2 = (*s)->exec(src, cmd({"sh", "-c", "echo changed after > /tmp/state"}));
  REQUIRE(w2);
  environment env;
  env.snapshot = "n1snap@1";
  auto later = (*s)->create(env, 9);
  REQUIRE_MESSAGE(later, describe(later.error_value()));
  CHECK(later->size() == 9);
  for (const auto& id : *later) {
    auto r = (*s)->exec(id, cmd({"cat", "/tmp/state"}));
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->out == "made on n1\n");
  }
  REQUIRE((*s)->close());
}

TEST_CASE("a node joined with --slots 0 stays a member and gets no sandbox") {
  cluster cl(1, {}, {"--slots", "0"});
  auto n1 = cl.node_name(0);
  auto m = cl.member(n1);
  REQUIRE(m);
  CHECK(m->last.slots == 0);
  auto s = cl.c->open_session({.quota = 20});
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 12);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  CHECK(ids->size() == 12);
  CHECK(by_node(**s)[n1].empty());
  CHECK(by_node(**s)[cl.coord_name()].size() == 12);
}

// Without the check the node would get them first: the coordinator's own node
// fills last.
TEST_CASE("a node whose state disk has less than --min-free-disk free gets no sandbox; the "
          "others take them, and nothing fails") {
  // 1,000,000 TiB: more than any disk has free.
  cluster cl(1, {}, {"--min-free-disk", "1000000t"});
  auto n1 = cl.node_name(0);
  auto s = cl.c->open_session({.quota = 20});
  REQUIRE(s);
  std::vector<error> failures;
  auto ids = (*s)->create(env_of(), 12, {}, [&](const error& e) { failures.push_back(e); });
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  CHECK(ids->size() == 12);
  CHECK(failures.empty());
  CHECK(by_node(**s)[n1].empty());
  CHECK(by_node(**s)[cl.coord_name()].size() == 12);
  // Asked directly, the node says why.
  auto direct = connect(cl.sys, cl.nodes[0]->port);
  auto ds = direct->find_session("default");
  REQUIRE(ds);
  check_error((*ds)->create(env_of(), 1), errc::overloaded, "--min-free-disk");
}

TEST_CASE("kill -9 of a node: its sandboxes are reported lost, new creates land elsewhere, it "
          "restarts and rejoins, nothing leaks") {
  auto before = settled_snapshot();
  {
    cluster cl(2);
    auto s = cl.c->open_session({.quota = 200});
    REQUIRE(s);
    auto w = (*s)->watch();
    REQUIRE(w);
    auto ids = (*s)->create(env_of(), 30);
    REQUIRE(ids);
    auto spread = by_node(**s);
    auto victim = cl.node_name(0);
    auto doomed = spread[victim];
    REQUIRE_MESSAGE(!doomed.empty(), spread_text(spread));
    // A session with a trajectory log, with sandboxes there too.
    auto logged = cl.c->open_session({.quota = 50, .trajectory = true});
    REQUIRE(logged);
    REQUIRE((*logged)->create(env_of(), 12));
    auto logged_doomed = by_node(**logged)[victim];
    REQUIRE(!logged_doomed.empty());
    // Commands in flight there when it dies: each is answered with `lost`.
    auto expect_lost = [](session& in, const std::string& id) {
      auto r = in.exec(id, cmd({"/bin/sleep", "60"}));
      CHECK_FALSE(r);
      if (!r)
        CHECK_MESSAGE(r.error_value().code == errc::lost, describe(r.error_value()));
    };
    std::thread slow([&, id = doomed.front()] { expect_lost(**s, id); });
    std::thread slow_logged([&, id = logged_doomed.front()] { expect_lost(**logged, id); });
    std::this_thread::sleep_for(300ms); // let it start; not a measurement
    uint16_t port = cl.nodes[0]->port;
    auto t0 = clock_type::now();
    cl.nodes[0]->stop(SIGKILL);

    std::set<std::string> told;
    double last_ms = 0;
    auto deadline = clock_type::now() + 60s;
    while (told.size() < doomed.size() && clock_type::now() < deadline) {
      auto ev = (*w)->next(200ms);
      REQUIRE(ev);
      if (*ev && (*ev)->kind == chronus_kind::lost) {
        told.insert((*ev)->sandbox_id);
        CHECK((*ev)->text.find(victim) != std::string::npos);
        last_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
      }
    }
    CHECK(told == std::set<std::string>(doomed.begin(), doomed.end()));
    MESSAGE(doomed.size() << " sandboxes of the killed node reported lost after " << last_ms
                          << " ms");
    slow.join();
    slow_logged.join();
    REQUIRE((*logged)->close());
    auto r = (*s)->exec(doomed.back(), cmd({"/bin/true"}));
    check_error(r, errc::lost, victim);
    // The node is lost; new sandboxes go to the others.
    auto m = cl.members();
    bool seen_lost = false;
    for (const auto& x : m)
      if (x.name == victim)
        seen_lost = seen_lost || x.state == "lost";
    CHECK(seen_lost);
    auto more = (*s)->create(env_of(), 40);
    REQUIRE(more);
    CHECK(more->size() == 40);
    auto after = by_node(**s);
    CHECK(after.count(victim) == 0);

    // It restarts on its state dir and port: it collects what the killed
    // process left and joins again.
    cl.nodes[0] = cl.start_node(0, port);
    CHECK_MESSAGE(eventually([&] { return cl.member(victim).has_value(); }, 60s),
                  cl.nodes[0]->bg.out());
    CHECK(cl.nodes[0]->bg.out().find("removed") != std::string::npos);
    auto back = (*s)->create(env_of(), 30);
    REQUIRE(back);
    CHECK(by_node(**s).count(victim) == 1);
    REQUIRE((*s)->close());
  }
  check_nothing_left(before);
}

TEST_CASE("a trajectory log in a cluster: packs taken on a node that is gone; its sandboxes are "
          "rebuilt on the others from the shared trajectory dir") {
  auto before = settled_snapshot();
  {
    cluster cl(2);
    auto victim = cl.node_name(0);
    std::string sid;
    std::vector<std::string> ids, on_victim;
    auto step = cmd({"sh", "-c",
                     "mkdir -p /work && echo one >> /work/runs && i=0; "
                     "while [ $i -lt 1200 ]; do : > /work/f$i; i=$((i+1)); done; "
                     "wc -l < /work/runs"});
    {
      // The first trainer: a command in each sandbox on the victim node, with
      // enough files that its pack is a file of the dir, not inline in the log.
      auto c = connect(cl.sys, cl.coord->port);
      auto s = c->open_session({.quota = 30, .trajectory = true});
      REQUIRE(s);
      sid = (*s)->id();
      // Keyed: a resumed session gives a create its logged sandboxes by key
      // (an unkeyed create is always fresh).
      auto made = (*s)->create(env_of(), 30, create_labels{"batch", {}});
      REQUIRE(made);
      for (const auto& m : *made)
        ids.push_back(m.id);
      on_victim = by_node(**s)[victim];
      REQUIRE_MESSAGE(!on_victim.empty(), spread_text(by_node(**s)));
      for (const auto& id : on_victim) {
        auto r = (*s)->exec(id, step);
        REQUIRE_MESSAGE(r, describe(r.error_value()));
        CHECK(r->out == "1\n");
      }
    } // the trainer goes: its sandboxes go, its log stays
    REQUIRE(eventually_gone(*cl.c, ids));
    size_t packs = 0;
    for (const auto& e : std::filesystem::directory_iterator(actor_layers() + "/trajectories/"
                                                              + sid + "/packs"))
      (void) e, ++packs;
    CHECK(packs >= on_victim.size());
    // The node that took the packs goes too.
    cl.nodes[0]->stop(SIGTERM);
    REQUIRE(eventually([&] { return !cl.member(victim).has_value(); }, 60s));
    auto s = cl.c->resume_session(sid);
    REQUIRE_MESSAGE(s, describe(s.error_value()));
    // The trainer again: the same create and step are answered from the log,
    // then a new command rebuilds each sandbox from its pack.
    auto again = (*s)->create(env_of(), 30, create_labels{"batch", {}});
    REQUIRE_MESSAGE(again, describe(again.error_value()));
    std::set<std::string> first(ids.begin(), ids.end()), second;
    for (const auto& m : *again)
      second.insert(m.id);
    CHECK(second == first);
    for (const auto& id : on_victim) {
      auto logged = (*s)->exec(id, step);
      REQUIRE_MESSAGE(logged, describe(logged.error_value()));
      CHECK(logged->out == "1\n");
      auto r = (*s)->exec(id, cmd({"sh", "-c", "cat /work/runs; ls /work | wc -l"}));
      REQUIRE_MESSAGE(r, describe(r.error_value()));
      CHECK(r->out == "one\n1201\n");
    }
    auto where = by_node(**s);
    CHECK(where.count(victim) == 0);
    MESSAGE(on_victim.size() << " sandboxes packed on " << victim << ", rebuilt on: "
                             << spread_text(where));
    REQUIRE((*s)->close());
  }
  check_nothing_left(before);
}

TEST_CASE("a hung node is lost by its missing heartbeats, then destroys its sandboxes and rejoins") {
  cluster cl(2);
  auto s = cl.c->open_session({.quota = 100});
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 30);
  REQUIRE(ids);
  auto victim = cl.node_name(1);
  auto doomed = by_node(**s)[victim];
  REQUIRE(!doomed.empty());
  cl.nodes[1]->bg.kill(SIGSTOP);
  bool lost = eventually([&] {
    for (const auto& x : cl.members())
      if (x.name == victim && x.state == "lost")
        return x.why.find("no heartbeat") != std::string::npos;
    return false;
  }, 60s);
  cl.nodes[1]->bg.kill(SIGCONT);
  REQUIRE(lost);
  auto r = (*s)->exec(doomed.front(), cmd({"/bin/true"}));
  check_error(r, errc::lost, victim);
  // Awake again: it hears it was declared lost, destroys what it had, rejoins.
  REQUIRE_MESSAGE(eventually([&] {
    auto m = cl.member(victim);
    return m && m->last.live == 0;
  }, 60s), cl.nodes[1]->bg.out());
  CHECK(cl.nodes[1]->bg.wait_for_output("declared lost", 10s));
  // Each of its sandboxes went saying why (its log line on stderr), not the
  // generic "by its trainer"; then the node said how many went.
  CHECK(cl.nodes[1]->bg.wait_for_output("which the coordinator declared lost; joining again", 30s));
  const auto& logged = cl.nodes[1]->bg.err();
  CHECK_MESSAGE(logged.find("declared its node lost (it missed its heartbeats)") != std::string::npos,
                logged);
  CHECK_MESSAGE(logged.find("by its trainer") == std::string::npos, logged);
  // `cluster status` shows it once, up.
  size_t rows = 0;
  for (const auto& x : cl.members())
    rows += x.name == victim;
  CHECK(rows == 1);
  // The session that lived through it uses it again.
  auto more = (*s)->create(env_of(), 40);
  REQUIRE_MESSAGE(more, describe(more.error_value()));
  CHECK(more->size() == 40);
  CHECK_MESSAGE(by_node(**s).count(victim) == 1, spread_text(by_node(**s)));
  auto there = by_node(**s)[victim];
  REQUIRE(!there.empty());
  auto e = (*s)->exec(there.front(), cmd({"/bin/true"}));
  CHECK_MESSAGE(e, describe(e.error_value()));
  REQUIRE((*s)->close());
}

TEST_CASE("ps through the coordinator while a node hangs: the others' sandboxes within 3 s each, "
          "the hung node named; errors in words") {
  // A long --beat-timeout: the hung node stays a member (not yet lost) while
  // it is asked.
  cluster cl(2, {"--beat-timeout", "60s"}, {"--beat-timeout", "60s"});
  auto s = cl.c->open_session({.quota = 100});
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 30);
  REQUIRE(ids);
  auto spread = by_node(**s);
  auto victim = cl.node_name(1);
  auto doomed = spread[victim];
  REQUIRE_MESSAGE(!doomed.empty(), spread_text(spread));
  REQUIRE(!spread[cl.node_name(0)].empty());
  cl.nodes[1]->bg.kill(SIGSTOP);
  struct resume_node {
    dsecd_proc& p;
    ~resume_node() { p.bg.kill(SIGCONT); }
  } resume{*cl.nodes[1]};

  auto all = cl.c->list_all();
  REQUIRE_MESSAGE(all, describe(all.error_value()));
  CHECK(all->missing == std::vector<std::string>{victim});
  std::set<std::string> listed;
  for (const auto& i : all->sandboxes)
    listed.insert(i.id);
  for (const auto& id : spread[cl.node_name(0)])
    CHECK(listed.count(id) == 1);
  for (const auto& id : doomed)
    CHECK(listed.count(id) == 0);
  // The command line prints the others' rows, names the node, exits 1.
  auto coord = "127.0.0.1:" + std::to_string(cl.coord->port);
  auto ps = run_process({suite::get().dsec_bin(), "--connect", coord, "ps"});
  CHECK_MESSAGE(ps.status == 1, ps.describe());
  CHECK(ps.out.find(spread[cl.node_name(0)].front()) != std::string::npos);
  CHECK(ps.out.find(doomed.front()) == std::string::npos);
  CHECK_MESSAGE(ps.err.find("node " + victim + " did not answer within 3 s")
                  != std::string::npos, ps.describe());
  // The session's list: its sandboxes there are rows of "no answer".
  auto mine = (*s)->list();
  REQUIRE(mine);
  size_t silent = 0;
  for (const auto& i : *mine)
    if (i.state == "no answer") {
      ++silent;
      CHECK(std::find(doomed.begin(), doomed.end(), i.id) != doomed.end());
    }
  CHECK(silent == doomed.size());
  auto sps = run_process({suite::get().dsec_bin(), "--connect", coord, "ps", "--session",
                          (*s)->id()});
  CHECK_MESSAGE(sps.status == 1, sps.describe());
  CHECK(sps.err.find("did not answer within 3 s") != std::string::npos);
  cl.nodes[1]->bg.kill(SIGCONT);
  auto back = cl.c->list_all();
  REQUIRE(back);
  CHECK(back->missing.empty());

  // A layer no store holds: the nodes' errors name their layer source by its
  // address, never by CAF's ids.
  std::vector<error> failures;
  (void) (*s)->create(env_of("nolayer@1"), 3, {},
                      [&](const error& e) { failures.push_back(e); });
  REQUIRE(!failures.empty());
  bool named = false;
  for (const auto& e : failures) {
    CHECK_MESSAGE(!shows_caf_internals(e.message), e.message);
    named = named || e.message.find("the coordinator " + cl.coord_name()) != std::string::npos;
  }
  CHECK_MESSAGE(named, describe(failures.front()));
  MESSAGE("a create of an unknown layer: " << describe(failures.front()));
}

TEST_CASE("a hung node whose connection times out first (--client-timeout < --beat-timeout) is "
          "reported as hung, a killed one as dropped") {
  cluster cl(2, {"--beat-timeout", "60s", "--client-timeout", "3s"}, {"--beat-timeout", "60s"});
  auto hung = cl.node_name(1);
  cl.nodes[1]->bg.kill(SIGSTOP);
  std::string why;
  bool lost = eventually([&] {
    for (const auto& x : cl.members())
      if (x.name == hung && x.state == "lost") {
        why = x.why;
        return true;
      }
    return false;
  }, 60s);
  cl.nodes[1]->bg.kill(SIGCONT);
  REQUIRE(lost);
  MESSAGE("the hung node: " << why);
  CHECK(why.find("no heartbeat for") != std::string::npos);
  CHECK(why.find("connection timed out") != std::string::npos);
  CHECK(why.find("died") == std::string::npos);
  CHECK(!shows_caf_internals(why));
  auto killed = cl.node_name(0);
  cl.nodes[0]->stop(SIGKILL);
  REQUIRE(eventually([&] {
    for (const auto& x : cl.members())
      if (x.name == killed && x.state == "lost") {
        why = x.why;
        return true;
      }
    return false;
  }, 60s));
  MESSAGE("the killed node: " << why);
  CHECK(why.find("connection dropped (the process died") != std::string::npos);
  // Restarted on its state dir, it collects what the killed process left.
  cl.nodes[0] = cl.start_node(0, 0);
  CHECK(eventually([&] { return cl.up() == 3; }, 60s));
}

TEST_CASE("the coordinator dies and none comes back: each node keeps its sandboxes for "
          "--orphan-grace, then destroys them; nodes rejoin a coordinator started later") {
  auto before = settled_snapshot();
  {
    cluster cl(2, {}, {"--orphan-grace", "500ms"});
    auto s = cl.c->open_session({.quota = 100});
    REQUIRE(s);
    auto ids = (*s)->create(env_of(), 30);
    REQUIRE(ids);
    auto spread = by_node(**s);
    std::vector<std::unique_ptr<client>> direct;
    for (size_t i = 0; i < 2; ++i) {
      direct.push_back(connect(cl.sys, cl.nodes[i]->port));
      auto st = direct.back()->stats();
      REQUIRE(st);
      CHECK(st->live == spread[cl.node_name(i)].size());
    }
    uint16_t port = cl.coord->port;
    cl.c.reset();
    s->reset();
    cl.coord->stop(SIGKILL);
    for (size_t i = 0; i < 2; ++i) {
      CHECK(cl.nodes[i]->bg.wait_for_output("are kept for 500 ms (--orphan-grace)", 10s));
      CHECK_MESSAGE(eventually([&] {
        auto st = direct[i]->stats();
        return st && st->live == 0;
      }, 60s), cl.nodes[i]->bg.out());
    }
    // A new coordinator on the same port: the nodes join it again, with
    // nothing to report.
    cl.coord = std::make_unique<dsecd_proc>(std::vector<std::string>{
      "--coordinator", "--slots", "200", "--listen", "127.0.0.1:" + std::to_string(port)});
    cl.c = connect(cl.sys, cl.coord->port);
    CHECK(eventually([&] { return cl.up() == 3; }, 60s));
    CHECK(cl.coord->bg.out().find("kept") == std::string::npos);
  }
  check_nothing_left(before);
}

TEST_CASE("kill -9 of the coordinator mid-session, `tools/cluster restart coordinator`: the "
          "trainer's client reconnects by itself, its session goes on with the sandboxes it "
          "had (exec works), new creates work, a call in flight failed with disconnected; "
          "nothing left after down") {
  auto before = settled_snapshot();
  temp_dir dir{"/tmp", "dsec-coord-restart"};
  auto cdir = dir / "c";
  int base = 10000 + static_cast<int>(::getpid() % 5000);
  spawn_options o;
  o.kill_after = std::chrono::seconds(180);
  auto script = cluster_script();
  // The coordinator runs no sandbox (--coordinator-slots 0): those of its
  // own node would die with its process.
  auto up = run_process({script, "up", "2", "--dir", cdir, "--port", std::to_string(base),
                         "--slots", "50", "--coordinator-slots", "0", "--", "--orphan-grace",
                         "120s"},
                        o);
  REQUIRE_MESSAGE(up.status == 0, up.describe());
  auto pid_of = [&](const std::string& name) { return daemon_pid(cdir, name); };
  {
    temp_dir src;
    REQUIRE(::mkdir((src / "bin").c_str(), 0755) == 0);
    auto cp = run_process({"/bin/cp", "/bin/busybox", src / "bin/busybox"});
    REQUIRE(cp.status == 0);
    auto built = run_process({suite::get().dsec_bin(), "--state", cdir + "/coordinator/state",
                              "layer", "build", "--kind", "base", "crbase@1", src.path()});
    REQUIRE_MESSAGE(built.status == 0, built.describe());
    environment env;
    env.base = "crbase@1";
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, static_cast<uint16_t>(base));
    auto s = c->open_session({.quota = 40, .name = "restart-me"});
    REQUIRE(s);
    auto ids = (*s)->create(env, 30);
    REQUIRE_MESSAGE(ids, describe(ids.error_value()));
    REQUIRE(ids->size() == 30);
    auto spread = by_node(**s);
    CHECK_MESSAGE(spread.size() == 2, spread_text(spread));
    // Something in every sandbox that must still be there afterwards.
    for (const auto& id : *ids) {
      auto r = (*s)->exec(id, cmd({"/bin/busybox", "sh", "-c", "echo " + id + " > /tmp/mark"}));
      REQUIRE_MESSAGE(r, describe(r.error_value()));
      REQUIRE(r->exit_code == 0);
    }
    // A session with a trajectory log: not adopted, but resumed from its log
    // by the reconnecting client (its sandbox rebuilt from its pack).
    auto logged = c->open_session({.quota = 2, .trajectory = true});
    REQUIRE_MESSAGE(logged, describe(logged.error_value()));
    auto lids = (*logged)->create(env, 1);
    REQUIRE_MESSAGE(lids, describe(lids.error_value()));
    {
      auto w = (*logged)->exec(lids->front(), cmd({"/bin/busybox", "sh", "-c", "echo t > /mark-t"}));
      REQUIRE_MESSAGE(w, describe(w.error_value()));
    }
    // A session with a warm pool: the pool ends with the coordinator's
    // process (its pooled sandboxes monitor the session), and the client sets
    // it again once it has reattached.
    auto pooled = c->open_session({.quota = 4, .name = "pooled"});
    REQUIRE_MESSAGE(pooled, describe(pooled.error_value()));
    auto took = (*pooled)->pool(env, 2);
    REQUIRE_MESSAGE(took, describe(took.error_value()));
    CHECK(*took == 2);
    auto pool_of = [&](uint32_t& target, uint32_t& ready) {
      target = ready = 0;
      auto ps = c->pools();
      if (!ps)
        return false;
      for (const auto& p : *ps)
        if (p.owner == (*pooled)->id()) {
          target += p.target;
          ready += p.ready;
        }
      return true;
    };
    uint32_t target = 0, ready = 0;
    CHECK(eventually([&] { return pool_of(target, ready) && ready == 2; }, 60s));
    // A session whose creates have keys and tags: a restarted coordinator's
    // session gets them back from the nodes with the sandboxes.
    auto keyed = c->open_session({.quota = 8, .name = "keyed"});
    REQUIRE_MESSAGE(keyed, describe(keyed.error_value()));
    auto batch = (*keyed)->create(env, 3, create_labels{"batch", {{"task", "t1"}}});
    REQUIRE_MESSAGE(batch, describe(batch.error_value()));
    REQUIRE(batch->size() == 3);
    auto solo = (*keyed)->create(env, 1, create_labels{"solo", {{"task", "t2"}}});
    REQUIRE_MESSAGE(solo, describe(solo.error_value()));
    REQUIRE(solo->size() == 1);
    // A command in flight when the coordinator dies.
    waiter<exec_result> inflight;
    (*s)->exec_async(ids->front(), cmd({"/bin/busybox", "sleep", "60"}), inflight.done());

    pid_t old = pid_of("coordinator");
    REQUIRE(old > 0);
    REQUIRE(::kill(old, SIGKILL) == 0);
    auto r = inflight.get(); // never hangs: the link dropped
    REQUIRE_FALSE(r);
    CHECK_MESSAGE(r.error_value().code == errc::disconnected, describe(r.error_value()));
    // Calls made before the coordinator is back fail the same way.
    auto early = (*s)->list();
    CHECK_FALSE(early);
    if (!early)
      CHECK(early.error_value().code == errc::disconnected);

    auto t0 = clock_type::now();
    auto rs = run_process({script, "restart", "coordinator", "--dir", cdir}, o);
    REQUIRE_MESSAGE(rs.status == 0, rs.describe());
    auto t_restarted = clock_type::now();
    CHECK(pid_of("coordinator") != old);
    // The client reconnects by itself and reattaches the session: the same
    // handle lists the 30 sandboxes (each adopted as its node reported it).
    REQUIRE(c->wait_connected(60s));
    CHECK(c->reconnects() >= 1);
    std::vector<sandbox_info> listed;
    CHECK_MESSAGE(eventually([&] {
      auto l = (*s)->list();
      if (!l)
        return false;
      listed = *l;
      return listed.size() == 30;
    }, 60s), "listed " << listed.size());
    auto t_usable = clock_type::now();
    std::set<std::string> before_ids(ids->begin(), ids->end()), now_ids;
    for (const auto& i : listed) {
      now_ids.insert(i.id);
      // Its id names its node (actors/sandbox_id.hpp), and its session came
      // back with its name.
      CHECK_MESSAGE(names_node(i.id, i.node), i.id << " on " << i.node);
      CHECK(i.session == (*s)->id());
    }
    CHECK(now_ids == before_ids);
    // By id, without the session (the command line's path): the node the id
    // names answers.
    auto by_id = c->exec(ids->back(), cmd({"/bin/busybox", "cat", "/tmp/mark"}));
    REQUIRE_MESSAGE(by_id, describe(by_id.error_value()));
    CHECK(by_id->out == ids->back() + "\n");
    // Each still runs, with what it had (not re-created).
    for (const auto& id : *ids) {
      auto e = (*s)->exec(id, cmd({"/bin/busybox", "cat", "/tmp/mark"}));
      REQUIRE_MESSAGE(e, id << ": " << describe(e.error_value()));
      CHECK(e->out == id + "\n");
    }
    MESSAGE("coordinator restart: tools/cluster restart took "
            << std::chrono::duration_cast<std::chrono::milliseconds>(t_restarted - t0).count()
            << " ms; the session listed its 30 sandboxes "
            << std::chrono::duration_cast<std::chrono::milliseconds>(t_usable - t_restarted).count()
            << " ms after it returned");
    // The logged session was resumed (docs/trajectory.md): the trainer's
    // command given again is answered from the log; the next one runs in the
    // sandbox rebuilt from the pack after it, which has the file.
    {
      auto again = (*logged)->exec(lids->front(),
                                   cmd({"/bin/busybox", "sh", "-c", "echo t > /mark-t"}));
      REQUIRE_MESSAGE(again, describe(again.error_value()));
      CHECK(again->exit_code == 0);
      auto back = (*logged)->exec(lids->front(), cmd({"/bin/busybox", "cat", "/mark-t"}));
      REQUIRE_MESSAGE(back, describe(back.error_value()));
      CHECK_MESSAGE(back->out == "t\n", "exit " << back->exit_code << ": " << back->err);
      auto lc = (*logged)->close();
      CHECK_MESSAGE(lc, describe(lc.error_value()));
    }
    // The session's name and quota came back with it.
    auto found = c->find_session("restart-me");
    CHECK_MESSAGE(found, describe(found.error_value()));
    auto more = (*s)->create(env, 11);
    CHECK_FALSE(more); // 30 + 11 > quota 40
    more = (*s)->create(env, 5);
    REQUIRE_MESSAGE(more, describe(more.error_value()));
    CHECK(more->size() == 5);
    auto e = (*s)->exec(more->front(), cmd({"/bin/busybox", "true"}));
    CHECK_MESSAGE(e, describe(e.error_value()));
    auto closed = (*s)->close();
    REQUIRE_MESSAGE(closed, describe(closed.error_value()));
    CHECK(*closed == 35);
    // The keyed session's sandboxes came back with their keys and tags: its
    // keys are in use again (a create of one is refused), find() finds them.
    std::vector<sandbox_info> kl;
    CHECK_MESSAGE(eventually([&] {
      auto l = (*keyed)->list();
      if (!l)
        return false;
      kl = *l;
      return kl.size() == 4 && std::all_of(kl.begin(), kl.end(),
                                           [](const auto& i) { return !i.key.empty(); });
    }, 60s), "the keyed session lists " << kl.size());
    std::set<std::string> keys;
    for (const auto& i : kl) {
      keys.insert(i.key);
      CHECK(i.tags.at("task") == (i.key == "solo" ? "t2" : "t1"));
    }
    CHECK(keys == std::set<std::string>{"batch#0", "batch#1", "batch#2", "solo"});
    auto found_solo = (*keyed)->find("solo");
    REQUIRE_MESSAGE(found_solo, describe(found_solo.error_value()));
    CHECK(found_solo->id == solo->front().id);
    auto again_solo = (*keyed)->create(env, 1, create_labels{"solo", {}});
    REQUIRE_FALSE(again_solo);
    CHECK_MESSAGE(again_solo.error_value().code == errc::already_exists,
                  describe(again_solo.error_value()));
    auto again_batch = (*keyed)->create(env, 3, create_labels{"batch", {}});
    REQUIRE_FALSE(again_batch);
    CHECK(again_batch.error_value().code == errc::already_exists);
    auto kc = (*keyed)->close();
    CHECK_MESSAGE(kc, describe(kc.error_value()));
    // The warm pool is back, and a create of its session claims from it.
    CHECK_MESSAGE(eventually([&] { return pool_of(target, ready) && target == 2 && ready == 2; },
                             60s),
                  "the pooled session's pool after the restart: target " << target << ", ready "
                                                                          << ready);
    auto claimed = (*pooled)->create(env, 1);
    REQUIRE_MESSAGE(claimed, describe(claimed.error_value()));
    CHECK(claimed->size() == 1);
    CHECK(eventually([&] {
      auto ps = c->pools();
      uint64_t n = 0;
      if (ps)
        for (const auto& p : *ps)
          if (p.owner == (*pooled)->id())
            n += p.claimed;
      return n >= 1;
    }, 60s));
    auto pc = (*pooled)->close();
    CHECK_MESSAGE(pc, describe(pc.error_value()));
  }
  auto down = run_process({script, "down", "--dir", cdir}, o);
  CHECK_MESSAGE(down.status == 0, down.describe());
  struct stat st {};
  CHECK(::stat(cdir.c_str(), &st) != 0);
  check_nothing_left(before);
}

TEST_CASE("a node that rejoins a restarted coordinator late: until it hands its sandboxes "
          "over, the session answers them with disconnected (retry), not not_found; then "
          "they work") {
  // The chaos run met it: right after `restart coordinator`, a trainer's
  // command on a sandbox whose node had not handed it over yet got not_found,
  // which says the sandbox does not exist (do not retry).
  auto before = settled_snapshot();
  temp_dir dir{"/tmp", "dsec-late-rejoin"};
  auto cdir = dir / "c";
  int base = 15000 + static_cast<int>(::getpid() % 5000);
  spawn_options o;
  o.kill_after = std::chrono::seconds(180);
  auto script = cluster_script();
  struct downer {
    std::string script, dir;
    ~downer() { (void) run_process({script, "down", "--dir", dir}); }
  } guard{script, cdir};
  auto up = run_process({script, "up", "2", "--dir", cdir, "--port", std::to_string(base),
                         "--slots", "20", "--coordinator-slots", "0", "--", "--orphan-grace",
                         "120s"},
                        o);
  REQUIRE_MESSAGE(up.status == 0, up.describe());
  auto pid_of = [&](const std::string& name) { return daemon_pid(cdir, name); };
  auto addr_of = [&](const std::string& name) {
    std::ifstream f(cdir + "/" + name + "/port");
    std::string port;
    f >> port;
    return "127.0.0.1:" + port;
  };
  {
    temp_dir src;
    REQUIRE(::mkdir((src / "bin").c_str(), 0755) == 0);
    REQUIRE(run_process({"/bin/cp", "/bin/busybox", src / "bin/busybox"}).status == 0);
    auto built = run_process({suite::get().dsec_bin(), "--state", cdir + "/coordinator/state",
                              "layer", "build", "--kind", "base", "lrbase@1", src.path()});
    REQUIRE_MESSAGE(built.status == 0, built.describe());
    environment env;
    env.base = "lrbase@1";
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, static_cast<uint16_t>(base));
    auto s = c->open_session({.quota = 10, .name = "late"});
    REQUIRE(s);
    auto ids = (*s)->create(env, 6);
    REQUIRE_MESSAGE(ids, describe(ids.error_value()));
    auto spread = by_node(**s);
    REQUIRE_MESSAGE(spread.size() == 2, spread_text(spread));
    auto late_ids = spread[addr_of("node-2")];
    REQUIRE_FALSE(late_ids.empty());
    auto late = late_ids.front();

    // node-2 hangs; the coordinator dies before it could count node-2 lost
    // (--beat-timeout 1.5 s), and comes back without it.
    pid_t n2 = pid_of("node-2"), old = pid_of("coordinator");
    REQUIRE(::kill(n2, SIGSTOP) == 0);
    struct conter {
      pid_t pid;
      ~conter() { ::kill(pid, SIGCONT); }
    } resume{n2};
    REQUIRE(::kill(old, SIGKILL) == 0);
    auto rs = run_process({script, "restart", "coordinator", "--dir", cdir}, o);
    REQUIRE_MESSAGE(rs.status == 0, rs.describe());
    REQUIRE(c->wait_connected(60s));
    // node-1's sandboxes are back; node-2's are not known yet: retry.
    auto n1 = spread[addr_of("node-1")].front();
    CHECK(eventually([&] { return static_cast<bool>((*s)->exec(n1, cmd({"/bin/busybox", "true"}))); },
                     60s));
    auto r = (*s)->exec(late, cmd({"/bin/busybox", "true"}));
    REQUIRE_FALSE(r);
    CHECK_MESSAGE(r.error_value().code == errc::disconnected, describe(r.error_value()));
    CHECK_MESSAGE(r.error_value().message.find("not known to session") != std::string::npos,
                  r.error_value().message);
    // Awake, node-2 rejoins and hands them over: they work, as they were.
    REQUIRE(::kill(n2, SIGCONT) == 0);
    CHECK(eventually([&] { return static_cast<bool>((*s)->exec(late, cmd({"/bin/busybox", "true"}))); },
                     60s));
    auto l = (*s)->list();
    REQUIRE_MESSAGE(l, describe(l.error_value()));
    CHECK(l->size() == 6);
    // An id that no node holds: within the grace a node might still bring
    // it, so it gets the same answer (not_found once the grace is over).
    auto none = (*s)->exec("ffffffffffff", cmd({"/bin/busybox", "true"}));
    REQUIRE_FALSE(none);
    CHECK(none.error_value().code == errc::disconnected);
    auto closed = (*s)->close();
    REQUIRE_MESSAGE(closed, describe(closed.error_value()));
    CHECK(*closed == 6);
  }
  auto down = run_process({script, "down", "--dir", cdir}, o);
  CHECK_MESSAGE(down.status == 0, down.describe());
  check_nothing_left(before);
}

TEST_CASE("tools/cluster up 2 | status | down: joined, usable, then nothing left") {
  auto before = settled_snapshot();
  temp_dir dir{"/tmp", "dsec-tools-cluster"};
  auto cdir = dir / "c";
  // Ports: a range unlikely to be in use; the script refuses taken ones.
  int base = 15000 + static_cast<int>(::getpid() % 5000);
  spawn_options o;
  o.kill_after = std::chrono::seconds(180);
  auto script = env_path("DSEC_CLUSTER_SCRIPT");
  ::setenv("DSECD", env_path("DSECD_BIN").c_str(), 1);
  ::setenv("DSEC", suite::get().dsec_bin().c_str(), 1);
  auto up = run_process({script, "up", "2", "--dir", cdir, "--port", std::to_string(base),
                         "--slots", "50", "--", "--state-ignored-by-nobody"},
                        o);
  // An unknown dsecd option makes every daemon exit: up says so and cleans up.
  CHECK(up.status == 1);
  CHECK(up.err.find("exited; its log:") != std::string::npos);
  CHECK(up.err.find("unknown argument '--state-ignored-by-nobody'") != std::string::npos);
  struct stat st {};
  CHECK(::stat(cdir.c_str(), &st) != 0);

  up = run_process({script, "up", "2", "--dir", cdir, "--port", std::to_string(base),
                    "--slots", "50"},
                   o);
  REQUIRE_MESSAGE(up.status == 0, up.describe());
  CHECK(up.out.find("joined 3 of 3 nodes") != std::string::npos);
  CHECK(up.out.find("3 nodes up") != std::string::npos);
  auto again = run_process({script, "up", "1", "--dir", cdir, "--port", std::to_string(base + 10)});
  CHECK(again.status == 1);
  CHECK(again.err.find("a cluster is up in " + cdir) != std::string::npos);
  auto status = run_process({script, "status", "--dir", cdir});
  CHECK(status.status == 0);
  CHECK(status.out.find("3 nodes up") != std::string::npos);
  {
    // A layer built on the coordinator's store, as the script says to.
    temp_dir src;
    REQUIRE(::mkdir((src / "bin").c_str(), 0755) == 0);
    auto cp = run_process({"/bin/cp", "/bin/busybox", src / "bin/busybox"});
    REQUIRE(cp.status == 0);
    REQUIRE(::symlink("busybox", (src / "bin/sh").c_str()) == 0);
    auto built = run_process({suite::get().dsec_bin(), "--state", cdir + "/coordinator/state",
                              "layer", "build", "--kind", "base", "tcbase@1", src.path()});
    REQUIRE_MESSAGE(built.status == 0, built.describe());
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, static_cast<uint16_t>(base));
    auto s = c->open_session({.quota = 30});
    REQUIRE(s);
    environment env;
    env.base = "tcbase@1";
    auto ids = (*s)->create(env, 30);
    REQUIRE_MESSAGE(ids, describe(ids.error_value()));
    CHECK(ids->size() == 30);
    auto spread = by_node(**s);
    CHECK_MESSAGE(spread.size() == 3, spread_text(spread));
    for (const auto& [node, boxes] : spread) {
      auto r = (*s)->exec(boxes.front(), cmd({"/bin/sh", "-c", "echo ok"}));
      REQUIRE_MESSAGE(r, node << ": " << describe(r.error_value()));
      CHECK(r->out == "ok\n");
    }
  }
  auto down = run_process({script, "down", "--dir", cdir});
  CHECK_MESSAGE(down.status == 0, down.describe());
  CHECK(down.out.find("stopped coordinator") != std::string::npos);
  CHECK(down.out.find("removed " + cdir) != std::string::npos);
  CHECK(::stat(cdir.c_str(), &st) != 0);
  check_nothing_left(before);
}

TEST_CASE("tools/cluster restart: a node killed with kill -9 comes back with its arguments and "
          "rejoins; a running or stopped one is refused; an unknown name exits 2") {
  auto before = settled_snapshot();
  temp_dir dir{"/tmp", "dsec-tools-cluster-restart"};
  auto cdir = dir / "c";
  int base = 20000 + static_cast<int>(::getpid() % 5000);
  spawn_options o;
  o.kill_after = std::chrono::seconds(180);
  auto script = cluster_script();
  auto up = run_process({script, "up", "2", "--dir", cdir, "--port", std::to_string(base),
                         "--slots", "50", "--", "--orphan-grace", "30s"},
                        o);
  REQUIRE_MESSAGE(up.status == 0, up.describe());
  auto pid_of = [&](const std::string& name) { return daemon_pid(cdir, name); };
  auto restart = [&](const std::string& name) {
    return run_process({script, "restart", name, "--dir", cdir}, o);
  };
  {
    auto r = restart("node-1");
    CHECK(r.status == 1);
    CHECK_MESSAGE(r.err.find("node-1 (pid " + std::to_string(pid_of("node-1")) + ") is running")
                    != std::string::npos,
                  r.describe());
    r = restart("node-9");
    CHECK(r.status == 2);
    CHECK_MESSAGE(r.err.find("known: coordinator, node-1, node-2") != std::string::npos,
                  r.describe());
    r = restart("coordinator-2");
    CHECK(r.status == 2);
    CHECK(r.err.find("this script starts one coordinator") != std::string::npos);
    // A stopped (hung) daemon is not dead: refused too, with what to do.
    pid_t two = pid_of("node-2");
    REQUIRE(two > 0);
    REQUIRE(::kill(two, SIGSTOP) == 0);
    r = restart("node-2");
    ::kill(two, SIGCONT);
    CHECK(r.status == 1);
    CHECK_MESSAGE(r.err.find("is stopped (SIGSTOP)") != std::string::npos, r.describe());
    CHECK(r.err.find("kill -CONT " + std::to_string(two)) != std::string::npos);
  }
  {
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, static_cast<uint16_t>(base));
    auto victim = "127.0.0.1:" + std::to_string(base + 1);
    auto state_of = [&](const std::string& name) {
      auto m = c->cluster();
      std::string st;
      if (m)
        for (const auto& x : *m)
          if (x.name == name)
            st = x.state;
      return st;
    };
    auto all_up = [&] {
      auto m = c->cluster();
      size_t k = 0;
      if (m)
        for (const auto& x : *m)
          k += x.state == "up";
      return k == 3;
    };
    REQUIRE(eventually(all_up, 60s)); // node-2 may have been lost while it was stopped
    pid_t old = pid_of("node-1");
    REQUIRE(old > 0);
    REQUIRE(::kill(old, SIGKILL) == 0);
    CHECK(eventually([&] { return state_of(victim) == "lost"; }, 60s));
    auto r = restart("node-1");
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out.find("restarted node-1") != std::string::npos);
    pid_t now = pid_of("node-1");
    CHECK(now != old);
    // The same command line, `-- EXTRA` arguments and the cluster key included.
    std::ifstream f("/proc/" + std::to_string(now) + "/cmdline");
    std::string line((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::replace(line.begin(), line.end(), '\0', ' ');
    CHECK_MESSAGE(line.find("--listen " + victim) != std::string::npos, line);
    CHECK(line.find("--state " + cdir + "/node-1/state") != std::string::npos);
    CHECK(line.find("--cluster-key " + cdir + "/coordinator/state/cluster.key")
          != std::string::npos);
    CHECK(line.find("--trajectories " + cdir + "/trajectories") != std::string::npos);
    CHECK(line.find("--orphan-grace 30s") != std::string::npos);
    // restart waited until the coordinator lists it up again.
    CHECK(state_of(victim) == "up");
    auto status = run_process({script, "status", "--dir", cdir});
    CHECK(status.out.find("3 nodes up") != std::string::npos);
    // Once it is back, a create through the coordinator lands there too (a
    // layer built on the coordinator's store, fetched by the nodes).
    temp_dir src;
    REQUIRE(::mkdir((src / "bin").c_str(), 0755) == 0);
    auto cp = run_process({"/bin/cp", "/bin/busybox", src / "bin/busybox"});
    REQUIRE(cp.status == 0);
    auto built = run_process({suite::get().dsec_bin(), "--state", cdir + "/coordinator/state",
                              "layer", "build", "--kind", "base", "rsbase@1", src.path()});
    REQUIRE_MESSAGE(built.status == 0, built.describe());
    environment env;
    env.base = "rsbase@1";
    auto s = c->open_session({.quota = 30});
    REQUIRE(s);
    auto ids = (*s)->create(env, 30);
    REQUIRE_MESSAGE(ids, describe(ids.error_value()));
    auto spread = by_node(**s);
    REQUIRE_MESSAGE(spread.count(victim) == 1, spread_text(spread));
    auto e = (*s)->exec(spread[victim].front(), cmd({"/bin/busybox", "true"}));
    CHECK_MESSAGE(e, describe(e.error_value()));
    REQUIRE((*s)->close());
    // Killed and restarted at once (the coordinator may not have noticed yet,
    // the old process may still be exiting): it comes back all the same.
    old = now;
    REQUIRE(::kill(old, SIGKILL) == 0);
    r = restart("node-1");
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    CHECK(pid_of("node-1") != old);
    CHECK(eventually([&] { return state_of(victim) == "up"; }, 60s));
    // Now it runs: a second restart is refused.
    r = restart("node-1");
    CHECK(r.status == 1);
    CHECK(r.err.find("is running") != std::string::npos);
  }
  auto down = run_process({script, "down", "--dir", cdir}, o);
  CHECK_MESSAGE(down.status == 0, down.describe());
  CHECK(down.out.find("stopped node-1") != std::string::npos);
  struct stat st {};
  CHECK(::stat(cdir.c_str(), &st) != 0);
  check_nothing_left(before);
}

TEST_CASE("with --tls a node holding a certificate of the CA joins; one without is refused") {
  temp_dir dir{"/tmp", "dsec-cluster-tls"};
  auto script = env_path("DSEC_CLUSTER_SCRIPT");
  auto certs = script.substr(0, script.rfind('/')) + "/tls-certs";
  auto made = run_process({certs, dir / "tls"});
  REQUIRE_MESSAGE(made.status == 0, made.describe());
  REQUIRE(::mkdir((dir / "a").c_str(), 0700) == 0);
  REQUIRE(::mkdir((dir / "b").c_str(), 0700) == 0);
  dsecd_proc coord({"--coordinator", "--tls", dir / "tls"});
  auto where = "127.0.0.1:" + std::to_string(coord.port);
  auto key = actor_layers() + "/cluster.key"; // the coordinator's: made in its state dir
  dsecd_proc good(
    {"--join", where, "--tls", dir / "tls", "--state", dir / "a", "--cluster-key", key});
  dsecd_proc bad({"--join", where, "--state", dir / "b", "--cluster-key", key});
  CHECK(good.bg.wait_for_output("joined the cluster of " + where, 60s));
  CHECK(bad.bg.wait_for_output("cannot join the coordinator " + where, 60s));
  auto status = run_process({suite::get().dsec_bin(), "--connect", where, "--tls", dir / "tls",
                             "cluster", "status"});
  CHECK_MESSAGE(status.status == 0, status.describe());
  CHECK(status.out.find("127.0.0.1:" + std::to_string(good.port)) != std::string::npos);
  CHECK(status.out.find("127.0.0.1:" + std::to_string(bad.port)) == std::string::npos);
  CHECK(status.out.find("2 nodes up") != std::string::npos);
}

TEST_CASE("tools/cluster up -- --tls DIR: waits with TLS, its hints say --tls, status and down work") {
  temp_dir dir{"/tmp", "dsec-tools-cluster-tls"};
  auto script = env_path("DSEC_CLUSTER_SCRIPT");
  auto certs = script.substr(0, script.rfind('/')) + "/tls-certs";
  auto made = run_process({certs, dir / "tls"});
  REQUIRE_MESSAGE(made.status == 0, made.describe());
  auto cdir = dir / "c";
  int base = 25000 + static_cast<int>(::getpid() % 5000);
  ::setenv("DSECD", env_path("DSECD_BIN").c_str(), 1);
  ::setenv("DSEC", suite::get().dsec_bin().c_str(), 1);
  ::unsetenv("DSEC_TLS");
  spawn_options o;
  o.kill_after = std::chrono::seconds(180);
  auto up = run_process({script, "up", "1", "--dir", cdir, "--port", std::to_string(base),
                         "--slots", "10", "--", "--tls", dir / "tls"},
                        o);
  REQUIRE_MESSAGE(up.status == 0, up.describe());
  CHECK(up.out.find("joined 2 of 2 nodes") != std::string::npos);
  CHECK(up.out.find("--tls " + (dir / "tls") + " run --base NAME@VERSION -- echo hello")
        != std::string::npos);
  auto status = run_process({script, "status", "--dir", cdir});
  CHECK_MESSAGE(status.status == 0, status.describe());
  CHECK(status.out.find("2 nodes up") != std::string::npos);
  auto help = run_process({script, "--help"});
  CHECK(help.out.find("set -euo") == std::string::npos);
  auto down = run_process({script, "down", "--dir", cdir});
  CHECK_MESSAGE(down.status == 0, down.describe());
}

TEST_CASE("--backend sim: 8 simulated nodes in the coordinator take 2,000 sandboxes in batches, "
          "spread over all; exec works; close destroys all; nothing is left") {
  auto before = settled_snapshot();
  {
    dsecd_proc coord({"--coordinator", "--backend", "sim", "--sim-nodes", "8", "--sim-slots",
                      "400"});
    CHECK(coord.bg.out().find("simulated backend, 8 nodes x 400 slots") != std::string::npos);
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, coord.port);
    auto status = [&] {
      auto m = c->cluster();
      REQUIRE_MESSAGE(m, "cluster status: " << describe(m.error_value()));
      return *m;
    };
    REQUIRE(eventually([&] { return status().size() == 8; }, 60s));
    std::set<std::string> names;
    for (const auto& m : status()) {
      CHECK(m.state == "up");
      CHECK_FALSE(m.coordinator);
      CHECK(m.last.slots == 400);
      names.insert(m.name);
    }
    CHECK(names == std::set<std::string>{"sim-1", "sim-2", "sim-3", "sim-4", "sim-5", "sim-6",
                                         "sim-7", "sim-8"});
    auto s = c->open_session({.quota = 2000});
    REQUIRE_MESSAGE(s, describe(s.error_value()));
    std::vector<std::string> all;
    for (int b = 0; b < 4; ++b) {
      auto ids = (*s)->create(env_of(), 500);
      REQUIRE_MESSAGE(ids, describe(ids.error_value()));
      CHECK(ids->size() == 500);
      all.insert(all.end(), ids->begin(), ids->end());
    }
    CHECK(std::set<std::string>(all.begin(), all.end()).size() == 2000);
    auto spread = by_node(**s);
    MESSAGE("2000 simulated sandboxes: " << spread_text(spread));
    CHECK(spread.size() == 8);
    size_t total = 0;
    for (const auto& [node, ids] : spread) {
      CHECK(node.rfind("sim-", 0) == 0);
      CHECK_MESSAGE(ids.size() >= 100, node << " got " << ids.size());
      total += ids.size();
    }
    CHECK(total == 2000);
    // Commands exit 0 with no output; files are not simulated.
    auto r = (*s)->exec(all.front(), cmd({"/bin/echo", "hi"}));
    REQUIRE_MESSAGE(r, describe(r.error_value()));
    CHECK(r->exit_code == 0);
    CHECK(r->out.empty());
    auto byid = c->exec(all.back(), cmd({"true"}));
    REQUIRE_MESSAGE(byid, describe(byid.error_value()));
    CHECK(byid->exit_code == 0);
    check_error((*s)->get(all.front(), "/etc"), errc::unsupported, "simulated");
    // The nodes' heartbeats count them.
    CHECK(eventually([&] {
      uint64_t live = 0;
      for (const auto& m : status())
        live += m.last.live;
      return live == 2000;
    }, 30s));
    auto n = (*s)->close();
    REQUIRE(n);
    CHECK(*n == 2000);
    CHECK(eventually([&] {
      uint64_t live = 0;
      for (const auto& m : status())
        live += m.last.live;
      return live == 0;
    }, 30s));
    // A session with a trajectory log needs a state dir, which a sim has not.
    auto t = c->open_session({.trajectory = true});
    check_error(t, errc::unsupported, "trajectory");
    auto res = coord.stop(SIGTERM);
    CHECK(res.status == 0);
  }
  check_nothing_left(before);
}

TEST_CASE("--backend sim: calls in flight get disconnected when the client closes or the daemon "
          "dies (the client's one watcher per destination)") {
  // Commands take an hour: they are in flight until something gives.
  dsecd_proc coord({"--coordinator", "--backend", "sim", "--sim-nodes", "2", "--sim-exec", "1h"});
  test_system ts;
  caf::actor_system sys{ts.cfg};
  struct results {
    std::mutex mu;
    std::vector<error> errs;
    size_t values = 0;
  };
  auto r = std::make_shared<results>();
  auto done = [r](expected<exec_result> x) {
    std::lock_guard g{r->mu};
    if (x)
      ++r->values;
    else
      r->errs.push_back(x.error_value());
  };
  auto count = [r] {
    std::lock_guard g{r->mu};
    return r->errs.size() + r->values;
  };
  {
    auto c = connect(sys, coord.port);
    auto s = c->open_session({});
    REQUIRE_MESSAGE(s, describe(s.error_value()));
    auto ids = (*s)->create(env_of(), 1);
    REQUIRE(ids);
    for (int i = 0; i < 3; ++i)
      (*s)->exec_async(ids->front(), cmd({"true"}), done);
    s->reset();
    c.reset(); // the client goes first: its calls hear so
    REQUIRE(eventually([&] { return count() == 3; }, 30s));
    std::lock_guard g{r->mu};
    CHECK(r->values == 0);
    for (const auto& e : r->errs) {
      CHECK(e.code == errc::disconnected);
      CHECK_MESSAGE(e.message.find("client was closed first") != std::string::npos, describe(e));
    }
    r->errs.clear();
  }
  auto c = connect(sys, coord.port);
  auto s = c->open_session({});
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 2);
  REQUIRE(ids);
  for (int i = 0; i < 4; ++i)
    (*s)->exec_async((*ids)[i % 2], cmd({"true"}), done);
  coord.stop(SIGKILL); // the daemon goes: every call in flight hears so
  REQUIRE(eventually([&] { return count() == 4; }, 30s));
  std::lock_guard g{r->mu};
  CHECK(r->values == 0);
  for (const auto& e : r->errs) {
    CHECK(e.code == errc::disconnected);
    CHECK_MESSAGE(e.message.find("gone") != std::string::npos, describe(e));
    CHECK_MESSAGE(!shows_caf_internals(e.message), describe(e));
  }
}

TEST_CASE("--backend sim: clear errors for bad flags") {
  auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), env_path("DSECD_BIN"));
    return run_process(args);
  };
  auto alone = run({"--backend", "sim"});
  CHECK(alone.status == 2);
  CHECK(alone.err.find("--backend sim simulates a whole cluster and needs --coordinator")
        != std::string::npos);
  auto zero = run({"--coordinator", "--backend", "sim", "--sim-nodes", "0"});
  CHECK(zero.status == 2);
  CHECK(zero.err.find("--sim-nodes: expected a whole number from 1") != std::string::npos);
  auto other = run({"--coordinator", "--backend", "qemu"});
  CHECK(other.status == 2);
  CHECK(other.err.find("--backend: expected 'real' or 'sim'") != std::string::npos);
  auto stray = run({"--coordinator", "--sim-create", "5ms"});
  CHECK(stray.status == 2);
  CHECK(stray.err.find("--sim-create is for --backend sim") != std::string::npos);
  auto dur = run({"--coordinator", "--backend", "sim", "--sim-exec", "soon"});
  CHECK(dur.status == 2);
  CHECK(dur.err.find("--sim-exec") != std::string::npos);
}

TEST_CASE("cluster flags and verbs: clear errors") {
  auto both = run_process({env_path("DSECD_BIN"), "--coordinator", "--join", "127.0.0.1:1"});
  CHECK(both.status == 2);
  CHECK(both.err.find("--coordinator and --join exclude each other") != std::string::npos);
  auto noport = run_process({env_path("DSECD_BIN"), "--join", "somewhere"});
  CHECK(noport.status == 2);
  CHECK(noport.err.find("--join: expected HOST:PORT") != std::string::npos);
  auto beat = run_process({env_path("DSECD_BIN"), "--coordinator", "--beat-interval", "2s",
                           "--beat-timeout", "1s"});
  CHECK(beat.status == 2);
  CHECK(beat.err.find("--beat-timeout must be longer") != std::string::npos);
  // A dsecd that is not a coordinator has no cluster.
  dsecd_proc plain;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, plain.port);
  check_error(c->cluster(), errc::unsupported, "not a cluster's coordinator");
  auto cli = run_process({suite::get().dsec_bin(), "--connect",
                          "127.0.0.1:" + std::to_string(plain.port), "cluster", "status"});
  CHECK(cli.status == 1);
  CHECK(cli.err.find("--coordinator") != std::string::npos);
}

TEST_CASE("cluster status lists the warm pools of every node") {
  cluster cl(1);
  auto took = cl.c->pool(env_of(), 2); // spread over the coordinator's node and node-1
  REQUIRE_MESSAGE(took, describe(took.error_value()));
  auto where = "127.0.0.1:" + std::to_string(cl.coord->port);
  auto status = [&](bool json) {
    std::vector<std::string> argv{suite::get().dsec_bin(), "--connect", where, "cluster",
                                  "status"};
    if (json)
      argv.emplace_back("--json");
    return run_process(argv);
  };
  proc_result r;
  CHECK(eventually([&] {
    r = status(false);
    return r.status == 0 && r.out.find("POOL ON") != std::string::npos
           && std::regex_search(r.out, std::regex{"node +" + std::string{tar_base}});
  }));
  CHECK_MESSAGE(r.out.find(tar_base) != std::string::npos, r.describe());
  auto j = status(true);
  REQUIRE_MESSAGE(j.status == 0, j.describe());
  auto py = run_process({"/usr/bin/python3", "-c",
                         "import json,sys; d=json.load(sys.stdin); "
                         "print(sum(p['target'] for p in d['pools']), "
                         "{p['environment']['base'] for p in d['pools']} == {'" +
                           std::string{tar_base} + "'})"},
                        spawn_options{j.out});
  CHECK_MESSAGE(py.out == "2 True\n", py.describe() << j.out);
  REQUIRE(cl.c->pool(env_of(), 0));
}

TEST_CASE("warm pools in a cluster: a session's single creates go to the node that holds its "
          "pool's ready sandbox, and claim it") {
  cluster cl(2);
  auto so = cl.c->open_session({.quota = 8});
  REQUIRE_MESSAGE(so, describe(so.error_value()));
  auto& s = *so;
  auto took = s->pool(env_of(), 1); // one node of three gets it (the first by name)
  REQUIRE_MESSAGE(took, describe(took.error_value()));
  REQUIRE(*took == 1);
  // The pool's node and its counts, as the coordinator saw them at that
  // node's last heartbeat (what placement goes by).
  struct seen {
    std::string node;
    uint32_t ready = 0;
    uint64_t claimed = 0;
  };
  auto look = [&] {
    seen out;
    for (const auto& m : cl.members())
      for (const auto& p : m.last.pools)
        if (p.owner == s->id()) {
          out.node = m.name;
          out.ready = p.ready;
          out.claimed = p.claimed;
        }
    return out;
  };
  seen at;
  REQUIRE_MESSAGE(eventually([&] { return (at = look()).ready == 1; }, 60s),
                  "the pool's sandbox was never reported ready");
  for (uint64_t round = 1; round <= 5; ++round) {
    auto ids = s->create(env_of(), 1);
    REQUIRE_MESSAGE(ids, describe(ids.error_value()));
    REQUIRE(ids->size() == 1);
    auto spread = by_node(*s);
    CHECK_MESSAGE(spread[at.node].size() == 1, "round " << round << ": " << spread_text(spread)
                                                        << " (the pool is on " << at.node << ")");
    REQUIRE(s->destroy(ids->front()));
    // Claimed there, refilled, and reported again before the next create.
    REQUIRE_MESSAGE(eventually([&] {
                      auto now = look();
                      return now.ready == 1 && now.claimed == round;
                    }, 60s),
                    "round " << round << ": the pool did not refill (claimed " << look().claimed
                             << ")");
  }
  REQUIRE(s->close());
}

TEST_CASE("process handles through the coordinator: a command on another node gets stdin, a "
          "signal and its end, through the session and by id") {
  auto before = settled_snapshot();
  {
    cluster cl(1);
    auto s = cl.c->open_session({.quota = 40});
    REQUIRE_MESSAGE(s, describe(s.error_value()));
    auto ids = (*s)->create(env_of(), 20);
    REQUIRE_MESSAGE(ids, describe(ids.error_value()));
    auto spread = by_node(**s);
    REQUIRE_MESSAGE(!spread[cl.node_name(0)].empty(), spread_text(spread));
    auto id = spread[cl.node_name(0)].front(); // on the node, not the coordinator
    auto req = cmd({"wc", "-c"});
    req.handle = true;
    req.open_stdin = true;
    auto check_feed = [&](std::unique_ptr<process> p) {
      auto eid = p->id();
      REQUIRE_MESSAGE(eid, describe(eid.error_value()));
      REQUIRE(p->write(std::string(600u << 10, 'z'))); // beyond the node's buffer
      REQUIRE(p->close_stdin());
      auto r = p->wait();
      REQUIRE_MESSAGE(r, describe(r.error_value()));
      CHECK(r->out == std::to_string(600u << 10) + "\n");
    };
    SUBCASE("through the session (its relay)") {
      check_feed((*s)->start(id, req));
    }
    SUBCASE("by id, through the coordinator's scheduler") {
      check_feed(cl.c->start(id, req));
    }
    SUBCASE("a detached command's log and end, by id through the coordinator and the session") {
      auto det = cmd({"sh", "-c", "echo out; echo err >&2; exit 5"});
      det.detach = true;
      auto started = (*s)->exec(id, det);
      REQUIRE_MESSAGE(started, describe(started.error_value()));
      logs_request q;
      q.wait = true; // each read waits for news while the command is live
      std::string out, err;
      expected<logs_reply> l = logs_reply{};
      for (int reads = 0; reads < 100; ++reads) { // a bound, not a timing
        l = cl.c->logs(id, q);
        REQUIRE_MESSAGE(l, describe(l.error_value()));
        for (const auto& p : l->pieces)
          (p.stream == 1 ? out : err) += p.data;
        q.since = l->next;
        if (!l->live)
          break;
      }
      CHECK_FALSE(l->live);
      CHECK(out == "out\n");
      CHECK(err == "err\n");
      REQUIRE(l->commands.size() == 1);
      CHECK_FALSE(l->commands[0].running);
      CHECK(l->commands[0].exit_code == 5);
      auto again = (*s)->logs(id, logs_request{});
      REQUIRE_MESSAGE(again, describe(again.error_value()));
      CHECK(again->next == 8);
      CHECK(again->pieces.size() == 2);
    }
    SUBCASE("a signal, and cancel") {
      auto sleeper = cmd({"sleep", "1000"});
      sleeper.handle = true;
      auto p = (*s)->start(id, sleeper);
      REQUIRE(p->id());
      REQUIRE(p->signal(SIGTERM));
      auto r = p->wait();
      REQUIRE_MESSAGE(r, describe(r.error_value()));
      CHECK(r->signal == SIGTERM);
      auto q = cl.c->start(id, sleeper);
      REQUIRE(q->id());
      q->cancel();
      CHECK(eventually([&] {
        auto l = cl.c->list();
        if (!l)
          return false;
        for (const auto& i : *l)
          if (i.id == id)
            return i.running == 0;
        return false;
      }));
    }
    auto n = (*s)->close();
    REQUIRE(n);
  }
  check_nothing_left(before);
}

TEST_CASE("tools/cluster up --netns: each daemon in a network namespace of its own; a "
          "partitioned node is lost while the others answer, and rejoins once healed; down "
          "removes the namespaces") {
  // iproute2's first `ip netns add` on a machine makes /run/netns a mount of
  // its own (bound on itself, shared), and it stays: the machine's from then
  // on, not the cluster's. Made before the snapshot, with a namespace of ours.
  auto probe = "dsec-test-" + std::to_string(::getpid());
  auto made = run_process({"/bin/sh", "-c", "PATH=/usr/sbin:/sbin:$PATH; ip netns add \"$0\" && "
                                             "ip netns del \"$0\"", probe});
  REQUIRE_MESSAGE(made.status == 0, made.describe());
  auto before = settled_snapshot();
  temp_dir dir{"/tmp", "dsec-tools-cluster-netns"};
  auto cdir = dir / "c";
  auto script = cluster_script();
  spawn_options o;
  o.kill_after = std::chrono::seconds(180);
  // Whatever fails below, the daemons and namespaces go before the dir does.
  struct downer {
    std::string script, dir;
    ~downer() { (void) run_process({script, "down", "--dir", dir}); }
  } guard{script, cdir};
  auto up = run_process({script, "up", "2", "--netns", "--dir", cdir, "--port", "7400",
                         "--slots", "8"},
                        o);
  REQUIRE_MESSAGE(up.status == 0, up.describe());
  auto file = [&](const std::string& path) {
    std::ifstream f(cdir + "/" + path);
    std::string v;
    std::getline(f, v);
    return v;
  };
  auto coord = file("coordinator/addr");
  CHECK(coord.rfind("198.18.", 0) == 0);
  // The hint runs clients in the fabric's namespace, with the certificates made.
  const std::string net_opt = "nsenter --net=/run/netns/";
  auto at = up.out.find(net_opt + "dsec-");
  REQUIRE_MESSAGE(at != std::string::npos, up.out);
  at += net_opt.size();
  auto fabric = up.out.substr(at, up.out.find(' ', at) - at);
  CHECK(fabric.ends_with("-fabric"));
  CHECK(fabric.size() > 13);
  auto prefix = fabric.substr(0, fabric.size() - std::string{"fabric"}.size()); // dsec-ID-
  auto dsec_in = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{"/usr/bin/nsenter", "--net=/run/netns/" + fabric, "--",
                                  suite::get().dsec_bin(), "--connect", coord, "--tls",
                                  cdir + "/certs"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, o);
  };
  auto netns_of = [](const std::string& pid) {
    std::error_code ec;
    return std::filesystem::read_symlink("/proc/" + pid + "/ns/net", ec).string();
  };
  std::set<std::string> seen{netns_of("self")};
  for (const char* d : {"coordinator", "node-1", "node-2"}) {
    auto ns = netns_of(file(std::string{d} + "/pid"));
    CHECK_MESSAGE(!ns.empty(), d);
    CHECK_MESSAGE(seen.insert(ns).second, d << " shares a network namespace: " << ns);
  }
  auto status = run_process({script, "status", "--dir", cdir}, o);
  CHECK_MESSAGE(status.out.find("3 nodes up") != std::string::npos, status.describe());

  // Sandboxes through the coordinator, then their node cut off.
  temp_dir src;
  REQUIRE(::mkdir((src / "bin").c_str(), 0755) == 0);
  REQUIRE(run_process({"/bin/cp", "/bin/busybox", src / "bin/busybox"}).status == 0);
  auto built = run_process({suite::get().dsec_bin(), "--state", cdir + "/coordinator/state",
                            "layer", "build", "--kind", "base", "nsbase@1", src.path()});
  REQUIRE_MESSAGE(built.status == 0, built.describe());
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto r = dsec_in({"run", "--detach", "--base", "nsbase@1", "--", "/bin/busybox", "sleep",
                      "600"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    ids.push_back(lines_of(r.out).at(0));
  }
  auto ps = dsec_in({"ps"});
  REQUIRE_MESSAGE(ps.status == 0, ps.describe());
  // The node of the first sandbox, and its name in the cluster's dir.
  std::string victim_addr, victim;
  for (const auto& l : lines_of(ps.out))
    if (l.rfind(ids[0], 0) == 0)
      victim_addr = l.substr(l.find("198.18."), l.find(' ', l.find("198.18.")) - l.find("198.18."));
  for (const char* d : {"coordinator", "node-1", "node-2"})
    if (file(std::string{d} + "/addr") == victim_addr)
      victim = d;
  REQUIRE_MESSAGE(!victim.empty(), ps.out);
  if (victim == "coordinator") {
    // The coordinator's own node holds them: cutting it off would cut off
    // every client; this run checks only the namespaces and the bridge.
    MESSAGE("the sandboxes landed on the coordinator's own node: no partition checked");
  } else {
    auto part = run_process({script, "partition", victim, "--dir", cdir}, o);
    REQUIRE_MESSAGE(part.status == 0, part.describe());
    CHECK(run_process({script, "partition", victim, "--dir", cdir}, o).status == 1);
    auto state = [&] {
      auto r = dsec_in({"cluster", "status", "--json"});
      auto k = r.out.find("\"name\":\"" + victim_addr + "\",\"state\":\"");
      if (k == std::string::npos)
        return std::string{};
      auto v = k + victim_addr.size() + 19;
      return r.out.substr(v, r.out.find('"', v) - v);
    };
    CHECK(eventually([&] { return state() == "lost"; }, 60s));
    // The others answer meanwhile: status names the lost node, ps does not hang.
    auto st = dsec_in({"cluster", "status"});
    CHECK_MESSAGE(st.out.find("no heartbeat") != std::string::npos, st.describe());
    ps = dsec_in({"ps"});
    CHECK_MESSAGE(ps.status == 0, ps.describe());
    CHECK(ps.out.find(ids[0]) == std::string::npos);
    auto heal = run_process({script, "heal", victim, "--dir", cdir}, o);
    REQUIRE_MESSAGE(heal.status == 0, heal.describe());
    CHECK(eventually([&] { return state() == "up"; }, 60s));
    CHECK(eventually(
      [&] { return run_process({"/bin/cat", cdir + "/" + victim + "/log"}).out.find(
                     "which the coordinator declared lost") != std::string::npos; },
      60s));
    CHECK(run_process({script, "heal", victim, "--dir", cdir}, o).status == 1);
  }
  // A new sandbox runs, and its command's output comes back over the bridge.
  auto r = dsec_in({"run", "--base", "nsbase@1", "--", "/bin/busybox", "echo", "over the bridge"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(r.out == "over the bridge\n");
  auto down = run_process({script, "down", "--dir", cdir}, o);
  CHECK_MESSAGE(down.status == 0, down.describe());
  auto list = run_process({"/usr/sbin/ip", "netns", "list"});
  CHECK_MESSAGE(list.out.find(prefix) == std::string::npos, list.out);
  check_nothing_left(before);
}

} // namespace dsec::test
