// Who may use a dsecd without --tls (actors/door.hpp, docs/security.md): the
// attack of issue 12 §1 was a local unprivileged user with a hand-built CAF
// client driving the root daemon. Here that user tries: with a raw socket
// (does the daemon say anything, or read anything, before it refuses?) and
// with dsec's own client; root and the --group's members get in.
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>

#include <unistd.h>

#include <string>

#include "runtime/peer.hpp"
#include "test/actors/common.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

// The intruder's output (dsecd_main.cpp, --intruder) as uid:gid.
std::string intrude(uint16_t port, uid_t uid, gid_t gid) {
  auto r = run_process({self_exe(), "--intruder", std::to_string(port), std::to_string(uid),
                        std::to_string(gid)});
  REQUIRE_MESSAGE(r.status == 0, r.describe());
  return r.out;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("door: a local user who is neither root nor in the group is refused before a byte") {
  dsecd_proc d;
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto root = connect(sys, d.port);
  auto before = node_stats_of(*root);

  auto out = intrude(d.port, 65534, 65534);
  // The daemon closed the raw socket without sending its handshake (nothing
  // it could have answered to was read), and dsec's client was told why.
  CHECK_MESSAGE(has(out, "raw 0 bytes, closed"), out);
  CHECK_MESSAGE(has(out, "refused disconnected: "), out);
  CHECK_MESSAGE(has(out, "uid 65534"), out);
  CHECK_MESSAGE(!has(out, "\nconnected\n"), out);
  CHECK_MESSAGE(!has(out, "\nsession "), out);

  // Both refusals were counted; no session was opened; root still works.
  auto after = node_stats_of(*root);
  CHECK(after.refused_clients == before.refused_clients + 2);
  CHECK(after.sessions == before.sessions);
  auto s = root->open_session();
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 1);
  REQUIRE(ids);
  auto r = (*s)->exec(ids->front(), cmd({"echo", "root gets in"}));
  REQUIRE(r);
  CHECK(r->out == "root gets in\n");
}

TEST_CASE("door: members of --group get in, as root does") {
  // nobody's own group is nogroup (65534) on Debian: a member of it.
  auto gid = group_id("nogroup");
  REQUIRE_MESSAGE(gid == 65534, "Debian has nogroup as gid 65534");
  dsecd_proc d({"--group", "nogroup"});
  auto out = intrude(d.port, 65534, 65534);
  CHECK_MESSAGE(has(out, "raw "), out);
  CHECK_MESSAGE(!has(out, "raw 0 bytes"), out); // the daemon's handshake came
  CHECK_MESSAGE(has(out, "\nconnected\n"), out);
  CHECK_MESSAGE(has(out, "session "), out);
  // Another user outside it is still refused.
  auto other = intrude(d.port, 65533, 65533);
  CHECK_MESSAGE(has(other, "raw 0 bytes, closed"), other);
  CHECK_MESSAGE(has(other, "refused disconnected: "), other);
}

TEST_CASE("door: a client idle or waiting longer than the client timeout keeps its link") {
  // dsecd drops a silent link after --client-timeout (3 s here, its least);
  // dsec's client beats every second, so a trainer that idles and then runs
  // a command longer than that loses nothing.
  dsecd_proc d({"--client-timeout", "3s"});
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto s = c->open_session();
  REQUIRE(s);
  auto ids = (*s)->create(env_of(), 1);
  REQUIRE(ids);
  ::sleep(5); // idle
  auto r = (*s)->exec(ids->front(), cmd({"sh", "-c", "sleep 5; echo done"}));
  REQUIRE_MESSAGE(r, describe(r.error_value()));
  CHECK(r->out == "done\n");
  CHECK(ids_of(node_list(*c)).count(ids->front()) == 1);
}
