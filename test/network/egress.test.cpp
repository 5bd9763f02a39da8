// Egress networking end to end (docs/network.md), with real kernel objects and
// no packet leaving the machine: each test case makes an "internet" network
// namespace holding HTTP servers (busybox httpd) on 198.18.0.2 and 198.18.0.3,
// joined to the host by a veth that is the node's --uplink (198.18.0.1 on the
// host's end). Sandboxes get /31s of 198.19.0.0/24 and reach the servers only
// as their policy says. Every object the test makes (netns, veth, servers) is
// removed by its fixture; every object dsecd makes (veths, table, dummy link)
// must be gone after destroy, shutdown, and a kill -9 followed by a restart.
#include <doctest/doctest.h>

#include <net/if.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/client.hpp"
#include "runtime/chronus.hpp"
#include "runtime/egress.hpp"
#include "runtime/metrics.hpp"
#include "runtime/netlink.hpp"
#include "test/actors/common.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"
#include "test/support/skip.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

namespace fs = std::filesystem;

const char* ip_bin() { return fs::exists("/usr/sbin/ip") ? "/usr/sbin/ip" : "/sbin/ip"; }

void sh(const std::vector<std::string>& argv) {
  auto r = run_process(argv);
  REQUIRE_MESSAGE(r.status == 0, argv[0] << " " << (argv.size() > 1 ? argv[1] : "") << " "
                                         << (argv.size() > 2 ? argv[2] : "") << ": "
                                         << r.describe());
}

bool have_tools() {
  return fs::exists(ip_bin()) && fs::exists("/bin/busybox") && ::geteuid() == 0;
}

// The host's probe (test/probe), for checks from the node itself.
std::string probe() { return env_path("DSEC_PROBE"); }

// The "internet": a netns with two addresses and servers on them, behind a veth.
struct internet {
  std::string tag = std::to_string(::getpid());
  std::string ns = "dsec-inet-" + tag;
  std::string uplink = "dtu" + tag; // never a dsecd prefix (dx....)
  std::string www = suite::get().root() + "/www-" + tag;
  std::vector<std::unique_ptr<background>> servers;

  internet() {
    // What killed runs of this suite left (their pid is in the names).
    auto netns = run_process({ip_bin(), "netns", "list"});
    std::istringstream lines{netns.out};
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("dsec-inet-", 0) != 0)
        continue;
      auto pid = std::atoi(line.c_str() + 10);
      if (pid > 0 && ::kill(pid, 0) < 0 && errno == ESRCH) {
        auto name = line.substr(0, line.find(' '));
        (void) run_process({"/bin/sh", "-c", std::string{ip_bin()} + " netns pids " + name
                                               + " | xargs -r kill -9"});
        (void) run_process({ip_bin(), "netns", "del", name});
        (void) run_process({ip_bin(), "link", "del", "dtu" + std::to_string(pid)});
      }
    }
    // Leftovers of a crashed earlier run with our pid: ours to remove.
    (void) run_process({ip_bin(), "netns", "del", ns});
    (void) run_process({ip_bin(), "link", "del", uplink});
    fs::create_directories(www);
    std::ofstream{www + "/index.html"} << "hello from the test internet\n";
    sh({ip_bin(), "netns", "add", ns});
    sh({ip_bin(), "link", "add", uplink, "type", "veth", "peer", "name", "inet0", "netns", ns});
    sh({ip_bin(), "addr", "add", "198.18.0.1/24", "dev", uplink});
    sh({ip_bin(), "link", "set", uplink, "up"});
    sh({ip_bin(), "-n", ns, "addr", "add", "198.18.0.2/24", "dev", "inet0"});
    sh({ip_bin(), "-n", ns, "addr", "add", "198.18.0.3/24", "dev", "inet0"});
    sh({ip_bin(), "-n", ns, "link", "set", "inet0", "up"});
    sh({ip_bin(), "-n", ns, "link", "set", "lo", "up"});
    for (const char* at : {"198.18.0.2:8000", "198.18.0.2:8001", "198.18.0.3:8000"})
      serve_in_ns(at);
    // The node's own address, served on the host itself.
    servers.push_back(std::make_unique<background>(std::vector<std::string>{
      "/bin/busybox", "httpd", "-f", "-p", "198.18.0.1:8002", "-h", www}));
    for (const char* a : {"198.18.0.2 8000", "198.18.0.2 8001", "198.18.0.3 8000",
                          "198.18.0.1 8002"}) {
      std::string s{a};
      auto sp = s.find(' ');
      REQUIRE_MESSAGE(eventually([&] {
                        auto r = run_process({probe(), "http-get", s.substr(0, sp),
                                              s.substr(sp + 1), "1000"});
                        return r.out.rfind("ok HTTP/1.", 0) == 0;
                      }),
                      "the test server at " << std::string{a} << " did not come up");
    }
  }
  // An authoritative DNS server for the test's names on 198.18.0.2:53.
  void start_dns() {
    servers.push_back(std::make_unique<background>(std::vector<std::string>{
      ip_bin(), "netns", "exec", ns, "/usr/sbin/dnsmasq", "--keep-in-foreground", "--no-resolv",
      "--no-hosts", "--bind-interfaces", "--listen-address=198.18.0.2", "--port=53",
      "--local-ttl=60", "--pid-file=", "--user=root", "--address=/allowed.test/198.18.0.3",
      "--address=/denied.test/198.18.0.2", "--address=/wild.test/198.18.0.2",
      "--address=/svc.test/198.18.0.3"}));
    REQUIRE_MESSAGE(eventually([&] {
                      auto r = run_process({"/bin/busybox", "nslookup", "allowed.test", "198.18.0.2"});
                      return r.out.find("198.18.0.3") != std::string::npos;
                    }),
                    "dnsmasq did not come up");
  }
  void serve_in_ns(const std::string& at) {
    servers.push_back(std::make_unique<background>(std::vector<std::string>{
      ip_bin(), "netns", "exec", ns, "/bin/busybox", "httpd", "-f", "-p", at, "-h", www}));
  }
  ~internet() {
    servers.clear(); // SIGKILLed and reaped
    (void) run_process({ip_bin(), "netns", "del", ns});
    (void) run_process({ip_bin(), "link", "del", uplink});
    std::error_code ec;
    fs::remove_all(www, ec);
  }
};

daemon_options egress_daemon(const internet& net) {
  daemon_options o;
  egress_options e;
  e.uplink = net.uplink;
  e.sandbox_net = "198.19.0.0/24";
  o.egress = e;
  return o;
}

environment egress_env(std::vector<std::string> allow, std::vector<std::string> deny = {}) {
  auto env = env_of();
  env.net = env.egress = true;
  env.allow = std::move(allow);
  env.deny = std::move(deny);
  return env;
}

std::unique_ptr<session> open(client& c) {
  auto s = c.open_session({}, true);
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

std::string make_one(session& s, const environment& env) {
  std::vector<std::string> failures;
  auto ids = s.create(env, 1, {}, [&](const error& e) { failures.push_back(describe(e)); });
  REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
  REQUIRE_MESSAGE(ids->size() == 1, "create failed: " << (failures.empty() ? "?" : failures[0]));
  return ids->front();
}

// What `probe http-get ADDR PORT` prints in the sandbox: "ok HTTP/1.0 200 OK"
// when it got through, "ETIMEDOUT" when the SYN was dropped.
std::string get(session& s, const std::string& id, const std::string& addr, int port) {
  auto r = s.exec(id, cmd({"/usr/bin/probe", "http-get", addr, std::to_string(port), "1500"}));
  REQUIRE_MESSAGE(r, "exec: " << describe(r.error_value()));
  auto out = r->out;
  while (!out.empty() && out.back() == '\n')
    out.pop_back();
  return out;
}

bool reached(const std::string& probe_out) { return probe_out.rfind("ok HTTP/1.", 0) == 0; }

std::string tag_of(const std::string& state) { return egress_tag(state); }

// dsecd's objects of this tag on the host: links and the table.
std::vector<std::string> leftovers(const std::string& tag) {
  std::vector<std::string> out;
  auto nl = rtnl::open();
  REQUIRE(nl);
  auto links = nl->links_with_prefix("dx" + tag);
  REQUIRE(links);
  for (auto& l : *links)
    out.push_back("link " + l);
  auto r = run_process({"/usr/sbin/nft", "list", "table", "inet", "dsec_" + tag});
  if (r.status == 0)
    out.push_back("table inet dsec_" + tag);
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v)
    s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "(nothing)" : s;
}

// A series of this process's /metrics (the embedded daemon's); -1: none.
double metric(const std::string& series) {
  auto text = metrics::process_registry().expose();
  auto at = text.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size() + 2));
}

// While its daemon runs: only the veths of namespaces wired ahead are left
// (dsecd --egress-prewire), as many as its gauge says are ready.
bool only_prewired_left(const std::string& tag) {
  return eventually([&] {
    auto nl = rtnl::open();
    auto links = nl ? nl->links_with_prefix("dx" + tag + "_") : expected<std::vector<std::string>>{
                                                                    std::vector<std::string>{}};
    return links && static_cast<double>(links->size()) == metric("dsec_egress_prewired");
  });
}

bool veths_gone(const std::string& tag) {
  return eventually([&] {
    auto nl = rtnl::open();
    auto links = nl ? nl->links_with_prefix("dx" + tag + "_") : expected<std::vector<std::string>>{
                                                                    std::vector<std::string>{}};
    return links && links->empty();
  });
}

} // namespace

TEST_SUITE("network") {

TEST_CASE("policy rules parse, and bad ones are named" ) {
  auto r = parse_net_rule("198.18.0.0/24:8000-8010");
  REQUIRE(r);
  CHECK(r->what == net_rule::kind::cidr);
  CHECK(r->net.to_string() == "198.18.0.0/24");
  CHECK(r->port_lo == 8000);
  CHECK(r->port_hi == 8010);
  CHECK(parse_net_rule("1.2.3.4")->port_hi == 65535);
  CHECK(parse_net_rule("*.example.org")->what == net_rule::kind::wildcard);
  CHECK(parse_net_rule("Example.ORG")->name == "example.org");
  CHECK(parse_net_rule("pypi")->what == net_rule::kind::service);
  for (const char* bad : {"10.0.0.1/8", "1.2.3.4:0", "1.2.3.4:70000", "1.2.3.4:9-8", "300.1.1.1",
                          "*.org", "a..b", "", "1.2.3.4/33"}) {
    auto p = parse_net_rule(bad);
    CHECK_MESSAGE(!p, bad << " parsed");
    if (!p)
      CHECK(p.error_value().code == errc::invalid_argument);
  }
  CHECK(parse_net_rule("10.0.0.1/8").error_value().message.find("10.0.0.0/8")
        != std::string::npos);
  auto special = always_denied_ranges();
  CHECK(names_special(*parse_ipv4_net("169.254.169.254"), special));
  CHECK(names_special(*parse_ipv4_net("10.1.0.0/16"), special));
  CHECK_FALSE(names_special(*parse_ipv4_net("198.18.0.0/24"), special)); // tests' internet
  CHECK_FALSE(names_special(*parse_ipv4_net("0.0.0.0/0"), special));
  CHECK_FALSE(names_special(*parse_ipv4_net("8.8.8.0/24"), special));
  // The environment checks its rules and its mode.
  auto env = env_of();
  env.allow = {"1.2.3.4"};
  CHECK_FALSE(env.validate());
  env.net = env.egress = true;
  CHECK(env.validate());
  env.allow = {"1.2.3.4/8"};
  CHECK_FALSE(env.validate());
  CHECK(env.set_network("bogus").error_value().message.find("bogus") != std::string::npos);
}

TEST_CASE("an egress sandbox reaches what its policy allows, nothing else"
          * skip_unless(have_tools(), "needs root, ip (iproute2) and busybox")) {
  internet net;
  embedded e{egress_daemon(net)};
  auto tag = tag_of(actor_layers());
  auto s = open(*e.c);
  // Its 2 spawners keep 4 namespaces each wired ahead (veth, /31, route,
  // loopback): both sandboxes below join one.
  REQUIRE(eventually([&] { return metric("dsec_egress_prewired") == 8; }));
  auto id = make_one(*s, egress_env({"198.18.0.2:8000"}));
  // The allowed address and port.
  CHECK(reached(get(*s, id, "198.18.0.2", 8000)));
  // The same address on another port, another address on the allowed port.
  CHECK(get(*s, id, "198.18.0.2", 8001) == "ETIMEDOUT");
  CHECK(get(*s, id, "198.18.0.3", 8000) == "ETIMEDOUT");
  // The node's own addresses: the uplink's (with a server on it) and the
  // sandbox's gateway, even when a rule names them.
  auto id2 = make_one(*s, egress_env({"198.18.0.0/24"}));
  CHECK(reached(get(*s, id2, "198.18.0.3", 8000)));
  CHECK(reached(get(*s, id2, "198.18.0.2", 8001)));
  CHECK(get(*s, id2, "198.18.0.1", 8002) == "ETIMEDOUT");
  // A sandbox has eth0 with a 198.19.0.x address, and the other sandbox's
  // address is not reachable from it (even with a listener there).
  auto a = s->exec(id, cmd({"/usr/bin/probe", "if-addr", "eth0"}));
  auto b = s->exec(id2, cmd({"/usr/bin/probe", "if-addr", "eth0"}));
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->out.rfind("198.19.0.", 0) == 0);
  auto b_addr = b->out.substr(0, b->out.find('\n'));
  REQUIRE(s->exec(id2, cmd({"/usr/bin/probe", "tcp-listen-all", "9000"})));
  auto to_b = s->exec(id, cmd({"/usr/bin/probe", "http-get", b_addr, "9000", "1500"}));
  REQUIRE(to_b);
  CHECK(to_b->out.rfind("ok", 0) != 0);
  // An exposed port reaches the egress sandbox's loopback whatever its
  // policy (the forwarded connection never crosses its veth or the table).
  auto hello = s->exec(id, cmd({"/usr/bin/probe", "tcp-listen", "7000"}));
  REQUIRE(hello);
  auto exposed = s->expose(id, 7000);
  REQUIRE_MESSAGE(exposed, describe(exposed.error_value()));
  auto via = run_process({probe(), "tcp-connect", std::to_string(exposed->host_port)});
  CHECK_MESSAGE(via.out == "ok hello\n", via.describe());
  CHECK(metric("dsec_egress_prewire_total{outcome=\"taken\"}") == 2);
  CHECK(metric("dsec_egress_prewire_total{outcome=\"missed\"}") == 0);
  // The stats count what was allowed and denied.
  auto st = node_stats_of(*e.c);
  CHECK(st.egress_sandboxes == 2);
  CHECK(st.egress_allowed >= 3);
  CHECK(st.egress_denied >= 4);
  // Destroyed: the veths go with the sandboxes' namespaces.
  REQUIRE(s->destroy(id));
  REQUIRE(s->destroy(id2));
  CHECK_MESSAGE(only_prewired_left(tag), "left: " << join(leftovers(tag)));
  CHECK(node_stats_of(*e.c).egress_sandboxes == 0);
}

TEST_CASE("each egress sandbox's traffic is counted, and what it is denied reaches its session "
          "as events"
          * skip_unless(have_tools(), "needs root, ip (iproute2) and busybox")) {
  internet net;
  embedded e{egress_daemon(net)};
  auto s = open(*e.c);
  auto w = s->watch();
  REQUIRE_MESSAGE(w, describe(w.error_value()));
  auto a = make_one(*s, egress_env({"198.18.0.2:8000"}));
  auto b = make_one(*s, egress_env({}));
  CHECK(reached(get(*s, a, "198.18.0.2", 8000)));
  CHECK(reached(get(*s, a, "198.18.0.2", 8000)));
  CHECK(get(*s, a, "198.18.0.3", 8000) == "ETIMEDOUT");
  CHECK(get(*s, b, "198.18.0.2", 8001) == "ETIMEDOUT");
  // One event per sandbox and destination, naming both (the node looks for
  // them about once a second).
  std::map<std::string, std::vector<std::string>> denied; // by sandbox
  auto collect = [&](std::chrono::milliseconds for_) {
    auto until = std::chrono::steady_clock::now() + for_;
    while (std::chrono::steady_clock::now() < until) {
      auto ev = w.value()->next(std::chrono::milliseconds(200));
      REQUIRE(ev);
      if (*ev && (*ev)->kind == chronus_kind::denied) {
        CHECK((*ev)->seq == 0);
        denied[(*ev)->sandbox_id].push_back((*ev)->text);
      }
    }
  };
  REQUIRE(eventually([&] {
    collect(std::chrono::milliseconds(200));
    return denied[a].size() >= 1 && denied[b].size() >= 1;
  }));
  CHECK(denied[a] == std::vector<std::string>{"tcp 198.18.0.3:8000"});
  CHECK(denied[b] == std::vector<std::string>{"tcp 198.18.0.2:8001"});
  // The same destination again within the node's memory of it: no new
  // event; another destination: one.
  CHECK(get(*s, a, "198.18.0.3", 8000) == "ETIMEDOUT");
  CHECK(get(*s, a, "198.18.0.3", 8002) == "ETIMEDOUT");
  REQUIRE(eventually([&] {
    collect(std::chrono::milliseconds(200));
    return denied[a].size() >= 2;
  }));
  collect(std::chrono::milliseconds(2500));
  CHECK(denied[a] == std::vector<std::string>{"tcp 198.18.0.3:8000", "tcp 198.18.0.3:8002"});
  CHECK(denied[b].size() == 1);
  // node stats: each sandbox's own counters.
  auto st = node_stats_of(*e.c);
  std::map<std::string, egress_traffic> by;
  for (const auto& t : st.egress_by_sandbox)
    by[t.sandbox] = t;
  REQUIRE(by.count(a) == 1);
  REQUIRE(by.count(b) == 1);
  CHECK(by[a].connections == 2);
  CHECK(by[a].sent_bytes > 0);
  CHECK(by[a].received_bytes > 0);
  CHECK(by[a].denied >= 3);
  CHECK(by[b].connections == 0);
  CHECK(by[b].sent_bytes == 0);
  CHECK(by[b].received_bytes == 0);
  CHECK(by[b].denied >= 1);
  // The sandbox's own usage (`dsec stats`) carries the same counters.
  auto ua = s->usage(a);
  REQUIRE_MESSAGE(ua, describe(ua.error_value()));
  CHECK(ua->egress);
  CHECK(ua->traffic.connections == 2);
  CHECK(ua->traffic.sent_bytes >= by[a].sent_bytes);
  CHECK(ua->traffic.denied >= by[a].denied);
  CHECK(ua->usage.processes >= 1);
  auto ub = s->usage(b);
  REQUIRE(ub);
  CHECK(ub->traffic.sent_bytes == 0);
  // /metrics: the node's packets by verdict and its egress sandboxes, as the
  // network's poll thread last read them (about once a second).
  auto value = [](const std::string& text, const std::string& series) {
    auto at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::atof(text.c_str() + at + series.size() + 2);
  };
  std::string text;
  CHECK_MESSAGE(eventually([&] {
                  text = metrics::process_registry().expose();
                  return value(text, "dsec_egress_sandboxes") == 2
                         && value(text, "dsec_egress_packets_total{verdict=\"denied\"}")
                              >= static_cast<double>(by[a].denied + by[b].denied)
                         && value(text, "dsec_egress_packets_total{verdict=\"allowed\"}") >= 2;
                }),
                text);
  // Gone with their sandboxes (the table's elements too).
  REQUIRE(s->destroy(a));
  CHECK(eventually([&] {
    auto now = node_stats_of(*e.c);
    return now.egress_by_sandbox.size() == 1 && now.egress_by_sandbox[0].sandbox == b;
  }));
  auto tag = tag_of(actor_layers());
  auto left = run_process({"/usr/sbin/nft", "list", "set", "inet", "dsec_" + tag, "sb_tx"});
  CHECK(left.out.find("dx") != std::string::npos); // b's
  REQUIRE(s->destroy(b));
  left = run_process({"/usr/sbin/nft", "list", "set", "inet", "dsec_" + tag, "sb_tx"});
  CHECK_MESSAGE(left.out.find("elements") == std::string::npos, left.out);
  // a's allow rule went with it (an interval set's element).
  auto allow = run_process({"/usr/sbin/nft", "list", "set", "inet", "dsec_" + tag, "allow"});
  CHECK(allow.status == 0);
  CHECK_MESSAGE(allow.out.find("elements") == std::string::npos, allow.out);
}

TEST_CASE("private, metadata and the node's denied ranges are denied unless a rule names them"
          * skip_unless(have_tools(), "needs root, ip (iproute2) and busybox")) {
  internet net;
  auto o = egress_daemon(net);
  o.egress->deny_ranges = {"198.18.0.3/32"};
  o.egress_prewire = 0; // each create wires its own namespace (the other path)
  embedded e{o};
  auto s = open(*e.c);
  CHECK(metric("dsec_egress_prewired") == 0);
  // Everything on port 8000: 198.18.0.2 is reached, 198.18.0.3 is in a range
  // the node denies (--deny-range) and a wide rule does not open it; nor the
  // metadata address.
  auto id = make_one(*s, egress_env({"0.0.0.0/0:8000"}));
  CHECK(reached(get(*s, id, "198.18.0.2", 8000)));
  CHECK(get(*s, id, "198.18.0.3", 8000) == "ETIMEDOUT");
  CHECK_FALSE(reached(get(*s, id, "169.254.169.254", 8000)));
  // The metadata address and the private ranges are in the node's always-denied
  // set; the node's own uplink address is too.
  auto tag = tag_of(actor_layers());
  for (const char* a : {"169.254.169.254", "10.1.2.3", "172.16.0.1", "192.168.1.1", "198.18.0.1"}) {
    auto r = run_process({"/usr/sbin/nft", "get", "element", "inet", "dsec_" + tag, "special",
                          std::string{"{ "} + a + " }"});
    CHECK_MESSAGE(r.status == 0, a << " is not in the always-denied set: " << r.describe());
  }
  // A rule that names a network inside the range opens it; a deny rule wins.
  auto named = make_one(*s, egress_env({"198.18.0.3:8000"}));
  CHECK(reached(get(*s, named, "198.18.0.3", 8000)));
  auto denied = make_one(*s, egress_env({"198.18.0.0/24:8000"}, {"198.18.0.2"}));
  CHECK(get(*s, denied, "198.18.0.2", 8000) == "ETIMEDOUT");
}

TEST_CASE("a live sandbox's policy changes for new connections"
          * skip_unless(have_tools(), "needs root, ip (iproute2) and busybox")) {
  internet net;
  embedded e{egress_daemon(net)};
  auto s = open(*e.c);
  auto id = make_one(*s, egress_env({}));
  CHECK(get(*s, id, "198.18.0.2", 8000) == "ETIMEDOUT");
  REQUIRE(s->set_network(id, {"198.18.0.2:8000"}, {}));
  CHECK(reached(get(*s, id, "198.18.0.2", 8000)));
  CHECK(get(*s, id, "198.18.0.3", 8000) == "ETIMEDOUT");
  // Through the client by id (what `dsec net` uses), to another set.
  REQUIRE(e.c->set_network(id, {"198.18.0.3:8000"}, {}));
  CHECK(get(*s, id, "198.18.0.2", 8000) == "ETIMEDOUT");
  CHECK(reached(get(*s, id, "198.18.0.3", 8000)));
  // A bad rule is refused and the policy stays.
  check_error(s->set_network(id, {"198.18.0.0/8"}, {}), errc::invalid_argument, "198.18.0.0/8");
  CHECK(reached(get(*s, id, "198.18.0.3", 8000)));
  // Only egress sandboxes have a policy.
  auto plain = make_one(*s, env_of());
  check_error(s->set_network(plain, {"1.2.3.4"}, {}), errc::invalid_argument, "none");
}

TEST_CASE("a policy change is logged: a resume answers it from the log, a rebuild has it"
          * skip_unless(have_tools(), "needs root, ip (iproute2) and busybox")) {
  internet net;
  embedded e{egress_daemon(net)};
  session_options logged;
  logged.quota = 4;
  logged.trajectory = true;
  auto episode_start = [&](session& s) {
    auto made = s.create(egress_env({"198.18.0.2:8000"}), 1, create_labels{"ep", {}});
    REQUIRE_MESSAGE(made, describe(made.error_value()));
    REQUIRE(made->size() == 1);
    return made->front().id;
  };
  auto state_of = [](session& s, const std::string& id) {
    auto l = s.list();
    REQUIRE(l);
    for (const auto& i : *l)
      if (i.id == id)
        return i.state;
    return std::string{"absent"};
  };
  std::string sid, id;
  {
    // The first trainer: a step under policy A, a change to B, a step under B.
    auto c = client::attach(e.sys, e.d->scheduler());
    auto s = c->open_session(logged, true);
    REQUIRE(s);
    sid = (*s)->id();
    id = episode_start(**s);
    CHECK(reached(get(**s, id, "198.18.0.2", 8000)));
    REQUIRE((*s)->set_network(id, {"198.18.0.3:8000"}, {}));
    CHECK(get(**s, id, "198.18.0.2", 8000) == "ETIMEDOUT");
  }
  REQUIRE(eventually_gone(*e.c, {id}));
  auto c = client::attach(e.sys, e.d->scheduler());
  auto resumed = c->resume_session(sid);
  REQUIRE_MESSAGE(resumed, describe(resumed.error_value()));
  auto& s = **resumed;
  CHECK(episode_start(s) == id);
  SUBCASE("the same change again: answered from the log; the rebuild after it has B") {
    CHECK(reached(get(s, id, "198.18.0.2", 8000)));
    REQUIRE(s.set_network(id, {"198.18.0.3:8000"}, {}));
    CHECK(get(s, id, "198.18.0.2", 8000) == "ETIMEDOUT");
    CHECK(state_of(s, id) == "replaying"); // nothing ran: all from the log
    // Past the log: rebuilt, with the policy the trainer set (B).
    CHECK(reached(get(s, id, "198.18.0.3", 8000)));
    CHECK(state_of(s, id) == "ready");
    CHECK(get(s, id, "198.18.0.2", 8000) == "ETIMEDOUT");
  }
  SUBCASE("a trainer that goes another way before the change: rebuilt with A") {
    CHECK(reached(get(s, id, "198.18.0.2", 8000)));
    CHECK(get(s, id, "198.18.0.3", 8000) == "ETIMEDOUT"); // not step 2: rebuilt here
    CHECK(state_of(s, id) == "ready");
    CHECK(reached(get(s, id, "198.18.0.2", 8000)));
  }
  SUBCASE("another change than the log's: the sandbox is rebuilt and gets it") {
    CHECK(reached(get(s, id, "198.18.0.2", 8000)));
    REQUIRE(s.set_network(id, {"198.18.0.2:8000", "198.18.0.3:8000"}, {}));
    CHECK(state_of(s, id) == "ready");
    CHECK(reached(get(s, id, "198.18.0.3", 8000)));
    CHECK(reached(get(s, id, "198.18.0.2", 8000)));
  }
}

TEST_CASE("dsecd sweeps what a killed dsecd left, and leaves nothing when stopped"
          * skip_unless(have_tools(), "needs root, ip (iproute2) and busybox")) {
  internet net;
  auto tag = tag_of(actor_layers());
  std::vector<std::string> args{"--uplink", net.uplink, "--sandbox-net", "198.19.0.0/24"};
  {
    dsecd_proc d{args};
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, d.port);
    auto s = open(*c);
    std::vector<std::string> ids;
    for (int i = 0; i < 3; ++i)
      ids.push_back(make_one(*s, egress_env({"198.18.0.2:8000"})));
    CHECK(reached(get(*s, ids[0], "198.18.0.2", 8000)));
    CHECK_FALSE(leftovers(tag).empty());
    s.reset();
    c.reset();
    d.stop(SIGKILL);
  }
  // The sandboxes died with it, and their veths with their namespaces; its
  // table and resolver link are still there...
  CHECK(veths_gone(tag));
  auto left = leftovers(tag);
  CHECK_MESSAGE(std::find(left.begin(), left.end(), "table inet dsec_" + tag) != left.end(),
                "after kill -9: " << join(left));
  {
    // ...until a dsecd of the same state dir starts: it sweeps them.
    dsecd_proc d{args};
    CHECK_MESSAGE(d.bg.out().find("dsecd: removed nftables table inet dsec_" + tag)
                    != std::string::npos,
                  d.bg.out());
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, d.port);
    auto s = open(*c);
    auto id = make_one(*s, egress_env({"198.18.0.2:8000"}));
    CHECK(reached(get(*s, id, "198.18.0.2", 8000)));
    // The command line changes it: `dsec net ID --allow ...`.
    auto net_cmd = run_process({env_path("DSEC_BIN"), "--connect",
                                "127.0.0.1:" + std::to_string(d.port), "net", id, "--allow",
                                "198.18.0.3:8000"});
    CHECK_MESSAGE(net_cmd.status == 0, net_cmd.describe());
    CHECK(net_cmd.out == id + ": allow 1, deny 0\n");
    CHECK(get(*s, id, "198.18.0.2", 8000) == "ETIMEDOUT");
    CHECK(reached(get(*s, id, "198.18.0.3", 8000)));
    s.reset();
    c.reset();
    auto r = d.stop(SIGTERM);
    CHECK(r.status == 0);
  }
  CHECK(veths_gone(tag));
  CHECK_MESSAGE(leftovers(tag).empty(), "after a stop: " << join(leftovers(tag)));
}

namespace {
// The network namespaces processes are in now (their inode numbers).
std::set<std::string> netns_in_use() {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::error_code ec;
    auto target = fs::read_symlink(e.path() / "ns/net", ec);
    if (!ec)
      out.insert(target.string());
  }
  return out;
}
} // namespace

TEST_CASE("1,000 egress sandboxes, then kill -9: the next dsecd collects the rest, nothing is left"
          * skip_unless(have_tools(), "needs root, ip (iproute2) and busybox")) {
  internet net;
  auto tag = tag_of(actor_layers());
  auto ns_before = netns_in_use();
  std::vector<std::string> args{"--uplink", net.uplink, "--sandbox-net", "198.19.0.0/22",
                                "--slots", "64"};
  {
    dsecd_proc d{args};
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, d.port);
    auto s = open(*c);
    // 20 rounds of 50: each round's sandboxes destroyed, the last one's kept.
    std::vector<std::string> live;
    int made = 0;
    for (int round = 0; round < 20; ++round) {
      std::vector<std::string> failures;
      auto ids = s->create(egress_env({"198.18.0.2:8000"}), 50, {},
                           [&](const error& e) { failures.push_back(describe(e)); });
      REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
      REQUIRE_MESSAGE(ids->size() == 50, "round " << round << ": "
                                                  << (failures.empty() ? "?" : failures[0]));
      made += 50;
      if (round == 19) {
        live = *ids;
        break;
      }
      for (const auto& id : *ids)
        REQUIRE(s->destroy(id));
    }
    CHECK(made == 1000);
    CHECK(reached(get(*s, live.front(), "198.18.0.2", 8000)));
    CHECK(get(*s, live.back(), "198.18.0.3", 8000) == "ETIMEDOUT");
    CHECK(node_stats_of(*c).egress_sandboxes == 50);
    s.reset();
    c.reset();
    d.stop(SIGKILL);
  }
  // Its 50 sandboxes died with it, and the namespaces it had wired ahead:
  // every veth goes with its namespace, and no namespace is left.
  CHECK_MESSAGE(veths_gone(tag), "after kill -9: " << join(leftovers(tag)));
  CHECK(eventually([&] {
    auto now = netns_in_use();
    return std::includes(ns_before.begin(), ns_before.end(), now.begin(), now.end());
  }));
  {
    // The next dsecd of the state dir removes the table the killed one left.
    dsecd_proc d{args};
    CHECK_MESSAGE(d.bg.out().find("dsecd: removed nftables table inet dsec_" + tag)
                    != std::string::npos,
                  d.bg.out());
    auto r = d.stop(SIGTERM);
    CHECK_MESSAGE(r.status == 0, r.describe());
  }
  CHECK(veths_gone(tag));
  CHECK_MESSAGE(leftovers(tag).empty(), "after a stop: " << join(leftovers(tag)));
  // No address of --sandbox-net on the node.
  auto nl = rtnl::open();
  REQUIRE(nl);
  auto addrs = nl->ipv4_addresses();
  REQUIRE(addrs);
  for (auto a : *addrs)
    CHECK_MESSAGE((a & 0xfffffc00u) != 0xc6130000u, "left: " << ipv4_to_string(a));
}

TEST_CASE("domain rules: the node's resolver answers allowed names and admits their answers"
          * skip_unless(have_tools() && fs::exists("/usr/sbin/dnsmasq"),
                        "needs root, ip, busybox and dnsmasq")) {
  internet net;
  net.start_dns();
  auto o = egress_daemon(net);
  o.egress->dns_upstream = "198.18.0.2:53";
  auto services = suite::get().root() + "/services-" + net.tag;
  std::ofstream{services} << "# a named service\ntestsvc svc.test 198.18.0.2:8001\n";
  o.egress->services_file = services;
  embedded e{o};
  auto s = open(*e.c);
  const std::string resolver = "198.19.0.1"; // the first address of 198.19.0.0/24
  auto lookup = [&](const std::string& id, const std::string& name) {
    auto r = s->exec(id, cmd({"/bin/busybox", "nslookup", name, resolver}));
    REQUIRE(r);
    return r->out + r->err;
  };
  auto events = s->watch();
  REQUIRE_MESSAGE(events, describe(events.error_value()));
  auto id = make_one(*s, egress_env({"allowed.test", "*.wild.test"}, {"no.wild.test"}));
  auto conf = s->exec(id, cmd({"/bin/cat", "/etc/resolv.conf"}));
  REQUIRE(conf);
  CHECK(conf->out == "nameserver " + resolver + "\n");
  // Not resolved yet: a direct connection is dropped.
  CHECK(get(*s, id, "198.18.0.3", 8000) == "ETIMEDOUT");
  auto a = lookup(id, "allowed.test");
  CHECK_MESSAGE(a.find("198.18.0.3") != std::string::npos, a);
  CHECK(reached(get(*s, id, "198.18.0.3", 8000)));
  // A name the policy does not allow: REFUSED, and its address stays dropped.
  auto d = lookup(id, "denied.test");
  CHECK_MESSAGE(d.find("REFUSED") != std::string::npos, d);
  CHECK(get(*s, id, "198.18.0.2", 8000) == "ETIMEDOUT");
  // *.wild.test: a name below it, not wild.test itself, not the denied one.
  CHECK_MESSAGE(lookup(id, "wild.test").find("REFUSED") != std::string::npos, "wild.test");
  CHECK_MESSAGE(lookup(id, "no.wild.test").find("REFUSED") != std::string::npos, "no.wild.test");
  auto w = lookup(id, "a.wild.test");
  CHECK_MESSAGE(w.find("198.18.0.2") != std::string::npos, w);
  CHECK(reached(get(*s, id, "198.18.0.2", 8000)));
  // Each refused name reached the session once, as a denied event (nslookup
  // asks twice, A and AAAA; denied.test was asked again below), and the
  // connection dropped before the lookup as a destination.
  CHECK_MESSAGE(lookup(id, "denied.test").find("REFUSED") != std::string::npos, "again");
  std::map<std::string, int> denied;
  CHECK(eventually([&] {
    for (;;) {
      auto ev = events.value()->next(std::chrono::milliseconds(100));
      REQUIRE(ev);
      if (!*ev)
        break;
      if ((*ev)->kind == chronus_kind::denied && (*ev)->sandbox_id == id)
        ++denied[(*ev)->text];
    }
    return denied.count("dns denied.test") && denied.count("dns no.wild.test")
           && denied.count("dns wild.test") && denied.count("tcp 198.18.0.3:8000");
  }));
  CHECK(denied["dns denied.test"] == 1);
  CHECK(denied["dns wild.test"] == 1);
  CHECK(denied["dns no.wild.test"] == 1);
  CHECK(denied.count("dns allowed.test") == 0);
  CHECK(denied.count("dns a.wild.test") == 0);
  // A new policy forgets what the old one admitted.
  REQUIRE(s->set_network(id, {"other.test"}, {}));
  CHECK(get(*s, id, "198.18.0.3", 8000) == "ETIMEDOUT");
  CHECK(get(*s, id, "198.18.0.2", 8000) == "ETIMEDOUT");
  // A named service: its domain and its CIDR rule.
  auto svc = make_one(*s, egress_env({"testsvc"}));
  CHECK(reached(get(*s, svc, "198.18.0.2", 8001)));
  CHECK(get(*s, svc, "198.18.0.3", 8000) == "ETIMEDOUT");
  CHECK(lookup(svc, "svc.test").find("198.18.0.3") != std::string::npos);
  CHECK(reached(get(*s, svc, "198.18.0.3", 8000)));
  // An unknown service is named in the error.
  std::vector<std::string> failures;
  auto ids = s->create(egress_env({"nosuch"}), 1, {},
                       [&](const error& err) { failures.push_back(describe(err)); });
  CHECK((!ids || ids->empty()));
  std::string why = !ids ? describe(ids.error_value()) : failures.empty() ? "" : failures[0];
  CHECK_MESSAGE(why.find("nosuch") != std::string::npos, why);
  CHECK_MESSAGE(why.find("testsvc") != std::string::npos, why);
}

// What a resolver falls back to when a UDP answer is truncated: the same
// rules, the same pinning, over TCP (pipelined queries, a half-close).
TEST_CASE("domain rules over TCP: the node's resolver answers and admits the same way"
          * skip_unless(have_tools() && fs::exists("/usr/sbin/dnsmasq"),
                        "needs root, ip, busybox and dnsmasq")) {
  internet net;
  net.start_dns();
  auto o = egress_daemon(net);
  o.egress->dns_upstream = "198.18.0.2:53";
  embedded e{o};
  auto s = open(*e.c);
  const std::string resolver = "198.19.0.1";
  auto id = make_one(*s, egress_env({"allowed.test", "*.wild.test"}));
  CHECK(get(*s, id, "198.18.0.3", 8000) == "ETIMEDOUT");
  CHECK(get(*s, id, "198.18.0.2", 8000) == "ETIMEDOUT");
  auto r = s->exec(id, cmd({"/usr/bin/probe", "dns-tcp", resolver, "allowed.test",
                            "denied.test", "a.wild.test"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  auto got = lines_of(r->out);
  std::set<std::string> answers{got.begin(), got.end()};
  const std::set<std::string> expected{"allowed.test rcode=0 198.18.0.3", "denied.test rcode=5",
                                       "a.wild.test rcode=0 198.18.0.2"};
  CHECK_MESSAGE(answers == expected, r->out << r->err);
  // The answers' addresses are admitted for this sandbox as over UDP.
  CHECK(reached(get(*s, id, "198.18.0.3", 8000)));
  CHECK(reached(get(*s, id, "198.18.0.2", 8000)));
  // Another sandbox asked nothing: nothing admitted for it.
  auto other = make_one(*s, egress_env({"allowed.test"}));
  CHECK(get(*s, other, "198.18.0.3", 8000) == "ETIMEDOUT");
  // Garbage on a stream ends that stream only: the resolver goes on serving.
  auto bad = s->exec(id, cmd({"/bin/sh", "-c",
                              "printf '\\000\\003abc' | /bin/busybox nc -w 2 " + resolver
                                + " 53; echo end"}));
  REQUIRE(bad);
  CHECK_MESSAGE(bad->out == "end\n", bad->out << bad->err);
  r = s->exec(other, cmd({"/usr/bin/probe", "dns-tcp", resolver, "allowed.test"}));
  REQUIRE(r);
  CHECK_MESSAGE(r->out == "allowed.test rcode=0 198.18.0.3\n", r->out << r->err);
  CHECK(reached(get(*s, other, "198.18.0.3", 8000)));
}

TEST_CASE("egress needs an uplink; none and loopback are unchanged") {
  embedded e;
  auto s = open(*e.c);
  std::vector<std::string> failures;
  auto ids = s->create(egress_env({"1.2.3.4"}), 1, {},
                       [&](const error& err) { failures.push_back(describe(err)); });
  CHECK((!ids || ids->empty()));
  std::string why = !ids ? describe(ids.error_value()) : failures.empty() ? "" : failures[0];
  CHECK_MESSAGE(why.find("--uplink") != std::string::npos, why);
  // none: no interface but loopback (down); loopback: lo only.
  auto none = make_one(*s, env_of());
  auto r = s->exec(none, cmd({"/usr/bin/probe", "if-addr", "eth0"}));
  REQUIRE(r);
  CHECK(r->out.find("ENODEV") != std::string::npos);
  auto lo_env = env_of();
  lo_env.net = true;
  auto lo = make_one(*s, lo_env);
  r = s->exec(lo, cmd({"/usr/bin/probe", "if-addr", "lo"}));
  REQUIRE(r);
  CHECK(r->out.rfind("127.0.0.1", 0) == 0);
}

} // TEST_SUITE
