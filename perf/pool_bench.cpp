// pool_bench: warm pools and the function backend through the C++ client
// (an embedded dsec::daemon, dsec::client::attach), in one run:
//
//   create-to-ready   session::create(1) until the client has the id: cold (no
//                     pool) vs claimed from a warm pool (refilled before each
//                     claim, so every create finds a ready sandbox)
//   calls per second  session::call (pool of --pool) vs create + exec + destroy
//                     of the same command, sequential, for --seconds each
//   paced claims      (--rate R) creates issued at R per second for --seconds,
//                     without waiting for each other, each destroyed once
//                     ready: create-to-ready p50/p99 with the pool refilling
//                     behind them, and how many were claims (the rest were
//                     cold creates because the pool had run dry)
//   peak              (--rate half) first the node's peak rate of cold
//                     creates in this run (no pool; 32 in flight, each
//                     destroyed once ready, for --seconds), then the paced
//                     claims at half of it (the goal: a claim p99
//                     under 1 ms at half the node's peak rate)
//
// Usage: pool_bench --state DIR --base NAME@V [--count N] [--pool N] [--seconds S]
//                   [--rate R|half]
// The base layer must be in DIR's store (dsec --state DIR layer build --kind
// base NAME@V ROOTFS) and have /bin/true (busybox is enough).
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/client.hpp"
#include "actors/daemon.hpp"
#include "actors/types.hpp"

using namespace dsec;
using clk = std::chrono::steady_clock;

namespace {

double us_since(clk::time_point t0) {
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count();
}

void report(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  std::printf("%-34s n=%zu p50=%.0f us p99=%.0f us max=%.0f us\n", what, v.size(), at(0.5),
              at(0.99), v.back());
}

uint32_t pool_ready(client& c) {
  auto st = c.stats();
  uint32_t n = 0;
  if (st)
    for (const auto& p : st->pools)
      n += p.ready;
  return n;
}

} // namespace

int main(int argc, char** argv) {
  std::string state, base;
  int count = 200, pool = 8;
  double seconds = 5;
  double paced = 0;
  bool half = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--state") state = v;
    else if (k == "--base") base = v;
    else if (k == "--count") count = std::atoi(v.c_str());
    else if (k == "--pool") pool = std::atoi(v.c_str());
    else if (k == "--seconds") seconds = std::atof(v.c_str());
    else if (k == "--rate" && v == "half") half = true;
    else if (k == "--rate") paced = std::atof(v.c_str());
  }
  if (state.empty() || base.empty() || count <= 0 || pool <= 0) {
    std::fprintf(stderr, "usage: pool_bench --state DIR --base NAME@V [--count N] [--pool N]"
                         " [--seconds S] [--rate R|half]\n");
    return 2;
  }
  caf::actor_system_config cfg;
  client::configure(cfg);
  caf::actor_system sys{cfg};
  daemon_options o;
  o.state_dir = state;
  auto d = daemon::start(sys, o);
  if (!d) {
    std::fprintf(stderr, "pool_bench: %s\n", d.error_value().message.c_str());
    return 1;
  }
  auto c = client::attach(sys, (*d)->scheduler());
  auto s = c->open_session({.quota = 4096});
  if (!s) {
    std::fprintf(stderr, "pool_bench: %s\n", s.error_value().message.c_str());
    return 1;
  }
  environment env;
  env.base = base;
  auto one = [&](std::vector<double>& lat) {
    auto t0 = clk::now();
    auto ids = (*s)->create(env, 1);
    lat.push_back(us_since(t0));
    if (!ids || ids->empty()) {
      std::fprintf(stderr, "pool_bench: create: %s\n",
                   ids ? "none made" : ids.error_value().message.c_str());
      std::exit(1);
    }
    (void) (*s)->destroy(ids->front());
  };
  std::vector<double> cold, warm;
  for (int i = 0; i < count; ++i)
    one(cold);
  if (auto n = (*s)->pool(env, static_cast<uint32_t>(pool)); !n) {
    std::fprintf(stderr, "pool_bench: pool: %s\n", n.error_value().message.c_str());
    return 1;
  }
  for (int i = 0; i < count; ++i) {
    while (pool_ready(*c) < static_cast<uint32_t>(pool))
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    one(warm);
  }
  report("create-to-ready, cold", cold);
  report("create-to-ready, warm pool claim", warm);
  exec_request req;
  req.argv = {"/bin/true"};
  auto rate = [&](const char* what, auto f) {
    auto t0 = clk::now();
    uint64_t n = 0;
    while (std::chrono::duration<double>(clk::now() - t0).count() < seconds) {
      f();
      ++n;
    }
    double sec = std::chrono::duration<double>(clk::now() - t0).count();
    std::printf("%-34s %llu in %.1f s = %.1f/s\n", what, static_cast<unsigned long long>(n),
                sec, n / sec);
  };
  environment fn = env;
  fn.backend = "function";
  rate("call (function backend, pool)", [&] {
    auto r = (*s)->call(fn, req);
    if (!r) {
      std::fprintf(stderr, "pool_bench: call: %s\n", r.error_value().message.c_str());
      std::exit(1);
    }
  });
  if (half) {
    // The node's peak: cold creates (the pool emptied first), 32 in flight,
    // each destroyed once ready, for `seconds`.
    (void) (*s)->pool(env, 0);
    for (auto st = c->stats(); st && st->live + st->pooled > 0; st = c->stats())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::mutex mu;
    std::condition_variable cv;
    uint64_t in_flight = 0, ready = 0, failed = 0;
    auto t0 = clk::now();
    auto until = t0 + std::chrono::duration<double>(seconds);
    while (clk::now() < until) {
      std::unique_lock<std::mutex> lk{mu};
      cv.wait(lk, [&] { return in_flight < 32; });
      ++in_flight;
      lk.unlock();
      (*s)->create_async(env, 1, [&](expected<std::vector<std::string>> r) {
        if (r && !r->empty())
          (*s)->destroy_async(r->front(), [](expected<void>) {});
        std::lock_guard<std::mutex> g{mu};
        --in_flight;
        (r && !r->empty() ? ready : failed)++;
        cv.notify_all();
      });
    }
    double sec = std::chrono::duration<double>(clk::now() - t0).count();
    {
      std::unique_lock<std::mutex> lk{mu};
      cv.wait(lk, [&] { return in_flight == 0; });
    }
    double peak = static_cast<double>(ready) / sec;
    std::printf("%-34s %llu in %.1f s = %.1f/s (%llu failed)\n", "peak cold creates (32 in flight)",
                static_cast<unsigned long long>(ready), sec, peak,
                static_cast<unsigned long long>(failed));
    paced = peak / 2;
    if (auto n = (*s)->pool(env, static_cast<uint32_t>(pool)); !n) {
      std::fprintf(stderr, "pool_bench: pool: %s\n", n.error_value().message.c_str());
      return 1;
    }
  }
  if (paced > 0) {
    // The pool full again, then creates at `paced` per second, each on its own.
    while (pool_ready(*c) < static_cast<uint32_t>(pool))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto claimed_of = [&] {
      uint64_t n = 0;
      if (auto st = c->stats())
        for (const auto& p : st->pools)
          n += p.claimed;
      return n;
    };
    auto claimed0 = claimed_of();
    std::mutex mu;
    std::vector<double> lat;
    std::atomic<uint64_t> answered{0}, failed{0};
    auto n = static_cast<uint64_t>(paced * seconds);
    auto t0 = clk::now();
    for (uint64_t i = 0; i < n; ++i) {
      std::this_thread::sleep_until(t0 + std::chrono::microseconds(
                                      static_cast<int64_t>(1e6 * static_cast<double>(i) / paced)));
      auto t = clk::now();
      (*s)->create_async(env, 1, [&, t](expected<std::vector<std::string>> r) {
        if (r && !r->empty()) {
          {
            std::lock_guard<std::mutex> g{mu};
            lat.push_back(us_since(t));
          }
          (*s)->destroy_async(r->front(), [](expected<void>) {});
        } else {
          ++failed;
        }
        ++answered;
      });
    }
    while (answered.load() < n)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto claims = claimed_of() - claimed0;
    char what[96];
    std::snprintf(what, sizeof what, "paced creates at %.0f/s, pool %d", paced, pool);
    report(what, lat);
    std::printf("  %llu of %llu were claims from the pool, %llu failed\n",
                static_cast<unsigned long long>(claims), static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(failed.load()));
  }
  (void) (*s)->pool(env, 0);
  rate("create + exec + destroy (no pool)", [&] {
    auto ids = (*s)->create(env, 1);
    if (!ids || ids->empty())
      std::exit(1);
    (void) (*s)->exec(ids->front(), req);
    (void) (*s)->destroy(ids->front());
  });
  (void) (*s)->close();
  return 0;
}
