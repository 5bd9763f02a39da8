// trajectory_bench: what a session's trajectory log (docs/trajectory.md) costs
// and what resume gives back, in an embedded daemon whose state dir is on
// the disk of $TMPDIR (fsync is real there; on tmpfs it would cost nothing).
//
//   build/perf/trajectory_bench [--commands K] [--files F] [--sandboxes N]
//
// 1. exec round trip of `true` in one sandbox, K times in a row, p50/p99:
//    no log; log with idempotent commands (record + fsync); log with
//    non-idempotent ones (record + pack of the writable layer + fsync), with
//    an empty writable layer and with F files of 10 KiB in it.
// 2. throughput: N sandboxes, one trainer thread each, K commands each:
//    commands/s without a log and with one (non-idempotent): how well the
//    batched fsync amortizes.
// 3. resume: the trainer goes away after K commands in the sandbox with F
//    files; a resumed session answers the K commands again (p50 from the log),
//    then the first new command rebuilds the sandbox from its last pack
//    (its latency, against a fresh create + exec).
// Needs root and busybox-static. Leaves nothing behind.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "actors/client.hpp"
#include "actors/daemon.hpp"
#include "runtime/store.hpp"

namespace {

using clk = std::chrono::steady_clock;

const char* usage = R"(usage: trajectory_bench [--commands K] [--files F] [--sandboxes N]

The cost of a session's trajectory log and what resume gives back, in an
embedded daemon with its state in $TMPDIR (default /tmp; fsync must be real).
K commands per measurement (default 300), F files of 10 KiB in the big
writable layer (default 1000), N sandboxes for throughput (default 16).
Needs root and busybox-static; leaves nothing behind.
)";

int rm_entry(const char* path, const struct stat*, int, FTW*) {
  return ::remove(path);
}

double ms_since(clk::time_point t0) {
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

double pct(std::vector<double> v, double p) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  auto i = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "trajectory_bench: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(dsec::expected<T> r, const char* what) {
  if (!r)
    die(std::string{what} + ": " + r.error_value().to_string());
  return std::move(*r);
}

dsec::exec_request cmd(std::vector<std::string> argv, bool idempotent = false) {
  dsec::exec_request r;
  r.argv = std::move(argv);
  r.idempotent = idempotent;
  return r;
}

// K execs of `req` in a row; the latencies in ms.
std::vector<double> round_trips(dsec::session& s, const std::string& id,
                                const dsec::exec_request& req, unsigned k) {
  std::vector<double> v;
  v.reserve(k);
  for (unsigned i = 0; i < k; ++i) {
    auto t0 = clk::now();
    auto r = must(s.exec(id, req), "exec");
    if (r.exit_code != 0)
      die("exec exited " + std::to_string(r.exit_code) + ": " + r.err);
    v.push_back(ms_since(t0));
  }
  return v;
}

void report(const char* what, const std::vector<double>& v) {
  std::printf("  %-52s p50 %6.2f ms  p99 %6.2f ms\n", what, pct(v, 50), pct(v, 99));
}

} // namespace

int main(int argc, char** argv) {
  unsigned commands = 300, files = 1000, sandboxes = 16;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](unsigned& out) {
      if (i + 1 >= argc || std::atoi(argv[i + 1]) <= 0) {
        std::fprintf(stderr, "trajectory_bench: %s needs a positive number\n", a.c_str());
        std::exit(2);
      }
      out = static_cast<unsigned>(std::atoi(argv[++i]));
    };
    if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      return 0;
    } else if (a == "--commands") {
      value(commands);
    } else if (a == "--files") {
      value(files);
    } else if (a == "--sandboxes") {
      value(sandboxes);
    } else {
      std::fprintf(stderr, "trajectory_bench: unknown option '%s'\n%s", a.c_str(), usage);
      return 2;
    }
  }
  if (::geteuid() != 0)
    die("needs root");
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string{tmp && *tmp ? tmp : "/tmp"} + "/dsec-trajectory-bench.XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    die("mkdtemp in " + tmpl + ": " + std::strerror(errno));
  std::string dir = tmpl;
  struct cleanup {
    std::string dir;
    ~cleanup() { ::nftw(dir.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS); }
  } clean{dir};
  auto root = dir + "/root";
  ::mkdir(root.c_str(), 0755);
  ::mkdir((root + "/bin").c_str(), 0755);
  {
    std::ifstream in{"/bin/busybox", std::ios::binary};
    std::ofstream out{root + "/bin/busybox", std::ios::binary};
    out << in.rdbuf();
    if (!in.good() && !in.eof())
      die("cannot copy /bin/busybox (busybox-static)");
  }
  ::chmod((root + "/bin/busybox").c_str(), 0755);
  for (auto l : {"sh", "true", "dd", "mkdir", "seq", "cat", "tar"})
    (void) ::symlink("busybox", (root + "/bin/" + l).c_str());
  auto st = must(dsec::store::open(dir + "/state"), "store");
  must(st.build(dsec::layer_kind::base, *dsec::parse_layer_ref("bench@1"), root), "layer");

  caf::actor_system_config cfg;
  dsec::client::configure(cfg);
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{2});
  cfg.set("logger.console", caf::atom("none"));
  caf::actor_system sys{cfg};
  dsec::daemon_options dopts;
  dopts.state_dir = dir + "/state";
  dopts.slots = sandboxes * 2 + 16;
  auto d = must(dsec::daemon::start(sys, dopts), "daemon");
  dsec::environment env;
  env.base = "bench@1";
  std::printf("trajectory_bench: state in %s (K=%u commands, F=%u files of 10 KiB, N=%u)\n",
              dir.c_str(), commands, files, sandboxes);

  const auto fill = cmd({"sh", "-c",
                         "mkdir -p /work && cd /work && for i in $(seq " + std::to_string(files)
                           + "); do dd if=/dev/zero of=f$i bs=10240 count=1 2>/dev/null; done"});
  dsec::session_options plain, logged;
  plain.quota = logged.quota = sandboxes * 2 + 8;
  logged.trajectory = true;

  // 1. Round trips.
  std::printf("exec round trip of `true`, %u in a row in one sandbox:\n", commands);
  std::string resume_id, big_box;
  std::vector<double> logged_big;
  {
    auto c = dsec::client::attach(sys, d->scheduler());
    auto sp = must(c->open_session(plain), "open");
    auto id = must(sp->create(env, 1), "create").at(0);
    round_trips(*sp, id, cmd({"true"}), 20); // warm
    report("no log", round_trips(*sp, id, cmd({"true"}), commands));
    auto sl = must(c->open_session(logged), "open");
    auto ids = must(sl->create(env, 2), "create");
    report("log, idempotent (record + fsync)", round_trips(*sl, ids[0], cmd({"true"}, true), commands));
    report("log, not idempotent, empty writable layer (+ pack)",
           round_trips(*sl, ids[0], cmd({"true"}), commands));
    auto t0 = clk::now();
    must(sl->exec(ids[1], fill), "fill");
    std::printf("  (writing %u files of 10 KiB, logged with its pack: %.0f ms)\n", files,
                ms_since(t0));
    logged_big = round_trips(*sl, ids[1], cmd({"true"}), commands);
    report(("log, not idempotent, " + std::to_string(files) + " files in the layer").c_str(),
           logged_big);
    resume_id = sl->id();
    big_box = ids[1];
    (void) sp->close();
    // The trainer goes away here: its logged session closes, the log stays.
  }

  // 2. Throughput.
  std::printf("throughput, %u sandboxes, one trainer thread each, %u commands each:\n",
              sandboxes, commands);
  for (bool with_log : {false, true}) {
    auto c = dsec::client::attach(sys, d->scheduler());
    auto s = must(c->open_session(with_log ? logged : plain), "open");
    auto ids = must(s->create(env, sandboxes), "create");
    if (ids.size() != sandboxes)
      die("created " + std::to_string(ids.size()) + " sandboxes");
    auto t0 = clk::now();
    std::vector<std::thread> ts;
    for (const auto& id : ids)
      ts.emplace_back([&, id] { round_trips(*s, id, cmd({"true"}), commands); });
    for (auto& t : ts)
      t.join();
    double secs = ms_since(t0) / 1000.0;
    std::printf("  %-52s %8.0f commands/s\n",
                with_log ? "log, not idempotent (record + pack + fsync)" : "no log",
                static_cast<double>(sandboxes) * commands / secs);
    (void) s->close();
  }

  // 3. Resume.
  std::printf("resume of the session whose sandbox has %u files, %u commands logged:\n", files,
              commands + 1);
  {
    auto c = dsec::client::attach(sys, d->scheduler());
    // The old trainer's session may still be closing: resume once it is gone.
    auto until = clk::now() + std::chrono::seconds(30);
    auto t0 = clk::now();
    auto rs = c->resume_session(resume_id);
    while (!rs && rs.error_value().code == dsec::errc::in_use && clk::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      t0 = clk::now();
      rs = c->resume_session(resume_id);
    }
    double resume_ms = ms_since(t0);
    auto s = must(std::move(rs), "resume");
    auto ids = must(s->create(env, 2), "create again");
    std::printf("  resume_session (reads the log)                       %6.2f ms\n", resume_ms);
    // The first sandbox's log (the K+K+K commands of part 1) answered again.
    std::vector<double> v;
    for (unsigned i = 0; i < commands; ++i) {
      auto t = clk::now();
      must(s->exec(ids[0], cmd({"true"}, true)), "replay");
      v.push_back(ms_since(t));
    }
    report("a logged command answered from the log", v);
    must(s->exec(ids[1], fill), "replay fill");
    round_trips(*s, big_box, cmd({"true"}), commands);
    t0 = clk::now();
    auto r = must(s->exec(big_box, cmd({"sh", "-c", "ls /work | wc -l"})), "rebuild");
    double rebuild_ms = ms_since(t0);
    if (std::atoi(r.out.c_str()) != static_cast<int>(files))
      die("the rebuilt sandbox has " + r.out + " files, not " + std::to_string(files));
    std::printf("  first new command: rebuild from the pack (%u files) + exec %6.2f ms\n", files,
                rebuild_ms);
    (void) s->close();
    auto c2 = dsec::client::attach(sys, d->scheduler());
    auto s2 = must(c2->open_session(plain), "open");
    t0 = clk::now();
    auto fresh = must(s2->create(env, 1), "create").at(0);
    must(s2->exec(fresh, cmd({"true"})), "exec");
    std::printf("  for comparison: a fresh create + exec                %6.2f ms\n", ms_since(t0));
    (void) s2->close();
  }
  (void) d->shutdown();
  return 0;
}
