#include "runtime/environment.hpp"

#include <doctest/doctest.h>

#include <limits>

#include "runtime/defaults.hpp"

using namespace dsec;

namespace {

environment valid() {
  environment e;
  e.base = "debian@12";
  e.workdir = "task@3";
  e.tools = {"py@1", "grader@2"};
  return e;
}

// The error of validate(), which must name `names`.
void check_refused(const environment& e, errc code, std::string_view names) {
  auto r = e.validate();
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == code);
  CHECK_MESSAGE(r.error_value().message.find(names) != std::string::npos,
                r.error_value().message);
}

} // namespace

TEST_CASE("environment::validate takes a well-formed environment and names what is wrong") {
  CHECK(valid().validate());
  auto with = [](auto f) {
    auto e = valid();
    f(e);
    return e;
  };
  check_refused(with([](auto& e) { e.base.clear(); }), errc::invalid_argument, "base layer");
  check_refused(with([](auto& e) { e.base = "no version"; }), errc::invalid_argument,
                "base 'no version'");
  check_refused(with([](auto& e) { e.workdir = "w@"; }), errc::invalid_argument, "workdir 'w@'");
  check_refused(with([](auto& e) { e.tools.push_back("@1"); }), errc::invalid_argument,
                "tool '@1'");
  check_refused(with([](auto& e) { e.tools.assign(environment::max_tools + 1, "t@1"); }),
                errc::invalid_argument, "at most 128 tool layers");
  CHECK(with([](auto& e) { e.tools.assign(environment::max_tools, "t@1"); }).validate());
  check_refused(with([](auto& e) { e.memory = 1024; }), errc::invalid_argument, "--memory 1024");
  check_refused(with([](auto& e) { e.pids = 5'000'000; }), errc::invalid_argument, "--pids");
  check_refused(with([](auto& e) { e.cpus = 0.001; }), errc::invalid_argument, "--cpus 0.001");
  check_refused(with([](auto& e) { e.cpus = -2; }), errc::invalid_argument, "--cpus -2");
  check_refused(with([](auto& e) { e.cpus = std::numeric_limits<double>::quiet_NaN(); }), errc::invalid_argument, "--cpus");
  check_refused(with([](auto& e) { e.disk = 1000; }), errc::invalid_argument, "--disk 1000");
  check_refused(with([](auto& e) { e.backend = "firecracker"; }), errc::unsupported,
                "backend 'firecracker' is not available (only container, function, microvm)");
  CHECK(with([](auto& e) { e.backend = "microvm"; }).validate());
  // What 0 means (the node's default, no limit) is valid.
  CHECK(with([](auto& e) {
          e.memory = 4ull << 20;
          e.pids = 1;
          e.cpus = 0.01;
          e.disk = environment::min_disk;
        }).validate());
}

TEST_CASE("environment::layer_slots lists the layers topmost first, each with its kind") {
  auto e = valid();
  auto slots = e.layer_slots();
  REQUIRE(slots.size() == 4);
  CHECK(slots[0].ref == "grader@2");
  CHECK(slots[0].kind == layer_kind::tool);
  CHECK(slots[1].ref == "py@1");
  CHECK(slots[2].ref == "task@3");
  CHECK(slots[2].kind == layer_kind::workdir);
  CHECK(std::string{slots[2].slot} == "workdir");
  CHECK(slots[3].ref == "debian@12");
  CHECK(slots[3].kind == layer_kind::base);
  environment bare;
  bare.base = "b@1";
  REQUIRE(bare.layer_slots().size() == 1);
  CHECK(bare.layer_slots()[0].kind == layer_kind::base);
}

TEST_CASE("environment: limits, defaults, comparison and differences") {
  auto e = valid();
  CHECK_FALSE(e.cgroup_limits().any());
  e.memory = 64ull << 20;
  e.cpus = 0.5;
  auto l = e.cgroup_limits();
  CHECK(l.memory_bytes == 64ull << 20);
  CHECK_FALSE(l.pids);
  CHECK(l.cpus == 0.5);

  sandbox_defaults d;
  d.memory_bytes = 256ull << 20;
  d.pids = 512;
  d.disk_bytes = 128ull << 20;
  d.apply(e); // fills only what is 0
  CHECK(e.memory == 64ull << 20);
  CHECK(e.pids == 512);
  CHECK(e.disk == 128ull << 20);

  auto a = valid(), b = valid();
  CHECK(a == b);
  CHECK(a.difference(b, "in the log", "now") == "the same environment");
  b.memory = 1ull << 30;
  b.net = true;
  CHECK(a != b);
  CHECK(a.difference(b, "in the log", "now")
        == "memory 0 in the log, 1073741824 now, net off in the log, on now");
}

TEST_CASE("check_layer_kind names the slot, the layer and both kinds") {
  CHECK(check_layer_kind("base", "b@1", layer_kind::base, layer_kind::base));
  auto r = check_layer_kind("--tool", "wd@1", layer_kind::workdir, layer_kind::tool);
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == errc::wrong_kind);
  CHECK(r.error_value().message == "--tool wd@1 is a workdir layer, not a tool layer");
}
