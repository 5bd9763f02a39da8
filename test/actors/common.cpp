#include "test/actors/common.hpp"

#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <thread>

#include "actors/types.hpp"
#include "test/support/host.hpp"
#include "test/support/process.hpp"

namespace dsec::test {

namespace fs = std::filesystem;

const std::string& actor_layers() {
  static const std::string state = [] {
    auto& s = suite::get();
    // The fixture's base tree (busybox, its applets, the probe) plus tar.
    auto src = s.root() + "/src/base-tar";
    fs::copy(s.root() + "/src/base", src,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    fs::create_symlink("busybox", src + "/bin/tar");
    REQUIRE(::chown((src + "/home/user").c_str(), 1000, 1000) == 0);
    s.build_layer("base", tar_base, src);
    return s.state();
  }();
  return state;
}

environment env_of(const std::string& workdir, const std::vector<std::string>& tools) {
  environment env;
  env.base = tar_base;
  env.workdir = workdir;
  env.tools = tools;
  return env;
}

exec_request cmd(std::vector<std::string> argv) {
  exec_request r;
  r.argv = std::move(argv);
  return r;
}

void configure_system(caf::actor_system_config& cfg) {
  client::configure(cfg);
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{2});
  cfg.set("logger.console", caf::atom("none"));
}

embedded::embedded(daemon_options opts) {
  if (opts.state_dir.empty())
    opts.state_dir = actor_layers();
  opts.netns_prewarm = 2;
  auto r = daemon::start(sys, opts);
  REQUIRE_MESSAGE(r, "daemon::start: " << describe(r.error_value()));
  d = std::move(*r);
  c = client::attach(sys, d->scheduler());
}

embedded::~embedded() {
  c.reset();
  if (d) {
    auto n = d->shutdown();
    // No doctest assertion while a failed one unwinds the stack (it aborts).
    if (std::uncaught_exceptions() == 0)
      CHECK_MESSAGE(n, "daemon shutdown: " << describe(n.error_value()));
    else if (!n)
      std::fprintf(stderr, "daemon shutdown: %s\n", describe(n.error_value()).c_str());
    d.reset();
  }
}

std::set<std::string> ids_of(const std::vector<sandbox_info>& infos) {
  std::set<std::string> out;
  for (const auto& i : infos)
    out.insert(i.id);
  return out;
}

std::vector<sandbox_info> node_list(client& c) {
  auto l = c.list();
  REQUIRE_MESSAGE(l, "list: " << describe(l.error_value()));
  return std::move(*l);
}

node_stats node_stats_of(client& c) {
  auto s = c.stats();
  REQUIRE_MESSAGE(s, "stats: " << describe(s.error_value()));
  return std::move(*s);
}

bool until_stats(client& c, const std::function<bool(const node_stats&)>& ok,
                 std::chrono::seconds cap) {
  auto give_up = std::chrono::steady_clock::now() + cap;
  while (std::chrono::steady_clock::now() < give_up) {
    if (ok(node_stats_of(c)))
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool eventually_gone(client& c, const std::vector<std::string>& ids) {
  return eventually([&] {
    auto l = c.list();
    if (!l)
      return false;
    auto live = ids_of(*l);
    for (const auto& id : ids)
      if (live.count(id))
        return false;
    return true;
  });
}

std::string host_tar(const std::string& dir) {
  auto r = run_process({"/bin/tar", "-c", "-f", "-", "-C", dir, "."});
  REQUIRE_MESSAGE(r.status == 0, "host tar: " << r.describe());
  return r.out;
}

void host_untar(const std::string& tar, const std::string& dir) {
  spawn_options o;
  o.input = tar;
  auto r = run_process({"/bin/tar", "-x", "-f", "-", "-C", dir}, o);
  REQUIRE_MESSAGE(r.status == 0, "host untar: " << r.describe());
}

std::string self_exe() {
  char buf[4096];
  auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  return std::string(buf, static_cast<size_t>(n));
}

std::string describe(const error& e) {
  return std::string{to_string(e.code)} + ": " + e.to_string();
}

dsecd_proc::dsecd_proc(const std::vector<std::string>& extra)
  : bg([&] {
      std::vector<std::string> argv{env_path("DSECD_BIN"), "--listen", "127.0.0.1:0",
                                    "--state", actor_layers()};
      argv.insert(argv.end(), extra.begin(), extra.end());
      return argv;
    }()) {
  REQUIRE_MESSAGE(bg.wait_for_output("listening on 127.0.0.1:"),
                  "dsecd did not start: " << bg.out() << bg.err());
  REQUIRE(bg.wait_for_output(" (state "));
  const std::string mark = "listening on 127.0.0.1:";
  port = static_cast<uint16_t>(std::atoi(bg.out().c_str() + bg.out().find(mark) + mark.size()));
  REQUIRE(port != 0);
}

dsecd_proc::~dsecd_proc() {
  if (!stopped)
    stop(SIGTERM);
}

proc_result dsecd_proc::stop(int sig) {
  stopped = true;
  bg.kill(sig);
  return bg.wait();
}

std::unique_ptr<client> connect(caf::actor_system& sys, uint16_t port) {
  auto c = client::connect(sys, "127.0.0.1", port);
  REQUIRE_MESSAGE(c, "connect: " << describe(c.error_value()));
  return std::move(*c);
}

} // namespace dsec::test
