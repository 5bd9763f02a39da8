// Nothing is left on the host: after many sandboxes, after sandboxes that leave
// processes behind, after failed creations, and after a `dsec run` killed with
// SIGKILL, the host looks as before (see host_snapshot: mounts, dsec cgroups,
// network namespaces, child processes, dsec-init processes, open descriptors).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "runtime/cgroup.hpp"
#include "test/support/fixture.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"
#include "test/support/sandbox.hpp"
#include "test/support/skip.hpp"

using namespace dsec::test;
using dsec::container_options;

namespace {


dsec::cgroup_root detect_cgroups() {
  auto cg = dsec::cgroup_root::detect();
  REQUIRE_MESSAGE(cg, cg.error_value().to_string());
  return std::move(*cg);
}

container_options options_for(int i) {
  container_options o;
  switch (i % 3) {
  case 1:
    o.net = true;
    break;
  case 2:
    o.lim.memory_bytes = 128ULL << 20;
    o.lim.pids = 64;
    o.lim.cpus = 1.0;
    break;
  default:
    break;
  }
  return o;
}

} // namespace

TEST_CASE("1,000 create/run/destroy cycles leave nothing behind") {
  auto before = settled_snapshot();
  {
    api_env env({tool_a, workdir_layer, base_layer});
    auto cg = detect_cgroups();

    // The control: while sandboxes of each kind live, the snapshot sees them.
    {
      auto plain = env.create(options_for(0), &cg);
      auto net = env.create(options_for(1), &cg);
      auto limited = env.create(options_for(2), &cg);
      auto during = host_snapshot::take();
      for (const auto* c : {plain.get(), net.get(), limited.get()}) {
        CHECK(during.dsec_inits.count(c->pid()) == 1);
        CHECK(during.children.count(c->pid()) == 1);
      }
      CHECK(during.children.count(env.sp().pid()) == 1);
      char link[64] = "";
      auto n = ::readlink(("/proc/" + std::to_string(net->pid()) + "/ns/net").c_str(), link,
                          sizeof link - 1);
      REQUIRE(n > 0);
      CHECK(during.net_namespaces.count(link) == 1);
      CHECK(before.net_namespaces.count(link) == 0);
      // One cgroup dir per hierarchy that serves the three limits.
      std::set<std::string> hierarchies;
      for (auto c : {dsec::cgroup_controller::memory, dsec::cgroup_controller::pids,
                     dsec::cgroup_controller::cpu})
        hierarchies.insert(cg.owner_dir(c));
      size_t limited_dirs = 0;
      for (const auto& h : hierarchies)
        limited_dirs += during.cgroup_dirs.count(h + "/" + limited->id());
      CHECK(limited_dirs == hierarchies.size());
      CHECK(during.fd_count > before.fd_count);
      CHECK_FALSE(diff(before, during).empty());
    }

    for (int i = 0; i < 1000; ++i) {
      auto c = env.create(options_for(i), &cg);
      auto r = exec_capture(*c, {"probe", "exit", std::to_string(i % 7)});
      REQUIRE_MESSAGE(r.status.code == i % 7, "cycle " << i << ": " << r.status.to_string()
                                                       << " " << r.out);
      auto d = c->destroy();
      REQUIRE_MESSAGE(d, "cycle " << i << ": " << d.error_value().to_string());
    }
  }
  check_nothing_left(before);
}

TEST_CASE("300 sandboxes with cgroups from a pool leave nothing once their root goes") {
  // dsecd's way: every sandbox has limits, and its cgroups go back to a pool.
  // Some write files (their tmpfs, and its charges, go with the sandbox's
  // mount namespace before the cgroup comes back), some are OOM-killed, some
  // leave processes behind.
  auto before = settled_snapshot();
  {
    api_env env({base_layer});
    auto cg = detect_cgroups();
    dsec::limits lim;
    lim.memory_bytes = 64ULL << 20;
    lim.pids = 32;
    cg.enable_pool(8);
    REQUIRE(cg.prewarm(lim, 4));
    for (int i = 0; i < 300; ++i) {
      CAPTURE(i);
      container_options o;
      o.lim = lim;
      o.net = i % 5 == 4;
      auto c = env.create(o, &cg);
      std::vector<std::string> cmd = {"probe", "exit", "0"};
      if (i % 3 == 1)
        cmd = {"probe", "fill", "/tmp/x", "1"};
      else if (i % 7 == 2)
        cmd = {"probe", "hog", "256"};
      else if (i % 11 == 3)
        cmd = {"sh", "-c", "probe sleep >/dev/null 2>&1 & exit 0"};
      (void) exec_capture(*c, cmd);
      auto d = c->destroy();
      REQUIRE_MESSAGE(d, d.error_value().to_string());
    }
    auto st = cg.pool_stats();
    CHECK(st.reused + st.made == 300 + 4);
    CHECK(st.reused > 290); // a fresh one only when all idle ones are in use
    CHECK(st.idle <= 8);
    // The control: the pool's idle cgroups are there until the root goes.
    auto during = host_snapshot::take();
    CHECK(during.cgroup_dirs.size() > before.cgroup_dirs.size());
  }
  check_nothing_left(before);
}

TEST_CASE("processes a command leaves in the background go with the sandbox") {
  auto before = settled_snapshot();
  {
    api_env env({base_layer});
    auto cg = detect_cgroups();
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      auto c = env.create(options_for(i), &cg);
      auto r = exec_capture(*c, {"sh", "-c",
                                 "probe spin >/dev/null 2>&1 & probe sleep >/dev/null 2>&1 & "
                                 "(probe sleep >/dev/null 2>&1 &); exit 5"});
      CHECK(r.status.code == 5);
      // They run on after the command: init and three more.
      auto inside = descendants(process_table(), c->pid());
      CHECK(inside.size() == 4);
      REQUIRE(c->destroy());
      for (pid_t p : inside)
        CHECK_FALSE(pid_exists(p));
    }
  }
  check_nothing_left(before);
}

TEST_CASE("failed creations and failed commands leave nothing behind") {
  auto before = settled_snapshot();
  {
    api_env env({base_layer});
    auto cg = detect_cgroups();

    SUBCASE("a lower layer that is not a directory (host step)") {
      int file = ::open("/etc/hostname", O_RDONLY | O_CLOEXEC);
      REQUIRE(file >= 0);
      std::vector<int> lowers{file};
      for (int i = 0; i < 3; ++i) {
        auto c = dsec::container::create(env.sp(), lowers, options_for(i), &cg);
        REQUIRE_FALSE(c);
        CHECK(c.error_value().step == "make_overlay");
      }
      ::close(file);
    }
    SUBCASE("a root without /proc (a step inside the sandbox)") {
      auto lowers = env.lowers_without_system();
      for (int i = 0; i < 3; ++i) {
        auto c = dsec::container::create(env.sp(), lowers, options_for(i), &cg);
        REQUIRE_FALSE(c);
        CHECK(c.error_value().step == "mount_proc");
      }
    }
    SUBCASE("limits that are refused") {
      container_options o;
      o.lim.memory_bytes = 4096; // below the 4 MiB minimum
      auto c = dsec::container::create(env.sp(), env.lowers(), o, &cg);
      REQUIRE_FALSE(c);
      CHECK(c.error_value().step == "make_cgroup");
      o.lim = {};
      o.lim.pids = 1ULL << 40;
      c = dsec::container::create(env.sp(), env.lowers(), o, &cg);
      REQUIRE_FALSE(c);
      // Limits without a cgroup root.
      o.lim = {};
      o.lim.pids = 10;
      c = dsec::container::create(env.sp(), env.lowers(), o, nullptr);
      REQUIRE_FALSE(c);
    }
    SUBCASE("a hostname the sandbox cannot take") {
      container_options o;
      o.hostname = std::string(100, 'h');
      auto c = dsec::container::create(env.sp(), env.lowers(), o, &cg);
      REQUIRE_FALSE(c);
    }
    SUBCASE("commands that cannot start: a bad cwd, a missing program, a bad user") {
      for (int i = 0; i < 3; ++i) {
        auto c = env.create(options_for(i), &cg);
        dsec::command cmd;
        cmd.argv = {"probe", "exit", "0"};
        cmd.env = dsec::command::default_env();
        cmd.cwd = "/no/such/dir";
        auto id = c->exec(cmd, {});
        REQUIRE_FALSE(id);
        CHECK(id.error_value().step == "chdir");
        cmd.cwd = "/";
        cmd.argv = {"no-such-program"};
        id = c->exec(cmd, {});
        REQUIRE_FALSE(id);
        CHECK(id.error_value().code == dsec::errc::not_found);
        cmd.argv = {"probe", "exit", "0"};
        cmd.uid = 100000; // not mapped in the sandbox's user namespace
        id = c->exec(cmd, {});
        REQUIRE_FALSE(id);
        // The sandbox still works afterwards.
        auto r = exec_capture(*c, {"probe", "exit", "3"});
        CHECK(r.status.code == 3);
        REQUIRE(c->destroy());
      }
    }
    // The spawner still serves after all that.
    auto c = env.create(options_for(2), &cg);
    CHECK(exec_capture(*c, {"probe", "exit", "0"}).status.code == 0);
  }
  check_nothing_left(before);
}

TEST_CASE("a limit the kernel rejects fails make_cgroup and leaves nothing behind"
          * skip_unless(cgroup_version_of(dsec::cgroup_controller::cpu) == dsec::cgroup_version::v1,
                        "a cpu quota the kernel rejects: the cpu controller is not on cgroup v1 "
                        "here (v1 refuses a child quota above its parent's)")) {
  auto before = settled_snapshot();
  {
    api_env env({base_layer});
    auto cg = detect_cgroups();
    REQUIRE(cg.version(dsec::cgroup_controller::cpu) == dsec::cgroup_version::v1);
    // cgroup v1 refuses a cpu quota above the parent's: give this process's
    // dsec owner dir (which dsec made below our own cgroup) a small quota.
    auto quota = cg.owner_dir(dsec::cgroup_controller::cpu) + "/cpu.cfs_quota_us";
    auto set_quota = [&](const char* v) {
      int fd = ::open(quota.c_str(), O_WRONLY | O_CLOEXEC);
      REQUIRE(fd >= 0);
      CHECK(::write(fd, v, std::strlen(v)) == static_cast<ssize_t>(std::strlen(v)));
      ::close(fd);
    };
    container_options o;
    o.lim.cpus = 2;
    o.lim.pids = 10; // other hierarchies, made before the cpu one fails
    o.lim.memory_bytes = 64ULL << 20;
    set_quota("10000");
    auto c = dsec::container::create(env.sp(), env.lowers(), o, &cg);
    set_quota("-1");
    REQUIRE_FALSE(c);
    CHECK(c.error_value().step == "make_cgroup");
    CHECK(c.error_value().sys_errno == EINVAL);
    // The control: within the parent's quota it works.
    o.lim.cpus = 0.05;
    set_quota("10000");
    auto ok = dsec::container::create(env.sp(), env.lowers(), o, &cg);
    set_quota("-1");
    REQUIRE_MESSAGE(ok, ok.error_value().to_string());
    CHECK(exec_capture(**ok, {"probe", "exit", "0"}).status.code == 0);
  }
  check_nothing_left(before);
}

TEST_CASE("a dsec run killed with SIGKILL takes its sandbox along; the next run collects its cgroups") {
  auto& s = suite::get();
  auto before = settled_snapshot();
  std::vector<pid_t> sandbox;
  std::vector<std::string> owner_dirs;
  {
    background run(s.run_argv({"--pids", "100", "--memory", "128m"},
                              {"sh", "-c", "probe spin & echo ready; exec probe sleep"}));
    REQUIRE_MESSAGE(run.wait_for_output("ready\n"), run.err());
    auto table = process_table();
    for (pid_t p : descendants(table, run.pid()))
      if (p != run.pid())
        sandbox.push_back(p);
    // The spawner, init, the spinner and the sleeper.
    CHECK(sandbox.size() == 4);
    CHECK(std::count_if(sandbox.begin(), sandbox.end(),
                        [&](pid_t p) { return table[p].comm == "dsec-init"; })
          == 1);
    auto owner = std::to_string(run.pid()) + "-" + std::to_string(table[run.pid()].starttime);
    for (const auto& dir : own_cgroup_dirs())
      if (::access((dir + "/dsec/" + owner).c_str(), F_OK) == 0)
        owner_dirs.push_back(dir + "/dsec/" + owner);
    // One per hierarchy dsec uses, at least the pids and memory ones.
    CHECK(owner_dirs.size() >= 2);
    for (const char* h : {"/pids/", "/memory/"})
      CHECK(std::any_of(owner_dirs.begin(), owner_dirs.end(), [&](const std::string& d) {
        return d.find(h) != std::string::npos && d.find(owner) != std::string::npos;
      }));

    run.kill(SIGKILL);
    CHECK(run.wait().status == 128 + SIGKILL);
  }
  // Its sandbox dies with it (PR_SET_PDEATHSIG), asynchronously.
  CHECK(eventually([&] {
    return std::none_of(sandbox.begin(), sandbox.end(), [](pid_t p) { return pid_exists(p); });
  }));
  // Its cgroup dirs stay until another dsec collects them.
  auto r = s.run({"--pids", "10"}, {"true"});
  CHECK_MESSAGE(r.status == 0, r.describe());
  for (const auto& d : owner_dirs)
    CHECK_MESSAGE(::access(d.c_str(), F_OK) != 0, d << " is still there");
  check_nothing_left(before);
}
