// TLS between dsecd and its clients (actors/transport.hpp, docs/security.md):
// certificates made by the real tools/tls-certs ($DSEC_TLS_CERTS) under the
// suite's temporary root, real dsecd processes ($DSECD_BIN --tls DIR), and as
// clients dsec::client in this process, the real `dsec --connect --tls`
// ($DSEC_BIN) and `dsec-load --tls` ($DSEC_LOAD_BIN).
//
// A client gets in only with a certificate from the daemon's CA; a plain client,
// a client whose certificate another CA signed and a client that does not trust
// the daemon's certificate are refused before the daemon sees a request (its
// session count does not move). Every dsecd is stopped with SIGTERM whatever
// the outcome (dsecd_proc, listener), and everything made lives under the
// suite's root, removed when the executable exits (or dies).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include <caf/event_based_actor.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/transport.hpp"
#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

namespace fs = std::filesystem;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// `tools/tls-certs ARGS...` to completion.
proc_result tls_certs(const std::vector<std::string>& args) {
  std::vector<std::string> argv{env_path("DSEC_TLS_CERTS")};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run_process(argv);
  CHECK_FALSE_MESSAGE(r.safety_killed, r.describe());
  return r;
}

void copy_file(const std::string& from, const std::string& to) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  fs::permissions(to, fs::status(from).permissions());
}

// A directory with ca.pem from `ca_of` and cert.pem, key.pem from `cert_of`.
std::string mix(const std::string& dir, const std::string& ca_of, const std::string& cert_of) {
  fs::create_directories(dir);
  copy_file(ca_of + "/ca.pem", dir + "/ca.pem");
  copy_file(cert_of + "/cert.pem", dir + "/cert.pem");
  copy_file(cert_of + "/key.pem", dir + "/key.pem");
  return dir;
}

// The suite's certificates, made once with tools/tls-certs.
struct certs {
  std::string good;      ///< CA A, and a certificate and key it signed
  std::string peer;      ///< another certificate of CA A (tools/tls-certs --ca good)
  std::string other;     ///< CA B, and its own certificate
  std::string wrong_cert; ///< trusts A (the daemon's CA), but B signed its certificate
  std::string wrong_ca;  ///< A signed its certificate, but it trusts only B
  // (configure_tls refuses both: they serve raw_tls_trainer and its checks)
};

const certs& the_certs() {
  static const certs c = [] {
    certs out;
    auto root = suite::get().root() + "/tls";
    out.good = root + "/good";
    out.peer = root + "/peer";
    out.other = root + "/other";
    for (const auto& args : std::vector<std::vector<std::string>>{
           {out.good}, {"--ca", out.good, out.peer, "trainer-1"}, {out.other, "10.9.8.7"}}) {
      auto r = tls_certs(args);
      REQUIRE_MESSAGE(r.status == 0, r.describe());
    }
    out.wrong_cert = mix(root + "/wrong-cert", out.good, out.other);
    out.wrong_ca = mix(root + "/wrong-ca", out.other, out.good);
    return out;
  }();
  return c;
}

// A trainer's actor system configured for TLS with `dir` (the config first).
struct tls_config {
  explicit tls_config(const std::string& dir) {
    configure_system(cfg);
    auto ok = configure_tls(cfg, tls_options{dir});
    REQUIRE_MESSAGE(ok, "configure_tls " << dir << ": " << describe(ok.error_value()));
  }
  caf::actor_system_config cfg;
};
struct tls_trainer {
  explicit tls_trainer(const std::string& dir) : conf(dir) {}
  tls_config conf;
  caf::actor_system sys{conf.cfg};
};

// A trainer with CAF's OpenSSL module set to DIR's files as they are, without
// configure_tls's checks (which refuse a certificate that DIR/ca.pem did not
// sign): what a peer configured by other means presents.
struct raw_tls_config {
  explicit raw_tls_config(const std::string& dir) {
    configure_system(cfg);
    cfg.load<caf::openssl::manager>();
    cfg.openssl_cafile = dir + "/ca.pem";
    cfg.openssl_certificate = dir + "/cert.pem";
    cfg.openssl_key = dir + "/key.pem";
  }
  caf::actor_system_config cfg;
};
struct raw_tls_trainer {
  explicit raw_tls_trainer(const std::string& dir) : conf(dir) {}
  raw_tls_config conf;
  caf::actor_system sys{conf.cfg};
};

// A plain trainer (no TLS).
struct plain_trainer {
  test_system ts;
  caf::actor_system sys{ts.cfg};
};

// `dsec --connect 127.0.0.1:PORT ARGS...` ($DSEC_TLS set to `env_tls` if given).
proc_result dsec_cli(uint16_t port, const std::vector<std::string>& args,
                     const std::string& env_tls = {}) {
  std::vector<std::string> argv{env_path("DSEC_BIN"), "--connect",
                                "127.0.0.1:" + std::to_string(port)};
  argv.insert(argv.end(), args.begin(), args.end());
  spawn_options o;
  o.in_child = [env_tls] {
    if (env_tls.empty())
      ::unsetenv("DSEC_TLS");
    else
      ::setenv("DSEC_TLS", env_tls.c_str(), 1);
  };
  auto r = run_process(argv, o);
  CHECK_FALSE_MESSAGE(r.safety_killed, r.describe());
  return r;
}

// `dsecd ARGS...` that must fail at start: it exits by itself.
proc_result dsecd_fails(const std::vector<std::string>& args) {
  auto state = suite::get().root() + "/refused-state";
  std::vector<std::string> argv{env_path("DSECD_BIN"), "--state", state};
  argv.insert(argv.end(), args.begin(), args.end());
  spawn_options o;
  o.kill_after = std::chrono::seconds{120};
  auto r = run_process(argv, o);
  CHECK_FALSE_MESSAGE(r.safety_killed, "dsecd did not refuse to start: " << r.describe());
  return r;
}

// A dsecd with --listen `listen` (port 0) and --tls `dir`, stopped with SIGTERM
// (it must exit 0) whatever the outcome.
struct listener {
  listener(const std::string& listen, const std::string& dir)
    : bg({env_path("DSECD_BIN"), "--listen", listen, "--state", actor_layers(), "--tls", dir}) {
    auto host = listen.substr(0, listen.rfind(':'));
    const std::string mark = "listening on " + host + ":";
    if (!bg.wait_for_output(" (state ")) {
      stopped = true;
      bg.kill(SIGTERM);
      auto end = bg.wait();
      FAIL("dsecd did not start: " << end.describe());
    }
    port = static_cast<uint16_t>(std::atoi(bg.out().c_str() + bg.out().find(mark) + mark.size()));
    REQUIRE_MESSAGE(port != 0, bg.out());
  }
  ~listener() {
    if (stopped)
      return;
    bg.kill(SIGTERM);
    auto end = bg.wait();
    if (std::uncaught_exceptions() == 0)
      CHECK_MESSAGE(end.status == 0, "dsecd: " << end.describe());
  }
  background bg;
  bool stopped = false;
  uint16_t port = 0;
};

// Connects with `sys` and expects a refusal naming `why`.
void check_refused(caf::actor_system& sys, uint16_t port, const std::string& why) {
  auto c = client::connect(sys, "127.0.0.1", port);
  check_error(c, errc::disconnected, why);
  if (!c)
    CHECK_MESSAGE(contains(c.error_value().message,
                           "cannot reach a dsecd at 127.0.0.1:" + std::to_string(port)),
                  describe(c.error_value()));
}

} // namespace

TEST_CASE("a client with a certificate from dsecd's CA gets in; every other is refused first") {
  const auto& k = the_certs();
  dsecd_proc d({"--tls", k.good});
  CHECK_MESSAGE(contains(d.bg.out(), "with TLS: peers need a certificate signed by " + k.good
                                       + "/ca.pem"),
                d.bg.out());

  tls_trainer t{k.good};
  auto c = connect(t.sys, d.port);
  auto before = node_stats_of(*c);

  // A session, a sandbox and a command, over TLS.
  {
    session_options opts;
    opts.quota = 4;
    auto s = c->open_session(opts);
    REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
    auto ids = (*s)->create(env_of(), 1);
    REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
    REQUIRE(ids->size() == 1);
    auto r = (*s)->exec(ids->front(), cmd({"sh", "-c", "echo over tls"}));
    REQUIRE_MESSAGE(r, "exec: " << describe(r.error_value()));
    CHECK(r->exit_code == 0);
    CHECK(r->out == "over tls\n");
    auto n = (*s)->close();
    REQUIRE_MESSAGE(n, "close: " << describe(n.error_value()));
    CHECK(*n == 1);
  }
  auto sessions = node_stats_of(*c).sessions;
  CHECK(sessions == before.sessions);
  auto created = node_stats_of(*c).created;

  // Another certificate of the same CA, from tools/tls-certs --ca: gets in.
  {
    tls_trainer p{k.peer};
    auto pc = connect(p.sys, d.port);
    CHECK(node_stats_of(*pc).node == node_stats_of(*c).node);
  }

  // Refused, each at the handshake.
  {
    plain_trainer plain;
    check_refused(plain.sys, d.port, "it may require TLS");
  }
  {
    tls_trainer other{k.other}; // another CA's certificate, trusting only that CA
    check_refused(other.sys, d.port, "the TLS handshake failed");
  }
  for (const auto& dir : {k.wrong_cert, k.wrong_ca}) {
    // wrong_cert: the daemon refuses the client; wrong_ca: the client the daemon.
    INFO("client certificates: " << dir);
    raw_tls_trainer wrong{dir};
    check_refused(wrong.sys, d.port, "the TLS handshake failed");
  }
  // The command line without --tls: `session open` would have made a session.
  {
    auto r = dsec_cli(d.port, {"session", "open"});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, "it may require TLS"), r.describe());
    CHECK(r.out.empty());
  }
  auto after = node_stats_of(*c);
  CHECK_MESSAGE(after.sessions == sessions, "a refused client reached the daemon");
  CHECK(after.created == created);

  // The command line with --tls DIR, or $DSEC_TLS.
  {
    auto r = dsec_cli(d.port, {"--tls", k.peer, "run", "--base", tar_base, "--", "echo", "cli"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK(r.out == "cli\n");
    r = dsec_cli(d.port, {"node", "stats"}, k.good);
    CHECK_MESSAGE(r.status == 0, r.describe());
    r = dsec_cli(d.port, {"--tls", k.other, "node", "stats"});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, "the TLS handshake failed"), r.describe());
  }
  // dsec-load --tls.
  {
    auto r = run_process({env_path("DSEC_LOAD_BIN"), "--connect",
                          "127.0.0.1:" + std::to_string(d.port), "--tls", k.good, "--count",
                          "3", "--base", tar_base, "--quiet", "--", "sh", "-c", "echo hi"});
    CHECK_MESSAGE(r.status == 0, r.describe());
    CHECK_MESSAGE(contains(r.out, "created    3"), r.describe());
    r = run_process({env_path("DSEC_LOAD_BIN"), "--connect",
                     "127.0.0.1:" + std::to_string(d.port), "--count", "3", "--base", tar_base,
                     "--quiet", "--", "sh", "-c", "echo hi"});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, "it may require TLS"), r.describe());
  }
  CHECK(eventually([&] { return node_stats_of(*c).live == 0; }));
  c.reset();
  auto end = d.stop(SIGTERM);
  CHECK_MESSAGE(end.status == 0, end.describe());
  CHECK_MESSAGE(contains(end.out, "dsecd: 0 sandboxes destroyed"), end.describe());
}

// What an actor that connects with the middleman's asynchronous connect_atom
// (the way a node joins a coordinator) learns: "ok", or connect_error's words.
std::string async_connect(caf::actor_system& sys, uint16_t port) {
  std::promise<std::string> result;
  auto f = result.get_future();
  sys.spawn([&result, port](caf::event_based_actor* self) {
    auto host = std::string{"127.0.0.1"};
    self->request(middleman_of(self->system()), caf::infinite, caf::connect_atom::value, host,
                  port)
      .then(
        [&result, self](caf::node_id&, caf::strong_actor_ptr& whom,
                        std::set<std::string>& ifs) {
          auto sched = caf::actor_cast<scheduler_actor>(whom);
          if (!whom || ifs != self->system().message_types<scheduler_actor>()) {
            result.set_value("not a scheduler");
            return;
          }
          self->request(sched, caf::infinite, stats_atom::value)
            .then([&result](const node_stats& s) { result.set_value("ok " + s.node); },
                  [&result](caf::error& e) { result.set_value("stats: " + to_string(e)); });
        },
        [&result, self, host, port](caf::error& e) {
          result.set_value(connect_error(self->system(), e, host, port).message);
        });
  });
  return f.get();
}

TEST_CASE("over TLS too, a client's exit messages and links end none of dsecd's actors") {
  // The TLS path has doormen and scribes of its own (CAF's OpenSSL module);
  // the screen sits in the BASP broker they all hand their bytes to
  // (actors/basp_guard.hpp). The surfaces suite has the rest of the attacks.
  const auto& k = the_certs();
  dsecd_proc d({"--tls", k.good});
  tls_trainer t{k.good};
  auto c = connect(t.sys, d.port);
  session_options opts;
  opts.quota = 3;
  auto s = c->open_session(opts);
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 1);
  REQUIRE(ids);
  auto sched = caf::actor_cast<caf::actor>(c->scheduler());
  auto sess = caf::actor_cast<caf::actor>((*s)->handle());
  auto before = node_stats_of(*c).refused_internal;
  for (const auto& target : {sched, sess}) {
    caf::anon_send_exit(target, caf::exit_reason::kill);
    caf::anon_send_exit(target, caf::exit_reason::user_shutdown);
  }
  auto doomed = t.sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    return {[=](int32_t x) {
      self->link_to(sched);
      self->link_to(sess);
      return x;
    }};
  });
  {
    caf::scoped_actor self{t.sys};
    self->request(doomed, std::chrono::seconds(30), int32_t{1})
      .receive([](int32_t) {}, [](caf::error&) {});
    self->monitor(doomed);
    caf::anon_send_exit(doomed, caf::exit_reason::kill);
    self->receive([](caf::down_msg&) {});
  }
  (void) node_stats_of(*c); // a round trip: the end of `doomed` has arrived
  CHECK(node_stats_of(*c).refused_internal >= before + 6); // 4 exits, 2 links
  auto r = (*s)->exec(ids->front(), cmd({"sh", "-c", "echo still"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "still\n");
  auto more = (*s)->create(env_of(), 1);
  CHECK_MESSAGE(more, describe(more.error_value()));
  auto other = c->open_session(session_options{});
  REQUIRE_MESSAGE(other, describe(other.error_value()));
  REQUIRE((*other)->close());
  REQUIRE((*s)->close());
}

TEST_CASE("an actor connects asynchronously through middleman_of, over TLS when configured") {
  const auto& k = the_certs();
  dsecd_proc d({"--tls", k.good});
  tls_trainer t{k.good};
  CHECK(tls_enabled(t.sys));
  CHECK(async_connect(t.sys, d.port) == "ok 127.0.0.1:" + std::to_string(d.port));
  plain_trainer plain;
  CHECK_FALSE(tls_enabled(plain.sys));
  auto refused = async_connect(plain.sys, d.port);
  CHECK_MESSAGE(contains(refused, "cannot reach 127.0.0.1:" + std::to_string(d.port)
                                    + ": the other side closed the connection during the "
                                      "handshake: it may require TLS"),
                refused);
}

TEST_CASE("a TLS client is refused by a plain dsecd, saying TLS may be why") {
  const auto& k = the_certs();
  dsecd_proc d;
  CHECK_MESSAGE(contains(d.bg.out(), "without TLS"), d.bg.out());
  tls_trainer t{k.good};
  check_refused(t.sys, d.port, "does not speak TLS");
}

TEST_CASE("dsecd refuses a non-loopback --listen without --tls") {
  for (const std::string listen : {"0.0.0.0:0", "10.1.2.3:7070", "[::]:0"}) {
    INFO("--listen " << listen);
    auto r = dsecd_fails({"--listen", listen});
    CHECK_MESSAGE(r.status == 2, r.describe());
    CHECK_MESSAGE(contains(r.err, "is not a loopback address; listening there needs --tls DIR"),
                  r.describe());
    CHECK(r.out.empty());
  }
  auto r = dsecd_fails({"--listen", "dsec.example:7070"});
  CHECK_MESSAGE(r.status == 2, r.describe());
  CHECK_MESSAGE(contains(r.err, "is not an IPv4 or IPv6 address"), r.describe());
}

TEST_CASE("with --tls dsecd listens on every address, and TLS is still required") {
  const auto& k = the_certs();
  listener l{"0.0.0.0:0", k.good};
  CHECK_MESSAGE(contains(l.bg.out(), "listening on 0.0.0.0:"), l.bg.out());
  tls_trainer t{k.good};
  auto c = connect(t.sys, l.port);
  auto sessions = node_stats_of(*c).sessions;
  plain_trainer plain;
  check_refused(plain.sys, l.port, "it may require TLS");
  CHECK(node_stats_of(*c).sessions == sessions);
}

TEST_CASE("dsecd --tls refuses missing and bad files, naming them") {
  const auto& k = the_certs();
  auto s = suite::get().scratch();
  auto no_key = mix(s / "no-key", k.good, k.good);
  fs::remove(no_key + "/key.pem");
  auto open_key = mix(s / "open-key", k.good, k.good);
  fs::permissions(open_key + "/key.pem", fs::perms::others_read, fs::perm_options::add);
  auto not_its_key = mix(s / "not-its-key", k.good, k.good);
  copy_file(k.other + "/key.pem", not_its_key + "/key.pem");
  auto not_pem = mix(s / "not-pem", k.good, k.good);
  write_file(not_pem + "/cert.pem", "hello\n");
  for (const auto& [dir, names] : std::vector<std::pair<std::string, std::string>>{
         {no_key, no_key + "/key.pem is missing"},
         {open_key, open_key + "/key.pem is open to group or others (mode 0604): chmod 600"},
         {not_its_key, not_its_key + "/key.pem is not the key of the certificate " + not_its_key
                         + "/cert.pem"},
         {k.wrong_cert, k.wrong_cert + "/cert.pem is not valid under the CA " + k.wrong_cert
                          + "/ca.pem"},
         {not_pem, not_pem + "/cert.pem holds no PEM certificate"},
         {s / "nosuch", s / "nosuch does not exist"}}) {
    INFO("--tls " << dir);
    auto r = dsecd_fails({"--listen", "127.0.0.1:0", "--tls", dir});
    CHECK_MESSAGE(r.status == 1, r.describe());
    CHECK_MESSAGE(contains(r.err, "dsecd: --tls " + dir + ": "), r.describe());
    CHECK_MESSAGE(contains(r.err, names), r.describe());
    CHECK_MESSAGE(!contains(r.out, "listening"), r.describe());

    // The same checks on a client's side.
    caf::actor_system_config cfg;
    auto ok = client::configure(cfg, tls_options{dir});
    REQUIRE_FALSE(ok);
    CHECK_MESSAGE(contains(ok.error_value().message, names), describe(ok.error_value()));
  }
  // The command line says which option was wrong, before any connection.
  auto r = dsec_cli(1, {"--tls", no_key, "node", "stats"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, "--tls " + no_key + ": the TLS key " + no_key
                                  + "/key.pem is missing"),
                r.describe());
}

TEST_CASE("dsecd reads its TLS files once: they may change or go away while it runs") {
  const auto& k = the_certs();
  auto s = suite::get().scratch();
  auto dir = mix(s / "moving", k.good, k.good);
  dsecd_proc d({"--tls", dir});
  fs::remove_all(dir); // CAF would abort dsecd at the next handshake, were it reading them
  tls_trainer t{k.good};
  auto c = connect(t.sys, d.port);
  CHECK(node_stats_of(*c).live == 0);
  plain_trainer plain;
  check_refused(plain.sys, d.port, "it may require TLS");
  c.reset();
  auto end = d.stop(SIGTERM);
  CHECK_MESSAGE(end.status == 0, end.describe());
}

TEST_CASE("tools/tls-certs: keys private, an existing CA kept unless --force") {
  auto s = suite::get().scratch();
  auto dir = s / "ca";
  auto r = tls_certs({dir, "node-1.example", "10.0.0.11"});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  for (const auto& [file, mode] : std::vector<std::pair<std::string, unsigned>>{
         {"ca.pem", 0644}, {"ca-key.pem", 0600}, {"cert.pem", 0644}, {"key.pem", 0600}}) {
    struct stat st{};
    REQUIRE_MESSAGE(::stat((dir + "/" + file).c_str(), &st) == 0, file);
    CHECK_MESSAGE((st.st_mode & 07777) == mode, file << ": mode " << std::oct
                                                      << (st.st_mode & 07777));
  }
  auto ca = read_file(dir + "/ca.pem");
  r = tls_certs({dir});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, dir + "/ca.pem exists"), r.describe());
  CHECK(read_file(dir + "/ca.pem") == ca);
  r = tls_certs({"--force", dir});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(read_file(dir + "/ca.pem") != ca);
  r = tls_certs({"--ca", s / "nosuch", s / "x"});
  CHECK_MESSAGE(r.status == 1, r.describe());
  CHECK_MESSAGE(contains(r.err, s / "nosuch/ca.pem is missing"), r.describe());
  r = tls_certs({"--help"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  CHECK(contains(r.out, "usage: tools/tls-certs"));
  r = tls_certs({});
  CHECK(r.status == 2);
}
