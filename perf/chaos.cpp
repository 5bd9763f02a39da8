// dsec-chaos: a trainer's load against a cluster of tools/cluster while the
// faults of a plan are injected, checking the invariants of issue 19 at every
// step and at the end (docs/cluster.md, "Chaos"). perf/chaos.sh brings the
// cluster up, runs this inside its fabric's network namespace, brings it down
// and checks that nothing is left on the machine.
//
// The load: W worker threads, each a loop of create (one sandbox, in one of S
// sessions of quota Q), a command whose output names the sandbox, and a
// destroy; some sandboxes are kept live instead (at most K) and checked every
// few seconds, so that sandboxes live through the faults. Blocking calls, one
// thread each: the client promises that none hangs, and a monitor thread
// holds it to that (a call in flight past --deadline is a violation).
//
// The invariants:
//   - every call is answered (a result, or an error naming why) within
//     --deadline;
//   - every sandbox the trainer was given ends exactly one way: destroyed by
//     the trainer (then never listed again), reported lost (an event or a
//     call's errc::lost; then never listed after the cluster settled), or
//     still alive and reachable at the end (its command answers);
//   - no id is given twice, no two live sandboxes share one; a command's
//     output is its own sandbox's;
//   - no session holds more live sandboxes than its quota, across restarts.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/client.hpp"
#include "runtime/chronus.hpp"

extern char** environ;

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

const char* usage =
  R"(usage: dsec-chaos --cluster DIR --plan FILE --base NAME@VER [OPTIONS]

Runs a trainer's load against the cluster of `tools/cluster up ... --dir DIR`
(run it where the coordinator is reachable: with --netns, in the fabric's
namespace) while it injects the faults of FILE, checks the invariants at every
step and at the end, prints a table and exits 1 on any violation (0 without).
perf/chaos.sh does all of it, the cluster included.

Options:
  --cluster DIR       the cluster's dir (its coordinator/addr, certs, pids)
  --plan FILE         the faults, one per line: AT ACTION [NAME [ARG]]; AT is
                      seconds from the start (`30`, `30s`, `2m`); `#` starts a
                      comment. Actions (NAME: coordinator or node-N):
                        kill NAME       SIGKILL its dsecd (by the pid file)
                        restart NAME    tools/cluster restart NAME
                        stop NAME       SIGSTOP (a hang) ... cont NAME SIGCONT
                        partition NAME  ... heal NAME (tools/cluster, --netns)
                        slow NAME RATE  ... fast NAME (tc tbf on its link)
                        fill NAME       ... free NAME (its state disk full)
                        layer           a new version of the base, built on the
                                        coordinator; creates use it from then on
                                        (every node fetches it)
                        end             the load stops (required, last)
                      Each runs when its time comes or, if the one before took
                      longer, right after it.
  --base NAME@VER     the base layer of the load's sandboxes (with /bin/busybox)
  --layer-src DIR     what `layer` builds the new versions from
  --script PATH       tools/cluster (default: $DSEC_CLUSTER_SCRIPT)
  --dsec PATH         the dsec binary `layer` runs (default: $DSEC, else dsec)
  --workers W         threads doing create, exec, destroy (default 6)
  --sessions S        sessions they spread over (default 2)
  --quota Q           each session's quota (default 8)
  --keep K            sandboxes kept live through the faults (default 8)
  --deadline SECONDS  the most any call may take (default 60)
  --settle SECONDS    after `end`, how long the cluster has to be whole again
                      (every daemon of DIR up) before the final check
                      (default 90)
  --seed N            the seed of the load's choices (default 1)
  --json FILE         also write the figures as JSON

The table: per fault, how long its action took and `create ok`, the time from
its start to the first successful create sent after the action was done; then
what the load did, how each sandbox ended, the errors by kind (with the first
and last time seen), the longest stretch without a successful create, and the
invariant violations.
)";

struct options {
  std::string dir, plan, base, layer_src, script, dsec, json;
  uint32_t workers = 6, sessions = 2, quota = 8, keep = 8;
  std::chrono::seconds deadline{60}, settle{90};
  uint64_t seed = 1;
};

struct step {
  double at = 0; // seconds from the start
  std::string action, name, arg;
  int line = 0;
};

double now_s(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  auto s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
    s.pop_back();
  return s;
}

// A child process with its stdout and stderr captured: {exit status, output}.
std::pair<int, std::string> run(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return {-1, std::string{"pipe: "} + std::strerror(errno)};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return {-1, argv[0] + ": " + std::strerror(rc)};
  }
  std::string out;
  char buf[4096];
  for (;;) {
    auto n = ::read(fds[0], buf, sizeof buf);
    if (n > 0)
      out.append(buf, static_cast<size_t>(n));
    else if (n == 0 || errno != EINTR)
      break;
  }
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

std::string one_line(std::string s) {
  while (!s.empty() && s.back() == '\n')
    s.pop_back();
  for (auto& c : s)
    if (c == '\n')
      c = ' ';
  if (s.size() > 300)
    s = s.substr(0, 300) + "...";
  return s;
}

// ---- what the trainer knows of each sandbox -----------------------------------

enum class fate { live, destroyed, lost, destroy_unknown };

struct box {
  std::string session;
  fate f = fate::live;
  bool kept = false;
  bool retry = false;             // its destroy met `disconnected`: the keeper retries it
  clock_type::time_point ended{}; // when destroy answered, or lost was heard
  std::string why;                // lost: how the trainer heard it
};

struct fault_row {
  step s;
  double started = 0, took = 0;
  std::string result;      // the action's own output (one line) or failure
  double recovered = -1;   // seconds from its start to the next create that succeeded
};

class chaos {
public:
  chaos(options o, std::vector<step> plan) : o_(std::move(o)), plan_(std::move(plan)) {}

  int run_all(dsec::client& c);

private:
  // ---- calls in flight, for the deadline -------------------------------------
  struct call_guard {
    chaos* self;
    uint64_t id;
    ~call_guard() {
      std::lock_guard lk{self->mu_};
      self->inflight_.erase(id);
    }
  };
  call_guard track(std::string what) {
    std::lock_guard lk{mu_};
    auto id = ++next_call_;
    inflight_.emplace(id, std::pair{std::move(what), clock_type::now()});
    return {this, id};
  }

  void violation(std::string what) {
    std::lock_guard lk{mu_};
    std::printf("  VIOLATION at %.1f s: %s\n", now_s(t0_), what.c_str());
    std::fflush(stdout);
    violations_.push_back(std::move(what));
  }

  void count_error(const std::string& verb, const dsec::error& e) {
    std::lock_guard lk{mu_};
    auto k = verb + " " + dsec::to_string(e.code);
    if (e.code == dsec::errc::overloaded && e.message.find("quota") != std::string::npos)
      k += " (quota)";
    note_error(k, e);
  }
  // Under mu_.
  void note_error(const std::string& k, const dsec::error& e) {
    auto t = now_s(t0_);
    if (errors_[k]++ == 0) {
      examples_[k] = one_line(e.message);
      first_[k] = t;
    }
    last_[k] = t;
  }

  void mark_lost(const std::string& id, std::string why) {
    std::lock_guard lk{mu_};
    auto i = boxes_.find(id);
    if (i == boxes_.end() || i->second.f == fate::lost)
      return;
    if (i->second.f == fate::destroyed)
      return; // destroyed first: a late event about it
    i->second.f = fate::lost;
    i->second.ended = clock_type::now();
    i->second.why = std::move(why);
  }

  std::string base() {
    std::lock_guard lk{mu_};
    return base_;
  }

  void worker(uint32_t index);
  void keeper();
  void retry_destroys();
  void destroy_box(dsec::session& s, const std::string& id, bool count);
  void watcher(dsec::client& c, uint32_t s);
  void monitor();
  void checkpoint(dsec::client& c, bool final);
  void inject(fault_row& row);
  bool exec_check(dsec::session& s, const std::string& id, const char* verb);
  bool settle(dsec::client& c);
  void final_check(dsec::client& c);
  void print_table();

  options o_;
  std::vector<step> plan_;
  std::vector<std::unique_ptr<dsec::session>> sessions_;
  clock_type::time_point t0_ = clock_type::now();
  std::atomic<bool> stop_{false}, done_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::pair<std::string, clock_type::time_point>> inflight_;
  std::set<uint64_t> flagged_;
  uint64_t next_call_ = 0;
  std::map<std::string, box> boxes_;
  std::vector<std::string> violations_;
  std::map<std::string, uint64_t> errors_;
  std::map<std::string, std::string> examples_;
  std::map<std::string, double> first_, last_; // when each kind was seen first and last
  std::vector<double> create_ok_at_; // seconds from the start, in order
  std::vector<double> create_ok_from_; // when each of those creates was sent
  uint64_t creates_ok_ = 0, creates_failed_ = 0, execs_ok_ = 0, destroys_ok_ = 0;
  uint64_t quota_refusals_ = 0, checks_ = 0, unknown_ = 0, alive_ = 0, late_lost_ = 0;
  uint64_t closed_ = 0;
  std::string base_;
  int layer_versions_ = 0;
  std::vector<fault_row> faults_;
};

bool chaos::exec_check(dsec::session& s, const std::string& id, const char* verb) {
  dsec::exec_request req;
  req.argv = {"/bin/busybox", "echo", id};
  req.timeout_ms = 20'000;
  auto g = track(std::string{verb} + " on " + id);
  auto r = s.exec(id, req);
  if (!r) {
    count_error(verb, r.error_value());
    if (r.error_value().code == dsec::errc::lost)
      mark_lost(id, "exec: " + one_line(r.error_value().message));
    return false;
  }
  if (r->exit_code != 0 || r->out != id + "\n") {
    violation("sandbox " + id + " answered `echo " + id + "` with exit " +
              std::to_string(r->exit_code) + " and \"" + one_line(r->out + r->err) + "\"");
    return false;
  }
  std::lock_guard lk{mu_};
  ++execs_ok_;
  return true;
}

void chaos::worker(uint32_t index) {
  std::mt19937_64 rng{o_.seed * 7919 + index};
  auto& s = *sessions_[index % sessions_.size()];
  while (!stop_) {
    dsec::environment env;
    env.base = base();
    env.ttl_ms = 600'000;
    std::optional<dsec::error> failed;
    std::vector<std::string> ids;
    const double sent = now_s(t0_);
    {
      auto g = track("create in " + s.id());
      auto r = s.create(env, 1, {}, [&](const dsec::error& e) { failed = e; });
      if (r)
        ids = std::move(*r);
      else
        failed = r.error_value();
    }
    if (ids.empty()) {
      auto e = failed.value_or(dsec::make_error(dsec::errc::system_error, "no id, no error"));
      count_error("create", e);
      std::unique_lock lk{mu_};
      ++creates_failed_;
      if (e.code == dsec::errc::overloaded && e.message.find("quota") != std::string::npos)
        ++quota_refusals_;
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 200));
      continue;
    }
    const auto id = ids.front();
    {
      std::lock_guard lk{mu_};
      ++creates_ok_;
      create_ok_at_.push_back(now_s(t0_));
      create_ok_from_.push_back(sent);
      box b;
      b.session = s.id();
      if (!boxes_.emplace(id, std::move(b)).second)
        violations_.push_back("id " + id + " was given by two creates");
    }
    bool ok = exec_check(s, id, "exec");
    {
      std::lock_guard lk{mu_};
      size_t kept = 0;
      for (auto& [k, b] : boxes_)
        kept += b.kept && b.f == fate::live;
      if (ok && kept < o_.keep && rng() % 3 == 0) {
        boxes_[id].kept = true;
        continue;
      }
    }
    destroy_box(s, id, true);
  }
}

// The trainer destroys sandbox `id`, and the box's fate follows the answer:
// destroyed, lost, or not known (the final check finds out; after
// `disconnected` the keeper tries again, as a trainer would). `count`: the
// error goes into the table's errors by kind.
void chaos::destroy_box(dsec::session& s, const std::string& id, bool count) {
  auto g = track("destroy of " + id);
  auto r = s.destroy(id);
  std::lock_guard lk{mu_};
  auto& b = boxes_[id];
  b.retry = false;
  if (r) {
    ++destroys_ok_;
    if (b.f == fate::lost)
      late_lost_++; // destroyed fine after a lost report: counted, see final_check
    b.f = fate::destroyed;
    b.ended = clock_type::now();
    return;
  }
  auto e = r.error_value();
  if (count)
    note_error(std::string{"destroy "} + dsec::to_string(e.code), e);
  if (e.code == dsec::errc::lost) {
    if (b.f != fate::lost) {
      b.f = fate::lost;
      b.ended = clock_type::now();
      b.why = "destroy: " + one_line(e.message);
    }
  } else if (b.f == fate::live || b.f == fate::destroy_unknown) {
    b.f = fate::destroy_unknown;
    b.retry = e.code == dsec::errc::disconnected;
  }
}

void chaos::keeper() {
  std::mt19937_64 rng{o_.seed * 31 + 5};
  while (!stop_) {
    {
      std::unique_lock lk{mu_};
      cv_.wait_for(lk, 3s, [&] { return stop_.load(); });
    }
    if (stop_)
      break;
    std::vector<std::pair<std::string, std::string>> kept; // id, session
    {
      std::lock_guard lk{mu_};
      for (auto& [id, b] : boxes_)
        if (b.kept && b.f == fate::live)
          kept.emplace_back(id, b.session);
    }
    for (auto& [id, sid] : kept) {
      if (stop_)
        break;
      for (auto& s : sessions_)
        if (s->id() == sid)
          exec_check(*s, id, "check");
    }
    // Now and then one of them goes, so that new ones are kept.
    if (!kept.empty() && rng() % 4 == 0) {
      auto& [id, sid] = kept[rng() % kept.size()];
      for (auto& s : sessions_)
        if (s->id() == sid)
          destroy_box(*s, id, false);
    }
    retry_destroys();
  }
}

// Destroys that met `disconnected` (the coordinator went) are tried again, as
// a trainer would: done, lost, or (not_found, closed) left to the final check.
void chaos::retry_destroys() {
  std::vector<std::pair<std::string, std::string>> again; // id, session
  {
    std::lock_guard lk{mu_};
    for (auto& [id, b] : boxes_)
      if (b.f == fate::destroy_unknown && b.retry)
        again.emplace_back(id, b.session);
  }
  for (auto& [id, sid] : again)
    for (auto& s : sessions_)
      if (s->id() == sid && !stop_)
        destroy_box(*s, id, false);
}

// A session's `lost` events; a watch that ends (the coordinator went) is made
// again once the client is connected again.
void chaos::watcher(dsec::client& c, uint32_t si) {
  auto& s = *sessions_[si];
  while (!done_) {
    auto ended = std::make_shared<std::atomic<bool>>(false);
    auto w = s.watch(
      [this](const dsec::chronus_event& ev) {
        if (ev.kind == dsec::chronus_kind::lost)
          mark_lost(ev.sandbox_id, "event: " + one_line(ev.text));
      },
      [ended](const dsec::error&) { *ended = true; });
    if (!w) {
      std::this_thread::sleep_for(500ms);
      continue;
    }
    while (!done_ && !*ended)
      std::this_thread::sleep_for(100ms);
    w->reset();
    if (!done_)
      c.wait_connected(5s);
  }
}

void chaos::monitor() {
  while (!done_) {
    std::this_thread::sleep_for(500ms);
    std::vector<std::string> late;
    {
      std::lock_guard lk{mu_};
      auto now = clock_type::now();
      for (auto& [id, call] : inflight_)
        if (now - call.second > o_.deadline && flagged_.insert(id).second)
          late.push_back(call.first + " unanswered after " +
                         std::to_string(o_.deadline.count()) + " s (started at " +
                         std::to_string(static_cast<int>(
                           std::chrono::duration<double>(call.second - t0_).count())) +
                         " s)");
    }
    for (auto& l : late)
      violation(l);
  }
}

// Every sandbox the cluster lists for our sessions: no id twice, no session
// over its quota, none the trainer destroyed (before the list was asked for).
void chaos::checkpoint(dsec::client& c, bool final) {
  auto asked = clock_type::now();
  auto g = track("list");
  auto r = c.list_all();
  if (!r) {
    count_error("list", r.error_value());
    return;
  }
  std::map<std::string, uint32_t> per_session, seen;
  std::set<std::string> ours;
  for (auto& s : sessions_)
    ours.insert(s->id());
  for (auto& x : r->sandboxes) {
    if (!ours.contains(x.session))
      continue;
    ++per_session[x.session];
    ++seen[x.id];
  }
  std::lock_guard lk{mu_};
  ++checks_;
  for (auto& [id, n] : seen) {
    if (n > 1)
      violations_.push_back("sandbox id " + id + " is listed " + std::to_string(n) + " times");
    auto b = boxes_.find(id);
    if (b != boxes_.end() && b->second.f == fate::destroyed && b->second.ended < asked)
      violations_.push_back("sandbox " + id + " is listed after its destroy succeeded");
    if (final && b != boxes_.end() && b->second.f == fate::lost && b->second.ended < asked &&
        r->missing.empty())
      violations_.push_back("sandbox " + id + " was reported lost (" + b->second.why +
                            ") and is alive at the end");
  }
  for (auto& [sid, n] : per_session)
    if (n > o_.quota)
      violations_.push_back("session " + sid + " holds " + std::to_string(n) +
                            " live sandboxes, over its quota of " + std::to_string(o_.quota));
}

void chaos::inject(fault_row& row) {
  auto& s = row.s;
  auto d = o_.dir + "/" + s.name;
  row.started = now_s(t0_);
  std::printf("[%6.1f s] %s %s %s\n", row.started, s.action.c_str(), s.name.c_str(),
              s.arg.c_str());
  std::fflush(stdout);
  auto signal = [&](int sig) {
    // Only the dsecd tools/cluster started: its pid file, and its command line
    // naming its own state dir.
    auto pid = slurp(d + "/pid");
    auto cmdline = slurp("/proc/" + pid + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (pid.empty() || cmdline.find("--state " + d + "/state") == std::string::npos) {
      row.result = "no running dsecd of " + s.name + " (pid file: '" + pid + "')";
      return false;
    }
    if (::kill(std::stoi(pid), sig) != 0) {
      row.result = std::string{"kill: "} + std::strerror(errno);
      return false;
    }
    row.result = "pid " + pid;
    return true;
  };
  bool ok = true;
  if (s.action == "kill")
    ok = signal(SIGKILL);
  else if (s.action == "stop")
    ok = signal(SIGSTOP);
  else if (s.action == "cont")
    ok = signal(SIGCONT);
  else if (s.action == "layer") {
    auto at = base_.find('@');
    auto name = base_.substr(0, at);
    auto ref = name + "@chaos" + std::to_string(++layer_versions_);
    auto [st, out] = run({o_.dsec, "--state", o_.dir + "/coordinator/state", "layer", "build",
                          "--kind", "base", ref, o_.layer_src});
    ok = st == 0;
    row.result = ok ? ref : one_line(out);
    if (ok) {
      std::lock_guard lk{mu_};
      base_ = ref;
    }
  } else {
    std::vector<std::string> argv{o_.script, s.action};
    if (!s.name.empty())
      argv.push_back(s.name);
    if (!s.arg.empty())
      argv.push_back(s.arg);
    argv.insert(argv.end(), {"--dir", o_.dir});
    auto [st, out] = run(argv);
    ok = st == 0;
    row.result = one_line(out);
  }
  row.took = now_s(t0_) - row.started;
  if (!ok)
    violation(s.action + " " + s.name + " (plan line " + std::to_string(s.line) +
              ") failed: " + row.result);
}

// Until every daemon of the cluster's dir is up in the coordinator's view.
bool chaos::settle(dsec::client& c) {
  std::set<std::string> want;
  for (int i = 1;; ++i) {
    auto a = slurp(o_.dir + "/node-" + std::to_string(i) + "/addr");
    if (a.empty())
      break;
    want.insert(a);
  }
  want.insert(slurp(o_.dir + "/coordinator/addr"));
  auto until = clock_type::now() + o_.settle;
  while (clock_type::now() < until) {
    c.wait_connected(5s);
    auto g = track("cluster status");
    auto r = c.cluster();
    if (r) {
      size_t up = 0;
      for (auto& m : *r)
        up += m.state == "up" && want.contains(m.name);
      if (up == want.size())
        return true;
    }
    std::this_thread::sleep_for(1s);
  }
  return false;
}

void chaos::final_check(dsec::client& c) {
  // A hung node that was declared lost destroys its sandboxes once it runs
  // again: wait for every daemon, then give the lost ones time to go.
  if (!settle(c))
    violation("the cluster was not whole " + std::to_string(o_.settle.count()) +
              " s after the end: some daemon is not up");
  std::this_thread::sleep_for(3s);
  std::optional<dsec::sandbox_list> last;
  for (int i = 0; i < 10 && !last; ++i) {
    auto g = track("list");
    auto r = c.list_all();
    if (r && r->missing.empty())
      last = std::move(*r);
    else
      std::this_thread::sleep_for(2s);
  }
  if (!last) {
    violation("no complete list of the cluster's sandboxes after the end");
    return;
  }
  checkpoint(c, true);
  std::set<std::string> listed;
  std::set<std::string> ours;
  for (auto& s : sessions_)
    ours.insert(s->id());
  for (auto& x : last->sandboxes)
    if (ours.contains(x.session))
      listed.insert(x.id);
  std::vector<std::pair<std::string, box>> snapshot;
  {
    std::lock_guard lk{mu_};
    for (auto& [id, b] : boxes_)
      snapshot.emplace_back(id, b);
    for (auto& id : listed)
      if (!boxes_.contains(id))
        ++unknown_; // its create's answer never reached the trainer
  }
  for (auto& [id, b] : snapshot) {
    dsec::session* s = nullptr;
    for (auto& x : sessions_)
      if (x->id() == b.session)
        s = x.get();
    if (b.f == fate::live || b.f == fate::destroy_unknown) {
      if (listed.contains(id)) {
        if (exec_check(*s, id, "final check")) {
          std::lock_guard lk{mu_};
          ++alive_;
        } else {
          std::lock_guard lk{mu_};
          if (boxes_[id].f != fate::lost)
            violations_.push_back("sandbox " + id + " is listed but its command fails");
        }
      } else if (b.f == fate::live) {
        // Not listed: only a lost report explains it.
        dsec::exec_request req;
        req.argv = {"/bin/busybox", "true"};
        auto g = track("final exec on " + id);
        auto r = s->exec(id, req);
        if (!r && r.error_value().code == dsec::errc::lost) {
          mark_lost(id, "final exec: " + one_line(r.error_value().message));
        } else {
          violation("sandbox " + id + " vanished: never destroyed by the trainer, never "
                    "reported lost, not listed (its command: " +
                    (r ? std::string{"ran"} : one_line(r.error_value().to_string())) + ")");
        }
      }
    }
  }
}

void chaos::print_table() {
  std::lock_guard lk{mu_};
  uint64_t destroyed = 0, lost = 0, unknown_destroy = 0;
  std::map<std::string, uint64_t> lost_how;
  for (auto& [id, b] : boxes_) {
    destroyed += b.f == fate::destroyed;
    unknown_destroy += b.f == fate::destroy_unknown;
    if (b.f == fate::lost) {
      ++lost;
      ++lost_how[b.why.substr(0, b.why.find(':'))];
    }
  }
  // The longest stretch without a successful create, while the load ran.
  double gap = 0, gap_from = 0, last = 0;
  for (auto t : create_ok_at_) {
    if (t - last > gap) {
      gap = t - last;
      gap_from = last;
    }
    last = t;
  }
  std::printf("\ndsec-chaos: %zu faults, %u workers over %zu sessions (quota %u), seed %llu\n",
              faults_.size(), o_.workers, sessions_.size(), o_.quota,
              static_cast<unsigned long long>(o_.seed));
  std::printf("  %-8s %-26s %8s %12s  %s\n", "at", "fault", "took", "create ok", "result");
  for (auto& f : faults_) {
    auto what = f.s.action + (f.s.name.empty() ? "" : " " + f.s.name) +
                (f.s.arg.empty() ? "" : " " + f.s.arg);
    char rec[32] = "never";
    if (f.recovered >= 0)
      std::snprintf(rec, sizeof rec, "+%.1f s", f.recovered);
    std::printf("  %6.1f s %-26s %6.1f s %12s  %s\n", f.started, what.c_str(), f.took, rec,
                f.result.substr(0, 70).c_str());
  }
  std::printf("creates: %llu ok, %llu failed (%llu over a quota); commands: %llu ok; "
              "destroys: %llu ok; checkpoints: %llu\n",
              (unsigned long long) creates_ok_, (unsigned long long) creates_failed_,
              (unsigned long long) quota_refusals_, (unsigned long long) execs_ok_,
              (unsigned long long) destroys_ok_, (unsigned long long) checks_);
  std::printf("sandboxes: %zu given to the trainer: %llu destroyed by it, %llu reported lost",
              boxes_.size(), (unsigned long long) (destroyed + unknown_destroy),
              (unsigned long long) lost);
  if (!lost_how.empty()) {
    std::printf(" (");
    bool first = true;
    for (auto& [how, n] : lost_how) {
      std::printf("%s%s %llu", first ? "" : ", ", how.c_str(), (unsigned long long) n);
      first = false;
    }
    std::printf(")");
  }
  std::printf(", %llu alive at the end; %llu listed that no create answer named\n",
              (unsigned long long) alive_, (unsigned long long) unknown_);
  std::printf("errors by kind:%s\n", errors_.empty() ? " none" : "");
  for (auto& [k, n] : errors_)
    std::printf("  %-24s %6llu  %5.1f-%5.1f s  e.g. %s\n", k.c_str(), (unsigned long long) n,
                first_[k], last_[k], examples_[k].substr(0, 100).c_str());
  std::printf("max unavailability: %.1f s without a successful create (from %.1f s)\n", gap,
              gap_from);
  std::printf("invariant violations: %zu\n", violations_.size());
  for (auto& v : violations_)
    std::printf("  %s\n", v.c_str());
  if (!o_.json.empty()) {
    std::ofstream j(o_.json);
    j << "{\"faults\":" << faults_.size() << ",\"creates_ok\":" << creates_ok_
      << ",\"creates_failed\":" << creates_failed_ << ",\"quota_refusals\":" << quota_refusals_
      << ",\"execs_ok\":" << execs_ok_ << ",\"destroys_ok\":" << destroys_ok_
      << ",\"sandboxes\":" << boxes_.size() << ",\"lost\":" << lost << ",\"alive\":" << alive_
      << ",\"unknown\":" << unknown_ << ",\"max_unavailable_s\":" << gap
      << ",\"violations\":" << violations_.size() << ",\"errors\":{";
    bool first = true;
    for (auto& [k, n] : errors_) {
      j << (first ? "" : ",") << '"' << k << "\":" << n;
      first = false;
    }
    j << "}}\n";
  }
}

int chaos::run_all(dsec::client& c) {
  base_ = o_.base;
  for (uint32_t i = 0; i < o_.sessions; ++i) {
    dsec::session_options so;
    so.quota = o_.quota;
    so.name = "chaos-" + std::to_string(i);
    auto s = c.open_session(so);
    if (!s) {
      std::fprintf(stderr, "dsec-chaos: opening a session: %s\n",
                   s.error_value().to_string().c_str());
      return 1;
    }
    sessions_.push_back(std::move(*s));
  }
  t0_ = clock_type::now();
  std::vector<std::thread> threads;
  threads.emplace_back([this] { monitor(); });
  for (uint32_t i = 0; i < o_.sessions; ++i)
    threads.emplace_back([this, &c, i] { watcher(c, i); });
  std::vector<std::thread> load;
  for (uint32_t i = 0; i < o_.workers; ++i)
    load.emplace_back([this, i] { worker(i); });
  load.emplace_back([this] { keeper(); });
  std::thread checker([this, &c] {
    while (!stop_) {
      std::unique_lock lk{mu_};
      if (cv_.wait_for(lk, 10s, [&] { return stop_.load(); }))
        break;
      lk.unlock();
      checkpoint(c, false);
    }
  });

  for (auto& s : plan_) {
    auto wait = s.at - now_s(t0_);
    if (wait > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    if (s.action == "end")
      break;
    fault_row row;
    row.s = s;
    faults_.push_back(std::move(row));
    inject(faults_.back());
  }
  std::printf("[%6.1f s] end: the load stops\n", now_s(t0_));
  std::fflush(stdout);
  {
    std::lock_guard lk{mu_};
    stop_ = true;
  }
  cv_.notify_all();
  // A worker stuck in a call past the deadline is a violation the monitor
  // reports; it is not waited for.
  auto until = clock_type::now() + o_.deadline + 5s;
  bool stuck = true;
  while (stuck && clock_type::now() < until) {
    {
      std::lock_guard lk{mu_};
      stuck = !inflight_.empty();
    }
    if (stuck)
      std::this_thread::sleep_for(100ms);
  }
  for (auto& t : load)
    stuck ? t.detach() : t.join();
  checker.join();
  // Recovery: for each fault, the first successful create sent once its
  // action was done (one in flight across a kill may still be answered).
  {
    std::lock_guard lk{mu_};
    for (auto& f : faults_)
      for (size_t i = 0; i < create_ok_at_.size(); ++i)
        if (create_ok_from_[i] >= f.started + f.took) {
          f.recovered = create_ok_at_[i] - f.started;
          break;
        }
  }
  final_check(c);
  for (auto& s : sessions_) {
    auto g = track("close of " + s->id());
    auto r = s->close();
    if (r)
      closed_ += *r;
    else
      count_error("close", r.error_value());
  }
  done_ = true;
  for (auto& t : threads)
    t.join();
  print_table();
  if (stuck) { // a thread is still in a call: it cannot be joined
    std::fflush(stdout);
    std::_Exit(1);
  }
  return violations_.empty() ? 0 : 1;
}

std::optional<std::vector<step>> parse_plan(const std::string& path, const std::string& dir,
                                            std::string& err) {
  std::ifstream f(path);
  if (!f) {
    err = "--plan " + path + ": cannot be read";
    return std::nullopt;
  }
  static const std::set<std::string> named{"kill",  "restart", "stop", "cont",  "partition",
                                           "heal",  "slow",    "fast", "fill",  "free"};
  std::vector<step> plan;
  std::string line;
  int n = 0;
  double last = 0;
  while (std::getline(f, line)) {
    ++n;
    if (auto h = line.find('#'); h != std::string::npos)
      line.resize(h);
    std::istringstream ls(line);
    std::string at;
    step s;
    s.line = n;
    if (!(ls >> at))
      continue;
    ls >> s.action >> s.name >> s.arg;
    std::string extra;
    auto where = path + ":" + std::to_string(n) + ": ";
    if (ls >> extra) {
      err = where + "unexpected '" + extra + "'";
      return std::nullopt;
    }
    double mult = 1;
    if (at.ends_with("m")) {
      mult = 60;
      at.pop_back();
    } else if (at.ends_with("s")) {
      at.pop_back();
    }
    char* e = nullptr;
    s.at = std::strtod(at.c_str(), &e) * mult;
    if (at.empty() || *e != '\0' || s.at < 0) {
      err = where + "expected a time (30, 30s, 2m), got '" + at + "'";
      return std::nullopt;
    }
    if (s.at < last) {
      err = where + "times go back (" + at + " after " + std::to_string(last) + " s)";
      return std::nullopt;
    }
    last = s.at;
    if (named.contains(s.action)) {
      if (s.name.empty()) {
        err = where + s.action + " needs a NAME (coordinator, node-N)";
        return std::nullopt;
      }
      if (::access((dir + "/" + s.name + "/argv").c_str(), F_OK) != 0) {
        err = where + "no daemon '" + s.name + "' in " + dir;
        return std::nullopt;
      }
      if ((s.action == "slow") != !s.arg.empty()) {
        err = where + (s.action == "slow" ? "slow needs NAME RATE (e.g. 2mbit)"
                                          : s.action + " takes only a NAME");
        return std::nullopt;
      }
    } else if (s.action == "layer" || s.action == "end") {
      if (!s.name.empty()) {
        err = where + s.action + " takes no argument";
        return std::nullopt;
      }
    } else {
      err = where + "unknown action '" + s.action +
            "' (kill, restart, stop, cont, partition, heal, slow, fast, fill, free, layer, end)";
      return std::nullopt;
    }
    plan.push_back(std::move(s));
  }
  if (plan.empty() || plan.back().action != "end") {
    err = path + ": the plan must end with an `end` step";
    return std::nullopt;
  }
  return plan;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  if (auto* s = std::getenv("DSEC_CLUSTER_SCRIPT"))
    o.script = s;
  o.dsec = std::getenv("DSEC") ? std::getenv("DSEC") : "dsec";
  auto bad = [](const std::string& what) {
    std::fprintf(stderr, "dsec-chaos: %s\nTry 'dsec-chaos --help'.\n", what.c_str());
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      return 0;
    }
    if (i + 1 >= argc)
      return bad(a + " needs a value");
    std::string v = argv[++i];
    auto number = [&](uint32_t lo, uint32_t hi) -> std::optional<uint32_t> {
      char* e = nullptr;
      auto x = std::strtoul(v.c_str(), &e, 10);
      if (v.empty() || *e != '\0' || x < lo || x > hi)
        return std::nullopt;
      return static_cast<uint32_t>(x);
    };
    std::optional<uint32_t> x;
    if (a == "--cluster")
      o.dir = v;
    else if (a == "--plan")
      o.plan = v;
    else if (a == "--base")
      o.base = v;
    else if (a == "--layer-src")
      o.layer_src = v;
    else if (a == "--script")
      o.script = v;
    else if (a == "--dsec")
      o.dsec = v;
    else if (a == "--json")
      o.json = v;
    else if (a == "--workers" && (x = number(1, 256)))
      o.workers = *x;
    else if (a == "--sessions" && (x = number(1, 64)))
      o.sessions = *x;
    else if (a == "--quota" && (x = number(1, 100000)))
      o.quota = *x;
    else if (a == "--keep" && (x = number(0, 100000)))
      o.keep = *x;
    else if (a == "--deadline" && (x = number(1, 3600)))
      o.deadline = std::chrono::seconds(*x);
    else if (a == "--settle" && (x = number(1, 3600)))
      o.settle = std::chrono::seconds(*x);
    else if (a == "--seed" && (x = number(0, 4294967295u)))
      o.seed = *x;
    else if (a.starts_with("--"))
      return bad(a == "--workers" || a == "--sessions" || a == "--quota" || a == "--keep" ||
                     a == "--deadline" || a == "--settle" || a == "--seed"
                   ? a + ": expected a whole number in range, got '" + v + "'"
                   : "unknown option '" + a + "'");
    else
      return bad("unexpected argument '" + a + "'");
  }
  if (o.dir.empty() || o.plan.empty() || o.base.empty())
    return bad("--cluster, --plan and --base are required");
  if (o.script.empty())
    return bad("--script (tools/cluster) is required without $DSEC_CLUSTER_SCRIPT");
  auto addr = slurp(o.dir + "/coordinator/addr");
  if (addr.empty())
    addr = "127.0.0.1:" + slurp(o.dir + "/coordinator/port");
  auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon + 1 == addr.size())
    return bad("--cluster " + o.dir + ": no coordinator's address in it (tools/cluster up?)");
  std::string err;
  auto plan = parse_plan(o.plan, o.dir, err);
  if (!plan) {
    std::fprintf(stderr, "dsec-chaos: %s\n", err.c_str());
    return 2;
  }
  for (auto& s : *plan)
    if (s.action == "layer" && o.layer_src.empty())
      return bad("the plan builds layers: --layer-src is required");
  ::signal(SIGPIPE, SIG_IGN);

  caf::actor_system_config cfg;
  dsec::tls_options tls{slurp(o.dir + "/tls")};
  if (auto ok = dsec::client::configure(cfg, tls); !ok) {
    std::fprintf(stderr, "dsec-chaos: TLS of %s: %s\n", o.dir.c_str(),
                 ok.error_value().to_string().c_str());
    return 1;
  }
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{2});
  cfg.set("logger.console", caf::atom("none"));
  int status = 1;
  {
    caf::actor_system sys{cfg};
    auto c = dsec::client::connect(sys, addr.substr(0, colon),
                                   static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
    if (!c) {
      std::fprintf(stderr, "dsec-chaos: connecting to %s: %s\n", addr.c_str(),
                   c.error_value().to_string().c_str());
      return 1;
    }
    chaos run{o, std::move(*plan)};
    status = run.run_all(**c);
    std::fflush(stdout);
    c->reset();
  }
  return status;
}
