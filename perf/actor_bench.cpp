// actor_bench: sandboxes through the whole actor path (client, session, node,
// sandbox, layer cache, runtime), against bwrap and a bare vfork+exec loop in the
// same run; and density (memory and create latency with thousands of sandboxes
// live). A plain main: it starts daemons and sweeps concurrency, which Google
// Benchmark's model does not fit. See perf/README.md for how to run and read it.
//
// One sandbox = create 1 (until the client hears it is ready) + exec of a static
// exit(0) binary (until its result is back) + destroy (until the reply).
//
// Two places for the daemon:
//   embedded  dsec::daemon in this process, dsec::client::attach
//   remote    build/tools/dsecd --listen 127.0.0.1:0 as a child process, reached
//             with dsec::client::connect over CAF's network layer
// Two drivers on the client side:
//   threads   N client threads, each a loop of session::create(1) / exec /
//             destroy through the blocking client library (what a trainer does)
//   actor     N event-based "lane" actors in this process, each the same loop
//             with asynchronous requests straight to the session actor (no
//             client thread blocks; measures the daemon, not the library)
//
// Setup: a temporary dir ($TMPDIR/dsec-actor-bench.*) with a rootfs (busybox,
// exit0), a layer store holding perf-busybox@1 built from it. Removed at the end,
// and by a guardian child if this process dies. dsecd children get SIGTERM if
// this process dies (PR_SET_PDEATHSIG) and destroy their sandboxes.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/client.hpp"
#include "actors/daemon.hpp"
#include "actors/types.hpp"
#include "runtime/container.hpp"
#include "runtime/engine.hpp"
#include "runtime/mount.hpp"
#include "runtime/store.hpp"

#ifndef DSEC_PERF_EXIT0
#define DSEC_PERF_EXIT0 ""
#endif
#ifndef DSEC_PERF_DSECD
#define DSEC_PERF_DSECD ""
#endif

namespace {

using clk = std::chrono::steady_clock;

double us_between(clk::time_point a, clk::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// ---- options ----------------------------------------------------------------

const char* usage = R"(usage: actor_bench [OPTIONS]

Rate mode (default): sandboxes (create 1 + exec /bin/exit0 + destroy) through
the actor path at each concurrency, then bwrap and a bare vfork+exec loop, all
in one run, repeated --rounds times interleaved.
Density mode (--density N): fills a node with N idle sandboxes, measuring
memory and create latency at the levels of --levels.

Options:
  --mode LIST          embedded, remote or both (default embedded,remote); each
                       may carry its own tuning: :tN daemon CAF threads, :sN
                       spawners, :cN CAF threads of this process (remote), e.g.
                       --mode remote:t1,remote:t2,remote:t4:s3 (compared in one run);
                       embedded may also carry :sharing (default) or :stealing,
                       CAF's scheduler policy
  --driver LIST        threads, actor or both (default threads)
  --clients LIST       concurrencies to sweep: client threads or lanes
                       (default 1,2,4,8,16)
  --batch N            sandboxes per create request (threads driver; default 1)
  --net                a fresh network namespace per sandbox (environment.net)
  --seconds S          measured time per point (default 3; plus 0.5 s warm-up)
  --rounds R           repeat the whole sweep R times, interleaved (default 1)
  --threads N          CAF scheduler threads of the daemon (default 2)
  --spawners N         zygotes of the daemon (default 2)
  --client-threads N   CAF threads of this process in remote mode (default 1)
  --bwrap LIST         bwrap peer concurrencies, 0 for none (default 2)
  --runtime LIST       runtime/ alone (no actors; container::create, exec,
                       wait, destroy from threads): concurrencies, 0 for none
                       (default 2)
  --no-ceiling         skip the bare vfork+exec loop
  --density N          density mode: fill to N live sandboxes
  --levels LIST        density: where to measure (default 0,1000,N)
  --probe K            density: sequential creates timed at each level (default 200)
  --slots N            the daemon's slots (default 3200, or N+K in density mode)
  --netns-probe N      density: also measure N bare network namespaces (default 0)
  --dsecd PATH         the daemon binary (default: beside this build)
  -h, --help           this text

Needs root, busybox-static and bubblewrap. Nothing is left behind.
)";

std::vector<unsigned> parse_list(const std::string& s) {
  std::vector<unsigned> out;
  std::stringstream ss{s};
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty())
      out.push_back(static_cast<unsigned>(std::stoul(item)));
  return out;
}

std::vector<std::string> parse_words(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss{s};
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty())
      out.push_back(item);
  return out;
}

struct options {
  std::vector<std::string> modes = {"embedded", "remote"};
  std::vector<std::string> drivers = {"threads"};
  std::vector<unsigned> clients = {1, 2, 4, 8, 16};
  unsigned batch = 1;
  bool net = false;
  double seconds = 3;
  unsigned rounds = 1;
  unsigned threads = 2;
  unsigned spawners = 2;
  unsigned client_threads = 1;
  std::vector<unsigned> bwrap = {2};
  std::vector<unsigned> runtime = {2};
  bool ceiling = true;
  unsigned density = 0;
  std::vector<unsigned> levels;
  unsigned probe = 200;
  unsigned slots = 0;
  unsigned netns_probe = 0;
  std::string dsecd;
};

// ---- the shared setup -------------------------------------------------------

struct bench_env {
  std::string dir, rootfs, exit0, state, bwrap;
  pid_t guardian = -1;
  int guardian_pipe = -1;
};

int rm_entry(const char* path, const struct stat*, int, FTW*) {
  ::remove(path);
  return 0;
}

void remove_tree(const std::string& dir) {
  if (!dir.empty())
    ::nftw(dir.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

// A child that removes the dir once this process is gone, however it ends.
void start_guardian(bench_env& e) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) < 0)
    return;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[1]);
    ::setpgid(0, 0);
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    ::prctl(PR_SET_NAME, "bench-guardian", 0, 0, 0);
    char c;
    ssize_t r;
    do
      r = ::read(p[0], &c, 1);
    while (r < 0 && errno == EINTR);
    // A dsecd child may still be destroying its sandboxes: give it time.
    ::sleep(5);
    remove_tree(e.dir);
    ::_exit(0);
  }
  ::close(p[0]);
  if (pid < 0) {
    ::close(p[1]);
    return;
  }
  e.guardian = pid;
  e.guardian_pipe = p[1];
}

bool copy_file(const std::string& from, const std::string& to, mode_t mode) {
  std::ifstream in{from, std::ios::binary};
  std::ofstream out{to, std::ios::binary | std::ios::trunc};
  if (!in || !out)
    return false;
  out << in.rdbuf();
  out.close();
  return out.good() && ::chmod(to.c_str(), mode) == 0;
}

bool executable(const std::string& p) {
  return !p.empty() && ::access(p.c_str(), X_OK) == 0;
}

std::string self_dir() {
  char buf[4096];
  auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    return ".";
  std::string s{buf, static_cast<size_t>(n)};
  return s.substr(0, s.rfind('/'));
}

std::string set_up(bench_env& e) {
  std::string exit0_src = DSEC_PERF_EXIT0;
  if (const char* v = std::getenv("DSEC_PERF_EXIT0"); v && *v)
    exit0_src = v;
  if (!executable(exit0_src))
    return "the static exit0 binary '" + exit0_src + "' is missing (ninja -C build perf-bench)";
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string{tmp && *tmp ? tmp : "/tmp"} + "/dsec-actor-bench.XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    return "mkdtemp " + tmpl + ": " + std::strerror(errno);
  e.dir = tmpl;
  start_guardian(e);
  e.rootfs = e.dir + "/rootfs";
  for (const char* d : {"", "/bin", "/dev", "/proc", "/tmp", "/etc"})
    if (::mkdir((e.rootfs + d).c_str(), 0755) < 0)
      return "mkdir " + e.rootfs + d + ": " + std::strerror(errno);
  e.exit0 = e.rootfs + "/bin/exit0";
  if (!copy_file(exit0_src, e.exit0, 0755))
    return "copying " + exit0_src;
  if (!copy_file("/bin/busybox", e.rootfs + "/bin/busybox", 0755))
    return "copying /bin/busybox (apt-get install busybox-static)";
  if (::symlink("busybox", (e.rootfs + "/bin/sh").c_str()) < 0)
    return std::string{"symlink sh: "} + std::strerror(errno);
  e.state = e.dir + "/state";
  {
    // Built here, then the store is closed: the daemon opens it itself.
    auto st = dsec::store::open(e.state);
    if (!st)
      return st.error_value().to_string();
    if (auto b = st->build(dsec::layer_kind::base, {"perf-busybox", "1"}, e.rootfs); !b)
      return b.error_value().to_string();
    if (auto s = st->system_layer(); !s)
      return s.error_value().to_string();
  }
  for (const char* p : {"/usr/bin/bwrap", "/bin/bwrap"})
    if (executable(p)) {
      e.bwrap = p;
      break;
    }
  return {};
}

void tear_down(bench_env& e) {
  remove_tree(e.dir);
  if (e.guardian_pipe >= 0)
    ::close(e.guardian_pipe);
  if (e.guardian > 0) {
    ::kill(e.guardian, SIGKILL); // ours; the dir is gone already
    int st;
    while (::waitpid(e.guardian, &st, 0) < 0 && errno == EINTR) {
    }
  }
}

// ---- what the machine and our processes spend ---------------------------------

// utime + stime (+ cutime + cstime: reaped children) of one process, in ticks.
uint64_t proc_ticks(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  std::ifstream f{path};
  std::string line;
  if (!std::getline(f, line))
    return 0;
  auto rp = line.rfind(')');
  if (rp == std::string::npos)
    return 0;
  std::istringstream ss{line.substr(rp + 2)};
  std::string field;
  uint64_t sum = 0;
  // fields after comm: state(3) ... utime(14) stime(15) cutime(16) cstime(17)
  for (int i = 3; i <= 17 && ss >> field; ++i)
    if (i >= 14)
      sum += std::stoull(field);
  return sum;
}

std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR* d = ::opendir(path);
  if (!d)
    return out;
  while (auto* ent = ::readdir(d)) {
    if (ent->d_name[0] == '.')
      continue;
    std::ifstream f{std::string{path} + "/" + ent->d_name + "/children"};
    pid_t c;
    while (f >> c)
      out.push_back(c);
  }
  ::closedir(d);
  return out;
}

// CPU of a process and all its live descendants (each with its reaped children),
// in nanoseconds. Kernel threads working for us (netns teardown) are not in it.
uint64_t tree_cpu_ns(pid_t root) {
  static const long hz = ::sysconf(_SC_CLK_TCK);
  uint64_t ticks = 0;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    ticks += proc_ticks(p);
    for (pid_t c : children_of(p))
      todo.push_back(c);
  }
  return ticks * 1'000'000'000ULL / static_cast<uint64_t>(hz);
}

struct box_cpu {
  uint64_t busy = 0, total = 0;
};

box_cpu read_box_cpu() {
  std::ifstream f{"/proc/stat"};
  std::string cpu;
  uint64_t v[10] = {};
  f >> cpu;
  for (auto& x : v)
    f >> x;
  box_cpu b;
  for (int i = 0; i < 10; ++i) {
    b.total += i < 8 ? v[i] : 0; // guest times are inside user already
    if (i != 3 && i != 4 && i < 8)
      b.busy += v[i];
  }
  return b;
}

std::map<std::string, long> meminfo() {
  std::map<std::string, long> m;
  std::ifstream f{"/proc/meminfo"};
  std::string key;
  long val;
  std::string unit;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ss{line};
    if (ss >> key >> val) {
      key.pop_back(); // ':'
      m[key] = val;   // KiB
    }
  }
  return m;
}

long rss_kib(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/status", pid);
  std::ifstream f{path};
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stol(line.substr(6));
  return 0;
}

// ---- samples --------------------------------------------------------------------

struct samples {
  std::vector<float> create, exec, destroy, cycle; // us
  uint64_t failed = 0;
  std::string first_error;
  void merge(const samples& o) {
    create.insert(create.end(), o.create.begin(), o.create.end());
    exec.insert(exec.end(), o.exec.begin(), o.exec.end());
    destroy.insert(destroy.end(), o.destroy.begin(), o.destroy.end());
    cycle.insert(cycle.end(), o.cycle.begin(), o.cycle.end());
    failed += o.failed;
    if (first_error.empty())
      first_error = o.first_error;
  }
};

double pct(std::vector<float> v, double p) {
  if (v.empty())
    return 0;
  auto k = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return v[k];
}

// One measured point.
struct result {
  std::string what;
  unsigned conc = 0;
  double rate = 0;        // sandboxes (or runs) per second
  double cpu_ms = 0;      // CPU of our process tree per sandbox
  double box_busy = 0;    // whole machine, percent of all CPUs
  samples s;
};

// The window every driver shares: counts completions between start and stop.
struct window {
  std::atomic<bool> stop{false};
  std::atomic<bool> measuring{false};
  std::atomic<uint64_t> done{0};
};

// Runs `start_load` (which returns once the load runs), waits warm-up + seconds,
// and fills in the rate and CPU; `stop_load` ends it and returns the samples.
result measure(const std::string& what, unsigned conc, double seconds, pid_t cpu_root,
               window& w, const std::function<void()>& start_load,
               const std::function<samples()>& stop_load) {
  result r;
  r.what = what;
  r.conc = conc;
  start_load();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto c0 = tree_cpu_ns(cpu_root);
  auto b0 = read_box_cpu();
  uint64_t n0 = w.done.load();
  auto t0 = clk::now();
  w.measuring = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  w.measuring = false;
  uint64_t n1 = w.done.load();
  auto t1 = clk::now();
  auto c1 = tree_cpu_ns(cpu_root);
  auto b1 = read_box_cpu();
  w.stop = true;
  r.s = stop_load();
  double secs = us_between(t0, t1) / 1e6;
  uint64_t n = n1 - n0;
  r.rate = static_cast<double>(n) / secs;
  r.cpu_ms = n ? static_cast<double>(c1 - c0) / 1e6 / static_cast<double>(n) : 0;
  r.box_busy = b1.total > b0.total ? 100.0 * static_cast<double>(b1.busy - b0.busy)
                                       / static_cast<double>(b1.total - b0.total)
                                   : 0;
  return r;
}

void print_header() {
  std::printf("%-34s %5s %8s %8s %8s %8s %8s %8s %8s %7s %5s %s\n", "what", "conc", "rate/s",
              "crt_p50", "crt_p99", "exec_p50", "dstr_p50", "cyc_p50", "cyc_p99", "cpu_ms",
              "box%", "failed");
}

void print_result(const result& r) {
  std::printf("%-34s %5u %8.0f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %7.2f %5.0f %lu%s%s\n",
              r.what.c_str(), r.conc, r.rate, pct(r.s.create, .5) / 1e3,
              pct(r.s.create, .99) / 1e3, pct(r.s.exec, .5) / 1e3, pct(r.s.destroy, .5) / 1e3,
              pct(r.s.cycle, .5) / 1e3, pct(r.s.cycle, .99) / 1e3, r.cpu_ms, r.box_busy,
              static_cast<unsigned long>(r.s.failed), r.s.first_error.empty() ? "" : "  ",
              r.s.first_error.c_str());
  std::fflush(stdout);
}

// ---- the peers: bwrap and a bare vfork+exec -----------------------------------

int run_child(const char* const* argv) {
  static char* const envp[] = {const_cast<char*>("PATH=/usr/sbin:/usr/bin:/sbin:/bin"), nullptr};
  pid_t pid = ::vfork();
  if (pid == 0) {
    ::execve(argv[0], const_cast<char* const*>(argv), envp);
    ::_exit(127);
  }
  if (pid < 0)
    return -1;
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -1;
  return st;
}

result run_processes(const std::string& what, std::vector<std::string> argv_s, unsigned conc,
                     double seconds) {
  window w;
  std::vector<std::thread> ts;
  std::vector<samples> per(conc);
  std::vector<const char*> argv;
  for (auto& a : argv_s)
    argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return measure(
    what, conc, seconds, ::getpid(), w,
    [&] {
      for (unsigned i = 0; i < conc; ++i)
        ts.emplace_back([&, i] {
          auto& s = per[i];
          while (!w.stop) {
            auto t0 = clk::now();
            int st = run_child(argv.data());
            auto t1 = clk::now();
            if (st != 0) {
              ++s.failed;
              s.first_error = "exit status " + std::to_string(st);
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
              continue;
            }
            if (w.measuring)
              s.cycle.push_back(static_cast<float>(us_between(t0, t1)));
            ++w.done;
          }
        });
    },
    [&] {
      for (auto& t : ts)
        t.join();
      samples all;
      for (auto& s : per)
        all.merge(s);
      return all;
    });
}

// ---- the daemon: embedded, or a dsecd child -------------------------------------

struct dsecd_child {
  pid_t pid = -1;
  uint16_t port = 0;
  int out = -1;

  static std::optional<dsecd_child> start(const std::string& bin, const std::string& state,
                                          const options& o, unsigned slots, std::string& err) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) < 0) {
      err = "pipe";
      return std::nullopt;
    }
    std::vector<std::string> args = {bin,          "--listen",  "127.0.0.1:0",
                                     "--state",    state,       "--slots",
                                     std::to_string(slots),     "--threads",
                                     std::to_string(o.threads), "--spawners",
                                     std::to_string(o.spawners)};
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      // If we die, dsecd gets SIGTERM and destroys its sandboxes.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent)
        ::_exit(1);
      ::dup2(p[1], 1);
      std::vector<char*> av;
      for (auto& a : args)
        av.push_back(a.data());
      av.push_back(nullptr);
      ::execv(av[0], av.data());
      ::_exit(127);
    }
    ::close(p[1]);
    if (pid < 0) {
      ::close(p[0]);
      err = "fork";
      return std::nullopt;
    }
    dsecd_child c;
    c.pid = pid;
    c.out = p[0];
    // Lines until "listening on HOST:PORT" (GC notes may come first).
    std::string buf;
    char ch;
    while (::read(c.out, &ch, 1) == 1) {
      if (ch != '\n') {
        buf += ch;
        continue;
      }
      auto at = buf.find("listening on ");
      if (at != std::string::npos) {
        auto colon = buf.find(':', at + 13);
        c.port = static_cast<uint16_t>(std::stoul(buf.substr(colon + 1)));
        return c;
      }
      buf.clear();
    }
    err = "dsecd exited before listening";
    c.stop();
    return std::nullopt;
  }

  void stop() {
    if (pid > 0) {
      ::kill(pid, SIGTERM); // ours: it destroys every sandbox, then exits
      int st;
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      pid = -1;
    }
    if (out >= 0) {
      ::close(out);
      out = -1;
    }
  }
};

// Everything a sandbox-making run needs; one actor system (this process's).
struct dsec_side {
  std::string mode;
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<dsec::daemon> daemon; // embedded
  std::optional<dsecd_child> child;     // remote
  std::unique_ptr<dsec::client> client;
  pid_t daemon_pid = -1;                // whose RSS is the daemon's
  pid_t cpu_root = -1;                  // whose tree holds all our CPU

  // `spec`: embedded or remote, optionally with :tN (daemon CAF threads), :sN
  // (spawners) and :cN (this process's CAF threads, remote), e.g. remote:t4:s2.
  std::string start(const std::string& spec, const bench_env& e, const options& o_in,
                    unsigned slots) {
    options o = o_in;
    std::string policy = "sharing";
    std::string m = spec.substr(0, spec.find(':'));
    mode = spec;
    std::replace(mode.begin(), mode.end(), ':', ' ');
    for (size_t at = spec.find(':'); at != std::string::npos; at = spec.find(':', at + 1)) {
      auto tok = spec.substr(at + 1, spec.find(':', at + 1) - at - 1);
      if (tok == "sharing" || tok == "stealing") {
        if (m != "embedded")
          return "bad mode '" + spec + "': the scheduler policy is for embedded only";
        policy = tok;
        continue;
      }
      if (tok.size() < 2)
        return "bad mode '" + spec + "'";
      unsigned v = static_cast<unsigned>(std::stoul(tok.substr(1)));
      if (v == 0)
        return "bad mode '" + spec + "'";
      switch (tok[0]) {
        case 't': o.threads = v; break;
        case 's': o.spawners = v; break;
        case 'c': o.client_threads = v; break;
        default: return "bad mode '" + spec + "' (:tN, :sN, :cN)";
      }
    }
    cfg = std::make_unique<caf::actor_system_config>();
    dsec::client::configure(*cfg);
    cfg->set("scheduler.policy",
             policy == "stealing" ? caf::atom("stealing") : caf::atom("sharing"));
    cfg->set("logger.console", caf::atom("none"));
    if (m == "embedded") {
      cfg->set("scheduler.max-threads", static_cast<size_t>(o.threads));
      sys = std::make_unique<caf::actor_system>(*cfg);
      dsec::daemon_options d;
      d.state_dir = e.state;
      d.slots = slots;
      d.spawners = o.spawners;
      auto dm = dsec::daemon::start(*sys, d);
      if (!dm)
        return dm.error_value().to_string();
      daemon = std::move(*dm);
      client = dsec::client::attach(*sys, daemon->scheduler());
      daemon_pid = ::getpid();
    } else {
      std::string err;
      child = dsecd_child::start(o.dsecd, e.state, o, slots, err);
      if (!child)
        return err;
      cfg->set("scheduler.max-threads", static_cast<size_t>(o.client_threads));
      sys = std::make_unique<caf::actor_system>(*cfg);
      auto c = dsec::client::connect(*sys, "127.0.0.1", child->port);
      if (!c)
        return c.error_value().to_string();
      client = std::move(*c);
      daemon_pid = child->pid;
    }
    cpu_root = ::getpid();
    return {};
  }

  void stop() {
    client.reset();
    if (daemon) {
      (void) daemon->shutdown();
      daemon.reset();
    }
    if (child)
      child->stop();
    child.reset();
    sys.reset();
    cfg.reset();
  }
};

dsec::environment bench_env_of(const options& o) {
  dsec::environment env;
  env.base = "perf-busybox@1";
  env.net = o.net;
  return env;
}

dsec::exec_request exit0_request() {
  dsec::exec_request r;
  r.argv = {"/bin/exit0"};
  return r;
}

// ---- driver 1: client threads over the blocking library ----------------------

result run_threads(dsec_side& d, const options& o, unsigned conc) {
  window w;
  std::vector<std::thread> ts;
  std::vector<samples> per(conc);
  auto env = bench_env_of(o);
  auto req = exit0_request();
  std::atomic<unsigned> started{0};
  std::string what = d.mode + " threads" + (o.batch > 1 ? " b" + std::to_string(o.batch) : "")
                     + (o.net ? " net" : "");
  return measure(
    what, conc, o.seconds, d.cpu_root, w,
    [&] {
      for (unsigned i = 0; i < conc; ++i)
        ts.emplace_back([&, i] {
          auto& s = per[i];
          dsec::session_options so;
          so.quota = 1u << 20;
          auto sess = d.client->open_session(so);
          ++started;
          if (!sess) {
            ++s.failed;
            s.first_error = sess.error_value().to_string();
            return;
          }
          auto& ss = **sess;
          std::vector<clk::time_point> ready;
          while (!w.stop) {
            bool m = w.measuring;
            ready.clear();
            auto t0 = clk::now();
            auto ids = ss.create(env, o.batch, [&](const std::string&) {
              ready.push_back(clk::now());
            });
            if (!ids || ids->size() != o.batch) {
              ++s.failed;
              if (s.first_error.empty())
                s.first_error = ids ? "fewer created than asked" : ids.error_value().to_string();
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
              if (!ids)
                continue;
            }
            if (m)
              for (auto t : ready)
                s.create.push_back(static_cast<float>(us_between(t0, t)));
            for (auto& id : *ids) {
              auto t1 = clk::now();
              auto r = ss.exec(id, req);
              auto t2 = clk::now();
              if (!r || r->exit_code != 0) {
                ++s.failed;
                if (s.first_error.empty())
                  s.first_error = r ? "exit " + std::to_string(r->exit_code)
                                    : r.error_value().to_string();
              } else if (m) {
                s.exec.push_back(static_cast<float>(us_between(t1, t2)));
              }
            }
            for (auto& id : *ids) {
              auto t3 = clk::now();
              auto r = ss.destroy(id);
              auto t4 = clk::now();
              if (!r) {
                ++s.failed;
                if (s.first_error.empty())
                  s.first_error = r.error_value().to_string();
              } else if (m) {
                s.destroy.push_back(static_cast<float>(us_between(t3, t4)));
              }
            }
            if (m)
              s.cycle.push_back(static_cast<float>(us_between(t0, clk::now())));
            w.done += ids->size();
          }
          (void) ss.close();
        });
      while (started < conc)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    },
    [&] {
      for (auto& t : ts)
        t.join();
      samples all;
      for (auto& s : per)
        all.merge(s);
      return all;
    });
}

// ---- driver 2: lane actors, asynchronous requests to the session -------------

struct lane {
  dsec::session_actor sess;
  dsec::environment env;
  dsec::exec_request req;
  window* w = nullptr;
  samples s;
  bool m = false;
  std::string id;
  bool have_id = false;
  clk::time_point t0, t1, t2;
  std::function<void()> next;
  std::function<void()> finished;
};

void spawn_lane(caf::actor_system& sys, std::shared_ptr<lane> L) {
  sys.spawn([L](caf::event_based_actor* self) -> caf::behavior {
    auto fail = [L](const std::string& why) {
      ++L->s.failed;
      if (L->s.first_error.empty())
        L->s.first_error = why;
    };
    auto destroy = [=] {
      auto t3 = clk::now();
      self->request(L->sess, caf::infinite, dsec::destroy_atom::value, L->id)
        .then(
          [=](bool) {
            auto t4 = clk::now();
            if (L->m) {
              L->s.destroy.push_back(static_cast<float>(us_between(t3, t4)));
              L->s.cycle.push_back(static_cast<float>(us_between(L->t0, t4)));
            }
            ++L->w->done;
            L->next();
          },
          [=](caf::error& e) {
            fail(dsec::from_caf(e).to_string());
            L->next();
          });
    };
    auto exec = [=] {
      L->t1 = clk::now();
      self->request(L->sess, caf::infinite, dsec::exec_atom::value, L->id, L->req)
        .then(
          [=](dsec::exec_result& r) {
            auto t2 = clk::now();
            if (r.exit_code != 0)
              fail("exit " + std::to_string(r.exit_code));
            else if (L->m)
              L->s.exec.push_back(static_cast<float>(us_between(L->t1, t2)));
            destroy();
          },
          [=](caf::error& e) {
            fail(dsec::from_caf(e).to_string());
            destroy();
          });
    };
    L->next = [=] {
      if (L->w->stop) {
        auto f = L->finished; // run_lanes breaks the cycle L -> next -> L later
        self->quit();
        f();
        return;
      }
      L->m = L->w->measuring;
      L->have_id = false;
      L->t0 = clk::now();
      self->request(L->sess, caf::infinite, dsec::create_atom::value, L->env, uint32_t{1},
                    caf::actor{self})
        .then(
          [=](uint32_t n) {
            if (n == 0) {
              fail("none created");
              L->next();
            }
          },
          [=](caf::error& e) {
            fail(dsec::from_caf(e).to_string());
            L->next();
          });
    };
    self->send(self, dsec::done_atom::value);
    return {
      [=](dsec::done_atom) { L->next(); },
      [=](dsec::ready_atom, std::string& id) {
        if (L->m)
          L->s.create.push_back(static_cast<float>(us_between(L->t0, clk::now())));
        L->id = std::move(id);
        exec();
      },
      [=](dsec::failed_atom, caf::error& e) { fail(dsec::from_caf(e).to_string()); },
    };
  });
}

result run_lanes(dsec_side& d, const options& o, unsigned conc) {
  window w;
  std::vector<std::shared_ptr<lane>> lanes;
  std::vector<std::unique_ptr<dsec::session>> sessions;
  std::mutex mu;
  std::condition_variable cv;
  unsigned left = conc;
  std::string what = d.mode + " actor" + (o.net ? " net" : "");
  return measure(
    what, conc, o.seconds, d.cpu_root, w,
    [&] {
      for (unsigned i = 0; i < conc; ++i) {
        dsec::session_options so;
        so.quota = 1u << 20;
        auto sess = d.client->open_session(so);
        if (!sess) {
          std::fprintf(stderr, "open_session: %s\n", sess.error_value().to_string().c_str());
          std::exit(1);
        }
        auto L = std::make_shared<lane>();
        L->sess = (*sess)->handle();
        L->env = bench_env_of(o);
        L->req = exit0_request();
        L->w = &w;
        L->finished = [&] {
          std::lock_guard<std::mutex> g{mu};
          if (--left == 0)
            cv.notify_all();
        };
        sessions.push_back(std::move(*sess));
        lanes.push_back(L);
      }
      for (auto& L : lanes)
        spawn_lane(*d.sys, L);
    },
    [&] {
      {
        std::unique_lock<std::mutex> lk{mu};
        cv.wait(lk, [&] { return left == 0; });
      }
      samples all;
      for (auto& L : lanes) {
        all.merge(L->s);
        L->next = nullptr; // the lane's actor is gone: break the cycle L -> next -> L
      }
      for (auto& s : sessions)
        (void) s->close();
      return all;
    });
}

// ---- the runtime alone: what the actors add to -----------------------------------

// An engine of its own (zygotes started from the main thread), the layers mounted
// once, and threads calling the synchronous container API like runtime_bench.
struct runtime_peer {
  std::unique_ptr<dsec::engine> eng;
  std::vector<dsec::layer_mount> mounts;
  std::vector<int> lowers; // topmost first: the system layer, the base

  std::string start(const bench_env& e, const options& o) {
    dsec::engine_options eo;
    eo.state_dir = e.state;
    eo.spawners = o.spawners;
    auto en = dsec::engine::start(eo);
    if (!en)
      return en.error_value().to_string();
    eng = std::move(*en);
    auto sys = eng->layers().system_layer();
    if (!sys)
      return sys.error_value().to_string();
    auto base = eng->layers().lease({"perf-busybox", "1"});
    if (!base)
      return base.error_value().to_string();
    const std::string& sys_path = *sys;
    for (const std::string* path : {&sys_path, &base->blob_path()}) {
      auto m = dsec::layer_mount::open(*path, eng->userns_fd());
      if (!m)
        return m.error_value().to_string();
      mounts.push_back(std::move(*m));
    }
    for (auto& m : mounts)
      lowers.push_back(m.dir_fd());
    return {};
  }
  void stop() {
    lowers.clear();
    mounts.clear();
    eng.reset();
  }
};

result run_runtime(runtime_peer& rt, const options& o, unsigned conc) {
  window w;
  std::vector<std::thread> ts;
  std::vector<samples> per(conc);
  dsec::container_options copts;
  copts.net = o.net;
  dsec::command cmd;
  cmd.argv = {"/bin/exit0"};
  cmd.env = dsec::command::default_env();
  return measure(
    std::string{"runtime alone"} + (o.net ? " net" : ""), conc, o.seconds, ::getpid(), w,
    [&] {
      for (unsigned i = 0; i < conc; ++i)
        ts.emplace_back([&, i] {
          auto& s = per[i];
          auto fail = [&](const std::string& why) {
            ++s.failed;
            if (s.first_error.empty())
              s.first_error = why;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          };
          while (!w.stop) {
            bool m = w.measuring;
            auto t0 = clk::now();
            auto c = dsec::container::create(rt.eng->pick(), rt.lowers, copts, nullptr);
            auto t1 = clk::now();
            if (!c) {
              fail(c.error_value().to_string());
              continue;
            }
            auto id = (*c)->exec(cmd, dsec::stdio{});
            auto st = id ? (*c)->wait(*id) : dsec::expected<dsec::exit_status>{id.error_value()};
            auto t2 = clk::now();
            if (!st || st->shell_code() != 0)
              fail(st ? "exit " + st->to_string() : st.error_value().to_string());
            (void) (*c)->destroy();
            c->reset();
            auto t3 = clk::now();
            if (m) {
              s.create.push_back(static_cast<float>(us_between(t0, t1)));
              s.exec.push_back(static_cast<float>(us_between(t1, t2)));
              s.destroy.push_back(static_cast<float>(us_between(t2, t3)));
              s.cycle.push_back(static_cast<float>(us_between(t0, t3)));
            }
            ++w.done;
          }
        });
    },
    [&] {
      for (auto& t : ts)
        t.join();
      samples all;
      for (auto& s : per)
        all.merge(s);
      return all;
    });
}

// ---- rate mode ------------------------------------------------------------------

int rate_mode(bench_env& e, const options& o) {
  std::vector<std::unique_ptr<dsec_side>> sides;
  unsigned slots = o.slots ? o.slots : 3200;
  runtime_peer rt;
  bool with_runtime = std::any_of(o.runtime.begin(), o.runtime.end(), [](unsigned c) { return c > 0; });
  if (with_runtime) {
    auto err = rt.start(e, o);
    if (!err.empty()) {
      std::fprintf(stderr, "actor_bench: runtime peer: %s\n", err.c_str());
      rt.stop();
      return 1;
    }
  }
  for (auto& m : o.modes) {
    auto s = std::make_unique<dsec_side>();
    auto err = s->start(m, e, o, slots);
    if (!err.empty()) {
      std::fprintf(stderr, "actor_bench: %s daemon: %s\n", m.c_str(), err.c_str());
      s->stop();
      for (auto& x : sides)
        x->stop();
      rt.stop();
      return 1;
    }
    // Warm: the layer mounted, the zygotes' first clone done, the heap grown.
    dsec::session_options so;
    auto sess = s->client->open_session(so);
    if (sess) {
      for (int i = 0; i < 20; ++i) {
        auto ids = (*sess)->create(bench_env_of(o), 4);
        if (ids)
          for (auto& id : *ids)
            (void) (*sess)->destroy(id);
      }
      (void) (*sess)->close();
    }
    sides.push_back(std::move(s));
  }
  std::printf("actor_bench: %u CPUs, %s, %.1f s per point, daemon: %u CAF threads (sharing), "
              "%u spawners; remote client: %u CAF threads\n",
              static_cast<unsigned>(std::thread::hardware_concurrency()),
              o.net ? "fresh netns per sandbox (net=true)" : "no fresh netns (net=false)",
              o.seconds, o.threads, o.spawners, o.client_threads);
  std::printf("times in ms; crt = create until ready at the client, exec = exec round trip, "
              "dstr = destroy round trip,\ncyc = one sandbox (or one batch) from create to "
              "destroyed; cpu_ms = CPU of this process tree (and dsecd) per sandbox\n\n");
  print_header();
  std::map<std::string, std::vector<result>> all; // by what + conc
  std::vector<std::string> order;                  // keys as they first came
  auto keep = [&](result r) {
    print_result(r);
    auto key = r.what + "#" + std::to_string(r.conc);
    if (!all.count(key))
      order.push_back(key);
    all[key].push_back(std::move(r));
  };
  for (unsigned round = 0; round < o.rounds; ++round) {
    for (auto& s : sides)
      for (auto& drv : o.drivers)
        for (unsigned c : o.clients)
          keep(drv == "actor" ? run_lanes(*s, o, c) : run_threads(*s, o, c));
    if (with_runtime)
      for (unsigned c : o.runtime)
        if (c > 0)
          keep(run_runtime(rt, o, c));
    if (!e.bwrap.empty())
      for (unsigned c : o.bwrap) {
        if (c == 0)
          continue;
        std::vector<std::string> base = {e.bwrap, "--unshare-all"};
        std::vector<std::string> tail = {"--ro-bind", e.rootfs, "/",     "--dev",
                                         "/dev",      "--proc", "/proc", "/bin/exit0"};
        auto a = base;
        a.insert(a.end(), tail.begin(), tail.end());
        keep(run_processes("bwrap --unshare-all", a, c, o.seconds));
        auto b = base;
        b.push_back("--share-net");
        b.insert(b.end(), tail.begin(), tail.end());
        keep(run_processes("bwrap --unshare-all --share-net", b, c, o.seconds));
      }
    if (o.ceiling)
      keep(run_processes("bare vfork+exec", {e.exit0}, 2, o.seconds));
  }
  for (auto& s : sides)
    s->stop();
  rt.stop();

  // Summary: the best concurrency of each dsec variant, against the peers.
  auto median_rate = [](const std::vector<result>& rs) {
    std::vector<double> v;
    for (auto& r : rs)
      v.push_back(r.rate);
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  auto peer = [&](const std::string& what) {
    double best = 0;
    for (auto& [k, rs] : all)
      if (k.rfind(what + "#", 0) == 0)
        best = std::max(best, median_rate(rs));
    return best;
  };
  double bw = peer("bwrap --unshare-all"), bws = peer("bwrap --unshare-all --share-net"),
         vf = peer("bare vfork+exec"), ra = peer(std::string{"runtime alone"} + (o.net ? " net" : ""));
  auto med = [](std::vector<double> v) {
    if (v.empty())
      return 0.0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::printf("\nmedians over %u round(s) (rate min..max); x bwrap: against the better of "
              "bwrap --unshare-all's concurrencies\n",
              o.rounds);
  std::printf("%-34s %5s %8s %13s %8s %8s %7s %5s %8s %8s\n", "what", "conc", "rate/s", "min..max",
              "crt_p50", "crt_p99", "cpu_ms", "box%", "x bwrap", "x runtime");
  for (auto& key : order) {
    auto& rs = all[key];
    std::vector<double> rate, p50, p99, cpu, box;
    for (auto& r : rs) {
      rate.push_back(r.rate);
      p50.push_back(pct(r.s.create, .5) / 1e3);
      p99.push_back(pct(r.s.create, .99) / 1e3);
      cpu.push_back(r.cpu_ms);
      box.push_back(r.box_busy);
    }
    char range[32];
    std::snprintf(range, sizeof range, "%.0f..%.0f", *std::min_element(rate.begin(), rate.end()),
                  *std::max_element(rate.begin(), rate.end()));
    double m = med(rate);
    std::printf("%-34s %5u %8.0f %13s %8.2f %8.2f %7.2f %5.0f %8.2f %8.2f\n",
                rs.front().what.c_str(), rs.front().conc, m, range, med(p50), med(p99), med(cpu),
                med(box), bw > 0 ? m / bw : 0, ra > 0 ? m / ra : 0);
  }
  std::printf("\nbest concurrency of each (median rate):\n");
  std::map<std::string, std::pair<unsigned, double>> best;
  for (auto& [k, rs] : all) {
    auto& w = rs.front().what;
    if (w.rfind("bwrap", 0) == 0 || w.rfind("bare", 0) == 0 || w.rfind("runtime", 0) == 0)
      continue;
    double r = median_rate(rs);
    if (r > best[w].second)
      best[w] = {rs.front().conc, r};
  }
  for (auto& [w, b] : best) {
    std::printf("  %-28s %6.0f/s at %3u   vs bwrap --unshare-all %.2fx", w.c_str(), b.second,
                b.first, bw > 0 ? b.second / bw : 0);
    std::printf("   vs --share-net %.2fx   vs runtime alone %.2fx   vs vfork+exec %.3fx\n",
                bws > 0 ? b.second / bws : 0, ra > 0 ? b.second / ra : 0,
                vf > 0 ? b.second / vf : 0);
  }
  std::printf("  peers: bwrap --unshare-all %.0f/s, --share-net %.0f/s, runtime alone %.0f/s, "
              "vfork+exec %.0f/s\n",
              bw, bws, ra, vf);
  return 0;
}

// ---- density mode -----------------------------------------------------------------

struct mem_snapshot {
  std::map<std::string, long> mi;
  long rss = 0;
};

mem_snapshot snap(pid_t daemon_pid) {
  // Let deferred frees (RCU, netns cleanup) settle a little.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  return {meminfo(), rss_kib(daemon_pid)};
}

void print_mem_delta(const char* label, const mem_snapshot& a, const mem_snapshot& b, long n) {
  if (n <= 0)
    return;
  auto d = [&](const char* k) {
    return static_cast<double>(b.mi.at(k) - a.mi.at(k)) / static_cast<double>(n);
  };
  std::printf("  %s, KiB per sandbox: MemAvailable -%.0f  (MemFree -%.0f)  daemon RSS +%.1f | "
              "Slab +%.0f (SUnreclaim +%.0f)  KernelStack +%.1f  PageTables +%.1f  AnonPages "
              "+%.1f  Shmem +%.1f  Percpu +%.1f\n",
              label, -d("MemAvailable"), -d("MemFree"),
              static_cast<double>(b.rss - a.rss) / static_cast<double>(n), d("Slab"),
              d("SUnreclaim"), d("KernelStack"), d("PageTables"), d("AnonPages"), d("Shmem"),
              d("Percpu"));
}

// The sandboxes' own processes (dsec-init, children of the daemon), averaged
// over at most `max` of them: robust to other jobs on the box, unlike MemAvailable.
struct init_mem {
  unsigned n = 0;
  double pte = 0, rss_anon = 0, priv = 0, pss = 0; // KiB each
};

init_mem sample_inits(pid_t daemon_pid, unsigned max) {
  init_mem r;
  for (pid_t c : children_of(daemon_pid)) {
    if (r.n >= max)
      break;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/comm", c);
    std::ifstream cf{path};
    std::string comm;
    cf >> comm;
    if (comm != "dsec-init")
      continue;
    auto field = [](const std::string& file, const char* key) {
      std::ifstream f{file};
      std::string line;
      while (std::getline(f, line))
        if (line.rfind(key, 0) == 0)
          return std::stod(line.substr(std::strlen(key)));
      return 0.0;
    };
    std::string base = "/proc/" + std::to_string(c);
    r.pte += field(base + "/status", "VmPTE:");
    r.rss_anon += field(base + "/status", "RssAnon:");
    r.priv += field(base + "/smaps_rollup", "Private_Clean:")
              + field(base + "/smaps_rollup", "Private_Dirty:");
    r.pss += field(base + "/smaps_rollup", "Pss:");
    ++r.n;
  }
  if (r.n) {
    r.pte /= r.n;
    r.rss_anon /= r.n;
    r.priv /= r.n;
    r.pss /= r.n;
  }
  return r;
}

// Makes n network namespaces in a child and holds them; memory per namespace.
void netns_probe(unsigned n) {
  int p[2], q[2];
  if (::pipe(p) < 0 || ::pipe(q) < 0)
    return;
  auto before = snap(::getpid());
  auto t0 = clk::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    rlimit rl{n + 64, n + 64};
    if (::setrlimit(RLIMIT_NOFILE, &rl) < 0) {
      ::getrlimit(RLIMIT_NOFILE, &rl);
      rl.rlim_cur = rl.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &rl);
    }
    unsigned made = 0;
    for (; made < n; ++made) {
      if (::unshare(CLONE_NEWNET) < 0)
        break;
      if (::open("/proc/self/ns/net", O_RDONLY) < 0)
        break;
    }
    (void) !::write(p[1], &made, sizeof made);
    char c;
    (void) !::read(q[0], &c, 1);
    ::_exit(0);
  }
  unsigned made = 0;
  (void) !::read(p[0], &made, sizeof made);
  double secs = us_between(t0, clk::now()) / 1e6;
  auto after = snap(::getpid());
  (void) !::write(q[1], "x", 1);
  int st;
  ::waitpid(pid, &st, 0);
  for (int fd : {p[0], p[1], q[0], q[1]})
    ::close(fd);
  std::printf("\nbare network namespaces (unshare(CLONE_NEWNET) + an fd each, in one process): "
              "%u made in %.2f s\n",
              made, secs);
  print_mem_delta("netns", before, after, made);
}

int density_mode(bench_env& e, const options& o) {
  unsigned n = o.density;
  std::vector<unsigned> levels = o.levels.empty() ? std::vector<unsigned>{0, 1000, n} : o.levels;
  // The probe is one more sandbox: with --slots N, measure at N-1 live.
  unsigned slots = o.slots ? o.slots : n + 1;
  for (auto& l : levels)
    l = std::min(l, slots - 1);
  std::printf("actor_bench density: up to %u live idle sandboxes, %s, %u slots, daemon %u "
              "threads, %u spawners\n",
              levels.back(), o.net ? "fresh netns each (net=true)" : "no fresh netns (net=false)",
              slots, o.threads, o.spawners);
  std::printf("limits: pid_max %s, fs.mount-max %s, RLIMIT_NOFILE %ld\n",
              [] {
                std::ifstream f{"/proc/sys/kernel/pid_max"};
                static std::string s;
                f >> s;
                return s.c_str();
              }(),
              [] {
                std::ifstream f{"/proc/sys/fs/mount-max"};
                static std::string s;
                f >> s;
                return s.c_str();
              }(),
              [] {
                rlimit rl{};
                ::getrlimit(RLIMIT_NOFILE, &rl);
                return static_cast<long>(rl.rlim_cur);
              }());
  int rc = 0;
  for (auto& m : o.modes) {
    dsec_side d;
    auto err = d.start(m, e, o, slots);
    if (!err.empty()) {
      std::fprintf(stderr, "actor_bench: %s daemon: %s\n", m.c_str(), err.c_str());
      d.stop();
      return 1;
    }
    std::printf("\n== %s (daemon pid %d)\n", m.c_str(), d.daemon_pid);
    auto env = bench_env_of(o);
    auto req = exit0_request();
    dsec::session_options so;
    so.quota = slots + 16;
    auto sess_r = d.client->open_session(so);
    if (!sess_r) {
      std::fprintf(stderr, "open_session: %s\n", sess_r.error_value().to_string().c_str());
      d.stop();
      return 1;
    }
    auto& sess = **sess_r;
    // Warm: the layer mounted, the zygotes' pools and the daemon's heap in use.
    for (int i = 0; i < 50; ++i) {
      auto ids = sess.create(env, 1);
      if (ids)
        for (auto& id : *ids) {
          (void) sess.exec(id, req);
          (void) sess.destroy(id);
        }
    }
    std::vector<std::string> live;
    auto base = snap(d.daemon_pid);
    std::printf("%8s %9s %9s %9s %9s %10s %12s %11s\n", "live", "crt_p50", "crt_p99", "crt_max",
                "dstr_p50", "fill/s", "MemAvail-MiB", "daemon-RSS");
    double p50_empty = 0, p99_empty = 0;
    for (unsigned level : levels) {
      // Fill to the level, 64 at a time (the daemon creates them concurrently).
      auto tf = clk::now();
      size_t from = live.size();
      while (live.size() < level) {
        auto want = static_cast<uint32_t>(std::min<size_t>(64, level - live.size()));
        auto ids = sess.create(env, want);
        if (!ids) {
          std::fprintf(stderr, "fill: %s\n", ids.error_value().to_string().c_str());
          rc = 1;
          break;
        }
        if (ids->size() < want) {
          std::fprintf(stderr, "fill: %zu of %u created\n", ids->size(), want);
          rc = 1;
        }
        live.insert(live.end(), ids->begin(), ids->end());
        if (ids->empty())
          break;
      }
      double fill_rate = live.size() > from
                           ? static_cast<double>(live.size() - from)
                               / (us_between(tf, clk::now()) / 1e6)
                           : 0;
      auto now = snap(d.daemon_pid);
      // The probe: sequential create (until ready) + destroy, one at a time.
      std::vector<float> crt, dstr;
      for (unsigned i = 0; i < o.probe; ++i) {
        auto t0 = clk::now();
        clk::time_point t1;
        auto ids = sess.create(env, 1, [&](const std::string&) { t1 = clk::now(); });
        if (!ids || ids->empty()) {
          std::fprintf(stderr, "probe: %s\n",
                       ids ? "none created" : ids.error_value().to_string().c_str());
          rc = 1;
          break;
        }
        crt.push_back(static_cast<float>(us_between(t0, t1)));
        auto t2 = clk::now();
        (void) sess.destroy(ids->front());
        dstr.push_back(static_cast<float>(us_between(t2, clk::now())));
      }
      std::printf("%8zu %9.2f %9.2f %9.2f %9.2f %10.0f %12.0f %11.1f\n", live.size(),
                  pct(crt, .5) / 1e3, pct(crt, .99) / 1e3, pct(crt, 1) / 1e3,
                  pct(dstr, .5) / 1e3, fill_rate,
                  static_cast<double>(now.mi["MemAvailable"]) / 1024.0,
                  static_cast<double>(now.rss) / 1024.0);
      std::fflush(stdout);
      if (auto im = sample_inits(d.daemon_pid, 200); im.n > 0)
        std::printf("  each sandbox's init (mean of %u): page tables %.1f KiB, RssAnon %.1f, "
                    "private %.1f, Pss %.1f\n",
                    im.n, im.pte, im.rss_anon, im.priv, im.pss);
      if (level == levels.front()) {
        p50_empty = pct(crt, .5);
        p99_empty = pct(crt, .99);
      } else {
        char label[64];
        std::snprintf(label, sizeof label, "0 -> %zu live", live.size());
        print_mem_delta(label, base, now, static_cast<long>(live.size()));
        std::printf("  create vs empty node: p50 %.2fx, p99 %.2fx\n",
                    p50_empty > 0 ? pct(crt, .5) / p50_empty : 0,
                    p99_empty > 0 ? pct(crt, .99) / p99_empty : 0);
      }
      if (rc != 0)
        break;
    }
    // Teardown: everything at once.
    auto td = clk::now();
    auto closed = sess.close();
    double secs = us_between(td, clk::now()) / 1e6;
    std::printf("  closed the session: %u sandboxes destroyed in %.2f s\n", closed ? *closed : 0u,
                secs);
    auto report = [&](const char* when) {
      auto after = snap(d.daemon_pid);
      std::printf("  %s: MemAvailable %+.1f MiB vs before the fill, daemon RSS %+.1f MiB\n", when,
                  static_cast<double>(after.mi["MemAvailable"] - base.mi["MemAvailable"])
                    / 1024.0,
                  static_cast<double>(after.rss - base.rss) / 1024.0);
    };
    report("after teardown");
    // The zygotes take back the network namespaces of ended sandboxes when they
    // are next asked for one (keeping up to 256 each): ask.
    // (A closed session is gone: a new one. Asking a closed session over the
    // network never returns: the client library waits with caf::infinite.)
    if (auto again = d.client->open_session(so); again) {
      for (unsigned i = 0; i < 2 * o.spawners; ++i) {
        auto ids = (*again)->create(env, 1);
        if (ids)
          for (auto& id : *ids)
            (void) (*again)->destroy(id);
      }
      (void) (*again)->close();
    }
    report("after one more create per zygote");
    auto before_stop = meminfo();
    d.stop();
    auto stopped = snap(::getpid());
    std::printf("  after the daemon stopped: MemAvailable %+.1f MiB vs before the fill (the "
                "daemon and its zygotes held %.1f MiB)\n",
                static_cast<double>(stopped.mi["MemAvailable"] - base.mi["MemAvailable"]) / 1024.0,
                static_cast<double>(stopped.mi["MemAvailable"] - before_stop["MemAvailable"])
                  / 1024.0);
  }
  if (o.netns_probe)
    netns_probe(o.netns_probe);
  return rc;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "actor_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "-h" || a == "--help") {
        std::fputs(usage, stdout);
        return 0;
      } else if (a == "--mode") {
        o.modes = parse_words(val());
        for (auto& m : o.modes)
          if (m == "both")
            o.modes = {"embedded", "remote"};
      } else if (a == "--driver") {
        o.drivers = parse_words(val());
        for (auto& m : o.drivers)
          if (m == "both")
            o.drivers = {"threads", "actor"};
      } else if (a == "--clients") {
        o.clients = parse_list(val());
      } else if (a == "--batch") {
        o.batch = static_cast<unsigned>(std::stoul(val()));
      } else if (a == "--net") {
        o.net = true;
      } else if (a == "--seconds") {
        o.seconds = std::stod(val());
      } else if (a == "--rounds") {
        o.rounds = static_cast<unsigned>(std::stoul(val()));
      } else if (a == "--threads") {
        o.threads = static_cast<unsigned>(std::stoul(val()));
      } else if (a == "--spawners") {
        o.spawners = static_cast<unsigned>(std::stoul(val()));
      } else if (a == "--client-threads") {
        o.client_threads = static_cast<unsigned>(std::stoul(val()));
      } else if (a == "--bwrap") {
        o.bwrap = parse_list(val());
      } else if (a == "--runtime") {
        o.runtime = parse_list(val());
      } else if (a == "--no-ceiling") {
        o.ceiling = false;
      } else if (a == "--density") {
        o.density = static_cast<unsigned>(std::stoul(val()));
      } else if (a == "--levels") {
        o.levels = parse_list(val());
      } else if (a == "--probe") {
        o.probe = static_cast<unsigned>(std::stoul(val()));
      } else if (a == "--slots") {
        o.slots = static_cast<unsigned>(std::stoul(val()));
      } else if (a == "--netns-probe") {
        o.netns_probe = static_cast<unsigned>(std::stoul(val()));
      } else if (a == "--dsecd") {
        o.dsecd = val();
      } else {
        std::fprintf(stderr, "actor_bench: unknown argument '%s' (try --help)\n", a.c_str());
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "actor_bench: bad value for %s\n", a.c_str());
      return 2;
    }
  }
  for (auto& m : o.modes)
    if (m.rfind("embedded", 0) != 0 && m.rfind("remote", 0) != 0) {
      std::fprintf(stderr, "actor_bench: --mode: embedded, remote or both (each optionally "
                           "with :tN :sN :cN)\n");
      return 2;
    }
  for (auto& m : o.drivers)
    if (m != "threads" && m != "actor") {
      std::fprintf(stderr, "actor_bench: --driver: threads, actor or both\n");
      return 2;
    }
  if (o.batch == 0 || o.clients.empty() || o.threads == 0 || o.spawners == 0 || o.rounds == 0) {
    std::fprintf(stderr, "actor_bench: --batch, --clients, --threads, --spawners and --rounds "
                         "must be positive\n");
    return 2;
  }
  if (o.dsecd.empty()) {
    o.dsecd = DSEC_PERF_DSECD;
    if (!executable(o.dsecd))
      o.dsecd = self_dir() + "/../tools/dsecd";
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "actor_bench: needs root (mounts, namespaces)\n");
    return 1;
  }
  if (std::any_of(o.modes.begin(), o.modes.end(),
                  [](const std::string& m) { return m.rfind("remote", 0) == 0; })
      && !executable(o.dsecd)) {
    std::fprintf(stderr, "actor_bench: no dsecd at %s (ninja -C build, or --dsecd)\n",
                 o.dsecd.c_str());
    return 1;
  }
  ::signal(SIGPIPE, SIG_IGN);
  std::setvbuf(stdout, nullptr, _IOLBF, 0); // a killed run still shows its lines
  // Our own descriptors: thousands of sandboxes in the embedded daemon.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  bench_env e;
  auto err = set_up(e);
  int rc = 1;
  if (!err.empty())
    std::fprintf(stderr, "actor_bench: setup failed: %s\n", err.c_str());
  else
    rc = o.density ? density_mode(e, o) : rate_mode(e, o);
  tear_down(e);
  return rc;
}
