// runtime_bench: the sandbox fast path of runtime/ (no actors), measured against
// its ceiling (a bare vfork+exec loop) and its peer (bwrap) in the same run.
//
// One sandbox = container::create + exec of a static exit(0) binary + wait +
// destroy. Setup (once, before any benchmark): a temporary state dir, a base
// layer built through dsec::store from a rootfs of busybox + exit0, the system
// layer, both mounted once and shared, and one spawner per worker thread (each
// started from the main thread, so that no benchmark thread's exit takes a
// zygote with it). Everything is removed at the end, and by a guardian process
// if this one dies (nothing is mounted in the host namespace, so there is only
// the directory to remove). See perf/README.md for how to read the counters.
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/cgroup.hpp"
#include "runtime/container.hpp"
#include "runtime/egress.hpp"
#include "runtime/netlink.hpp"
#include "runtime/mount.hpp"
#include "runtime/spawner.hpp"
#include "runtime/store.hpp"

#ifndef DSEC_PERF_EXIT0
#define DSEC_PERF_EXIT0 ""
#endif

namespace {

using clk = std::chrono::steady_clock;

constexpr int max_threads = 2; // one spawner each

uint64_t ns_since(clk::time_point t0, clk::time_point t1) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
}

// ---- the shared setup -------------------------------------------------------

struct bench_env {
  std::string dir;     // the temporary directory holding everything below
  std::string rootfs;  // dir/rootfs: busybox + exit0, the base layer's source
  std::string exit0;   // rootfs/bin/exit0 as the host sees it
  std::string bwrap;   // empty when bwrap is not installed
  pid_t guardian = -1;
  int guardian_pipe = -1;
  std::optional<dsec::store> st;
  std::optional<dsec::layer_lease> base;
  std::vector<std::unique_ptr<dsec::spawner>> spawners;
  std::vector<dsec::layer_mount> mounts; // system layer, base layer
  std::vector<int> lowers;               // their dir fds, topmost first
  dsec::command cmd;
  // Below this process's cgroup: a root without a pool and one with a pool
  // (prewarmed), both removed at the end. Empty if cgroups are unavailable.
  std::optional<dsec::cgroup_root> cg_fresh, cg_pool;
  std::string cg_error;
  // Egress networking (BM_sandbox_egress): a node network whose uplink is a
  // veth pair of ours (no packet is sent: the benchmark only attaches).
  std::unique_ptr<dsec::egress_network> egress;
  std::string egress_error;
};

// The uplink (a veth pair) and the tag of the benchmark's egress network (fixed, so
// a run sweeps what a killed one left).
constexpr const char* bench_uplink = "dtbench0";
constexpr const char* bench_tag = "beef";

bench_env* env = nullptr;

// The limits every dsecd sandbox gets by default: memory and pids (two v1
// hierarchies on this machine, one v2 cgroup elsewhere).
dsec::limits default_shape() {
  dsec::limits lim;
  lim.memory_bytes = 256ull << 20;
  lim.pids = 512;
  return lim;
}


int rm_entry(const char* path, const struct stat*, int, FTW*) {
  ::remove(path);
  return 0;
}

void remove_tree(const std::string& dir) {
  if (!dir.empty())
    ::nftw(dir.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

// A child that removes `dir` once this process is gone, however it ends
// (SIGKILL included): it waits for EOF on a pipe only we hold the write end of.
void start_guardian(bench_env& e) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) < 0)
    return;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[1]);
    // Ctrl-C, timeout(1) and kill -- -PGID signal the whole process group:
    // leave it, and ignore the rest, to outlive the benchmark and clean up.
    ::setpgid(0, 0);
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    ::prctl(PR_SET_NAME, "bench-guardian", 0, 0, 0);
    char c;
    ssize_t r;
    do
      r = ::read(p[0], &c, 1); // only EOF (or an error) ever comes
    while (r < 0 && errno == EINTR);
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
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0)
    return false;
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  bool ok = out >= 0;
  char buf[1 << 16];
  ssize_t n;
  while (ok && (n = ::read(in, buf, sizeof buf)) > 0)
    ok = ::write(out, buf, static_cast<size_t>(n)) == n;
  ::close(in);
  if (out >= 0)
    ok = ::close(out) == 0 && ok;
  return ok && ::chmod(to.c_str(), mode) == 0;
}

bool executable(const std::string& p) {
  return !p.empty() && ::access(p.c_str(), X_OK) == 0;
}

// Builds the layers, mounts them, starts the spawners. Returns an error text.
std::string set_up(bench_env& e) {
  std::string exit0_src = DSEC_PERF_EXIT0;
  if (const char* v = std::getenv("DSEC_PERF_EXIT0"); v && *v)
    exit0_src = v;
  if (!executable(exit0_src))
    return "the static exit0 binary '" + exit0_src
           + "' is missing (ninja -C build perf-bench, or set DSEC_PERF_EXIT0)";
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string{tmp && *tmp ? tmp : "/tmp"} + "/dsec-perf.XXXXXX";
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
    return "copying " + exit0_src + ": " + std::strerror(errno);
  if (!copy_file("/bin/busybox", e.rootfs + "/bin/busybox", 0755))
    return "copying /bin/busybox (apt-get install busybox-static): "
           + std::string{std::strerror(errno)};
  if (::symlink("busybox", (e.rootfs + "/bin/sh").c_str()) < 0)
    return std::string{"symlink sh: "} + std::strerror(errno);

  auto st = dsec::store::open(e.dir + "/state");
  if (!st)
    return st.error_value().to_string();
  e.st.emplace(std::move(*st));
  dsec::layer_ref ref{"perf-busybox", "1"};
  if (auto b = e.st->build(dsec::layer_kind::base, ref, e.rootfs); !b)
    return b.error_value().to_string();
  auto lease = e.st->lease(ref);
  if (!lease)
    return lease.error_value().to_string();
  e.base.emplace(std::move(*lease));
  auto sys_layer = e.st->system_layer();
  if (!sys_layer)
    return sys_layer.error_value().to_string();

  for (int i = 0; i < max_threads; ++i) {
    auto sp = dsec::spawner::start({});
    if (!sp)
      return sp.error_value().to_string();
    e.spawners.push_back(std::move(*sp));
  }
  // Mounted once, idmapped through the first spawner's user namespace: every
  // spawner maps the same host id range, so all of them can use these mounts.
  const std::string& sys_path = *sys_layer;
  for (const std::string* path : {&sys_path, &e.base->blob_path()}) {
    auto m = dsec::layer_mount::open(*path, e.spawners[0]->userns_fd());
    if (!m)
      return m.error_value().to_string();
    e.mounts.push_back(std::move(*m));
  }
  for (const auto& m : e.mounts)
    e.lowers.push_back(m.dir_fd());
  e.cmd.argv = {"/bin/exit0"};
  e.cmd.env = {"PATH=/bin"};
  for (auto* root : {&e.cg_fresh, &e.cg_pool}) {
    auto r = dsec::cgroup_root::detect();
    if (!r) {
      e.cg_error = r.error_value().to_string();
      break;
    }
    root->emplace(std::move(*r));
  }
  if (e.cg_pool) {
    e.cg_pool->enable_pool(64);
    if (auto ok = e.cg_pool->prewarm(default_shape(), 2 * max_threads); !ok) {
      e.cg_error = ok.error_value().to_string();
      e.cg_pool.reset();
      e.cg_fresh.reset();
    }
  }
  for (const char* p : {"/usr/bin/bwrap", "/bin/bwrap"})
    if (executable(p)) {
      e.bwrap = p;
      break;
    }
  (void) dsec::egress_network::sweep(bench_tag);
  if (auto nl = dsec::rtnl::open()) {
    (void) nl->delete_link(bench_uplink);
    if (auto d = nl->add_veth(bench_uplink, "dtbench1", 0); !d) {
      e.egress_error = d.error_value().to_string();
    } else {
      dsec::egress_options eo;
      eo.uplink = bench_uplink;
      eo.tag = bench_tag;
      auto net = dsec::egress_network::start(eo);
      if (net)
        e.egress = std::move(*net);
      else
        e.egress_error = net.error_value().to_string();
    }
  }
  return {};
}

void tear_down(bench_env& e) {
  e.egress.reset(); // its table and links
  if (auto nl = dsec::rtnl::open())
    (void) nl->delete_link(bench_uplink);
  e.cg_pool.reset(); // removes its idle cgroups and this process's dirs
  e.cg_fresh.reset();
  e.mounts.clear();   // the detached layer mounts go with their last fd
  e.lowers.clear();
  e.spawners.clear(); // each closes its socket and reaps its zygote
  e.base.reset();
  e.st.reset();
  remove_tree(e.dir);
  if (e.guardian_pipe >= 0)
    ::close(e.guardian_pipe);
  if (e.guardian > 0) {
    int st;
    while (::waitpid(e.guardian, &st, 0) < 0 && errno == EINTR) {
    }
  }
}

// ---- CPU time of everything a sandbox runs in -------------------------------

// Nanoseconds of CPU used so far by this process (all threads), by its reaped
// children (each sandbox's init, reaped by destroy(), with the commands it
// reaped) and by the zygotes (alive: read from /proc/PID/schedstat). Not counted:
// kernel threads working on our behalf (e.g. the asynchronous teardown of
// network namespaces in a kworker, RCU callbacks).
uint64_t cpu_ns_all() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  uint64_t ns = static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL
                + static_cast<uint64_t>(ts.tv_nsec);
  rusage ru{};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  for (const auto& tv : {ru.ru_utime, ru.ru_stime})
    ns += static_cast<uint64_t>(tv.tv_sec) * 1'000'000'000ULL
          + static_cast<uint64_t>(tv.tv_usec) * 1000ULL;
  for (const auto& sp : env->spawners) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/schedstat", sp->pid());
    if (FILE* f = std::fopen(path, "re")) {
      unsigned long long run = 0;
      if (std::fscanf(f, "%llu", &run) == 1)
        ns += run;
      std::fclose(f);
    }
  }
  return ns;
}

// ---- per-thread samples, merged by thread 0 after the timed loop -------------

// Thread i writes only slot i inside its loop; benchmark's stop barrier ends every
// thread's loop before thread 0 leaves its own, so thread 0 may then read all.
std::array<std::vector<uint64_t>, max_threads> create_samples, cycle_samples;

double percentile(std::vector<uint64_t>& v, double p) {
  if (v.empty())
    return 0;
  auto k = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return static_cast<double>(v[k]);
}

// Sets p50/p99 over all threads' samples on thread 0 (the counters of the other
// threads are 0; benchmark sums counters over threads).
void report_percentiles(benchmark::State& state, const char* prefix,
                        std::array<std::vector<uint64_t>, max_threads>& samples) {
  double p50 = 0, p99 = 0;
  if (state.thread_index() == 0) {
    std::vector<uint64_t> all;
    for (int i = 0; i < state.threads(); ++i)
      all.insert(all.end(), samples[static_cast<size_t>(i)].begin(),
                 samples[static_cast<size_t>(i)].end());
    p50 = percentile(all, 0.50) / 1e3;
    p99 = percentile(all, 0.99) / 1e3;
  }
  state.counters[std::string{prefix} + "_p50_us"] = p50;
  state.counters[std::string{prefix} + "_p99_us"] = p99;
}

// Mean microseconds per sandbox: the sum over threads divided by all iterations.
benchmark::Counter mean_us(uint64_t sum_ns) {
  return benchmark::Counter(static_cast<double>(sum_ns) / 1e3, benchmark::Counter::kAvgIterations);
}

// ---- (a)-(e): dsec sandboxes --------------------------------------------------

// One sandbox per iteration: create, exec exit0, wait, destroy. `chronus`: made
// with container_options::chronus (the socket and the trusted helper);
// `trusted`: exit0 runs as a trusted command.
// A 10-rule egress policy, as a trainer might give one (no packet is sent).
const std::vector<std::string> bench_policy = {
  "1.1.1.0/24:53",      "8.8.8.8:53",         "93.184.216.0/24:80", "151.101.0.0/16:443",
  "140.82.112.0/20:443", "185.199.108.0/22:443", "104.16.0.0/13:443", "13.32.0.0/15:443",
  "10.20.0.0/16:8080",  "192.168.7.0/24"};

void sandbox_loop(benchmark::State& state, bool net, bool chronus, bool trusted,
                  const dsec::cgroup_root* cgroups = nullptr, const dsec::limits& lim = {},
                  bool egress = false, bool prewired = false) {
  auto& e = *env;
  if (egress && !e.egress) {
    state.SkipWithError(("egress: " + e.egress_error).c_str());
    for (auto _ : state) {
    }
    return;
  }
  auto t = static_cast<size_t>(state.thread_index());
  if (t >= e.spawners.size()) {
    state.SkipWithError("more threads than spawners");
    for (auto _ : state) {
    }
    return;
  }
  dsec::spawner& sp = *e.spawners[t];
  dsec::container_options opts;
  opts.net = net;
  opts.chronus = chronus;
  opts.hostname = "perf";
  opts.lim = lim;
  auto cmd = e.cmd;
  cmd.trusted = trusted;
  auto& samples = create_samples[t];
  auto& cycles = cycle_samples[t];
  samples.clear();
  samples.reserve(1 << 16);
  cycles.clear();
  cycles.reserve(1 << 16);
  // Per-step sums, by position in container::timings() (the order is fixed).
  std::vector<const char*> step_names;
  std::vector<uint64_t> step_ns;
  uint64_t create_ns = 0, exec_ns = 0, wait_ns = 0, destroy_ns = 0;
  uint64_t attach_ns = 0, release_ns = 0; // egress: inside create and destroy
  uint64_t missed = 0;                     // prewired: creates that found none ready
  if (prewired) {
    // As dsecd does (--egress-prewire 4): this spawner's zygote makes the
    // namespaces, the network's thread wires them while the loop runs.
    e.egress->prewire(&sp, 4, [&sp] { return sp.make_netns(); });
    auto until = clk::now() + std::chrono::seconds(10);
    while (e.egress->prewire_stats().ready < 4 && clk::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Thread 0 reads the CPU clocks before the start barrier and after the stop
  // barrier, so the window holds every thread's sandboxes and nothing else.
  uint64_t cpu0 = state.thread_index() == 0 ? cpu_ns_all() : 0;
  for (auto _ : state) {
    auto t0 = clk::now();
    std::optional<dsec::egress_network::prewired> pre;
    if (prewired) {
      pre = e.egress->take(&sp);
      missed += pre ? 0 : 1;
    }
    opts.netns = pre ? pre->netns.get() : -1;
    auto c = dsec::container::create(sp, e.lowers, opts, cgroups);
    std::unique_ptr<dsec::egress_link> link;
    if (c && egress && pre) {
      auto ta = clk::now();
      link = std::move(pre->link);
      pre.reset();
      auto a = e.egress->activate(*link, bench_policy, {});
      attach_ns += ns_since(ta, clk::now());
      if (!a) {
        state.SkipWithError(("egress activate: " + a.error_value().to_string()).c_str());
        break;
      }
    } else if (c && egress) {
      auto ta = clk::now();
      auto l = e.egress->attach((*c)->pid(), (*c)->pidfd(), bench_policy, {});
      attach_ns += ns_since(ta, clk::now());
      if (!l) {
        state.SkipWithError(("egress attach: " + l.error_value().to_string()).c_str());
        break;
      }
      link = std::move(*l);
    }
    auto t1 = clk::now();
    if (!c) {
      state.SkipWithError(("create: " + c.error_value().to_string()).c_str());
      break;
    }
    auto id = (*c)->exec(cmd, dsec::stdio{});
    auto t2 = clk::now();
    if (!id) {
      state.SkipWithError(("exec: " + id.error_value().to_string()).c_str());
      break;
    }
    auto status = (*c)->wait(*id);
    auto t3 = clk::now();
    if (!status || status->shell_code() != 0) {
      state.SkipWithError(status ? ("exit0 " + status->to_string()).c_str()
                                 : ("wait: " + status.error_value().to_string()).c_str());
      break;
    }
    auto steps = (*c)->timings();
    if (step_names.empty())
      for (const auto& s : steps) {
        step_names.push_back(s.name);
        step_ns.push_back(0);
      }
    for (size_t i = 0; i < steps.size() && i < step_ns.size(); ++i)
      step_ns[i] += steps[i].ns;
    auto d = (*c)->destroy();
    c->reset(); // ~container: nothing left to do after destroy()
    auto tr = clk::now();
    link.reset(); // its set elements; the veth goes with the netns
    release_ns += ns_since(tr, clk::now());
    auto t4 = clk::now();
    if (!d) {
      state.SkipWithError(("destroy: " + d.error_value().to_string()).c_str());
      break;
    }
    auto cn = ns_since(t0, t1);
    samples.push_back(cn);
    cycles.push_back(ns_since(t0, t4));
    create_ns += cn;
    exec_ns += ns_since(t1, t2);
    wait_ns += ns_since(t2, t3);
    destroy_ns += ns_since(t3, t4);
  }
  uint64_t cpu = state.thread_index() == 0 ? cpu_ns_all() - cpu0 : 0;
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.counters["cpu_us"] = mean_us(cpu);
  state.counters["create_us"] = mean_us(create_ns);
  state.counters["exec_us"] = mean_us(exec_ns);
  state.counters["wait_us"] = mean_us(wait_ns);
  state.counters["destroy_us"] = mean_us(destroy_ns);
  if (egress) {
    state.counters["egress_attach_us"] = mean_us(attach_ns);
    state.counters["egress_release_us"] = mean_us(release_ns);
  }
  if (prewired) {
    state.counters["prewire_missed"] = static_cast<double>(missed);
    e.egress->prewire(&sp, 0, {});
  }
  // Host steps first, then the steps inside the sandbox ("in." prefix: they
  // happen during wait_ready). Steps that take no time in this configuration
  // (make_cgroup without limits, join_cgroup, setup_network without --net) are
  // kept so that every row has the same columns.
  bool inside = false;
  for (size_t i = 0; i < step_names.size(); ++i) {
    std::string name = inside ? std::string{"in."} + step_names[i] : step_names[i];
    state.counters[name + "_us"] = mean_us(step_ns[i]);
    if (std::strcmp(step_names[i], "wait_ready") == 0)
      inside = true;
  }
  report_percentiles(state, "create", create_samples);
  report_percentiles(state, "cycle", cycle_samples);
}

// Arg 0: 0 = no network namespace, 1 = a fresh one per sandbox (--net).
void BM_sandbox(benchmark::State& state) {
  sandbox_loop(state, state.range(0) != 0, false, false);
}

// An egress sandbox (docs/network.md): a fresh network namespace, a veth, a
// routed /31, a default route and a 10-rule policy, all inside create.
void BM_sandbox_egress(benchmark::State& state) {
  sandbox_loop(state, true, false, false, nullptr, {}, true);
}

// The same, the namespace wired ahead (dsecd --egress-prewire 4): the create
// joins it and adds the policy's elements; the network's thread wires the
// next ones meanwhile, on the same two cores.
void BM_sandbox_egress_prewired(benchmark::State& state) {
  sandbox_loop(state, true, false, false, nullptr, {}, true, true);
}

// A Chronus sandbox without --net. Arg 0: 1 = exit0 runs as a trusted command.
void BM_sandbox_chronus(benchmark::State& state) {
  sandbox_loop(state, false, true, state.range(0) != 0);
}

// ---- cgroups: a fresh one per sandbox, or one from a pool ---------------------

// create + destroy of a sandbox's cgroups with the default limits, no process
// in them. Arg 0: 1 = from a pool (dsecd), 0 = a fresh cgroup each time (dsec run).
void BM_cgroup(benchmark::State& state) {
  auto& root = state.range(0) != 0 ? env->cg_pool : env->cg_fresh;
  if (!root) {
    state.SkipWithError(("cgroups: " + env->cg_error).c_str());
    for (auto _ : state) {
    }
    return;
  }
  auto lim = default_shape();
  uint64_t create_ns = 0, destroy_ns = 0;
  auto name = "bench-" + std::to_string(state.thread_index());
  auto before = root->pool_stats();
  for (auto _ : state) {
    auto t0 = clk::now();
    auto cg = root->create(name, lim);
    auto t1 = clk::now();
    if (!cg) {
      state.SkipWithError(("create: " + cg.error_value().to_string()).c_str());
      break;
    }
    cg->close_join_fds();
    auto d = cg->destroy();
    auto t2 = clk::now();
    if (!d) {
      state.SkipWithError(("destroy: " + d.error_value().to_string()).c_str());
      break;
    }
    create_ns += ns_since(t0, t1);
    destroy_ns += ns_since(t1, t2);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.counters["create_us"] = mean_us(create_ns);
  state.counters["destroy_us"] = mean_us(destroy_ns);
  if (state.thread_index() == 0) {
    auto st = root->pool_stats();
    state.counters["pool_misses"] = static_cast<double>(st.made - before.made);
    state.counters["pool_discarded"] = static_cast<double>(st.discarded - before.discarded);
  }
}

// BM_sandbox/net:0 with the default limits (every dsec sandbox has them now).
// Arg 0: 1 = cgroups from a pool (dsecd), 0 = a fresh cgroup per sandbox.
void BM_sandbox_limits(benchmark::State& state) {
  auto& root = state.range(0) != 0 ? env->cg_pool : env->cg_fresh;
  if (!root) {
    state.SkipWithError(("cgroups: " + env->cg_error).c_str());
    for (auto _ : state) {
    }
    return;
  }
  auto before = root->pool_stats();
  sandbox_loop(state, false, false, false, &*root, default_shape());
  if (state.thread_index() == 0) {
    auto st = root->pool_stats();
    state.counters["pool_misses"] = static_cast<double>(st.made - before.made);
    state.counters["pool_discarded"] = static_cast<double>(st.discarded - before.discarded);
  }
}

// ---- (f), (g): processes forked from here --------------------------------------

// vfork + execve + waitpid; returns the wait status or -1.
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

std::array<std::vector<uint64_t>, max_threads> proc_samples;

void run_loop(benchmark::State& state, const std::vector<const char*>& argv_in) {
  std::vector<const char*> argv = argv_in;
  argv.push_back(nullptr);
  auto t = static_cast<size_t>(state.thread_index());
  auto& samples = proc_samples[t];
  samples.clear();
  samples.reserve(1 << 16);
  uint64_t cpu0 = state.thread_index() == 0 ? cpu_ns_all() : 0;
  for (auto _ : state) {
    auto t0 = clk::now();
    int st = run_child(argv.data());
    samples.push_back(ns_since(t0, clk::now()));
    if (st != 0) {
      state.SkipWithError((std::string{argv[0]} + " failed, wait status "
                           + std::to_string(st)).c_str());
      break;
    }
  }
  uint64_t cpu = state.thread_index() == 0 ? cpu_ns_all() - cpu0 : 0;
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.counters["cpu_us"] = mean_us(cpu);
  report_percentiles(state, "run", proc_samples);
}

// The ceiling: no isolation at all.
void BM_vfork_exec(benchmark::State& state) {
  run_loop(state, {env->exit0.c_str()});
}

// The peer, on the rootfs the base layer was built from. Arg 1: --share-net
// (no network namespace, like a dsec sandbox without --net).
void BM_bwrap(benchmark::State& state) {
  if (env->bwrap.empty()) {
    state.SkipWithError("bwrap is not installed (apt-get install bubblewrap)");
    for (auto _ : state) {
    }
    return;
  }
  std::vector<const char*> argv = {env->bwrap.c_str(), "--unshare-all"};
  if (state.range(0) != 0)
    argv.push_back("--share-net");
  for (const char* a : {"--ro-bind", env->rootfs.c_str(), "/", "--dev", "/dev", "--proc",
                        "/proc", "/bin/exit0"})
    argv.push_back(a);
  run_loop(state, argv);
}

// Registered by main() (see there for the options that shape them).
void register_benchmarks(int64_t iterations) {
  auto fix = [&](benchmark::internal::Benchmark* b) {
    b->Threads(1)->Threads(2)->UseRealTime();
    if (iterations > 0)
      b->Iterations(iterations);
  };
  fix(benchmark::RegisterBenchmark("BM_sandbox", BM_sandbox)->ArgName("net")->Arg(0)->Arg(1));
  fix(benchmark::RegisterBenchmark("BM_sandbox_egress", BM_sandbox_egress));
  fix(benchmark::RegisterBenchmark("BM_sandbox_egress_prewired", BM_sandbox_egress_prewired));
  fix(benchmark::RegisterBenchmark("BM_sandbox_chronus", BM_sandbox_chronus)
        ->ArgName("trusted")->Arg(0)->Arg(1));
  fix(benchmark::RegisterBenchmark("BM_sandbox_limits", BM_sandbox_limits)
        ->ArgName("pool")->Arg(0)->Arg(1));
  fix(benchmark::RegisterBenchmark("BM_cgroup", BM_cgroup)->ArgName("pool")->Arg(0)->Arg(1));
  fix(benchmark::RegisterBenchmark("BM_vfork_exec", BM_vfork_exec));
  fix(benchmark::RegisterBenchmark("BM_bwrap", BM_bwrap)->ArgName("share_net")->Arg(0)->Arg(1));
}

} // namespace

constexpr const char* usage_extra = R"(
runtime_bench options besides benchmark's own (--benchmark_filter=REGEX, ...):
  --dsec_iterations=N   run every benchmark exactly N iterations per thread
                        (for profilers: perf record, valgrind --tool=callgrind)
Defaults: --benchmark_min_time=2 (enough samples for a p99; pass your own to
change it). Needs root. See perf/README.md for what each counter means.
)";

int main(int argc, char** argv) {
  // Our own flag, and a longer default min time (benchmark's 0.5 s gives too few
  // samples for a p99), before benchmark parses the rest.
  int64_t iterations = 0;
  bool min_time_given = false, help = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    std::string_view a{argv[i]};
    if (a.rfind("--dsec_iterations=", 0) == 0) {
      iterations = std::atoll(argv[i] + std::strlen("--dsec_iterations="));
      if (iterations <= 0) {
        std::fprintf(stderr, "runtime_bench: --dsec_iterations needs a positive number\n");
        return 1;
      }
      continue;
    }
    if (a.rfind("--benchmark_min_time", 0) == 0)
      min_time_given = true;
    if (a == "--help" || a == "-h")
      help = true;
    args.push_back(argv[i]);
  }
  static char default_min_time[] = "--benchmark_min_time=2";
  if (!min_time_given && iterations == 0)
    args.insert(args.begin() + 1, default_min_time);
  int nargs = static_cast<int>(args.size());
  args.push_back(nullptr);
  if (help)
    std::fputs(usage_extra, stdout);
  benchmark::Initialize(&nargs, args.data());
  if (benchmark::ReportUnrecognizedArguments(nargs, args.data()))
    return 1;
  register_benchmarks(iterations);
  if (::geteuid() != 0) {
    std::fprintf(stderr, "runtime_bench: needs root (mounts, namespaces)\n");
    return 1;
  }
  bench_env e;
  env = &e;
  auto err = set_up(e);
  int rc = 0;
  if (!err.empty()) {
    std::fprintf(stderr, "runtime_bench: setup failed: %s\n", err.c_str());
    rc = 1;
  } else {
    benchmark::AddCustomContext("dsec.rootfs", e.rootfs);
    benchmark::AddCustomContext("dsec.bwrap", e.bwrap.empty() ? "(none)" : e.bwrap);
    benchmark::RunSpecifiedBenchmarks();
  }
  tear_down(e);
  env = nullptr;
  benchmark::Shutdown();
  return rc;
}
