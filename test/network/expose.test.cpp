// Exposed ports (docs/network.md, "Exposed ports"): a port of the node that
// dsecd forwards to a TCP port on a sandbox's loopback, in its own network
// namespace. Everything here is on loopback (the node's 127.0.0.1 and the
// sandboxes' own), or in a network namespace the test makes: no packet leaves
// the machine. The servers inside are the test probe (`probe tcp-listen`:
// "hello" to every connection) and the system layer's busybox httpd.
#include <doctest/doctest.h>

#include <atomic>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <set>
#include <thread>
#include <vector>

#include "actors/client.hpp"
#include "runtime/fd.hpp"
#include "runtime/port_forward.hpp"
#include "test/actors/common.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"
#include "test/support/skip.hpp"

using namespace dsec;
using namespace std::chrono_literals;
using namespace dsec::test;

namespace {

namespace fs = std::filesystem;

const char* ip_bin() { return fs::exists("/usr/sbin/ip") ? "/usr/sbin/ip" : "/sbin/ip"; }
bool is_root() { return ::geteuid() == 0; }

// The system layer's busybox, inside every sandbox.
const std::string busybox = "/.dsec/libexec/busybox";

std::unique_ptr<session> open(client& c) {
  auto s = c.open_session({}, true);
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

environment loopback_env(std::vector<uint16_t> expose = {}) {
  auto env = env_of();
  env.net = true;
  env.expose = std::move(expose);
  return env;
}

std::string make_one(session& s, const environment& env) {
  std::vector<std::string> failures;
  auto ids = s.create(env, 1, {}, [&](const error& e) { failures.push_back(describe(e)); });
  REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
  REQUIRE_MESSAGE(ids->size() == 1, "create failed: " << (failures.empty() ? "?" : failures[0]));
  return ids->front();
}

// Why a create failed (its one failure, or the call's error).
std::string create_error(session& s, const environment& env) {
  std::vector<std::string> failures;
  auto ids = s.create(env, 1, {}, [&](const error& e) { failures.push_back(describe(e)); });
  if (!ids)
    return describe(ids.error_value());
  return failures.empty() ? "(created)" : failures.front();
}

sandbox_info info_of(session& s, const std::string& id) {
  auto all = s.list();
  REQUIRE(all);
  for (auto& i : *all)
    if (i.id == id)
      return i;
  FAIL("sandbox " << id << " is not in its session's list");
  return {};
}

// A server in the sandbox, started by a command that returns once it listens.
void serve_hello(session& s, const std::string& id, uint16_t port) {
  auto r = s.exec(id, cmd({"/usr/bin/probe", "tcp-listen", std::to_string(port)}));
  REQUIRE(r);
  REQUIRE_MESSAGE(r->out == "listening\n", r->out << r->err);
}

// busybox httpd on the sandbox's 127.0.0.1:PORT, serving /srv/index.html = `body`.
void serve_http(session& s, const std::string& id, uint16_t port, const std::string& body) {
  REQUIRE(s.exec(id, cmd({busybox, "mkdir", "-p", "/srv"})));
  REQUIRE(s.exec(id, cmd({"/usr/bin/probe", "write", "/srv/index.html", body})));
  auto req = cmd({busybox, "httpd", "-f", "-p", "127.0.0.1:" + std::to_string(port), "-h", "/srv"});
  req.detach = true;
  REQUIRE(s.exec(id, req));
}

// One TCP exchange with HOST:PORT on the node: connects, sends `request`,
// reads until the peer closes (or the safety net), returns what came, or
// "ERR <errno name>" when the connection failed or was reset.
std::string talk(const std::string& host, uint16_t port, const std::string& request) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  unique_fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(s);
  timeval tv{30, 0}; // a safety net, not a threshold
  ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    return std::string{"ERR "} + strerrorname_np(errno);
  if (!request.empty() && ::send(s.get(), request.data(), request.size(), MSG_NOSIGNAL) < 0)
    return std::string{"ERR "} + strerrorname_np(errno);
  std::string got;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(s.get(), buf, sizeof buf, 0);
    if (n == 0)
      return got;
    if (n < 0)
      return got.empty() ? std::string{"ERR "} + strerrorname_np(errno) : got;
    got.append(buf, static_cast<size_t>(n));
  }
}

std::string http_get(const exposed_port& p) {
  auto r = talk(p.host, p.host_port, "GET / HTTP/1.0\r\n\r\n");
  auto body = r.find("\r\n\r\n");
  return r.rfind("HTTP/1.", 0) == 0 && body != std::string::npos ? r.substr(body + 4) : r;
}

// Whether anything listens on TCP port `port` of this machine's namespace.
bool listening(uint16_t port) {
  for (const char* f : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in{f};
    std::string line;
    std::getline(in, line); // header
    while (std::getline(in, line)) {
      std::istringstream w{line};
      std::string sl, local, remote, st;
      w >> sl >> local >> remote >> st;
      auto colon = local.rfind(':');
      if (st == "0A" && colon != std::string::npos
          && std::stoul(local.substr(colon + 1), nullptr, 16) == port)
        return true;
    }
  }
  return false;
}

// The nft ruleset of the machine, to check that exposing adds nothing there.
std::string ruleset() { return run_process({"/usr/sbin/nft", "list", "ruleset"}).out; }

exposed_port parse_address(uint16_t inner, const std::string& addr) {
  exposed_port p;
  p.port = inner;
  auto colon = addr.rfind(':');
  REQUIRE(colon != std::string::npos);
  p.host = addr.substr(0, colon);
  p.host_port = static_cast<uint16_t>(std::stoul(addr.substr(colon + 1)));
  return p;
}

} // namespace

TEST_SUITE("network") {

TEST_CASE("exposed ports: what is refused, and why") {
  // The spec is checked before anything is made.
  auto env = env_of();
  env.expose = {8080};
  auto v = env.validate();
  REQUIRE_FALSE(v);
  CHECK(v.error_value().code == errc::invalid_argument);
  CHECK_MESSAGE(v.error_value().message.find("network none") != std::string::npos,
                v.error_value().message);
  env.net = true;
  CHECK(env.validate());
  env.expose = {8080, 8080};
  CHECK(env.validate().error_value().code == errc::already_exists);
  env.expose = {0};
  CHECK(env.validate().error_value().code == errc::invalid_argument);
  env.expose = {8080};
  env.backend = "microvm";
  CHECK(env.validate().error_value().code == errc::unsupported);
  CHECK(env.to_json().find("\"expose\": [8080]") != std::string::npos);
  for (const char* bad : {"0", "65536", "-1", "80x", "", "123456"}) {
    auto p = parse_port(bad, "--expose");
    CHECK_MESSAGE(!p, bad << " parsed");
    if (!p)
      CHECK(p.error_value().message.find(std::string{"'"} + bad + "'") != std::string::npos);
  }
  CHECK(*parse_port("65535", "port") == 65535);

  embedded e;
  auto s = open(*e.c);
  // A sandbox without a network of its own has nothing to forward to.
  auto none = make_one(*s, env_of());
  auto r = s->expose(none, 8080);
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == errc::invalid_argument);
  CHECK_MESSAGE(r.error_value().message.find("network none") != std::string::npos,
                describe(r.error_value()));
  // Creating one that asks for it anyway is refused by the session.
  auto why = create_error(*s, [] {
    auto x = env_of();
    x.expose = {8080};
    return x;
  }());
  CHECK_MESSAGE(why.find("network none") != std::string::npos, why);
  // A port already exposed, at creation or later.
  auto lo = make_one(*s, loopback_env({8080}));
  r = s->expose(lo, 8080);
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == errc::already_exists);
  CHECK_MESSAGE(r.error_value().message.find("8080") != std::string::npos,
                describe(r.error_value()));
  REQUIRE(s->expose(lo, 8081));
  CHECK(s->expose(lo, 8081).error_value().code == errc::already_exists);
  // A bad port, an unknown sandbox.
  CHECK(s->expose(lo, 0).error_value().code == errc::invalid_argument);
  CHECK(e.c->expose("nosuch", 8080).error_value().code == errc::not_found);
}

TEST_CASE("a server in a sandbox answers the trainer through its exposed port") {
  embedded e;
  auto s = open(*e.c);
  auto rules_before = ruleset();
  // Exposed at creation: the port is forwarded before anything listens.
  auto a = make_one(*s, loopback_env({7000}));
  auto ia = info_of(*s, a);
  REQUIRE(ia.exposed.size() == 1);
  auto pa = ia.exposed[0];
  CHECK(pa.port == 7000);
  CHECK(pa.host == "127.0.0.1");
  CHECK(pa.host_port != 0);
  CHECK(pa.address() == "127.0.0.1:" + std::to_string(pa.host_port));
  // Nothing listens inside yet: the trainer's connection is reset.
  auto early = talk(pa.host, pa.host_port, "");
  CHECK_MESSAGE(early.rfind("ERR ", 0) == 0, early);
  serve_hello(*s, a, 7000);
  CHECK(talk(pa.host, pa.host_port, "") == "hello\n");
  // Exposed later, an HTTP server.
  serve_http(*s, a, 8080, "from a\n");
  auto pa2 = s->expose(a, 8080);
  REQUIRE_MESSAGE(pa2, describe(pa2.error_value()));
  CHECK(pa2->port == 8080);
  CHECK(pa2->host_port != pa.host_port);
  REQUIRE(eventually([&] { return http_get(*pa2) == "from a\n"; }));
  // A second sandbox exposing the same inner port gets another port of the
  // node, and its own server answers there.
  auto b = make_one(*s, loopback_env());
  serve_http(*s, b, 8080, "from b\n");
  auto pb = s->expose(b, 8080);
  REQUIRE(pb);
  CHECK(pb->host_port != pa2->host_port);
  REQUIRE(eventually([&] { return http_get(*pb) == "from b\n"; }));
  CHECK(http_get(*pa2) == "from a\n");
  // Many requests, and a body bigger than the forwarder's buffers both ways.
  for (int i = 0; i < 50; ++i)
    REQUIRE(http_get(*pa2) == "from a\n");
  std::string big;
  while (big.size() < (1u << 20))
    big += "abcdefghijklmnop\n";
  big.resize(1u << 20);
  REQUIRE(s->exec(a, cmd({busybox, "sh", "-c",
                          busybox + " yes abcdefghijklmnop | " + busybox
                            + " head -c 1048576 >/srv/big"})));
  auto got = talk(pa2->host, pa2->host_port, "GET /big HTTP/1.0\r\n\r\n");
  auto at = got.find("\r\n\r\n");
  REQUIRE(at != std::string::npos);
  CHECK(got.substr(at + 4) == big);
  // list and the stats show them; exposing added no nft rule.
  auto ib = info_of(*s, b);
  REQUIRE(ib.exposed.size() == 1);
  CHECK(ib.exposed[0].host_port == pb->host_port);
  CHECK(info_of(*s, a).exposed.size() == 2);
  auto st = node_stats_of(*e.c);
  CHECK(st.exposed_ports == 3);
  CHECK(st.exposed_connections >= 54);
  CHECK(st.exposed_refused >= 1);
  CHECK(ruleset() == rules_before);
  // The sandbox ends: its addresses stop answering, nothing listens there.
  REQUIRE(listening(pa.host_port));
  REQUIRE(s->destroy(a));
  CHECK_FALSE(listening(pa.host_port));
  CHECK_FALSE(listening(pa2->host_port));
  CHECK(talk(pa2->host, pa2->host_port, "GET / HTTP/1.0\r\n\r\n") == "ERR ECONNREFUSED");
  CHECK(http_get(*pb) == "from b\n"); // the other one goes on
  REQUIRE(s->destroy(b));
  CHECK_FALSE(listening(pb->host_port));
  CHECK(node_stats_of(*e.c).exposed_ports == 0);
  CHECK(ruleset() == rules_before);
}

TEST_CASE("a sandbox that does not read stalls only its own connection") {
  // A sandbox side that accepts and never reads (probe tcp-hold): the
  // trainer's writes stop once the forwarder's buffer and the sockets' are
  // full (nothing grows), and the forwarder goes on serving other
  // connections meanwhile.
  embedded e;
  auto s = open(*e.c);
  auto id = make_one(*s, loopback_env({9000, 7000}));
  auto info = info_of(*s, id);
  REQUIRE(info.exposed.size() == 2);
  auto hold = s->exec(id, cmd({"/usr/bin/probe", "tcp-hold", "9000"}));
  REQUIRE(hold);
  REQUIRE(hold->out == "listening\n");
  serve_hello(*s, id, 7000);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(info.exposed[0].host_port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  unique_fd c;
  c = unique_fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  REQUIRE(c);
  int err = ::connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  REQUIRE((err == 0 || errno == EINPROGRESS));
  pollfd p{c.get(), POLLOUT, 0};
  REQUIRE(::poll(&p, 1, 30000) == 1);
  // Write until the socket says "would block", for good (the forwarder
  // stopped reading us), counting the bytes it took: at most what the kernel's socket buffers hold (the trainer's send
  // buffer, the forwarder's two sockets, the server's receive buffer: each at
  // most tcp_wmem's or tcp_rmem's max) plus the forwarder's buffer: a buffer
  // that grew would take everything, up to the loop's cap.
  auto sysctl_max = [](const char* f) {
    std::ifstream in{f};
    size_t lo = 0, def = 0, hi = 0;
    in >> lo >> def >> hi;
    return hi;
  };
  size_t bound = 2 * sysctl_max("/proc/sys/net/ipv4/tcp_wmem")
                 + 2 * sysctl_max("/proc/sys/net/ipv4/tcp_rmem") + (64u << 10);
  std::vector<char> chunk(64 * 1024, 'y');
  size_t sent = 0;
  for (int idle = 0; idle < 3 && sent <= bound + (16u << 20);) {
    ssize_t n = ::send(c.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      idle = 0;
      continue;
    }
    REQUIRE_MESSAGE((n < 0 && errno == EAGAIN), strerrorname_np(errno));
    pollfd w{c.get(), POLLOUT, 0};
    if (::poll(&w, 1, 1000) == 0)
      ++idle; // a second with no room, three times in a row
  }
  MESSAGE("a stalled connection took " << sent << " bytes (bound " << bound << ")");
  CHECK_MESSAGE(sent <= bound, sent << " bytes taken, bound " << bound);
  // The forwarder is not stuck: the other port answers.
  CHECK(talk("127.0.0.1", info.exposed[1].host_port, "") == "hello\n");
  // The sandbox goes: the stalled connection is closed too.
  REQUIRE(s->destroy(id));
  char buf[65536];
  bool closed = eventually([&] {
    ssize_t n = ::recv(c.get(), buf, sizeof buf, 0);
    return n == 0 || (n < 0 && errno != EAGAIN);
  });
  CHECK(closed);
}

TEST_CASE("the forwarder bounds connections per port, passes half-closes, closes with its port"
          * skip_unless(is_root() && fs::exists(ip_bin()), "needs root and ip (iproute2)")) {
  // runtime/port_forward.hpp alone, into a network namespace the test makes
  // (lo up), with a server the test itself holds there.
  // What killed runs of this case left (their pid is in the name).
  std::istringstream lines{run_process({ip_bin(), "netns", "list"}).out};
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("dsec-fwd-", 0) != 0)
      continue;
    auto pid = std::atoi(line.c_str() + 9);
    if (pid > 0 && ::kill(pid, 0) < 0 && errno == ESRCH)
      (void) run_process({ip_bin(), "netns", "del", line.substr(0, line.find(' '))});
  }
  std::string ns = "dsec-fwd-" + std::to_string(::getpid());
  (void) run_process({ip_bin(), "netns", "del", ns});
  REQUIRE(run_process({ip_bin(), "netns", "add", ns}).status == 0);
  struct cleanup_t {
    std::string ns;
    ~cleanup_t() { (void) run_process({ip_bin(), "netns", "del", ns}); }
  } cleanup{ns};
  REQUIRE(run_process({ip_bin(), "-n", ns, "link", "set", "lo", "up"}).status == 0);
  unique_fd nsfd(::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(nsfd);
  // A process in it (the forwarder finds the namespace through a pidfd),
  // which says when it is there.
  int ready[2];
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::setns(nsfd.get(), CLONE_NEWNET) < 0)
      ::_exit(1);
    (void) !::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char in_ns = 0;
  REQUIRE(::read(ready[0], &in_ns, 1) == 1);
  ::close(ready[0]);
  struct reap_t {
    pid_t pid;
    ~reap_t() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{child};
  unique_fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, child, 0)));
  REQUIRE(pidfd);
  // The server: a listener in the namespace, made by a thread that enters it.
  unique_fd server;
  std::thread([&] {
    if (::setns(nsfd.get(), CLONE_NEWNET) < 0)
      return;
    server = unique_fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_port = htons(5000);
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(server.get(), reinterpret_cast<sockaddr*>(&at), sizeof at) < 0
        || ::listen(server.get(), 64) < 0)
      server.reset();
  }).join();
  REQUIRE(server);
  timeval tv{30, 0}; // safety nets against a hang, not thresholds
  ::setsockopt(server.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  port_forward_options o;
  o.per_port = 2;
  auto fw = port_forwarder::start(o);
  REQUIRE(fw);
  auto f = (*fw)->expose(pidfd.get(), 5000);
  REQUIRE(f);
  CHECK((*f)->host() == "127.0.0.1");
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons((*f)->host_port());
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto dial = [&] {
    unique_fd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(::connect(c.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
    ::setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return c;
  };
  // Two are joined to the server (it accepts them and echoes a byte)...
  auto c1 = dial(), c2 = dial();
  std::vector<unique_fd> inner;
  for (int i = 0; i < 2; ++i) {
    inner.emplace_back(::accept4(server.get(), nullptr, nullptr, SOCK_CLOEXEC));
    REQUIRE(inner.back());
    ::setsockopt(inner.back().get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  REQUIRE(::send(inner[0].get(), "1", 1, 0) == 1);
  char ch = 0;
  REQUIRE(::recv(c1.get(), &ch, 1, 0) == 1);
  CHECK(ch == '1');
  // ...the third is over the limit: reset at once, counted as refused.
  auto c3 = dial();
  CHECK(::recv(c3.get(), &ch, 1, 0) <= 0);
  auto st = (*fw)->stats();
  CHECK(st.forwards == 1);
  CHECK(st.connections == 2);
  CHECK(st.accepted == 2);
  CHECK(st.refused == 1);
  // Half-closes pass: the trainer ends its side, the server reads EOF and
  // can still answer.
  REQUIRE(::shutdown(c2.get(), SHUT_WR) == 0);
  CHECK(::recv(inner[1].get(), &ch, 1, 0) == 0);
  REQUIRE(::send(inner[1].get(), "2", 1, 0) == 1);
  REQUIRE(::recv(c2.get(), &ch, 1, 0) == 1);
  CHECK(ch == '2');
  inner[1].reset();
  CHECK(::recv(c2.get(), &ch, 1, 0) == 0);
  // The forward goes: its listener and its connections with it (the
  // trainer's reset, the sandbox's side closed).
  auto port = (*f)->host_port();
  f->reset();
  CHECK_FALSE(listening(port));
  errno = 0;
  CHECK(::recv(c1.get(), &ch, 1, 0) < 0);
  CHECK(errno == ECONNRESET);
  CHECK(::recv(inner[0].get(), &ch, 1, 0) == 0);
  CHECK((*fw)->stats().connections == 0);
  // Bad addresses are named.
  port_forward_options bad;
  bad.address = "localhost";
  auto nf = port_forwarder::start(bad);
  REQUIRE_FALSE(nf);
  CHECK(nf.error_value().message.find("localhost") != std::string::npos);
  bad = {};
  bad.idle_timeout = std::chrono::milliseconds(-1);
  nf = port_forwarder::start(bad);
  REQUIRE_FALSE(nf);
  CHECK(nf.error_value().message.find("--expose-idle-timeout") != std::string::npos);

  // An idle timeout closes a connection through which nothing moves, and
  // not one that keeps moving bytes (a byte every 100 ms against a 2 s
  // timeout), whose bytes still pass after the idle one went.
  port_forward_options io;
  io.idle_timeout = std::chrono::seconds(2);
  auto ifw = port_forwarder::start(io);
  REQUIRE(ifw);
  auto idle_f = (*ifw)->expose(pidfd.get(), 5000);
  REQUIRE(idle_f);
  to.sin_port = htons((*idle_f)->host_port());
  auto quiet = dial(), busy = dial();
  unique_fd quiet_in(::accept4(server.get(), nullptr, nullptr, SOCK_CLOEXEC));
  unique_fd busy_in(::accept4(server.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(quiet_in);
  REQUIRE(busy_in);
  ::setsockopt(quiet_in.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(busy_in.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  // (which accepted socket is which: the first bytes say)
  REQUIRE(::send(quiet.get(), "q", 1, 0) == 1);
  REQUIRE(::send(busy.get(), "b", 1, 0) == 1);
  REQUIRE(::recv(quiet_in.get(), &ch, 1, 0) == 1);
  char other = 0;
  REQUIRE(::recv(busy_in.get(), &other, 1, 0) == 1);
  CHECK(std::set<char>{ch, other} == std::set<char>{'q', 'b'});
  if (ch != 'q')
    std::swap(quiet_in, busy_in);
  std::atomic<bool> quiet_gone{false};
  int busy_sent = 0, busy_got = 0;
  std::thread pinger([&] {
    char b = 0;
    while (!quiet_gone.load() && busy_sent < 600) { // (60 s at most)
      if (::send(busy.get(), "p", 1, MSG_NOSIGNAL) != 1)
        break;
      ++busy_sent;
      if (::recv(busy_in.get(), &b, 1, 0) != 1)
        break;
      ++busy_got;
      std::this_thread::sleep_for(100ms);
    }
  });
  errno = 0;
  auto got = ::recv(quiet.get(), &ch, 1, 0); // blocks until the forwarder closes it
  int why = errno;
  quiet_gone = true;
  pinger.join();
  CHECK(got < 0);
  CHECK(why == ECONNRESET);
  CHECK(::recv(quiet_in.get(), &ch, 1, 0) == 0); // the sandbox's side closed
  CHECK(busy_got == busy_sent);
  CHECK(busy_sent > 10);
  REQUIRE(::send(busy.get(), "z", 1, 0) == 1);
  REQUIRE(::recv(busy_in.get(), &ch, 1, 0) == 1);
  CHECK(ch == 'z');
  REQUIRE(::send(busy_in.get(), "y", 1, 0) == 1);
  REQUIRE(::recv(busy.get(), &ch, 1, 0) == 1);
  CHECK(ch == 'y');
  auto ist = (*ifw)->stats();
  CHECK(ist.idle_closed == 1);
  CHECK(ist.connections == 1);
}

TEST_CASE("dsec expose, ps and run --expose against a dsecd; kill -9 leaves nothing") {
  auto before = settled_snapshot();
  auto rules_before = ruleset();
  uint16_t host_port = 0, later_port = 0;
  std::string id;
  {
    // A short idle timeout: a connection left quiet is closed and counted.
    dsecd_proc d{{"--expose-idle-timeout", "2s"}};
    auto at = "127.0.0.1:" + std::to_string(d.port);
    auto dsec = [&](std::vector<std::string> args) {
      std::vector<std::string> argv{env_path("DSEC_BIN"), "--connect", at};
      argv.insert(argv.end(), args.begin(), args.end());
      return run_process(argv);
    };
    // Refusals: a bad port (usage), a sandbox without its own network.
    auto bad = dsec({"run", "--detach", "--base", "bbt@1", "--net", "--expose", "0", "--",
                     "/usr/bin/probe", "exit", "0"});
    CHECK(bad.status == 2);
    CHECK_MESSAGE(bad.err.find("--expose '0'") != std::string::npos, bad.describe());
    auto none = dsec({"run", "--detach", "--base", "bbt@1", "--expose", "8080", "--",
                      "/usr/bin/probe", "exit", "0"});
    CHECK(none.status != 0);
    CHECK_MESSAGE(none.err.find("network none") != std::string::npos, none.describe());
    // Exposed at creation, the server started by the command itself.
    auto r = dsec({"run", "--detach", "--base", "bbt@1", "--net", "--expose", "7000", "--",
                   "/usr/bin/probe", "tcp-listen", "7000"});
    REQUIRE_MESSAGE(r.status == 0, r.describe());
    id = r.out.substr(0, r.out.find('\n'));
    auto mark = "dsec: " + id + ": port 7000 at ";
    auto m = r.err.find(mark);
    REQUIRE_MESSAGE(m != std::string::npos, r.describe());
    auto addr = r.err.substr(m + mark.size(), r.err.find('\n', m) - m - mark.size());
    auto p = parse_address(7000, addr);
    CHECK(p.host == "127.0.0.1");
    host_port = p.host_port;
    REQUIRE(eventually([&] { return talk(p.host, p.host_port, "") == "hello\n"; }));
    // Later, by the command line; ps shows both.
    auto x = dsec({"expose", id, "7001"});
    REQUIRE_MESSAGE(x.status == 0, x.describe());
    CHECK(x.out.rfind(id + " 7001 127.0.0.1:", 0) == 0);
    later_port = parse_address(7001, x.out.substr(x.out.rfind(' ') + 1, std::string::npos))
                   .host_port;
    auto again = dsec({"expose", id, "7001"});
    CHECK(again.status == 1);
    CHECK_MESSAGE(again.err.find("already exposed") != std::string::npos, again.describe());
    CHECK(dsec({"expose", id, "70000"}).status == 2);
    auto ps = dsec({"ps"});
    CHECK_MESSAGE(ps.out.find("PORTS") != std::string::npos, ps.out);
    CHECK_MESSAGE(ps.out.find("7000->" + addr + ",7001->127.0.0.1:"
                              + std::to_string(later_port))
                    != std::string::npos,
                  ps.out);
    auto js = dsec({"ps", "--json"});
    CHECK_MESSAGE(js.out.find("\"exposed\": [{\"port\": 7000, \"address\": \"" + addr + "\"}")
                    != std::string::npos,
                  js.out);
    auto stats = dsec({"node", "stats"});
    CHECK_MESSAGE(stats.out.find("exposed ports   2 now") != std::string::npos, stats.out);
    CHECK_MESSAGE(stats.out.find(", 0 closed idle") != std::string::npos, stats.out);
    {
      // A connection through which nothing moves (a server on 7001 that
      // holds it and never writes) is reset within 1.125 timeouts; node
      // stats counts it.
      auto hold = dsec({"exec", id, "--", "/usr/bin/probe", "tcp-hold", "7001"});
      REQUIRE_MESSAGE(hold.status == 0, hold.describe());
      unique_fd quiet{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(later_port);
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      REQUIRE(::connect(quiet.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
      char buf[64];
      pollfd pf{quiet.get(), POLLIN, 0};
      REQUIRE(::poll(&pf, 1, 30000) == 1);
      CHECK(::read(quiet.get(), buf, sizeof buf) <= 0);
      REQUIRE(eventually([&] {
        return dsec({"node", "stats"}).out.find(", 1 closed idle") != std::string::npos;
      }));
    }
    // kill -9: the daemon's sockets die with it.
    d.stop(SIGKILL);
  }
  CHECK_FALSE(listening(host_port));
  CHECK_FALSE(listening(later_port));
  CHECK(talk("127.0.0.1", host_port, "") == "ERR ECONNREFUSED");
  CHECK(ruleset() == rules_before);
  {
    // The next dsecd of the state dir starts clean and exposes again.
    dsecd_proc d;
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, d.port);
    auto s = open(*c);
    auto nid = make_one(*s, loopback_env({7000}));
    serve_hello(*s, nid, 7000);
    auto p = info_of(*s, nid).exposed.at(0);
    CHECK(talk(p.host, p.host_port, "") == "hello\n");
    s.reset();
    c.reset();
    CHECK(d.stop(SIGTERM).status == 0);
    CHECK_FALSE(listening(p.host_port));
  }
  check_nothing_left(before);
}

} // TEST_SUITE
