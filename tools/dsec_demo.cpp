// dsec-demo: the README's demo session. Starts an embedded single-node dsecd
// (the same actors as the daemon, in this process), opens a session, creates a
// batch of sandboxes, runs a command in each, shows progress and a summary, and
// shuts down cleanly.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/client.hpp"
#include "actors/daemon.hpp"
#include "tools/dsec/cli.hpp"

namespace {

const char* usage = R"(usage: dsec-demo [--state DIR] [--count N] [--parallel K] [--chronus]
                 --base NAME@VERSION [--workdir NAME@VERSION] [--tool NAME@VERSION]...
                 -- CMD [ARGS...]

Starts an embedded single-node dsec daemon, opens a session, creates N
sandboxes (default 100) in one batch, runs CMD in each from K client threads
(default 4), destroys them, prints progress and a summary (created, rate, time
to ready and command p50/p99), and shuts the daemon down.

With --chronus the sandboxes have Chronus and CMD runs as a trusted command
(a grader): the demo watches the session's events, answers each feedback
request with reward 1 if its payload is "pass" (else 0), and the summary counts
the events by kind.
)";

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

double pct(std::vector<double> v, double p) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  auto i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

} // namespace

int main(int argc, char** argv) {
  using namespace dsec;
  std::string state = cli::default_state_dir();
  uint32_t count = 100;
  unsigned parallel = 4;
  environment env;
  std::vector<std::string> cmd;
  cli::args a{argc, argv, 1};
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(usage, stdout);
      return 0;
    }
    if (a.rest(cmd))
      break;
    std::string v;
    auto opt = [&](const char* name) {
      auto r = a.option(name, v);
      if (!r) {
        std::fprintf(stderr, "dsec-demo: %s\n", r.error_value().message.c_str());
        std::exit(2);
      }
      return *r;
    };
    if (opt("--state"))
      state = v;
    else if (opt("--count"))
      count = static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 10));
    else if (opt("--parallel"))
      parallel = static_cast<unsigned>(std::max(1ul, std::strtoul(v.c_str(), nullptr, 10)));
    else if (opt("--base"))
      env.base = v;
    else if (opt("--workdir"))
      env.workdir = v;
    else if (opt("--tool"))
      env.tools.push_back(v);
    else if (a.flag("--chronus"))
      env.chronus = true;
    else {
      std::fprintf(stderr, "dsec-demo: unknown argument '%s'\n%s", std::string{a.peek()}.c_str(),
                   usage);
      return 2;
    }
  }
  if (env.base.empty() || cmd.empty() || count == 0) {
    std::fputs(usage, stderr);
    return 2;
  }

  caf::actor_system_config cfg;
  client::configure(cfg);
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{2});
  cfg.set("logger.console", caf::atom("none"));
  caf::actor_system sys{cfg};

  std::printf("starting an embedded dsecd (state %s)...\n", state.c_str());
  daemon_options o;
  o.state_dir = state;
  o.slots = std::max<uint32_t>(count, 64);
  auto d = daemon::start(sys, o);
  if (!d) {
    std::fprintf(stderr, "dsec-demo: %s\n", d.error_value().to_string().c_str());
    return 1;
  }
  auto c = client::attach(sys, (*d)->scheduler());
  session_options so;
  so.quota = count;
  so.name = "demo";
  auto s = c->open_session(so);
  if (!s) {
    std::fprintf(stderr, "dsec-demo: %s\n", s.error_value().to_string().c_str());
    return 1;
  }
  std::printf("session %s open; creating %u sandboxes of base=%s%s%s", (*s)->id().c_str(), count,
              env.base.c_str(), env.workdir.empty() ? "" : " workdir=",
              env.workdir.c_str());
  for (auto& t : env.tools)
    std::printf(" tool=%s", t.c_str());
  std::printf("\n");

  bool tty = ::isatty(1) == 1; // progress lines only on a terminal

  // Chronus: the trainer's side. Events come on one of CAF's threads; a
  // feedback request is answered from a thread of ours (answer() blocks).
  struct chronus_side {
    std::mutex mu;
    std::map<std::string, size_t> kinds;
    std::vector<std::pair<std::string, chronus_feedback>> to_answer;
    std::vector<double> latency_ms; // event stamped by the node -> seen here
  };
  auto cs = std::make_shared<chronus_side>();
  std::unique_ptr<event_stream> watch;
  if (env.chronus) {
    auto w = (*s)->watch([cs](const chronus_event& ev) {
      timespec ts{};
      ::clock_gettime(CLOCK_MONOTONIC, &ts);
      auto now = static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u +
                 static_cast<uint64_t>(ts.tv_nsec);
      std::lock_guard<std::mutex> g{cs->mu};
      cs->kinds[to_string(ev.kind) +
                (ev.kind == chronus_kind::stage ? " " + ev.text : std::string{})]++;
      cs->latency_ms.push_back(static_cast<double>(now - ev.monotonic_ns) / 1e6);
      if (ev.kind == chronus_kind::feedback) {
        chronus_feedback fb;
        fb.request_id = ev.seq;
        fb.reward = ev.payload == "pass" ? 1.0 : 0.0;
        fb.text = ev.payload == "pass" ? "well done" : "try again";
        fb.done = true;
        cs->to_answer.emplace_back(ev.sandbox_id, std::move(fb));
      }
    });
    if (!w) {
      std::fprintf(stderr, "dsec-demo: watch: %s\n", w.error_value().to_string().c_str());
      return 1;
    }
    watch = std::move(*w);
  }
  std::atomic<bool> answering{env.chronus};
  std::atomic<size_t> answered{0};
  std::thread answerer([&] {
    while (answering) {
      std::vector<std::pair<std::string, chronus_feedback>> todo;
      {
        std::lock_guard<std::mutex> g{cs->mu};
        todo.swap(cs->to_answer);
      }
      for (auto& [id, fb] : todo)
        if ((*s)->answer(id, fb))
          ++answered;
      if (todo.empty())
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });

  // 1. One batch; each sandbox is usable as soon as it is ready.
  std::vector<double> ready_ms;
  std::vector<std::string> failures;
  auto t0 = clock_type::now();
  auto ids = (*s)->create(
    env, count,
    [&](const std::string&) {
      ready_ms.push_back(ms_since(t0));
      if ((tty && ready_ms.size() % 25 == 0) || ready_ms.size() == count) {
        std::printf("\r  ready %zu/%u", ready_ms.size(), count);
        std::fflush(stdout);
      }
    },
    [&](const error& e) { failures.push_back(e.to_string()); });
  double create_s = ms_since(t0) / 1000;
  std::printf("\n");
  if (!ids) {
    std::fprintf(stderr, "dsec-demo: create: %s\n", ids.error_value().to_string().c_str());
    return 1;
  }

  // 2. The command in each, from several client threads.
  exec_request req;
  req.argv = cmd;
  req.trusted = env.chronus;
  std::mutex mu;
  std::vector<double> exec_ms;
  std::vector<int> codes;
  std::string sample;
  std::atomic<size_t> next{0};
  auto t1 = clock_type::now();
  std::vector<std::thread> workers;
  for (unsigned w = 0; w < parallel; ++w)
    workers.emplace_back([&] {
      for (size_t i; (i = next++) < ids->size();) {
        auto te = clock_type::now();
        auto r = (*s)->exec((*ids)[i], req);
        std::lock_guard<std::mutex> g{mu};
        exec_ms.push_back(ms_since(te));
        if (!r) {
          failures.push_back(r.error_value().to_string());
          continue;
        }
        codes.push_back(r->signal ? 128 + r->signal : r->exit_code);
        if (sample.empty())
          sample = r->out;
        if ((tty && exec_ms.size() % 25 == 0) || exec_ms.size() == ids->size()) {
          std::printf("\r  ran %zu/%zu", exec_ms.size(), ids->size());
          std::fflush(stdout);
        }
      }
    });
  for (auto& t : workers)
    t.join();
  double exec_s = ms_since(t1) / 1000;
  std::printf("\n");

  answering = false;
  answerer.join();

  // 3. Destroy them all by closing the session.
  auto t2 = clock_type::now();
  auto closed = (*s)->close();
  double close_s = ms_since(t2) / 1000;

  size_t ok = std::count(codes.begin(), codes.end(), 0);
  std::printf("\nsummary\n");
  std::printf("  created        %zu of %u (%zu failed) in %.2f s: %.0f sandboxes/s\n",
              ids->size(), count, count - ids->size(), create_s,
              create_s > 0 ? static_cast<double>(ids->size()) / create_s : 0.0);
  std::printf("  time to ready  p50 %.1f ms, p99 %.1f ms (from the start of the batch)\n",
              pct(ready_ms, 0.5), pct(ready_ms, 0.99));
  std::printf("  commands       %zu ran, %zu exited 0, in %.2f s: %.0f/s; each p50 %.1f ms, "
              "p99 %.1f ms\n",
              codes.size(), ok, exec_s,
              exec_s > 0 ? static_cast<double>(codes.size()) / exec_s : 0.0,
              pct(exec_ms, 0.5), pct(exec_ms, 0.99));
  std::printf("  destroyed      %u with the session in %.2f s\n", closed ? *closed : 0, close_s);
  if (!sample.empty())
    std::printf("  first output   %s%s", sample.c_str(), sample.back() == '\n' ? "" : "\n");
  if (env.chronus) {
    std::lock_guard<std::mutex> g{cs->mu};
    std::string kinds;
    for (const auto& [k, n] : cs->kinds)
      kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + k;
    std::printf("  chronus        %s; %zu feedback requests answered; node to trainer p50 %.2f "
                "ms, p99 %.2f ms\n",
                kinds.empty() ? "no events" : kinds.c_str(), answered.load(),
                pct(cs->latency_ms, 0.5), pct(cs->latency_ms, 0.99));
  }
  for (size_t i = 0; i < failures.size() && i < 3; ++i)
    std::printf("  failure        %s\n", failures[i].c_str());

  watch.reset();
  auto n = (*d)->shutdown();
  std::printf("daemon shut down%s\n", n ? "; nothing left behind" : "");
  s->reset();
  c.reset();
  d->reset();
  return failures.empty() && ok == codes.size() ? 0 : 1;
}
