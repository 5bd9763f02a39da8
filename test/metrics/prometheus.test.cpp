// The metrics suite (docs/observability.md): a real Prometheus server
// (Debian's `prometheus`, started here on a loopback port with a generated
// config and a storage dir of this test's) scrapes a real dsecd's /metrics
// while sandboxes are made; PromQL queries through its HTTP API return the
// create count and a latency quantile equal to what dsecd's histogram says.
// Nothing is left: Prometheus is killed and reaped, its dir removed, also
// when a check fails (RAII below).
#include <doctest/doctest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <png.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/metrics.hpp"
#include "runtime/metrics_text.hpp"
#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"
#include "test/support/skip.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

const char* prometheus_bin = "/usr/bin/prometheus";

bool have_prometheus() { return ::access(prometheus_bin, X_OK) == 0; }

// A free loopback port (another process could take it before we use it; then
// the server says so and the test fails, naming it).
uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A directory of this test's, removed however the test ends.
struct scoped_dir {
  explicit scoped_dir(const std::string& name)
    : path(suite::get().root() + "/" + name + "-" + std::to_string(::getpid())) {
    std::filesystem::create_directories(path);
  }
  ~scoped_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

// The port dsecd printed for its metrics.
uint16_t metrics_port(dsecd_proc& d, const std::string& scheme = "http") {
  const std::string mark = "metrics on " + scheme + "://127.0.0.1:";
  REQUIRE_MESSAGE(d.bg.wait_for_output("/metrics (and"), "dsecd: " << d.bg.out() << d.bg.err());
  auto at = d.bg.out().find(mark);
  REQUIRE(at != std::string::npos);
  return static_cast<uint16_t>(std::atoi(d.bg.out().c_str() + at + mark.size()));
}

// A running Prometheus that scrapes `target` every second.
struct prometheus {
  explicit prometheus(uint16_t target)
    : dir("prometheus"), port(free_port()), config(dir.path + "/prometheus.yml") {
    {
      std::ofstream f{config};
      f << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        << "scrape_configs:\n  - job_name: dsecd\n    static_configs:\n"
        << "      - targets: ['127.0.0.1:" << target << "']\n";
    }
    bg = std::make_unique<background>(std::vector<std::string>{
      prometheus_bin, "--config.file=" + config, "--storage.tsdb.path=" + dir.path + "/data",
      "--web.listen-address=127.0.0.1:" + std::to_string(port), "--log.level=warn"});
    httplib::Client c("127.0.0.1", port);
    bool up = eventually([&] {
      auto r = c.Get("/-/ready");
      return r && r->status == 200;
    });
    REQUIRE_MESSAGE(up, "prometheus did not get ready: " << bg->out() << bg->err());
  }
  ~prometheus() { stop(); }
  void stop() {
    if (!bg)
      return;
    pid = bg->pid();
    bg->kill(SIGTERM);
    (void) bg->wait();
    bg.reset();
  }

  // The value of a PromQL expression that gives one sample; nullopt when it
  // gives none (yet).
  std::optional<double> query(const std::string& promql) {
    httplib::Client c("127.0.0.1", port);
    auto r = c.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
    REQUIRE_MESSAGE(r, "prometheus' HTTP API did not answer");
    REQUIRE_MESSAGE(r->status == 200, "query " << promql << ": " << r->status << " " << r->body);
    auto j = nlohmann::json::parse(r->body);
    REQUIRE(j["status"] == "success");
    auto& result = j["data"]["result"];
    if (!result.is_array() || result.empty())
      return std::nullopt;
    REQUIRE_MESSAGE(result.size() == 1, promql << " gave " << result.dump());
    return std::stod(result[0]["value"][1].get<std::string>());
  }

  scoped_dir dir; // destroyed after the process is gone
  uint16_t port;
  std::string config;
  std::unique_ptr<background> bg;
  pid_t pid = -1;
};

// dsecd's own histogram, from its /metrics text.
metrics::histogram::snapshot scraped_histogram(const std::string& text, const std::string& name) {
  metrics::histogram::snapshot s;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "_bucket{", 0) != 0)
      continue;
    auto le = line.find("le=\"");
    REQUIRE(le != std::string::npos);
    auto end = line.find('"', le + 4);
    auto bound = line.substr(le + 4, end - le - 4);
    auto count = std::stod(line.substr(line.rfind(' ') + 1));
    if (bound != "+Inf")
      s.bounds.push_back(std::stod(bound));
    s.cumulative.push_back(static_cast<uint64_t>(count));
  }
  return s;
}

} // namespace

TEST_CASE("metrics: a real Prometheus scrapes dsecd; PromQL gives the creates and a quantile"
          * skip_unless(have_prometheus(), "needs Debian's prometheus (tools/setup installs it)")) {
  pid_t prom_pid = -1;
  {
    dsecd_proc d({"--metrics", "127.0.0.1:0"});
    auto mport = metrics_port(d);
    httplib::Client m("127.0.0.1", mport);
    auto ready = m.Get("/readyz");
    REQUIRE(ready);
    CHECK_MESSAGE(ready->status == 200, ready->body);
    auto health = m.Get("/healthz");
    REQUIRE(health);
    CHECK(health->status == 200);

    prometheus p(mport);
    CHECK(eventually([&] { return p.query("up{job=\"dsecd\"}") == 1.0; }));

    // Sandboxes under load: batches, a command in each, all destroyed.
    constexpr uint32_t n = 24;
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, d.port);
    auto s = c->open_session({}, true);
    REQUIRE_MESSAGE(s, describe(s.error_value()));
    std::vector<std::string> ids;
    for (int b = 0; b < 3; ++b) {
      auto got = (*s)->create(env_of(), n / 3);
      REQUIRE_MESSAGE(got, describe(got.error_value()));
      ids.insert(ids.end(), got->begin(), got->end());
    }
    REQUIRE(ids.size() == n);
    for (const auto& id : ids) {
      auto r = (*s)->exec(id, cmd({"true"}));
      REQUIRE_MESSAGE(r, describe(r.error_value()));
    }
    for (const auto& id : ids)
      REQUIRE((*s)->destroy(id));
    REQUIRE(eventually_gone(*c, ids));

    // What Prometheus scraped: the creates, the commands, the destroys.
    std::optional<double> creates, execs, destroys;
    CHECK_MESSAGE(eventually([&] {
                    creates = p.query("sum(dsec_sandbox_creates_total{job=\"dsecd\"})");
                    destroys = p.query("sum(dsec_sandbox_destroys_total{job=\"dsecd\"})");
                    execs = p.query("sum(dsec_sandbox_exec_seconds_count{job=\"dsecd\"})");
                    return creates == double{n} && destroys == double{n} && execs == double{n};
                  }),
                  "creates " << creates.value_or(-1) << ", destroys " << destroys.value_or(-1)
                             << ", commands " << execs.value_or(-1) << " (want " << n << ")");
    CHECK(p.query("sum(dsec_sandboxes_live{job=\"dsecd\"})") == 0.0);

    // The p90 of the create latency, by PromQL, equals dsecd's histogram's
    // (nothing is created any more: both are of the same buckets).
    auto text = m.Get("/metrics");
    REQUIRE(text);
    REQUIRE(text->status == 200);
    auto h = scraped_histogram(text->body, "dsec_sandbox_create_seconds");
    REQUIRE(h.count() == n);
    double want = h.quantile(0.9);
    std::optional<double> got;
    CHECK(eventually([&] {
      got = p.query(
        "histogram_quantile(0.9, sum by (le) (dsec_sandbox_create_seconds_bucket{job=\"dsecd\"}))");
      return got && std::fabs(*got - want) <= 1e-9 * std::max(1.0, want);
    }));
    CHECK_MESSAGE(got, "no quantile from prometheus");
    if (got)
      CHECK_MESSAGE(std::fabs(*got - want) <= 1e-9 * std::max(1.0, want),
                    "prometheus " << *got << ", dsecd " << want);
    CHECK(want > 0);
    CHECK(want <= h.bounds.back());
    // The process' own figures came along.
    auto rss = p.query("process_resident_memory_bytes{job=\"dsecd\"}");
    REQUIRE(rss);
    CHECK(*rss > 1e6);
    c.reset();
    p.stop();
    prom_pid = p.pid;
    auto end = d.stop(SIGTERM);
    CHECK_MESSAGE(end.status == 0, end.describe());
  }
  // Nothing left: the server is reaped, its directory gone.
  CHECK(prom_pid > 0);
  CHECK_FALSE(pid_exists(prom_pid));
  CHECK_FALSE(std::filesystem::exists(suite::get().root() + "/prometheus-"
                                      + std::to_string(::getpid())));
}

TEST_CASE("metrics: dsecd's --metrics flags are checked before it starts") {
  struct bad_case {
    std::vector<std::string> args;
    std::string names;
  };
  const std::vector<bad_case> cases{
    {{"--metrics", "10.1.2.3:9100"}, "not a loopback address"},
    {{"--metrics", "nohost"}, "--metrics"},
    {{"--metrics", "localhost:70000"}, "--metrics"},
    {{"--metrics-token", "/nonexistent"}, "--metrics-token is for --metrics"},
    {{"--metrics", "127.0.0.1:0", "--metrics-token", "/nonexistent/token"}, "/nonexistent/token"},
  };
  for (const auto& bc : cases) {
    std::vector<std::string> argv{env_path("DSECD_BIN"), "--listen", "127.0.0.1:0", "--state",
                                  actor_layers()};
    argv.insert(argv.end(), bc.args.begin(), bc.args.end());
    auto r = run_process(argv);
    CHECK_MESSAGE(r.status != 0, r.describe());
    CHECK_MESSAGE(r.err.find(bc.names) != std::string::npos, r.describe());
  }
}

TEST_CASE("metrics: /readyz says not ready while the node is cordoned") {
  dsecd_proc d({"--metrics", "127.0.0.1:0"});
  auto mport = metrics_port(d);
  httplib::Client m("127.0.0.1", mport);
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto r = m.Get("/readyz");
  REQUIRE(r);
  CHECK(r->status == 200);
  auto name = "127.0.0.1:" + std::to_string(d.port);
  auto cordon = run_process({env_path("DSEC_BIN"), "--connect", name, "node", "cordon", name});
  REQUIRE_MESSAGE(cordon.status == 0, cordon.describe());
  r = m.Get("/readyz");
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK_MESSAGE(r->body.find("cordoned") != std::string::npos, r->body);
  auto text = m.Get("/metrics");
  REQUIRE(text);
  CHECK(text->body.find("\ndsec_nodes_cordoned 1\n") != std::string::npos);
  auto un = run_process({env_path("DSEC_BIN"), "--connect", name, "node", "uncordon", name});
  REQUIRE_MESSAGE(un.status == 0, un.describe());
  r = m.Get("/readyz");
  REQUIRE(r);
  CHECK(r->status == 200);
}

namespace {

bool have_tmux() { return ::access("/usr/bin/tmux", X_OK) == 0; }

// A tmux server of this test's own (-L SOCKET), killed however the test ends.
struct tmux_server {
  tmux_server() : sock("dsec-top-test-" + std::to_string(::getpid())) {}
  ~tmux_server() { (void) run_process({"/usr/bin/tmux", "-L", sock, "kill-server"}); }
  proc_result tmux(std::vector<std::string> args) {
    args.insert(args.begin(), {"/usr/bin/tmux", "-L", sock});
    return run_process(args);
  }
  std::string sock;
};

// The words of the line of `screen` that starts with `first`.
std::vector<std::string> row_of(const std::string& screen, const std::string& first) {
  std::istringstream in(screen);
  for (std::string line; std::getline(in, line);) {
    std::istringstream w(line);
    std::vector<std::string> words;
    for (std::string x; w >> x;)
      words.push_back(x);
    if (!words.empty() && words[0] == first)
      return words;
  }
  return {};
}

} // namespace

TEST_CASE("dsec top: under tmux, a daemon's row shows its live sandboxes and creates/s"
          * skip_unless(have_tmux(), "needs tmux")) {
  dsecd_proc d({"--metrics", "127.0.0.1:0"});
  auto mport = metrics_port(d);
  auto where = "127.0.0.1:" + std::to_string(mport);
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto s = c->open_session({}, true);
  REQUIRE_MESSAGE(s, describe(s.error_value()));
  auto first = (*s)->create(env_of(), 3);
  REQUIRE_MESSAGE(first, describe(first.error_value()));
  tmux_server t;
  auto started = t.tmux({"new-session", "-d", "-s", "top", "-x", "160", "-y", "24",
                         env_path("DSEC_BIN") + " top " + where});
  REQUIRE_MESSAGE(started.status == 0, started.describe());
  std::string screen;
  auto capture = [&] {
    auto r = t.tmux({"capture-pane", "-p", "-t", "top"});
    screen = r.out;
    return row_of(screen, where);
  };
  // DAEMON CREATES/S P50MS P99MS LIVE FREE POOLED CACHE... : LIVE is the 5th word.
  CHECK_MESSAGE(eventually([&] {
                  auto row = capture();
                  return row.size() >= 6 && row[4] == "3";
                }),
                "screen:\n" << screen);
  CHECK(screen.find("CREATES/S") != std::string::npos);
  // New creates show as a rate and a latency in the next frame.
  auto more = (*s)->create(env_of(), 4);
  REQUIRE_MESSAGE(more, describe(more.error_value()));
  CHECK_MESSAGE(eventually([&] {
                  auto row = capture();
                  return row.size() >= 6 && row[4] == "7" && row[1] != "-" && row[1] != "0.0"
                         && row[2] != "-";
                }),
                "screen:\n" << screen);
  // A daemon that goes away is named unreachable, and top keeps going.
  c.reset();
  auto end = d.stop(SIGTERM);
  CHECK_MESSAGE(end.status == 0, end.describe());
  CHECK_MESSAGE(eventually([&] {
                  auto row = capture();
                  return row.size() >= 2 && row[1] == "unreachable";
                }),
                "screen:\n" << screen);
}

TEST_CASE("dsec top: bad arguments exit 2 and name what was wrong") {
  for (auto [args, names] : std::vector<std::pair<std::vector<std::string>, std::string>>{
         {{}, "at least one dsecd"},
         {{"--interval", "1ms", "127.0.0.1:1"}, "--interval"},
         {{"--iterations", "0", "127.0.0.1:1"}, "--iterations"},
         {{"nohost"}, "nohost"},
         {{"--frob"}, "--frob"}}) {
    std::vector<std::string> argv{env_path("DSEC_BIN"), "top"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run_process(argv);
    CHECK_MESSAGE(r.status == 2, r.describe());
    CHECK_MESSAGE(r.err.find(names) != std::string::npos, r.describe());
  }
  // Not a tty: frames one after the other; --iterations ends it.
  auto r = run_process({env_path("DSEC_BIN"), "top", "--iterations", "2", "--interval", "100ms",
                        "127.0.0.1:1"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  auto row = row_of(r.out, "127.0.0.1:1");
  REQUIRE(row.size() >= 2);
  CHECK(row[1] == "unreachable");
  CHECK(r.out.find("DAEMON") != r.out.rfind("DAEMON")); // two frames
  CHECK(r.out.find("\x1b[") == std::string::npos);
}

TEST_CASE("metrics: with --tls, /metrics needs a certificate of the daemon's CA, and the token") {
  scoped_dir dir("metrics-tls");
  auto certs = [&](std::vector<std::string> args) {
    args.insert(args.begin(), env_path("DSEC_TLS_CERTS"));
    auto r = run_process(args);
    REQUIRE_MESSAGE(r.status == 0, r.describe());
  };
  auto good = dir.path + "/good", other = dir.path + "/other";
  certs({good});
  certs({other});
  auto token_file = dir.path + "/token";
  {
    std::ofstream f{token_file};
    f << "a-token-of-some-length-0123\n";
  }
  REQUIRE(::chmod(token_file.c_str(), 0600) == 0);
  dsecd_proc d({"--tls", good, "--metrics", "127.0.0.1:0", "--metrics-token", token_file});
  auto mport = metrics_port(d, "https");
  CHECK(d.bg.out().find("with a bearer token") != std::string::npos);
  auto get = [&](const std::string& with, bool token) {
    std::unique_ptr<httplib::SSLClient> c;
    if (with.empty())
      c = std::make_unique<httplib::SSLClient>("127.0.0.1", mport);
    else
      c = std::make_unique<httplib::SSLClient>("127.0.0.1", mport, with + "/cert.pem",
                                               with + "/key.pem");
    c->set_ca_cert_path((good + "/ca.pem").c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(std::chrono::seconds(5));
    httplib::Headers h;
    if (token)
      h.emplace("Authorization", "Bearer a-token-of-some-length-0123");
    return c->Get("/metrics", h);
  };
  auto ok = get(good, true);
  REQUIRE_MESSAGE(ok, "no answer: " << httplib::to_string(ok.error()));
  CHECK(ok->status == 200);
  CHECK(ok->body.find("dsec_slots ") != std::string::npos);
  auto no_token = get(good, false);
  REQUIRE(no_token);
  CHECK(no_token->status == 401);
  CHECK_FALSE(get("", true));    // no client certificate: the handshake fails
  CHECK_FALSE(get(other, true)); // one another CA signed: too
  httplib::Client plain("127.0.0.1", mport);
  auto p = plain.Get("/metrics");
  CHECK((!p || p->status != 200));
  // dsec top with --tls and the token shows the daemon's row; without --tls
  // it cannot read it, and says so in the row.
  auto where = "127.0.0.1:" + std::to_string(mport);
  auto top = run_process({env_path("DSEC_BIN"), "top", "--iterations", "1", "--tls", good,
                          "--token", token_file, where});
  CHECK_MESSAGE(top.status == 0, top.describe());
  auto row = top.out.find(where);
  REQUIRE_MESSAGE(row != std::string::npos, top.out);
  auto row_text = top.out.substr(row, top.out.find('\n', row) - row);
  CHECK_MESSAGE(row_text.find("unreachable") == std::string::npos, row_text);
  CHECK_MESSAGE(row_text.find("HTTP") == std::string::npos, row_text);
  std::istringstream fields(row_text);
  size_t n = 0;
  for (std::string f; fields >> f;)
    ++n;
  CHECK_MESSAGE(n >= 10, row_text); // the name and every column, up to its RSS
  top = run_process({env_path("DSEC_BIN"), "top", "--iterations", "1", "--token", token_file,
                     where});
  CHECK_MESSAGE(top.out.find("unreachable") != std::string::npos, top.describe());
  top = run_process({env_path("DSEC_BIN"), "top", "--tls", dir.path + "/none", where});
  CHECK(top.status == 2);
  CHECK_MESSAGE(top.err.find(dir.path + "/none/ca.pem") != std::string::npos, top.describe());
  // A token file open to others is refused before dsecd starts.
  REQUIRE(::chmod(token_file.c_str(), 0644) == 0);
  auto r = run_process({env_path("DSECD_BIN"), "--listen", "127.0.0.1:0", "--state",
                        actor_layers(), "--metrics", "127.0.0.1:0", "--metrics-token",
                        token_file});
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.err.find("chmod 600") != std::string::npos, r.describe());
}

TEST_CASE("metrics: a coordinator shows its nodes up, their heartbeats, then a lost one; a node "
          "is ready once joined") {
  scoped_dir dir("metrics-cluster");
  auto key = dir.path + "/cluster.key";
  {
    std::ofstream f{key};
    f << std::string(64, 'a') << "\n";
  }
  REQUIRE(::chmod(key.c_str(), 0600) == 0);
  auto cport = free_port();
  auto coordinator = "127.0.0.1:" + std::to_string(cport);
  // The node first: it retries the join every second, not ready meanwhile.
  background node({env_path("DSECD_BIN"), "--join", coordinator, "--listen", "127.0.0.1:0",
                   "--state", dir.path + "/node-state", "--cluster-key", key, "--metrics",
                   "127.0.0.1:0"});
  REQUIRE_MESSAGE(node.wait_for_output("/metrics (and"), node.out() << node.err());
  auto port_after = [](const std::string& out, const std::string& mark) {
    auto at = out.find(mark);
    REQUIRE(at != std::string::npos);
    return static_cast<uint16_t>(std::atoi(out.c_str() + at + mark.size()));
  };
  auto node_name = "127.0.0.1:" + std::to_string(port_after(node.out(), "listening on 127.0.0.1:"));
  httplib::Client nm("127.0.0.1", port_after(node.out(), "metrics on http://127.0.0.1:"));
  auto r = nm.Get("/readyz");
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK_MESSAGE(r->body.find("not joined to the coordinator " + coordinator) != std::string::npos,
                r->body);
  background coord({env_path("DSECD_BIN"), "--coordinator", "--listen", coordinator, "--state",
                    actor_layers(), "--cluster-key", key, "--metrics", "127.0.0.1:0"});
  REQUIRE_MESSAGE(coord.wait_for_output("/metrics (and"), coord.out() << coord.err());
  httplib::Client cm("127.0.0.1", port_after(coord.out(), "metrics on http://127.0.0.1:"));
  CHECK(eventually([&] {
    auto x = nm.Get("/readyz");
    return x && x->status == 200;
  }));
  std::optional<std::vector<metrics::sample>> s;
  auto scrape = [&] {
    auto x = cm.Get("/metrics");
    REQUIRE(x);
    auto p = metrics::parse_text(x->body);
    REQUIRE_MESSAGE(p, p.error_value().message);
    s = std::move(*p);
  };
  metrics::labels at_node{{"node", node_name}};
  CHECK(eventually([&] {
    scrape();
    return metrics::sum_of(*s, "dsec_cluster_node_up", at_node) == 1
           && metrics::sum_of(*s, "dsec_cluster_node_up", {{"node", coordinator}}) == 1;
  }));
  bool has_age = false;
  for (const auto& x : *s)
    if (x.name == "dsec_cluster_node_heartbeat_age_seconds" && x.label("node") == node_name)
      has_age = x.value >= 0;
  CHECK(has_age);
  CHECK(metrics::sum_of(*s, "dsec_cluster_node_slots", at_node) > 0);
  CHECK(metrics::sum_of(*s, "dsec_build_info", {{"role", "coordinator"}}) == 1);
  // The node stops: the coordinator counts it lost (its row stays, at 0).
  node.kill(SIGTERM);
  auto end = node.wait();
  CHECK_MESSAGE(end.status == 0, end.describe());
  CHECK(eventually([&] {
    scrape();
    return metrics::sum_of(*s, "dsec_cluster_node_up", at_node) == 0
           && metrics::sum_of(*s, "dsec_cluster_node_up", {{"node", coordinator}}) == 1;
  }));
  coord.kill(SIGTERM);
  auto cend = coord.wait();
  CHECK_MESSAGE(cend.status == 0, cend.describe());
}

namespace {

const char* chromium_bin = "/usr/bin/chromium";

bool have_chromium() { return ::access(chromium_bin, X_OK) == 0; }

// Headless Chromium on `url`, kept from the network: every host name but
// 127.0.0.1 resolves to nothing and its background services are off, so it
// sends no packet off the machine. `what`: "--dump-dom" (the DOM once the
// page's script has run, on stdout) or "--screenshot=FILE".
proc_result chromium(const std::string& url, const std::string& what, const std::string& profile) {
  return run_process({chromium_bin, "--headless", "--no-sandbox", "--disable-gpu",
                      "--user-data-dir=" + profile, "--no-first-run",
                      "--disable-background-networking", "--disable-component-update",
                      "--disable-sync", "--disable-default-apps", "--disable-extensions",
                      "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                      "--window-size=1000,1600", "--virtual-time-budget=8000", what, url});
}

// The pixels of a PNG as RGB, read with libpng.
struct rgb_image {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
  [[nodiscard]] size_t count(uint8_t r, uint8_t g, uint8_t b) const {
    size_t n = 0;
    for (size_t i = 0; i + 2 < rgb.size(); i += 3)
      n += rgb[i] == r && rgb[i + 1] == g && rgb[i + 2] == b;
    return n;
  }
};

std::optional<rgb_image> read_png(const std::string& path) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&img, path.c_str()))
    return std::nullopt;
  img.format = PNG_FORMAT_RGB;
  rgb_image out;
  out.width = img.width;
  out.height = img.height;
  out.rgb.resize(PNG_IMAGE_SIZE(img));
  if (!png_image_finish_read(&img, nullptr, out.rgb.data(), 0, nullptr)) {
    png_image_free(&img);
    return std::nullopt;
  }
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

size_t occurrences(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (auto at = s.find(part); at != std::string::npos; at = s.find(part, at + part.size()))
    ++n;
  return n;
}

} // namespace

TEST_CASE("status: a coordinator's /status page shows its 3 nodes and their sandboxes, in "
          "headless Chromium" * skip_unless(have_chromium(), "needs Debian's chromium (tools/setup "
                                                             "installs it)")) {
  scoped_dir dir("status-cluster");
  auto key = dir.path + "/cluster.key";
  {
    std::ofstream f{key};
    f << std::string(64, 'b') << "\n";
  }
  REQUIRE(::chmod(key.c_str(), 0600) == 0);
  auto cport = free_port();
  auto coordinator = "127.0.0.1:" + std::to_string(cport);
  background coord({env_path("DSECD_BIN"), "--coordinator", "--listen", coordinator, "--state",
                    actor_layers(), "--cluster-key", key, "--metrics", "127.0.0.1:0"});
  REQUIRE_MESSAGE(coord.wait_for_output("/metrics (and"), coord.out() << coord.err());
  auto at = coord.out().find("metrics on http://127.0.0.1:");
  REQUIRE(at != std::string::npos);
  auto mport = static_cast<uint16_t>(std::atoi(coord.out().c_str() + at + 28));
  std::vector<std::unique_ptr<background>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<background>(std::vector<std::string>{
      env_path("DSECD_BIN"), "--join", coordinator, "--listen", "127.0.0.1:0", "--state",
      dir.path + "/node-" + std::to_string(i), "--cluster-key", key}));
    REQUIRE_MESSAGE(nodes.back()->wait_for_output("listening on"), nodes.back()->err());
  }
  httplib::Client m("127.0.0.1", mport);
  nlohmann::json st;
  auto status = [&] {
    auto r = m.Get("/status.json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    st = nlohmann::json::parse(r->body);
  };
  auto nodes_up = [&] {
    size_t up = 0;
    for (const auto& n : st["nodes"])
      up += n["up"].get<bool>();
    return up;
  };
  REQUIRE_MESSAGE(eventually([&] {
                    status();
                    return nodes_up() == 3;
                  }),
                  st.dump());

  // Sandboxes on the cluster, held while the page is looked at.
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, cport);
  auto s = c->open_session({}, true);
  REQUIRE_MESSAGE(s, describe(s.error_value()));
  constexpr size_t n = 12;
  auto ids = (*s)->create(env_of(), n);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  REQUIRE(ids->size() == n);
  // The nodes' heartbeats tell the coordinator; the history's last sample has them.
  auto live_in = [](const nlohmann::json& by_node) {
    double sum = 0;
    for (const auto& [_, v] : by_node.items())
      sum += v.get<double>();
    return sum;
  };
  CHECK_MESSAGE(eventually([&] {
                  status();
                  double now_live = 0;
                  for (const auto& x : st["nodes"])
                    now_live += x["live"].get<double>();
                  return now_live == n && !st["history"].empty()
                         && live_in(st["history"].back()["nodes_live"]) == n;
                }),
                st.dump());
  // The rates add up to the counts: a coordinator's are its cluster's (from
  // the nodes' heartbeats), in the intervals since it started: the 12 creates.
  double integral = -1, created = -1;
  CHECK_MESSAGE(eventually([&] {
                  status();
                  integral = 0;
                  for (const auto& h : st["history"])
                    integral += h["creates_per_s"].get<double>() * h["dt_s"].get<double>();
                  created = st["cluster"]["created"].get<double>();
                  return created == n && std::abs(integral - created) < 1e-6;
                }),
                "creates/s over the history add up to " << integral << ", the cluster made "
                                                        << created);
  // The create latency is the cluster's too: every node's histogram from its
  // heartbeats, summed (the coordinator's own node made only some of them).
  std::string text;
  CHECK_MESSAGE(eventually([&] {
                  auto r = m.Get("/metrics");
                  REQUIRE(r);
                  text = r->body;
                  return contains(text, "dsec_cluster_create_seconds_count " + std::to_string(n)
                                          + "\n");
                }),
                text);
  CHECK(contains(text, "# TYPE dsec_cluster_create_seconds histogram"));
  CHECK(contains(text, "dsec_cluster_create_seconds_bucket{le=\"+Inf\"} " + std::to_string(n)));
  status();
  CHECK(st["latency_of"] == "the cluster's nodes (their heartbeats)");
  CHECK_MESSAGE(eventually([&] {
                  status();
                  for (const auto& h : st["history"])
                    if (!h["create_p50_ms"].is_null() && h["create_p50_ms"].get<double>() > 0)
                      return true;
                  return false;
                }),
                st.dump());

  // The page in a real browser: its script fetched /status.json and drew it.
  auto page = "http://127.0.0.1:" + std::to_string(mport) + "/status";
  auto dom = chromium(page, "--dump-dom", dir.path + "/chromium");
  REQUIRE_MESSAGE(dom.status == 0, dom.describe());
  CHECK_MESSAGE(occurrences(dom.out, "<tr class=\"node\"") == 3, dom.out);
  CHECK(contains(dom.out, "data-node=\"" + coordinator + "\""));
  CHECK(occurrences(dom.out, ">up</td>") == 3);
  CHECK(contains(dom.out, "data-rendered="));
  CHECK(contains(dom.out, "data-series=\"creates/s\""));
  CHECK(contains(dom.out, "data-series=\"" + coordinator + "\"")); // live per node
  CHECK(contains(dom.out, "<p id=\"error\"></p>"));                 // no fetch error shown
  CHECK(contains(dom.out, "create latency of the cluster's nodes (their heartbeats)"));
  // And what it looks like: the plots' colours are on the screenshot.
  auto shot = dir.path + "/status.png";
  auto r = chromium(page, "--screenshot=" + shot, dir.path + "/chromium");
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  auto img = read_png(shot);
  REQUIRE_MESSAGE(img, "cannot read " << shot);
  CHECK(img->width == 1000);
  CHECK(img->count(0x22, 0xaa, 0x77) > 20); // #2a7: creates/s, p50, the first node's line
  CHECK(img->count(0x44, 0x77, 0xcc) > 20); // #47c: destroys/s, the second node's line
  CHECK(img->count(0xcc, 0x33, 0x33) > 20); // #c33: failures/s, p99, the third node's line

  for (const auto& id : *ids)
    CHECK((*s)->destroy(id));
  CHECK(eventually_gone(*c, *ids));
  c.reset();
  for (auto& x : nodes) {
    x->kill(SIGTERM);
    auto end = x->wait();
    CHECK_MESSAGE(end.status == 0, end.describe());
  }
  coord.kill(SIGTERM);
  auto cend = coord.wait();
  CHECK_MESSAGE(cend.status == 0, cend.describe());
}
