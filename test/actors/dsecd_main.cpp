// The dsecd suite's main: doctest, or, run as `--trainer PORT COUNT MODE`, a
// trainer process for the tests that kill one. It connects to the dsecd on
// 127.0.0.1:PORT, opens an owned session, creates COUNT sandboxes of bbt@1,
// prints "id ID" for each and then "created", and then, with MODE "exit",
// _exits at once (no destructor runs, nothing is closed) or, with "hang",
// waits to be killed. With "midbatch" it prints "first ID" when the first
// sandbox is ready and then waits to be killed, the batch still going. Any
// failure: "error ..." and status 1.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "actors/client.hpp"
#include "test/actors/common.hpp"

namespace {

[[noreturn]] void fail(const char* what, const dsec::error& e) {
  std::printf("error %s: %s\n", what, dsec::test::describe(e).c_str());
  std::fflush(stdout);
  ::_exit(1);
}

int trainer(int argc, char** argv) {
  if (argc != 5)
    return 2;
  auto port = static_cast<uint16_t>(std::atoi(argv[2]));
  auto count = static_cast<uint32_t>(std::atoi(argv[3]));
  std::string mode = argv[4];
  caf::actor_system_config cfg;
  dsec::test::configure_system(cfg);
  caf::actor_system sys{cfg};
  auto c = dsec::client::connect(sys, "127.0.0.1", port);
  if (!c)
    fail("connect", c.error_value());
  auto s = (*c)->open_session();
  if (!s)
    fail("open_session", s.error_value());
  dsec::environment env;
  env.base = dsec::test::tar_base;
  if (mode == "midbatch") {
    auto r = (*s)->create(env, count, [](const std::string& id) {
      std::printf("first %s\n", id.c_str());
      std::fflush(stdout);
      for (;;)
        ::pause();
    });
    fail("create", r ? dsec::make_error(dsec::errc::sandbox_failed, "the batch returned before the kill")
           : r.error_value());
  }
  auto ids = (*s)->create(env, count);
  if (!ids)
    fail("create", ids.error_value());
  for (const auto& id : *ids)
    std::printf("id %s\n", id.c_str());
  std::printf("created\n");
  std::fflush(stdout);
  if (mode == "exit")
    ::_exit(0);
  for (;;)
    ::pause();
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--trainer") == 0)
    return trainer(argc, argv);
  return doctest::Context(argc, argv).run();
}
