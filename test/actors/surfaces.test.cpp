// Two surfaces (docs/security.md, "Who may send what"; issue 12 §1): a client
// that got through the connection's authentication (these tests run as root)
// talks to a real dsecd with a hand-built CAF client, as an attacker would:
// the project's own message types, any verb, to any actor it can name, and
// handles forged for actor ids it guesses (CAF's ids are small and sequential).
// Every internal verb is refused for want of the daemon's or cluster's key, and
// counted; no host path comes from a message; a forged down message changes
// nothing; a node without the cluster's key cannot join.
#include <doctest/doctest.h>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "actors/surface.hpp"
#include "actors/types.hpp"
#include "test/actors/common.hpp"
#include "test/support/host.hpp"

namespace dsec::test {
namespace {

using namespace std::chrono_literals;

// ---- the attacker's tools -----------------------------------------------------

/// A handle to actor `id` of the process `where`, as any connected peer can
/// make one: the BASP broker makes a proxy for whatever (node, id) it is given.
caf::actor forge(caf::actor_system& sys, const caf::node_id& where, caf::actor_id id) {
  auto bb = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  REQUIRE(bb);
  auto* broker = static_cast<caf::io::basp_broker*>(caf::actor_cast<caf::abstract_actor*>(bb));
  return caf::actor_cast<caf::actor>(broker->proxy_registry_ptr()->get_or_put(where, id));
}

/// How a raw request ended: a value of the type asked for, or an error; and who
/// answered (a reply names its sender: that is how handles leak).
struct outcome {
  bool ok = false;
  error err;
  caf::actor from;
};

template <class... Ts, class... Xs>
outcome ask_raw(caf::actor_system& sys, const caf::actor& to, Xs... xs) {
  caf::scoped_actor self{sys};
  outcome o;
  self->request(to, 30s, xs...)
    .receive(
      [&](Ts&...) {
        o.ok = true;
        o.from = caf::actor_cast<caf::actor>(self->current_sender());
      },
      [&](caf::error& e) { o.err = from_caf(e); });
  return o;
}

/// What a request sent to every actor id in [first, last] of process `where`
/// came to: all sent at once, each answered or timed out within 10 s (an actor
/// that skips what it does not know answers nothing).
struct spray_result {
  size_t ok = 0, unauthorized = 0, other = 0;
};

template <class... Ts, class... Xs>
spray_result spray(caf::actor_system& sys, const caf::node_id& where, caf::actor_id first,
                   caf::actor_id last, Xs... xs) {
  caf::scoped_actor self{sys};
  spray_result out;
  std::vector<decltype(self->request(caf::actor{}, 10s, xs...))> pending;
  for (auto id = first; id <= last; ++id)
    pending.push_back(self->request(forge(sys, where, id), 10s, xs...));
  for (auto& h : pending)
    h.receive([&](Ts&...) { ++out.ok; },
              [&](caf::error& e) {
                if (from_caf(e).code == errc::unauthorized)
                  ++out.unauthorized;
                else
                  ++out.other;
              });
  return out;
}

/// Sends without waiting (a reacts_to verb has no reply).
template <class... Xs>
void tell_raw(const caf::actor& to, Xs... xs) {
  caf::anon_send(to, xs...);
}

/// A key as an attacker would have one: any 256 bits but the right ones.
internal_key guessed_key() {
  return internal_key::random();
}

void check_refused(const outcome& o, const std::string& what) {
  CHECK_MESSAGE(!o.ok, what << ": the daemon did it");
  if (!o.ok)
    CHECK_MESSAGE(o.err.code == errc::unauthorized, what << ": " << describe(o.err));
}

/// Watches a directory and a file in it with inotify: anything that opens,
/// reads, writes or creates there is seen.
struct tripwire {
  explicit tripwire(const std::string& dir, const std::string& file)
    : fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    REQUIRE(fd >= 0);
    REQUIRE(::inotify_add_watch(fd, dir.c_str(), IN_ALL_EVENTS) >= 0);
    REQUIRE(::inotify_add_watch(fd, file.c_str(), IN_ALL_EVENTS) >= 0);
  }
  ~tripwire() { ::close(fd); }

  /// The events since the watch began (IN_IGNORED and the like left out).
  size_t events() {
    alignas(inotify_event) char buf[8192];
    size_t n = 0;
    for (;;) {
      auto got = ::read(fd, buf, sizeof buf);
      if (got <= 0)
        return n;
      for (char* p = buf; p < buf + got;) {
        auto* ev = reinterpret_cast<inotify_event*>(p);
        if (!(ev->mask & (IN_IGNORED | IN_Q_OVERFLOW)))
          ++n;
        p += sizeof(inotify_event) + ev->len;
      }
    }
  }

  int fd;
};

std::string contents(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    (void) e, ++n;
  return n;
}

/// A root-only directory holding a secret file: what the old attacks named
/// as a pack to read and as a blob dir to write.
struct vault {
  vault() {
    REQUIRE(::chmod(dir.path().c_str(), 0700) == 0);
    std::ofstream{secret} << "the secret\n";
    REQUIRE(::chmod(secret.c_str(), 0600) == 0);
  }
  temp_dir dir{"/tmp", "dsec-vault"};
  std::string secret = dir / "secret";
};

uint64_t refused_of(client& c) {
  return node_stats_of(c).refused_internal;
}

// A dsecd and an attacker connected to it: its own actor system, the
// project's types, the scheduler's handle and a session of its own.
struct attacker {
  explicit attacker(uint16_t port) : c(connect(sys, port)) {
    sched = caf::actor_cast<caf::actor>(c->scheduler());
  }
  test_system ts;
  caf::actor_system sys{ts.cfg};
  std::unique_ptr<client> c;
  caf::actor sched;

  /// A session opened for `trainer`, an actor of the attacker's: its handle
  /// and id.
  std::pair<caf::actor, std::string> open_for(const caf::actor& trainer) {
    std::pair<caf::actor, std::string> out;
    caf::scoped_actor self{sys};
    self->request(sched, std::chrono::seconds(30), open_atom::value, session_options{}, trainer)
      .receive(
        [&](session_actor& h, std::string& sid) {
          out = {caf::actor_cast<caf::actor>(h), std::move(sid)};
        },
        [&](caf::error& e) { FAIL(describe(from_caf(e))); });
    return out;
  }
};

// ---- CAF's own messages (docs/security.md, "CAF's own messages") ---------------

namespace basp = caf::io::basp;

/// What still works after an attack on the daemon's actors: the scheduler
/// opens sessions, the session creates and runs commands, the sandbox answers
/// (by id, through the scheduler: it names itself in the reply).
void still_works(attacker& a, session& s, const std::string& id, const caf::actor& sandbox) {
  auto fresh = a.c->open_session({.quota = 1});
  REQUIRE_MESSAGE(fresh, "the scheduler: " << describe(fresh.error_value()));
  REQUIRE((*fresh)->close());
  auto more = s.create(env_of(), 1);
  REQUIRE_MESSAGE(more, "the session: " << describe(more.error_value()));
  auto r = s.exec(more->front(), cmd({"/bin/sh", "-c", "echo made"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "made\n");
  auto old = s.exec(id, cmd({"/bin/sh", "-c", "echo alive"}));
  REQUIRE_MESSAGE(old, "the first sandbox: " << describe(old.error_value()));
  CHECK(old->out == "alive\n");
  auto again = ask_raw<std::string>(a.sys, a.sched, get_atom::value, id, std::string{"/tmp"});
  REQUIRE_MESSAGE(again.ok, describe(again.err));
  CHECK(again.from == sandbox);
}

/// A session with one sandbox, and the sandbox's handle (a by-id get hands it
/// out: a reply names its sender).
struct victims {
  explicit victims(attacker& a) {
    auto opened = a.c->open_session({.quota = 3});
    REQUIRE(opened);
    s = std::move(*opened);
    auto ids = s->create(env_of(), 1);
    REQUIRE(ids);
    id = ids->front();
    auto leak = ask_raw<std::string>(a.sys, a.sched, get_atom::value, id, std::string{"/tmp"});
    REQUIRE_MESSAGE(leak.ok, describe(leak.err));
    REQUIRE(leak.from);
    sandbox = leak.from;
    sess = caf::actor_cast<caf::actor>(s->handle());
    all = {a.sched, sess, sandbox};
  }
  std::unique_ptr<session> s;
  std::string id;
  caf::actor sandbox, sess;
  std::vector<caf::actor> all; // the scheduler, the session, the sandbox
};

/// A connection that speaks BASP by hand, with CAF's own header and
/// serializers, as an attacker's program would: it says what CAF would not.
struct raw_peer {
  raw_peer(caf::actor_system& sys, uint16_t port) : sys(sys) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    timeval tv{30, 0}; // a safety net only: the daemon talks at once
    REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
    // The daemon's server handshake comes first; its node id leads it.
    auto head = read_exactly(basp::header_size);
    basp::header hdr;
    caf::binary_deserializer h{sys, head};
    REQUIRE_FALSE(h(hdr));
    REQUIRE(hdr.operation == basp::message_type::server_handshake);
    auto payload = read_exactly(hdr.payload_len);
    caf::binary_deserializer p{sys, payload};
    REQUIRE_FALSE(p(daemon));
  }
  ~raw_peer() { ::close(fd); }

  std::vector<char> read_exactly(size_t n) {
    std::vector<char> buf(n);
    size_t got = 0;
    while (got < n) {
      auto r = ::read(fd, buf.data() + got, n - got);
      if (r < 0 && errno == EINTR)
        continue;
      REQUIRE_MESSAGE(r > 0, "the daemon's handshake ended after " << got << " bytes");
      got += static_cast<size_t>(r);
    }
    return buf;
  }

  /// Sends a header and its payload; false when the daemon closed the connection.
  template <class... Ts>
  bool send(basp::header hdr, Ts... xs) {
    std::vector<char> payload;
    caf::binary_serializer ps{sys, payload};
    REQUIRE_FALSE(ps(xs...));
    hdr.payload_len = static_cast<uint32_t>(payload.size());
    std::vector<char> out;
    caf::binary_serializer hs{sys, out};
    REQUIRE_FALSE(hs(hdr));
    out.insert(out.end(), payload.begin(), payload.end());
    size_t done = 0;
    while (done < out.size()) {
      auto r = ::send(fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      if (r < 0 && errno == EINTR)
        continue;
      if (r <= 0)
        return false;
      done += static_cast<size_t>(r);
    }
    return true;
  }

  /// The client handshake: "I am node `as`".
  bool hello(const caf::node_id& as, uint8_t flags = 0) {
    return send(basp::header{basp::message_type::client_handshake, flags, 0, 0, 0, 0}, as);
  }

  /// Reads and drops what the daemon sends until it closes the connection
  /// (true), or until the safety net's 30 s pass without a byte (false).
  bool closed_by_daemon() {
    char buf[4096];
    for (;;) {
      auto r = ::read(fd, buf, sizeof buf);
      if (r == 0)
        return true;
      if (r < 0 && errno == EINTR)
        continue;
      if (r < 0)
        return errno == ECONNRESET;
    }
  }

  caf::actor_system& sys;
  int fd = -1;
  caf::node_id daemon;
};

/// A node id nobody has: what a raw peer may call itself.
caf::node_id made_up_node() {
  caf::node_id::default_data::host_id_type host;
  host.fill(0x5a);
  return caf::make_node_id(4242, host);
}

} // namespace

TEST_CASE("surfaces: a client's place_atom with its own session handle is refused; no sandbox, "
          "no quota bypassed, counted") {
  dsecd_proc d;
  attacker a(d.port);
  auto s = a.c->open_session({.quota = 1});
  REQUIRE(s);
  auto before = node_stats_of(*a.c);
  placement pl;
  pl.request = 1;
  pl.session_id = (*s)->id();
  pl.ttl_ms = 60'000;
  auto session = (*s)->handle();
  // As the old daemon took it (no key): not a verb of the scheduler any more.
  auto old = ask_raw<uint32_t>(a.sys, a.sched, place_atom::value, env_of(), uint32_t{50}, session,
                               pl);
  CHECK_FALSE(old.ok);
  // With a key of its own making: refused, said so, counted.
  auto forged = ask_raw<internal_key, uint32_t>(a.sys, a.sched, place_atom::value, guessed_key(),
                                                env_of(), uint32_t{50}, session, pl);
  check_refused(forged, "place");
  CHECK(forged.err.message.find("place is internal to dsec") != std::string::npos);
  auto after = node_stats_of(*a.c);
  CHECK(after.live == 0);
  CHECK(after.created == before.created);
  CHECK(after.creating == 0);
  CHECK(after.refused_internal >= before.refused_internal + 1);
  // The session's quota (1) still holds for what the client may do.
  REQUIRE((*s)->create(env_of(), 1));
  check_error((*s)->create(env_of(), 1), errc::overloaded, "quota");
  CHECK(node_stats_of(*a.c).live == 1);
  REQUIRE((*s)->close());
  CHECK(d.bg.wait_for_output("refused place (scheduler)", 10s));
}

TEST_CASE("surfaces: spawn_atom sprayed at every actor id of a cluster's node is refused by its "
          "node actor; nothing is made") {
  temp_dir dir{"/tmp", "dsec-surfaces"};
  REQUIRE(::mkdir((dir / "node").c_str(), 0700) == 0);
  dsecd_proc coord({"--coordinator", "--slots", "10"});
  dsecd_proc node({"--join", "127.0.0.1:" + std::to_string(coord.port), "--state", dir / "node",
                   "--slots", "10", "--cluster-key", actor_layers() + "/cluster.key"});
  REQUIRE(node.bg.wait_for_output("joined the cluster of", 60s));
  // The node's process published its scheduler; its node actor went to the
  // coordinator when it joined: it is in its registry, reachable by id.
  attacker a(node.port);
  attacker trainer(coord.port);
  auto sess = trainer.c->open_session({.quota = 4});
  REQUIRE(sess);
  auto before = node_stats_of(*a.c);
  placement pl;
  pl.request = 1;
  pl.session_id = (*sess)->id();
  auto where = a.c->scheduler().node();
  auto keyed = spray<internal_key, uint32_t>(a.sys, where, 1, 200, spawn_atom::value,
                                             guessed_key(), env_of(), uint32_t{4},
                                             (*sess)->handle(), pl);
  // and in the old form, without a key
  auto old = spray<uint32_t>(a.sys, where, 1, 200, spawn_atom::value, env_of(), uint32_t{4},
                             (*sess)->handle(), pl);
  CHECK(keyed.ok == 0);
  CHECK(old.ok == 0);
  // The node actor was among them (it alone has spawn): it said no.
  CHECK(keyed.unauthorized >= 1);
  MESSAGE("spawn to ids 1..200 of the node's process: " << keyed.unauthorized
                                                        << " refused for the key, "
                                                        << keyed.other << " otherwise");
  auto after = node_stats_of(*a.c);
  CHECK(after.live == 0);
  CHECK(after.created == before.created);
  CHECK(after.refused_internal >= before.refused_internal + 1);
  auto l = (*sess)->list();
  REQUIRE(l);
  CHECK(l->empty());
  REQUIRE((*sess)->close());
}

TEST_CASE("surfaces: the old attack (a placement and a pack naming a root-only file and dir) "
          "reads and writes no host file") {
  dsecd_proc d;
  attacker a(d.port);
  vault v;
  auto shadow_before = contents("/etc/shadow");
  auto s = a.c->open_session({.quota = 2, .trajectory = true});
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 1);
  REQUIRE(ids);
  auto id = ids->front();
  // A reply names its sender: a by-id get goes through the session to the
  // sandbox, which answers itself. The attacker has the sandbox's handle.
  auto leak = ask_raw<std::string>(a.sys, a.sched, get_atom::value, id, std::string{"/tmp"});
  REQUIRE_MESSAGE(leak.ok, describe(leak.err));
  REQUIRE(leak.from);
  auto sandbox = leak.from;
  auto before = node_stats_of(*a.c);
  tripwire wire(v.dir.path(), v.secret);
  {
    // Old forms: a pack path and a blob dir, a placement with a seed pack and blobs.
    auto p1 = ask_raw<std::string>(a.sys, sandbox, pack_atom::value, v.secret, v.dir.path());
    CHECK_FALSE(p1.ok);
    // New forms, with a guessed key: refused before the name is even looked at.
    auto p2 = ask_raw<internal_key, std::string>(a.sys, sandbox, pack_atom::value, guessed_key(),
                                                 std::string{"../../../../.." + v.secret});
    check_refused(p2, "pack");
    placement pl;
    pl.request = 7;
    pl.session_id = (*s)->id();
    pl.keep_upper = true;
    pl.id = "aaaaaaaaaaaa";
    pl.seed_pack = v.secret;
    auto p3 = ask_raw<internal_key, uint32_t>(a.sys, a.sched, place_atom::value, guessed_key(),
                                              env_of(), uint32_t{1}, (*s)->handle(), pl);
    check_refused(p3, "place");
    // And the other verbs of the sandbox itself, with no key or a guessed one.
    auto e1 = ask_raw<exec_result>(a.sys, sandbox, exec_atom::value, cmd({"true"}));
    CHECK_FALSE(e1.ok);
    auto e2 = ask_raw<exec_result>(a.sys, sandbox, exec_atom::value, guessed_key(),
                                   cmd({"/bin/sh", "-c", "cat " + v.secret}));
    check_refused(e2, "exec");
    auto g = ask_raw<std::string>(a.sys, sandbox, get_atom::value, guessed_key(),
                                  std::string{"/etc"});
    check_refused(g, "get");
    // Process handles: a command's stdin and its signal, by its id.
    auto in = ask_raw<uint64_t>(a.sys, sandbox, stdin_atom::value, guessed_key(), uint64_t{1},
                                std::string{"x"}, false);
    check_refused(in, "stdin");
    auto sig = ask_raw<bool>(a.sys, sandbox, signal_atom::value, guessed_key(), uint64_t{1},
                             int32_t{9}); // SIGKILL
    check_refused(sig, "signal");
    // The log of its detached commands (their output).
    auto lg = ask_raw<logs_reply>(a.sys, sandbox, logs_atom::value, guessed_key(), logs_request{});
    check_refused(lg, "logs");
  }
  // Everything above was handled (the sandbox and the scheduler answered).
  CHECK(wire.events() == 0);
  CHECK(contents(v.secret) == "the secret\n");
  CHECK(entries(v.dir.path()) == 1);
  CHECK(contents("/etc/shadow") == shadow_before);
  auto after = node_stats_of(*a.c);
  CHECK(after.refused_internal >= before.refused_internal + 7);
  CHECK(after.live == 1);
  // The client's own verbs still work, through the session.
  auto r = (*s)->exec(id, cmd({"/bin/sh", "-c", "echo fine"}));
  REQUIRE(r);
  CHECK(r->out == "fine\n");
  REQUIRE((*s)->close());
}

TEST_CASE("surfaces: forged session-internal messages (ready, failed, gone, placed, lost, a "
          "trainer's down) change nothing") {
  dsecd_proc d;
  attacker a(d.port);
  auto s = a.c->open_session({.quota = 1});
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 1);
  REQUIRE(ids);
  auto id = ids->front();
  auto sess = caf::actor_cast<caf::actor>((*s)->handle());
  auto before = refused_of(*a.c);
  // A sandbox handle of the attacker's own, to be taken for one of the session's.
  auto fake = a.sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](exec_atom, const internal_key&, const exec_request&) { return exec_result{}; }};
  });
  auto k = guessed_key();
  tell_raw(sess, ready_atom::value, k, std::string{"evil00000000"},
           caf::actor_cast<sandbox_actor>(fake), uint64_t{1});
  tell_raw(sess, gone_atom::value, k, id);
  for (int i = 0; i < 3; ++i) // each would let one more sandbox past the quota
    tell_raw(sess, failed_atom::value, k, to_caf(make_error(errc::overloaded, "forged")),
             uint64_t{1});
  tell_raw(sess, placed_atom::value, k, uint64_t{1}, a.sys.node(), uint32_t{1});
  tell_raw(sess, lost_atom::value, k, a.c->scheduler().node(), std::string{"127.0.0.1:1"},
           std::string{"forged"});
  tell_raw(sess, shutdown_atom::value, k);
  tell_raw(sess, flush_atom::value, k);
  // The session answers after handling all of that (one connection: in order).
  auto l = (*s)->list();
  REQUIRE(l);
  REQUIRE(l->size() == 1);
  CHECK(l->front().id == id);
  auto r = (*s)->exec(id, cmd({"/bin/sh", "-c", "echo still"}));
  REQUIRE(r);
  CHECK(r->out == "still\n");
  check_error((*s)->exec("evil00000000", cmd({"true"})), errc::not_found, "evil00000000");
  check_error((*s)->create(env_of(), 1), errc::overloaded, "quota");
  CHECK(refused_of(*a.c) >= before + 8);
  REQUIRE((*s)->close());
  caf::anon_send_exit(fake, caf::exit_reason::kill);

  // A session opened for a trainer actor of the attacker's; a down message
  // naming that trainer, which is alive, would close it.
  auto trainer = a.sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](int32_t) {}};
  });
  auto [owned, owned_id] = a.open_for(trainer);
  auto refused = refused_of(*a.c);
  tell_raw(owned, caf::down_msg{trainer.address(), caf::exit_reason::kill});
  auto alive = ask_raw<std::vector<sandbox_info>>(a.sys, owned, list_atom::value);
  CHECK(alive.ok);
  CHECK(refused_of(*a.c) == refused + 1);
  auto still = a.c->find_session(owned_id);
  CHECK_MESSAGE(still, describe(still.error_value()));
  // The trainer really ends: now the session does close (the test could fail).
  caf::anon_send_exit(trainer, caf::exit_reason::kill);
  CHECK(eventually([&] { return !a.c->find_session(owned_id); }));
}

TEST_CASE("surfaces: with the right key, names that would be paths are still checked: no "
          "placement or pack reaches a host file") {
  vault v;
  embedded e;
  auto s = e.c->open_session({.quota = 4, .trajectory = true});
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 1);
  REQUIRE(ids);
  caf::scoped_actor self{e.sys};
  const auto& key = e.d->member_key();
  tripwire wire(v.dir.path(), v.secret);
  auto spawn_with = [&](placement pl) {
    error err;
    bool ok = false;
    self->request(e.d->node(), 30s, spawn_atom::value, key, env_of(), uint32_t{1},
                  (*s)->handle(), pl)
      .receive([&](internal_key&, uint32_t) { ok = true; },
               [&](caf::error& x) { err = from_caf(x); });
    CHECK_FALSE_MESSAGE(ok, "spawned with " << pl.session_id << " / " << pl.seed_pack);
    return err;
  };
  placement pl;
  pl.request = 99;
  pl.session_id = (*s)->id();
  pl.keep_upper = true;
  pl.id = "bbbbbbbbbbbb";
  pl.seed_pack = v.secret;
  auto e1 = spawn_with(pl);
  CHECK(e1.code == errc::invalid_argument);
  CHECK(e1.message.find("a pack name") != std::string::npos);
  pl.seed_pack = "../../../../../.." + v.secret;
  CHECK(spawn_with(pl).code == errc::invalid_argument);
  pl.seed_pack.clear();
  pl.session_id = "../../../../../.." + v.dir.path();
  auto e2 = spawn_with(pl);
  CHECK(e2.code == errc::invalid_argument);
  CHECK(e2.message.find("a session id") != std::string::npos);
  pl.session_id = (*s)->id();
  pl.id = "../x";
  CHECK(spawn_with(pl).code == errc::invalid_argument);
  // A pack of a genuine sandbox, by a name that is a path.
  sandbox_actor sb;
  self->request(e.d->node(), 30s, lookup_atom::value, key, ids->front())
    .receive([&](internal_key&, sandbox_actor& x) { sb = x; },
             [&](caf::error& x) { FAIL(describe(from_caf(x))); });
  for (const std::string& name : std::vector<std::string>{
         v.secret, "../../../../../.." + v.secret, "..", ".hidden", "a/b"}) {
    error err;
    self->request(sb, 30s, pack_atom::value, key, name)
      .receive([&](internal_key&, std::string&) { FAIL("packed as " << name); },
               [&](caf::error& x) { err = from_caf(x); });
    CHECK_MESSAGE(err.code == errc::invalid_argument, name << ": " << describe(err));
  }
  CHECK(wire.events() == 0);
  CHECK(contents(v.secret) == "the secret\n");
  CHECK(entries(v.dir.path()) == 1);
  CHECK(e.c->stats()->live == 1);
  REQUIRE((*s)->close());
}

TEST_CASE("surfaces: a node with a wrong cluster key cannot join; keys must be private files") {
  temp_dir dir{"/tmp", "dsec-surfaces-key"};
  REQUIRE(::mkdir((dir / "node").c_str(), 0700) == 0);
  dsecd_proc coord({"--coordinator", "--slots", "10"});
  auto where = "127.0.0.1:" + std::to_string(coord.port);
  auto wrong = dir / "wrong.key";
  std::ofstream{wrong} << internal_key::random().to_hex() << "\n";
  REQUIRE(::chmod(wrong.c_str(), 0600) == 0);
  {
    dsecd_proc node({"--join", where, "--state", dir / "node", "--cluster-key", wrong});
    CHECK_MESSAGE(node.bg.wait_for_output("not the cluster's", 60s), node.bg.out());
    CHECK(node.bg.out().find(wrong) != std::string::npos);
    CHECK(node.bg.out().find("joined the cluster") == std::string::npos);
    test_system ts;
    caf::actor_system sys{ts.cfg};
    auto c = connect(sys, coord.port);
    auto m = c->cluster();
    REQUIRE(m);
    size_t up = 0;
    for (const auto& x : *m)
      up += x.state == "up";
    CHECK(up == 1); // the coordinator's own node only
    CHECK(node_stats_of(*c).refused_internal >= 1);
  }
  auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), env_path("DSECD_BIN"));
    return run_process(args);
  };
  // No key at all: it says which file it looked for.
  auto none = run({"--join", where, "--state", dir / "node"});
  CHECK(none.status == 1);
  CHECK(none.err.find(dir / "node/cluster.key") != std::string::npos);
  // A key open to others is refused like a TLS key.
  REQUIRE(::chmod(wrong.c_str(), 0644) == 0);
  auto open = run({"--join", where, "--state", dir / "node", "--cluster-key", wrong});
  CHECK(open.status == 1);
  CHECK(open.err.find("open to group or others") != std::string::npos);
  // Not a key.
  REQUIRE(::chmod(wrong.c_str(), 0600) == 0);
  std::ofstream{wrong} << "not a key\n";
  auto garbage = run({"--join", where, "--state", dir / "node", "--cluster-key", wrong});
  CHECK(garbage.status == 1);
  CHECK(garbage.err.find("holds no key") != std::string::npos);
  auto stray = run({"--cluster-key", wrong});
  CHECK(stray.status == 2);
  CHECK(stray.err.find("--cluster-key is for a --coordinator") != std::string::npos);
  // The coordinator's own key: a private file it made.
  struct stat st {};
  REQUIRE(::stat((actor_layers() + "/cluster.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("surfaces: exit messages (kill, and other reasons) and unanswered errors sent to the "
          "scheduler, a session, a sandbox and every guessed id end none of them; counted") {
  dsecd_proc d;
  attacker a(d.port);
  victims v(a);
  auto before = refused_of(*a.c);
  uint64_t sent = 0;
  for (const auto& target : v.all) {
    // kill cannot be trapped; any other reason but normal ends an actor that
    // sets no exit handler; an error that answers no request ends it too.
    for (auto reason : {caf::exit_reason::kill, caf::exit_reason::user_shutdown,
                        caf::exit_reason::unhandled_exception}) {
      caf::anon_send_exit(target, reason);
      ++sent;
    }
    caf::anon_send(target, caf::make_error(caf::sec::runtime_error));
    ++sent;
  }
  // And every actor the daemon ever named over a connection, by guessed id.
  auto where = a.c->scheduler().node();
  for (caf::actor_id id = 1; id <= 200; ++id) {
    caf::anon_send_exit(forge(a.sys, where, id), caf::exit_reason::kill);
    ++sent;
  }
  // One connection, in order: all of the above was handled before this.
  auto after = refused_of(*a.c);
  CHECK(after >= before + sent);
  MESSAGE(sent << " exit and error messages sent; refused: " << after - before);
  still_works(a, *v.s, v.id, v.sandbox);
  CHECK(d.bg.wait_for_output("refused an exit message from a connection", 10s));
  REQUIRE(v.s->close());
}

TEST_CASE("surfaces: a client's actor linked to the scheduler, a session, a sandbox and every "
          "guessed id takes none of them with it when it is killed; counted") {
  dsecd_proc d;
  attacker a(d.port);
  victims v(a);
  auto targets = v.all;
  auto where = a.c->scheduler().node();
  for (caf::actor_id id = 1; id <= 200; ++id)
    targets.push_back(forge(a.sys, where, id));
  auto before = refused_of(*a.c);
  // The actor links itself to every target when asked, then answers: CAF
  // sends a link request (link_atom) for each, which the daemon's BASP broker
  // would turn into a link of its own, ahead of the answer.
  auto doomed = a.sys.spawn([targets](caf::event_based_actor* self) -> caf::behavior {
    return {[=](int32_t x) {
      for (const auto& t : targets)
        self->link_to(t);
      return x;
    }};
  });
  {
    caf::scoped_actor self{a.sys};
    self->request(doomed, 30s, int32_t{1}).receive([](int32_t) {}, [](caf::error&) {});
  }
  // Handled before this answer (one connection, in order). A handle to an id
  // with no actor behind it ends as soon as the daemon's BASP says so, so CAF
  // sends a link request only for the live ones (the three, and any other).
  auto linked = refused_of(*a.c);
  CHECK(linked >= before + v.all.size());
  MESSAGE("links to " << targets.size() << " handles; requests refused: " << linked - before);
  // The ended handles may have ended it already (an exit for reason unknown,
  // which is not normal: the daemon's linked actors would end with it too);
  // if not, it is killed now.
  {
    caf::scoped_actor self{a.sys};
    self->monitor(doomed);
    caf::anon_send_exit(doomed, caf::exit_reason::kill);
    self->receive([](caf::down_msg&) {});
  }
  // Its end travels to the daemon as an exit message for each linked handle
  // (refused) and as BASP's report of its end (taken: the daemon's proxy of
  // it ends, linked to nothing). Two round trips let both take effect first.
  (void) refused_of(*a.c);
  CHECK(refused_of(*a.c) >= before + 2 * v.all.size());
  still_works(a, *v.s, v.id, v.sandbox);
  REQUIRE(v.s->close());
}

TEST_CASE("surfaces: a raw BASP peer that says it is another connected client's node is cut "
          "off; the traffic for that node still goes to it") {
  dsecd_proc d;
  attacker a(d.port);
  victims v(a);
  auto before = refused_of(*a.c);
  test_system ts;
  caf::actor_system sys{ts.cfg};
  {
    raw_peer raw(sys, d.port);
    // CAF takes a second connection from a node it knows as an alternative
    // route, and with select_connection_flag as the route: the daemon's
    // messages to the victim (for a member: the cluster key) would come here.
    raw.hello(a.sys.node());
    raw.hello(a.sys.node(), basp::header::select_connection_flag);
    CHECK(raw.closed_by_daemon());
  }
  {
    raw_peer raw(sys, d.port); // as the daemon itself
    raw.hello(raw.daemon);
    CHECK(raw.closed_by_daemon());
  }
  {
    raw_peer raw(sys, d.port); // a node of its own first, then another one
    raw.hello(made_up_node());
    raw.hello(a.sys.node(), basp::header::select_connection_flag);
    CHECK(raw.closed_by_daemon());
  }
  // The victim's replies still come to the victim.
  auto l = ask_raw<std::vector<sandbox_info>>(a.sys, v.sess, list_atom::value);
  CHECK_MESSAGE(l.ok, describe(l.err));
  CHECK(refused_of(*a.c) >= before + 3);
  still_works(a, *v.s, v.id, v.sandbox);
  REQUIRE(v.s->close());
}

TEST_CASE("surfaces: a BASP down report for another client's actor (its trainer) from a raw "
          "peer does not close that client's session") {
  dsecd_proc d;
  attacker a(d.port);
  auto trainer = a.sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](int32_t) {}};
  });
  auto [owned, owned_id] = a.open_for(trainer);
  auto before = refused_of(*a.c);
  test_system ts;
  caf::actor_system sys{ts.cfg};
  raw_peer raw(sys, d.port);
  REQUIRE(raw.hello(made_up_node()));
  // "The trainer's actor has ended": BASP's down operation, naming the
  // victim's node and actor. CAF would end its proxy there, and the session,
  // which monitors it, would see its trainer gone and close.
  REQUIRE(raw.send(basp::header{basp::message_type::down_message, 0, 0, 0, trainer.id(), 0},
                   a.sys.node(), raw.daemon, caf::make_error(caf::exit_reason::kill)));
  // Handled by now: two round trips on the victim's connection.
  (void) refused_of(*a.c);
  CHECK(refused_of(*a.c) >= before + 1);
  auto alive = ask_raw<std::vector<sandbox_info>>(a.sys, owned, list_atom::value);
  CHECK_MESSAGE(alive.ok, describe(alive.err));
  auto still = a.c->find_session(owned_id);
  CHECK_MESSAGE(still, describe(still.error_value()));
  // The trainer really ends: now the session does close (the test could fail).
  caf::anon_send_exit(trainer, caf::exit_reason::kill);
  CHECK(eventually([&] { return !a.c->find_session(owned_id); }));
}

} // namespace dsec::test
