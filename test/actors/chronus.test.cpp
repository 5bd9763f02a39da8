// Chronus end to end, through an embedded daemon and dsec::client: trusted
// commands in real sandboxes run the real `chronus` client (dsec's own, at
// /.dsec/bin), the node's endpoint reads their frames through io_uring, the
// session forwards the events to a watching trainer, and the trainer's answers
// reach the very sandbox that asked. The agent's own commands cannot take part:
// they have no trusted channel, and frames on /run/chronus.sock without the
// token (which never leaves the node) are refused and counted; malformed,
// truncated, oversized and flooding frames sent from inside a sandbox are
// refused and counted too, and the node serves on. The attacks of issue 12 §2
// are tests here too: the agent replaces `chronus` and /bin/sh, removes
// /run/chronus.sock and holds its connections, and reaches for the channel
// through /proc; none of it gets it a forged report.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/chronus.hpp"
#include "test/actors/common.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"

using namespace dsec;
using namespace dsec::test;

namespace {

using namespace std::chrono_literals;

std::unique_ptr<session> open(client& c) {
  auto s = c.open_session({});
  REQUIRE_MESSAGE(s, "open_session: " << describe(s.error_value()));
  return std::move(*s);
}

environment chronus_env() {
  auto env = env_of();
  env.chronus = true;
  return env;
}

std::vector<std::string> make(session& s, const environment& env, uint32_t count) {
  std::vector<std::string> failures;
  auto ids = s.create(env, count, {}, [&](const error& e) { failures.push_back(describe(e)); });
  REQUIRE_MESSAGE(ids, "create: " << describe(ids.error_value()));
  REQUIRE_MESSAGE(ids->size() == count, "created " << ids->size() << " of " << count
                                                   << "; first failure: "
                                                   << (failures.empty() ? "none"
                                                                        : failures.front()));
  return std::move(*ids);
}

exec_request sh(const std::string& script, bool trusted) {
  auto r = cmd({"sh", "-c", script});
  r.trusted = trusted;
  return r;
}

exec_result run(session& s, const std::string& id, const exec_request& req) {
  auto r = s.exec(id, req);
  REQUIRE_MESSAGE(r, "exec: " << describe(r.error_value()));
  return std::move(*r);
}

// Pulls events until `pred` says enough, or a generous cap passes (a hang
// guard, not a timing check).
std::vector<chronus_event> pull(event_stream& w, size_t count) {
  std::vector<chronus_event> got;
  auto give_up = std::chrono::steady_clock::now() + 120s;
  while (got.size() < count && std::chrono::steady_clock::now() < give_up) {
    auto ev = w.next(200ms);
    REQUIRE_MESSAGE(ev, describe(ev.error_value()));
    if (*ev)
      got.push_back(std::move(**ev));
  }
  return got;
}

} // namespace

TEST_CASE("Chronus: 100 sandboxes walk through their stages, and each gets its own answer") {
  embedded e;
  auto s = open(*e.c);
  auto w = s->watch();
  REQUIRE_MESSAGE(w, describe(w.error_value()));
  auto ids = make(*s, chronus_env(), 100);
  // Each sandbox's grader: stages, a report, a log line, then it asks for
  // feedback with its own hostname (the sandbox id) and keeps the answer.
  const std::string script =
    "set -e; chronus stage cloned; chronus stage compiling; chronus report tests=12 passed=11;"
    " chronus log \"built $(hostname)\"; chronus stage testing;"
    " chronus feedback \"$(hostname)\" > /tmp/answer; chronus stage submitted";
  for (const auto& id : ids) {
    auto req = sh(script, true);
    req.detach = true;
    run(*s, id, req);
  }
  // The trainer: answer each feedback request with a reward of its own.
  std::map<std::string, double> reward;
  for (size_t i = 0; i < ids.size(); ++i)
    reward[ids[i]] = static_cast<double>(i) + 0.5;
  std::map<std::string, std::vector<chronus_event>> by_box;
  size_t total = 0, answered = 0;
  auto give_up = std::chrono::steady_clock::now() + 180s;
  while (total < ids.size() * 7 && std::chrono::steady_clock::now() < give_up) {
    auto ev = (*w)->next(200ms);
    REQUIRE_MESSAGE(ev, describe(ev.error_value()));
    if (!*ev)
      continue;
    auto& x = **ev;
    ++total;
    if (x.kind == chronus_kind::feedback) {
      // It asked with its own id: the event says where it came from, truly.
      CHECK(x.payload == x.sandbox_id);
      chronus_feedback fb;
      fb.request_id = x.seq;
      fb.reward = reward.at(x.sandbox_id);
      fb.text = "for " + x.sandbox_id;
      fb.done = true;
      auto r = s->answer(x.sandbox_id, fb);
      CHECK_MESSAGE(r, describe(r.error_value()));
      answered += r.has_value();
      // A second answer to the same request finds nobody waiting.
      check_error(s->answer(x.sandbox_id, fb), errc::not_found, "feedback request");
    }
    by_box[x.sandbox_id].push_back(std::move(x));
  }
  CHECK(total == ids.size() * 7);
  CHECK(answered == ids.size());
  CHECK(by_box.size() == ids.size());
  for (const auto& id : ids) {
    const auto& evs = by_box[id];
    REQUIRE_MESSAGE(evs.size() == 7, id << ": " << evs.size() << " events");
    std::vector<std::string> kinds;
    for (size_t i = 0; i < evs.size(); ++i) {
      CHECK(evs[i].seq == i + 1); // in order, numbered per sandbox
      if (i > 0)
        CHECK(evs[i].monotonic_ns >= evs[i - 1].monotonic_ns);
      kinds.push_back(to_string(evs[i].kind) +
                      (evs[i].kind == chronus_kind::stage ? ":" + evs[i].text : ""));
    }
    CHECK(kinds == std::vector<std::string>{"stage:cloned", "stage:compiling", "report",
                                            "log", "stage:testing", "feedback",
                                            "stage:submitted"});
    CHECK(evs[2].metrics == std::vector<chronus_metric>{{"tests", 12}, {"passed", 11}});
    CHECK(evs[3].text == "built " + id);
  }
  // Every sandbox received its own answer, and nobody else's.
  for (const auto& id : ids) {
    auto r = run(*s, id, cmd({"cat", "/tmp/answer"}));
    CHECK_MESSAGE(r.exit_code == 0, id << ": " << r.err);
    char want[64];
    std::snprintf(want, sizeof want, "\"reward\":%g", reward.at(id));
    CHECK_MESSAGE(r.out.find(want) != std::string::npos, id << ": " << r.out);
    CHECK_MESSAGE(r.out.find("\"text\":\"for " + id + "\"") != std::string::npos,
                  id << ": " << r.out);
    CHECK(r.out.find("\"done\":true") != std::string::npos);
  }
  auto st = node_stats_of(*e.c);
  CHECK(st.chronus_sandboxes == ids.size());
  CHECK(st.chronus_events >= ids.size() * 7);
  CHECK(st.chronus_answered == ids.size());
  auto n = s->close();
  REQUIRE(n);
  CHECK(*n == ids.size());
  // The endpoint lets go of them on its own thread, just after.
  auto gone = std::chrono::steady_clock::now() + 30s;
  while (node_stats_of(*e.c).chronus_sandboxes != 0 && std::chrono::steady_clock::now() < gone)
    std::this_thread::sleep_for(10ms);
  CHECK(node_stats_of(*e.c).chronus_sandboxes == 0);
}

TEST_CASE("Chronus: the agent's commands cannot report, forge a token or read a grader's") {
  embedded e;
  auto s = open(*e.c);
  auto w = s->watch();
  REQUIRE(w);
  auto id = make(*s, chronus_env(), 1).front();
  auto before = node_stats_of(*e.c);
  // Untrusted: no channel at all, and none to name either (fd 3 is not open).
  auto r = run(*s, id, sh("chronus stage fake", false));
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(r.err.find("CHRONUS_FD is not set") != std::string::npos, r.err);
  r = run(*s, id, sh("CHRONUS_FD=3 chronus stage fake", false));
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(r.err.find("CHRONUS_FD=3 is not a Chronus channel") != std::string::npos, r.err);
  // A forged token: refused by the node, counted.
  r = run(*s, id, sh("DSEC_CHRONUS_TOKEN=" + std::string(64, 'a') + " chronus stage fake", false));
  CHECK(r.exit_code == 5);
  CHECK_MESSAGE(r.err.find("token") != std::string::npos, r.err);
  auto after = node_stats_of(*e.c);
  CHECK(after.chronus_unauthenticated == before.chronus_unauthenticated + 1);
  // A grader's environment: the agent cannot read it from /proc (and there is
  // no secret in it anyway).
  auto grader = sh("echo $$ > /tmp/grader.pid; exec sleep 1000", true);
  grader.detach = true;
  run(*s, id, grader);
  r = run(*s, id,
          sh("while [ ! -s /tmp/grader.pid ]; do sleep 0.05; done; cat /proc/$(cat /tmp/grader.pid)"
             "/environ",
             false));
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("CHRONUS") == std::string::npos);
  // The control: a trusted command has the channel at fd 3, no token, and
  // dsec's own bin dir first in its PATH.
  r = run(*s, id, sh("echo ${DSEC_CHRONUS_TOKEN:-none} $CHRONUS_FD ${PATH%%:*}; chronus stage real",
                     true));
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out == "none 3 /.dsec/bin\n");
  // Only the real one reached the session.
  auto evs = pull(**w, 1);
  REQUIRE(evs.size() == 1);
  CHECK(evs[0].text == "real");
  auto more = (*w)->next(300ms);
  REQUIRE(more);
  CHECK_FALSE(more->has_value());
  // A trusted command needs a Chronus sandbox.
  auto plain = make(*s, env_of(), 1).front();
  auto t = s->exec(plain, sh("true", true));
  check_error(t, errc::invalid_argument, "Chronus");
}

TEST_CASE("Chronus: a feedback request times out on its own; answers need a waiting request") {
  embedded e;
  auto s = open(*e.c);
  auto id = make(*s, chronus_env(), 1).front();
  auto r = run(*s, id, sh("chronus feedback --timeout 300ms please", true));
  CHECK_MESSAGE(r.exit_code == 3, r.err);
  chronus_feedback fb;
  fb.request_id = 1; // that request: its client is gone
  check_error(s->answer(id, fb), errc::not_found, "feedback request");
  fb.request_id = 99; // never asked
  check_error(s->answer(id, fb), errc::not_found, "feedback request 99");
  // Bad feedback is refused before it is sent.
  fb.reward = std::numeric_limits<double>::infinity();
  auto bad = s->answer(id, fb);
  REQUIRE_FALSE(bad);
  CHECK(bad.error_value().code == errc::invalid_argument);
  // A sandbox without Chronus, and an unknown one.
  fb.reward = 1;
  auto plain = make(*s, env_of(), 1).front();
  check_error(s->answer(plain, fb), errc::not_found, "Chronus");
  check_error(s->answer("no-such-box", fb), errc::not_found, "no-such-box");
  // Nobody watched all along: the session kept the event for the first watcher.
  auto w = s->watch();
  REQUIRE(w);
  CHECK((*w)->backlog() == 1);
  auto evs = pull(**w, 1);
  REQUIRE(evs.size() == 1);
  CHECK(evs[0].kind == chronus_kind::feedback);
  CHECK(evs[0].payload == "please");
  CHECK(evs[0].sandbox_id == id);
}

namespace {

std::string hex_of(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string unhex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(std::string{hex.substr(i, 2)}, nullptr, 16));
  return out;
}

// The replies `probe seqpacket-frames` printed, decoded.
std::vector<chronus_reply> replies_of(const std::string& out) {
  std::vector<chronus_reply> rs;
  for (const auto& line : lines_of(out)) {
    if (line.rfind("reply ", 0) != 0)
      continue;
    auto bytes = unhex(line.substr(6));
    auto r = decode_reply(as_bytes(bytes));
    REQUIRE_MESSAGE(r, "an undecodable reply: " << describe(r.error_value()));
    rs.push_back(*r);
  }
  return rs;
}

} // namespace

TEST_CASE("Chronus: malformed, truncated, oversized, forged and flooding frames from a sandbox") {
  embedded e;
  auto s = open(*e.c);
  auto w = s->watch();
  REQUIRE(w);
  auto ids = make(*s, chronus_env(), 2);
  auto& bad = ids[0];
  auto& good = ids[1];
  auto before = node_stats_of(*e.c);
  chronus_request stage;
  stage.kind = chronus_kind::stage;
  stage.text = "forged";
  auto forged = encode_request(chronus_token{}, stage); // a token of zeros: not theirs
  auto truncated = forged.substr(0, forged.size() - 9);
  std::string junk = "\x01\x00\x00\x00\xff\xff\xff\x7f garbage";
  auto r = run(*s, bad,
               cmd({"probe", "seqpacket-frames", "/run/chronus.sock", "hex:" + hex_of(junk),
                    "hex:" + hex_of(truncated), "zeros:70000", "hex:" + hex_of(forged),
                    "hex:00"}));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out << r.err);
  auto rs = replies_of(r.out);
  REQUIRE_MESSAGE(rs.size() == 5, r.out);
  for (const auto& x : rs)
    CHECK(x.kind == chronus_reply_kind::rejected);
  CHECK_MESSAGE(rs[2].reason.find("70000") != std::string::npos, rs[2].reason);
  CHECK_MESSAGE(rs[3].reason.find("token") != std::string::npos, rs[3].reason);
  auto mid = node_stats_of(*e.c);
  CHECK(mid.chronus_malformed == before.chronus_malformed + 3); // junk, truncated, one byte
  CHECK(mid.chronus_too_large == before.chronus_too_large + 1);
  CHECK(mid.chronus_unauthenticated == before.chronus_unauthenticated + 1);

  // A flood: far beyond the burst, without reading the replies.
  r = run(*s, bad, cmd({"probe", "seqpacket-frames", "/run/chronus.sock",
                        "repeat:6000:" + hex_of(forged)}));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out << r.err);
  CHECK(r.out == "sent 6000\n");
  // The node reads every one of them (refusing most as flooding) and serves on:
  // the other sandbox's grader still gets through.
  auto t = run(*s, good, sh("chronus stage unaffected", true));
  CHECK_MESSAGE(t.exit_code == 0, t.err);
  auto give_up = std::chrono::steady_clock::now() + 60s;
  node_stats after;
  do {
    after = node_stats_of(*e.c);
    std::this_thread::sleep_for(20ms);
  } while (after.chronus_flooding + after.chronus_unauthenticated <
             mid.chronus_flooding + mid.chronus_unauthenticated + 6000 &&
           std::chrono::steady_clock::now() < give_up);
  CHECK(after.chronus_flooding > mid.chronus_flooding);
  CHECK(after.chronus_flooding + after.chronus_unauthenticated ==
        mid.chronus_flooding + mid.chronus_unauthenticated + 6000);
  // Nothing of it reached the session: only the good sandbox's stage.
  auto evs = pull(**w, 1);
  REQUIRE(evs.size() == 1);
  CHECK(evs[0].sandbox_id == good);
  CHECK(evs[0].text == "unaffected");
  auto more = (*w)->next(300ms);
  REQUIRE(more);
  CHECK_FALSE(more->has_value());
}

TEST_CASE("Chronus: one sandbox cannot hold more than 32 connections of the node") {
  embedded e;
  auto s = open(*e.c);
  auto id = make(*s, chronus_env(), 1).front();
  auto before = node_stats_of(*e.c);
  auto r = run(*s, id, cmd({"probe", "seqpacket-hold", "/run/chronus.sock", "40"}));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out << r.err);
  CHECK(r.out == "held 32 refused 8\n");
  CHECK(node_stats_of(*e.c).chronus_refused_connections == before.chronus_refused_connections + 8);
  // Once they are closed, a grader connects as ever.
  auto t = run(*s, id, sh("chronus stage after", true));
  CHECK_MESSAGE(t.exit_code == 0, t.err);
}

TEST_CASE("Chronus: a socket the agent put at /run/chronus.sock gets nothing of a grader's") {
  embedded e;
  auto s = open(*e.c);
  auto w = s->watch();
  REQUIRE(w);
  auto id = make(*s, chronus_env(), 1).front();
  // The agent replaces the socket with its own listener...
  auto fake = cmd({"probe", "seqpacket-listen", "/run/chronus.sock"});
  fake.detach = true;
  run(*s, id, fake);
  auto r = run(*s, id, sh("while ! ls -l /run/chronus.sock | grep -q '^s'; do sleep 0.05; done;"
                          " sleep 0.2; chronus stage graded", true));
  // ...and the grader does not use it: its channel goes to the node.
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  auto evs = pull(**w, 1);
  REQUIRE(evs.size() == 1);
  CHECK(evs[0].text == "graded");
  // A client that was given a token and the default socket (none is, by dsec)
  // refuses to talk to a listener inside the sandbox.
  r = run(*s, id, sh("DSEC_CHRONUS_TOKEN=" + std::string(64, 'a') + " chronus stage graded",
                     false));
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(r.err.find("not dsec's Chronus socket") != std::string::npos, r.err);
}

// ---- issue 12 §2 and §6: the trusted path, as the attacks ------------------------

namespace {

node_stats wait_for_stats(client& c, const std::function<bool(const node_stats&)>& done) {
  auto give_up = std::chrono::steady_clock::now() + 60s; // a hang guard
  node_stats st;
  do {
    st = node_stats_of(c);
    if (done(st))
      break;
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < give_up);
  return st;
}

} // namespace

TEST_CASE("Chronus attack: the agent replaces `chronus` everywhere it can; a grader's stage is "
          "still genuine") {
  embedded e;
  auto s = open(*e.c);
  auto w = s->watch();
  REQUIRE(w);
  auto id = make(*s, chronus_env(), 1).front();
  // The agent keeps the real client and puts a wrapper that records its
  // environment, argv and descriptors, then passes the call on, in every
  // directory of the default PATH; then it tries dsec's own copy.
  auto r = run(*s, id, sh(R"(
cp /usr/local/bin/chronus /tmp/real-chronus
cat > /tmp/wrapper <<'END'
#!/bin/sh
{ echo "wrapper ran: $*"; env; ls -l /proc/$$/fd; } >> /tmp/stolen
exec /tmp/real-chronus "$@"
END
chmod 755 /tmp/wrapper
for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
  mkdir -p $d && cp /tmp/wrapper $d/chronus || echo "cannot write $d"
done
try() { if "$@" 2>/dev/null; then echo "did: $*"; fi; }
try cp /tmp/wrapper /.dsec/bin/chronus
try rm -f /.dsec/bin/chronus
try mv /.dsec/bin /.dsec/old
try mv /.dsec /dsec-old
try rm -rf /.dsec
try mkdir /.dsec/bin2
try chmod 777 /.dsec/bin
try ln -s /tmp/wrapper /.dsec/bin/sh
cmp -s /.dsec/bin/chronus /tmp/real-chronus && echo intact
)",
                          false));
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK_MESSAGE(r.out == "intact\n", r.out << r.err);
  // The wrapper is in place for anyone who runs `chronus` from the usual PATH.
  r = run(*s, id, sh("command -v chronus; chronus stage by-the-agent", false));
  CHECK(r.out == "/usr/local/sbin/chronus\n");
  CHECK(r.exit_code == 1); // the wrapper ran the real client: no channel
  r = run(*s, id, cmd({"rm", "/tmp/stolen"}));
  CHECK(r.exit_code == 0);

  // The grader: `chronus stage grading`, as a trusted command, and through a
  // shell; both run dsec's own client, never the wrapper.
  auto grading = cmd({"chronus", "stage", "grading"});
  grading.trusted = true;
  r = run(*s, id, grading);
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  r = run(*s, id, sh("command -v chronus; chronus report tests_passed=3", true));
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out == "/.dsec/bin/chronus\n");
  // A PATH of the caller's own still comes after dsec's.
  auto own_path = sh("command -v chronus", true);
  own_path.env = {"PATH=/usr/local/sbin:/bin"};
  r = run(*s, id, own_path);
  CHECK(r.out == "/.dsec/bin/chronus\n");
  r = run(*s, id, sh("cat /tmp/stolen", false));
  CHECK_MESSAGE(r.exit_code != 0, "the wrapper ran: " << r.out);
  auto evs = pull(**w, 2);
  REQUIRE(evs.size() == 2);
  CHECK(evs[0].sandbox_id == id);
  CHECK(evs[0].kind == chronus_kind::stage);
  CHECK(evs[0].text == "grading");
  CHECK(evs[1].kind == chronus_kind::report);
  CHECK(evs[1].metrics == std::vector<chronus_metric>{{"tests_passed", 3}});

  // No token anywhere the agent can look, while a grader runs: nothing in any
  // environment it can read; and every 64-hex-digit string in its files and
  // those environments, tried as the token, is refused.
  auto holder = sh("exec sleep 1000", true);
  holder.detach = true;
  run(*s, id, holder);
  auto before = node_stats_of(*e.c);
  r = run(*s, id, sh(R"(
cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c -e DSEC_CHRONUS_TOKEN -e CHRONUS_FD
{ cat /proc/[0-9]*/environ
  for d in /*; do case $d in /proc|/sys|/dev) ;; *) grep -rhoE '[0-9a-fA-F]{64}' $d ;; esac; done
} 2>/dev/null | tr '\0' '\n' | grep -oE '[0-9a-fA-F]{64}' | sort -u | head -n 300 > /tmp/candidates
n=0; for t in $(cat /tmp/candidates); do
  DSEC_CHRONUS_TOKEN=$t chronus stage harvested 2>/dev/null; [ $? = 5 ] && n=$((n + 1))
done
[ $n = $(wc -l < /tmp/candidates) ] && echo "all $n refused"
)",
                     false));
  auto tried = lines_of(r.out);
  REQUIRE_MESSAGE(tried.size() == 2, r.out << r.err);
  CHECK(tried[0] == "0");
  CHECK(tried[1].rfind("all ", 0) == 0);
  auto n = std::stoul(tried[1].substr(4));
  CHECK(node_stats_of(*e.c).chronus_unauthenticated == before.chronus_unauthenticated + n);
  // The control: the grader's own environment has CHRONUS_FD, and no token.
  r = run(*s, id, sh("cat /proc/self/environ | tr '\\0' '\\n' | grep -c -e DSEC_CHRONUS_TOKEN -e "
                     "CHRONUS_FD=3",
                     true));
  CHECK_MESSAGE(r.out == "1\n", r.out << r.err);
  // Nothing harvested reached the session.
  auto more = (*w)->next(300ms);
  REQUIRE(more);
  CHECK_FALSE(more->has_value());
}

TEST_CASE("Chronus attack: the agent replaces /bin/sh; a pristine grader runs the image's own") {
  embedded e;
  auto s = open(*e.c);
  auto w = s->watch();
  REQUIRE(w);
  auto id = make(*s, chronus_env(), 1).front();
  auto r = run(*s, id, sh(R"(
mkdir -p /work && echo 'the answer is 42' > /work/solution.txt
cp /bin/busybox /tmp/busybox
rm /bin/sh
printf '#!/tmp/busybox sh\necho "sh wrapper ran: $*" >> /tmp/sh.log\nexec /tmp/busybox sh "$@"\n' > /bin/sh
chmod 755 /bin/sh
)",
                          false));
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  // Without --pristine a trusted `sh` is the agent's (what a grader cannot
  // trust: docs/chronus.md).
  r = run(*s, id, sh("true", true));
  CHECK(r.exit_code == 0);
  r = run(*s, id, cmd({"cat", "/tmp/sh.log"}));
  CHECK(r.out == "sh wrapper ran: -c true\n");
  REQUIRE(run(*s, id, cmd({"rm", "/tmp/sh.log"})).exit_code == 0);

  // --pristine: the layers' sh, the agent's files read-only at /.dsec/agent.
  auto grader = sh(R"(
cat /.dsec/agent/work/solution.txt
test -e /work/solution.txt || echo "no /work here"
head -c 14 /.dsec/agent/bin/sh; echo
echo x > /.dsec/agent/work/solution.txt 2>/dev/null || echo "cannot write the agent's files"
rm /.dsec/agent/work/solution.txt 2>/dev/null || echo "cannot remove them"
touch /.dsec/agent/work/new 2>/dev/null || echo "cannot add to them"
echo scratch > /tmp/grader-scratch && cat /tmp/grader-scratch
echo x > /bin/new 2>/dev/null || echo "the root is read-only"
chronus stage pristine-grading
)",
                   true);
  grader.pristine = true;
  r = run(*s, id, grader);
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out == "the answer is 42\nno /work here\n#!/tmp/busybox\ncannot write the agent's files\n"
                 "cannot remove them\ncannot add to them\nscratch\nthe root is read-only\n");
  // The agent's wrapper never ran, its file is untouched, and the grader's
  // scratch file is not in its /tmp.
  r = run(*s, id, cmd({"/tmp/busybox", "sh", "-c",
                       "cat /tmp/sh.log 2>/dev/null; cat /work/solution.txt; "
                       "ls /tmp/grader-scratch 2>/dev/null; ls /work"}));
  CHECK(r.out == "the answer is 42\nsolution.txt\n");
  auto evs = pull(**w, 1);
  REQUIRE(evs.size() == 1);
  CHECK(evs[0].text == "pristine-grading");
  // --pristine needs --trusted.
  auto untrusted = cmd({"true"});
  untrusted.pristine = true;
  check_error(s->exec(id, untrusted), errc::invalid_argument, "--pristine needs --trusted");
}

TEST_CASE("Chronus attack: the agent floods, holds every connection and removes "
          "/run/chronus.sock; a grader still reports") {
  embedded e;
  auto s = open(*e.c);
  auto w = s->watch();
  REQUIRE(w);
  auto id = make(*s, chronus_env(), 1).front();
  auto before = node_stats_of(*e.c);
  // It spends its rate limit...
  chronus_request stage;
  stage.kind = chronus_kind::stage;
  stage.text = "forged";
  auto forged = encode_request(chronus_token{}, stage);
  auto r = run(*s, id, cmd({"probe", "seqpacket-frames", "/run/chronus.sock",
                            "repeat:6000:" + hex_of(forged)}));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out << r.err);
  auto st = wait_for_stats(*e.c, [&](const node_stats& x) {
    return x.chronus_flooding + x.chronus_unauthenticated
           >= before.chronus_flooding + before.chronus_unauthenticated + 6000;
  });
  CHECK(st.chronus_flooding > before.chronus_flooding);
  // ...holds every connection it may have (and more: refused)...
  auto hold = cmd({"probe", "seqpacket-hold", "/run/chronus.sock", "40", "forever"});
  hold.detach = true;
  run(*s, id, hold);
  st = wait_for_stats(*e.c, [&](const node_stats& x) {
    return x.chronus_refused_connections >= before.chronus_refused_connections + 8;
  });
  CHECK(st.chronus_refused_connections == before.chronus_refused_connections + 8);
  // ...and removes the socket.
  r = run(*s, id, sh("rm /run/chronus.sock && ls /run", false));
  CHECK(r.exit_code == 0);
  CHECK(r.out.empty());
  r = run(*s, id, cmd({"probe", "seqpacket-send", "/run/chronus.sock", "x"}));
  CHECK(r.out == "ENOENT\n");
  // The grader reports, a few calls at once over its one channel, each with
  // its own connection and its own reply.
  r = run(*s, id, sh("chronus report tests_passed=100 &&"
                     " for i in 1 2 3 4 5 6; do chronus log \"line $i\" & done; wait",
                     true));
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  r = run(*s, id, sh("chronus feedback --timeout 200ms done?; echo $?", true));
  CHECK(r.out == "3\n"); // its own answer (a timeout), not another call's ack
  auto evs = pull(**w, 8);
  REQUIRE(evs.size() == 8);
  CHECK(evs[0].kind == chronus_kind::report);
  CHECK(evs[0].metrics == std::vector<chronus_metric>{{"tests_passed", 100}});
  std::set<std::string> logs;
  for (size_t i = 1; i < 7; ++i)
    logs.insert(evs[i].text);
  CHECK(logs
        == std::set<std::string>{"line 1", "line 2", "line 3", "line 4", "line 5", "line 6"});
  CHECK(evs[7].kind == chronus_kind::feedback);
  for (const auto& ev : evs)
    CHECK(ev.text != "forged");
}

TEST_CASE("Chronus attack: the agent's commands cannot get the trusted channel, inherited or "
          "through /proc") {
  embedded e;
  auto s = open(*e.c);
  auto w = s->watch();
  REQUIRE(w);
  auto id = make(*s, chronus_env(), 1).front();
  // A grader that holds its channel (fd 3) while it runs.
  auto grader = sh("echo $$ > /tmp/grader.pid; exec probe sleep", true);
  grader.detach = true;
  run(*s, id, grader);
  // Not inherited: the agent's commands have nothing at fd 3 or above.
  auto r = run(*s, id, cmd({"ls", "/proc/self/fd"}));
  CHECK(r.out == "0\n1\n2\n3\n"); // 3 is ls's own directory
  // Not through /proc or pidfd_getfd: not from init (pid 1, not dumpable), the
  // helper (pid 2) or the grader (another Landlock domain), whatever the number.
  // (The grader's /proc/PID/fd can be listed, as its owner's: the numbers, not
  // what they are.)
  r = run(*s, id, sh(R"(
while [ ! -s /tmp/grader.pid ]; do sleep 0.05; done; g=$(cat /tmp/grader.pid)
for p in 1 2 $g; do
  for f in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do
    readlink /proc/$p/fd/$f && echo "readlink $p $f"
    probe getfd $p $f | grep -v -x EPERM | sed "s/^/getfd $p $f: /"
    out=$(probe cat /proc/$p/fd/$f 2>&1)
    case "$out" in EACCES|ENOENT) ;; *) echo "open $p $f: $out" ;; esac
  done
done
)",
                     false));
  CHECK_MESSAGE(r.out.empty(), r.out << r.err);
  // The control: the same reach works from a trusted command (same domain),
  // so the checks above can fail.
  r = run(*s, id, sh("probe getfd $(cat /tmp/grader.pid) 3", true));
  CHECK(r.out == "ok\n");
  // Nothing of it reached the session.
  auto more = (*w)->next(300ms);
  REQUIRE(more);
  CHECK_FALSE(more->has_value());
}
