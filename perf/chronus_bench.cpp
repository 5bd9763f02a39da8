// chronus_bench: Chronus events through the whole path — a trusted command in a
// sandbox (perf/chronus_load, over tools/chronus/chronus.h), the node's endpoint
// on the io_uring reactor, actor mail to the session, and a trainer's watch
// (dsec::client, session::watch with a callback) — in an embedded daemon.
//
//   build/perf/chronus_bench [--sandboxes N] [--events K] [--latency-events L]
//
// 1. latency: one sandbox at a time sends L reports, 2 ms apart; each carries
//    CLOCK_MONOTONIC from just before its send, and the trainer's callback takes
//    the difference on arrival (the sandbox shares the host's monotonic clock).
//    Reported: p50, p90, p99, max.
// 2. throughput: N sandboxes each send K reports as fast as their acks return,
//    all at once; reported: events/s the trainer received, from the first to the
//    last, and the node's CPU time per event (this process: daemon + trainer).
// Needs root and busybox-static. Makes its layers in a temporary state dir,
// removed at the end.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <ftw.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/client.hpp"
#include "actors/daemon.hpp"
#include "runtime/store.hpp"

#ifndef DSEC_PERF_CHRONUS_LOAD
#define DSEC_PERF_CHRONUS_LOAD ""
#endif

namespace {

using namespace std::chrono_literals;

const char* usage = R"(usage: chronus_bench [--sandboxes N] [--events K] [--latency-events L]

Chronus events from trusted commands in sandboxes to a trainer's watch, in an
embedded daemon. Latency: L reports (default 500), one sandbox at a time, 2 ms
apart: p50/p90/p99/max from the call in the sandbox to the trainer's callback.
Throughput: N sandboxes (default 1000) each send K reports (default 100) as fast
as their acks return: events/s received by the trainer, CPU per event.
Needs root and busybox-static; leaves nothing behind.
)";

double mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

double cpu_s() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

bool copy_file(const std::string& from, const std::string& to) {
  std::ifstream in{from, std::ios::binary};
  std::ofstream out{to, std::ios::binary | std::ios::trunc};
  out << in.rdbuf();
  return in.good() || in.eof() ? (out.close(), ::chmod(to.c_str(), 0755) == 0) : false;
}

int rm_entry(const char* path, const struct stat*, int, FTW*) {
  return ::remove(path);
}

double pct(std::vector<double> v, double p) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  auto i = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct recorder {
  std::mutex mu;
  std::vector<double> latency_us;
  std::atomic<uint64_t> events{0};
  double first_ns = 0, last_ns = 0;
  bool record_latency = true;

  void on_event(const dsec::chronus_event& ev) {
    double now = mono_ns();
    std::lock_guard<std::mutex> g{mu};
    if (first_ns == 0)
      first_ns = now;
    last_ns = now;
    events.fetch_add(1, std::memory_order_relaxed);
    if (record_latency && !ev.metrics.empty())
      latency_us.push_back((now - ev.metrics.front().value) / 1e3);
  }
};

} // namespace

int main(int argc, char** argv) {
  unsigned sandboxes = 1000, events = 100, latency_events = 500;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](unsigned& out) {
      if (i + 1 >= argc || std::atoi(argv[i + 1]) <= 0) {
        std::fprintf(stderr, "chronus_bench: %s needs a positive number\n", a.c_str());
        std::exit(2);
      }
      out = static_cast<unsigned>(std::atoi(argv[++i]));
    };
    if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      return 0;
    } else if (a == "--sandboxes") {
      value(sandboxes);
    } else if (a == "--events") {
      value(events);
    } else if (a == "--latency-events") {
      value(latency_events);
    } else {
      std::fprintf(stderr, "chronus_bench: unknown option '%s'\n%s", a.c_str(), usage);
      return 2;
    }
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "chronus_bench: needs root\n");
    return 1;
  }
  char tmpl[] = "/tmp/dsec-chronus-bench.XXXXXX";
  if (!::mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  std::string dir = tmpl;
  struct cleanup {
    std::string dir;
    ~cleanup() { ::nftw(dir.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS); }
  } clean{dir};
  auto root = dir + "/root";
  ::mkdir(root.c_str(), 0755);
  ::mkdir((root + "/bin").c_str(), 0755);
  if (!copy_file("/bin/busybox", root + "/bin/busybox") ||
      !copy_file(DSEC_PERF_CHRONUS_LOAD, root + "/bin/chronus_load")) {
    std::fprintf(stderr, "chronus_bench: cannot copy busybox (busybox-static) or %s\n",
                 DSEC_PERF_CHRONUS_LOAD);
    return 1;
  }
  for (auto l : {"sh", "sleep"})
    (void) ::symlink("busybox", (root + "/bin/" + l).c_str());
  auto st = dsec::store::open(dir + "/state");
  if (!st) {
    std::fprintf(stderr, "chronus_bench: %s\n", st.error_value().to_string().c_str());
    return 1;
  }
  auto ref = dsec::parse_layer_ref("bench@1");
  if (auto b = st->build(dsec::layer_kind::base, *ref, root); !b) {
    std::fprintf(stderr, "chronus_bench: %s\n", b.error_value().to_string().c_str());
    return 1;
  }

  caf::actor_system_config cfg;
  dsec::client::configure(cfg);
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{2});
  cfg.set("logger.console", caf::atom("none"));
  caf::actor_system sys{cfg};
  dsec::daemon_options dopts;
  dopts.state_dir = dir + "/state";
  dopts.slots = sandboxes + 16;
  auto d = dsec::daemon::start(sys, dopts);
  if (!d) {
    std::fprintf(stderr, "chronus_bench: %s\n", d.error_value().to_string().c_str());
    return 1;
  }
  auto c = dsec::client::attach(sys, (*d)->scheduler());
  dsec::session_options so;
  so.quota = sandboxes + 16;
  auto s = c->open_session(so);
  if (!s) {
    std::fprintf(stderr, "chronus_bench: %s\n", s.error_value().to_string().c_str());
    return 1;
  }
  auto rec = std::make_shared<recorder>();
  auto w = (*s)->watch([rec](const dsec::chronus_event& ev) { rec->on_event(ev); });
  if (!w) {
    std::fprintf(stderr, "chronus_bench: watch: %s\n", w.error_value().to_string().c_str());
    return 1;
  }
  dsec::environment env;
  env.base = "bench@1";
  env.chronus = true;
  auto t_create = std::chrono::steady_clock::now();
  auto ids = (*s)->create(env, sandboxes);
  if (!ids || ids->size() != sandboxes) {
    std::fprintf(stderr, "chronus_bench: created %zu of %u sandboxes\n",
                 ids ? ids->size() : size_t{0}, sandboxes);
    return 1;
  }
  double create_s =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - t_create).count();
  std::printf("chronus_bench: %u sandboxes with Chronus created in %.2f s\n", sandboxes,
              create_s);

  auto wait_for = [&](uint64_t n, std::chrono::seconds cap) {
    auto end = std::chrono::steady_clock::now() + cap;
    while (rec->events.load() < n && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(1ms);
    return rec->events.load() >= n;
  };

  // 1. Latency, one sandbox at a time.
  {
    unsigned per = std::max(1u, latency_events / 10);
    unsigned boxes = (latency_events + per - 1) / per;
    for (unsigned i = 0; i < boxes; ++i) {
      dsec::exec_request r;
      r.argv = {"chronus_load", std::to_string(per), "2000"};
      r.trusted = true;
      auto res = (*s)->exec((*ids)[i % ids->size()], r);
      if (!res || res->exit_code != 0) {
        std::fprintf(stderr, "chronus_bench: chronus_load failed: %s\n",
                     res ? res->err.c_str() : res.error_value().to_string().c_str());
        return 1;
      }
    }
    uint64_t want = static_cast<uint64_t>(boxes) * per;
    if (!wait_for(want, 30s)) {
      std::fprintf(stderr, "chronus_bench: %llu of %llu events arrived\n",
                   static_cast<unsigned long long>(rec->events.load()),
                   static_cast<unsigned long long>(want));
      return 1;
    }
    std::lock_guard<std::mutex> g{rec->mu};
    auto& v = rec->latency_us;
    std::printf("latency, sandbox call -> trainer callback, %zu events, 2 ms apart:\n"
                "  p50 %.0f us   p90 %.0f us   p99 %.0f us   max %.0f us\n",
                v.size(), pct(v, 50), pct(v, 90), pct(v, 99), pct(v, 100));
  }

  // 2. Throughput: every sandbox at once.
  {
    {
      std::lock_guard<std::mutex> g{rec->mu};
      rec->record_latency = false;
      rec->first_ns = rec->last_ns = 0;
    }
    uint64_t base = rec->events.load();
    auto st0 = c->stats();
    double cpu0 = cpu_s();
    for (const auto& id : *ids) {
      dsec::exec_request r;
      r.argv = {"chronus_load", std::to_string(events)};
      r.trusted = true;
      r.detach = true;
      auto res = (*s)->exec(id, r);
      if (!res) {
        std::fprintf(stderr, "chronus_bench: %s\n", res.error_value().to_string().c_str());
        return 1;
      }
    }
    uint64_t want = base + static_cast<uint64_t>(sandboxes) * events;
    bool all = wait_for(want, 300s);
    double cpu = cpu_s() - cpu0;
    auto st1 = c->stats();
    uint64_t got = rec->events.load() - base;
    double span_s;
    {
      std::lock_guard<std::mutex> g{rec->mu};
      span_s = (rec->last_ns - rec->first_ns) / 1e9;
    }
    std::printf("throughput, %u sandboxes x %u reports at once: %llu events in %.2f s = "
                "%.0f events/s%s\n"
                "  this process (daemon + trainer) CPU: %.1f us per event; refused by the "
                "node: %llu\n",
                sandboxes, events, static_cast<unsigned long long>(got), span_s,
                span_s > 0 ? static_cast<double>(got) / span_s : 0.0,
                all ? "" : " (NOT ALL ARRIVED)", got ? cpu * 1e6 / static_cast<double>(got) : 0.0,
                st0 && st1 ? static_cast<unsigned long long>(
                               (st1->chronus_flooding + st1->chronus_malformed +
                                st1->chronus_invalid + st1->chronus_unauthenticated) -
                               (st0->chronus_flooding + st0->chronus_malformed +
                                st0->chronus_invalid + st0->chronus_unauthenticated))
                           : 0ull);
    if (!all)
      return 1;
  }
  (void) (*s)->close();
  w->reset();
  s->reset();
  c.reset();
  (void) (*d)->shutdown();
  return 0;
}
