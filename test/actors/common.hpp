// What the actor suites share: the layers they need on top of the suite
// fixture's (a busybox base that has tar, for put/get), an actor system
// configured like a trainer's, an embedded daemon that cleans up after itself,
// and checks for dsec::expected results.
//
//   bbt@1  base  the fixture's bb@1 tree plus /bin/tar (busybox), /usr/bin/probe
//   wd@1, ta@1, tb@1 as in test/support/fixture.hpp
#pragma once

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "actors/client.hpp"
#include "actors/daemon.hpp"
#include "runtime/error.hpp"
#include "test/support/fixture.hpp"
#include "test/support/process.hpp"

namespace dsec::test {

inline constexpr const char* tar_base = "bbt@1";

/// Builds bbt@1 once (and the fixture's layers); returns the state dir.
const std::string& actor_layers();

/// An environment of bbt@1 plus the given workdir and tools.
environment env_of(const std::string& workdir = {}, const std::vector<std::string>& tools = {});

/// A command.
exec_request cmd(std::vector<std::string> argv);

/// A trainer's actor system config: dsec's types, the middleman, two threads, no logs.
void configure_system(caf::actor_system_config& cfg);

/// An actor system configured by configure_system (the config must outlive the system).
struct test_system {
  test_system() { configure_system(cfg); }
  caf::actor_system_config cfg;
};

/// A daemon in this process over its own actor system, with a client attached.
/// The destructor shuts the daemon down and ends the actor system.
struct embedded : test_system {
  explicit embedded(daemon_options opts = {});
  ~embedded();

  caf::actor_system sys{cfg};
  std::unique_ptr<daemon> d;
  std::unique_ptr<client> c;
};

/// The ids in a list.
std::set<std::string> ids_of(const std::vector<sandbox_info>& infos);

/// The node's list through `c`; the test fails if it errs.
std::vector<sandbox_info> node_list(client& c);

/// The node's stats through `c`; the test fails if they err.
node_stats node_stats_of(client& c);

/// Polls the node's stats through `c` until `ok` holds; false after `cap` (a
/// failure, not a measure).
bool until_stats(client& c, const std::function<bool(const node_stats&)>& ok,
                 std::chrono::seconds cap = std::chrono::seconds(120));

/// True once none of `ids` is on the node (polled with a generous cap).
bool eventually_gone(client& c, const std::vector<std::string>& ids);

/// A tar archive of `dir`'s contents, made by the host's tar.
std::string host_tar(const std::string& dir);

/// Unpacks `tar` into `dir` with the host's tar; the test fails if it fails.
void host_untar(const std::string& tar, const std::string& dir);

/// "code: message" for failure messages.
std::string describe(const error& e);

/// The path of the running test binary (for tests that start it again in
/// another mode, e.g. as a trainer or an intruder).
std::string self_exe();

/// A dsecd process started by a test ($DSECD_BIN --listen 127.0.0.1:0 --state
/// actor_layers()). Unless the test stopped it, the destructor ends it with
/// SIGTERM (every sandbox destroyed) and waits; the background's safety net
/// SIGKILLs it if that hangs (its sandboxes then die with it).
struct dsecd_proc {
  explicit dsecd_proc(const std::vector<std::string>& extra = {});
  ~dsecd_proc();
  proc_result stop(int sig);

  background bg;
  bool stopped = false;
  uint16_t port = 0;
};

/// A client of the dsecd at 127.0.0.1:port; the test fails if it cannot connect.
std::unique_ptr<client> connect(caf::actor_system& sys, uint16_t port);

/// Checks that `r` failed with `code` and that its message names `names`.
template <class T>
void check_error(const expected<T>& r, errc code, std::string_view names) {
  REQUIRE_FALSE_MESSAGE(r.has_value(), "expected " << to_string(code) << " naming '"
                                                   << std::string{names} << "', got a value");
  const auto& e = r.error_value();
  CHECK_MESSAGE(e.code == code, "expected " << to_string(code) << ", got " << describe(e));
  CHECK_MESSAGE(e.message.find(names) != std::string::npos,
                "the message should name '" << std::string{names} << "': " << describe(e));
}

} // namespace dsec::test
