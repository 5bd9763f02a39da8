#include "test/support/sandbox.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>

#include <doctest/doctest.h>

#include "runtime/layer.hpp"
#include "test/support/fixture.hpp"

namespace dsec::test {

api_env::api_env(const std::vector<std::string>& refs) {
  auto& s = suite::get();
  auto st = store::open(s.state());
  REQUIRE_MESSAGE(st, st.error_value().to_string());
  auto sys = st->system_layer();
  REQUIRE_MESSAGE(sys, sys.error_value().to_string());
  auto sp = spawner::start({});
  REQUIRE_MESSAGE(sp, sp.error_value().to_string());
  sp_ = std::move(*sp);
  std::vector<std::string> images{*sys};
  for (const auto& r : refs) {
    auto ref = parse_layer_ref(r);
    REQUIRE_MESSAGE(ref, ref.error_value().to_string());
    auto l = st->lease(*ref);
    REQUIRE_MESSAGE(l, l.error_value().to_string());
    images.push_back(l->blob_path());
    leases_.push_back(std::move(*l));
  }
  for (const auto& img : images) {
    auto m = layer_mount::open(img, sp_->userns_fd());
    REQUIRE_MESSAGE(m, m.error_value().to_string());
    mounts_.push_back(std::move(*m));
  }
  for (const auto& m : mounts_)
    lowers_.push_back(m.dir_fd());
}

std::unique_ptr<container> api_env::create(const container_options& opts,
                                           const cgroup_root* cgroups) {
  auto c = container::create(*sp_, lowers_, opts, cgroups);
  REQUIRE_MESSAGE(c, c.error_value().to_string());
  return std::move(*c);
}

exec_result exec_capture(container& c, const std::vector<std::string>& argv) {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  command cmd;
  cmd.argv = argv;
  cmd.env = command::default_env();
  auto id = c.exec(cmd, stdio{-1, p[1], p[1]});
  ::close(p[1]);
  if (!id)
    ::close(p[0]);
  REQUIRE_MESSAGE(id, id.error_value().to_string());
  // Read while it runs (the output may be larger than the pipe), then wait.
  exec_result res;
  ::fcntl(p[0], F_SETFL, O_NONBLOCK);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  char buf[4096];
  auto drain = [&] {
    ssize_t n;
    while ((n = ::read(p[0], buf, sizeof buf)) > 0)
      res.out.append(buf, static_cast<size_t>(n));
  };
  for (;;) {
    drain();
    auto step = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    auto st = c.wait(*id, step);
    if (st) {
      res.status = *st;
      break;
    }
    if (st.error_value().code != errc::timeout || std::chrono::steady_clock::now() > deadline) {
      ::close(p[0]);
      FAIL("waiting for " << argv[0] << ": " << st.error_value().to_string());
    }
  }
  drain();
  ::close(p[0]);
  return res;
}

} // namespace dsec::test
