// dsecd's log lines (runtime/log.hpp, docs/observability.md "Logs"): a daemon
// run with --log-format json, one sandbox and one session followed through
// its stderr, refusals logged once per cause.
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>

#include <signal.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test/actors/common.hpp"

using namespace dsec;
using namespace dsec::test;
using json = nlohmann::json;

TEST_CASE("dsecd --log-format json: one sandbox and one session followed through the log; "
          "refusals once per cause") {
  dsecd_proc d{{"--log-format", "json", "--log-level", "info"}};
  test_system ts;
  caf::actor_system sys{ts.cfg};
  auto c = connect(sys, d.port);
  auto s = c->open_session({}, true);
  REQUIRE(s);
  auto sid = (*s)->id();
  auto ids = (*s)->create(env_of(), 1);
  REQUIRE_MESSAGE(ids, describe(ids.error_value()));
  auto id = ids->front();
  auto r = (*s)->exec(id, cmd({"true"}));
  REQUIRE(r);
  // Three creates of a layer the store does not have: one line for the cause.
  for (int i = 0; i < 3; ++i)
    check_error((*s)->create(env_of({}, {"nosuch@3"}), 1), errc::not_found, "nosuch@3");
  REQUIRE((*s)->destroy(id));
  REQUIRE((*s)->close());
  auto end = d.stop(SIGTERM);
  REQUIRE_MESSAGE(end.status == 0, end.describe());

  std::vector<json> log;
  for (const auto& line : lines_of(end.err)) {
    auto j = json::parse(line, nullptr, false);
    REQUIRE_MESSAGE(!j.is_discarded(), "not a JSON line: " << line);
    REQUIRE(j.is_object());
    for (const char* k : {"time", "level", "component", "msg"})
      CHECK_MESSAGE(j.contains(k), line);
    log.push_back(std::move(j));
  }
  auto find = [&](const char* component, const std::string& msg, const char* key,
                  const std::string& value) {
    size_t n = 0;
    for (const auto& j : log)
      n += j.value("component", "") == component && j.value("msg", "") == msg
           && j.value(key, "") == value;
    return n;
  };
  CHECK(find("daemon", "listening", "role", "node") == 1);
  CHECK(find("session", "opened", "session", sid) == 1);
  CHECK(find("sandbox", "ready", "sandbox", id) == 1);
  CHECK(find("sandbox", "destroyed", "sandbox", id) == 1);
  CHECK(find("session", "closed", "session", sid) == 1);
  CHECK(find("daemon", "stopped", "signal", "TERM") == 1);
  // The sandbox's lines name its session.
  for (const auto& j : log)
    if (j.value("sandbox", "") == id)
      CHECK(j.value("session", "") == sid);
  // The unknown layer: refused three times, logged once, at warn, naming it.
  size_t refusals = 0;
  for (const auto& j : log)
    if (j.value("level", "") == "warn" && j.value("cause", "") == "not_found") {
      ++refusals;
      CHECK_MESSAGE(j.value("error", "").find("nosuch@3") != std::string::npos, j.dump());
    }
  CHECK(refusals == 1);
}

TEST_CASE("dsecd: a bad --log-format or --log-level is refused, naming it") {
  auto r = run_process({env_path("DSECD_BIN"), "--log-format", "xml"});
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.err.find("--log-format: expected text or json, got 'xml'") != std::string::npos,
                r.describe());
  r = run_process({env_path("DSECD_BIN"), "--log-level", "loud"});
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.err.find("--log-level: expected debug, info, warn or error") != std::string::npos,
                r.describe());
}
