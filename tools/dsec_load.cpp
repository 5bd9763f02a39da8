// dsec-load: the load-test harness. It drives a dsec node the way a fleet of
// trainers does: N episodes (create a sandbox, run commands, optionally send
// Chronus events and watch them arrive, destroy), C of them in flight, paced by
// a token bucket, over S sessions, drawn from a catalogue of environments with
// a Zipf-skewed popularity. It prints a live progress line and ends with a
// table (and optionally JSON) of counts, rate and latency percentiles.
//
// How it drives the client: only the *_async calls. Every episode is a chain of
// completions (create -> exec... -> chronus exec -> destroy), each step issued
// from the previous step's completion on one of CAF's threads; the main thread
// only hands out creates (concurrency and rate), prints progress and watches for
// SIGINT/SIGTERM. A pool of C threads doing blocking calls would have been the
// other choice; it was not taken because with C in the thousands (--hold) it
// costs a stack per episode and the measurement would include thread wake-ups
// of this process rather than the node's latency. The async calls cost one
// small event-based actor per request and no thread.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
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
#include <unordered_map>
#include <vector>

#include "actors/client.hpp"
#include "actors/daemon.hpp"
#include "runtime/chronus.hpp"
#include "runtime/endpoint.hpp"
#include "runtime/json.hpp"
#include "runtime/layer.hpp"
#include "tools/dsec/cli.hpp"
#include "tools/load_report.hpp"

namespace {

using clk = std::chrono::steady_clock;
using namespace std::chrono_literals;

const char* usage = R"(usage: dsec-load (--connect HOST:PORT | --embedded [--state DIR]) --count N
                 [--concurrency C] [--rate R] [--sessions S] [--batch B] [--hold]
                 [--commands K] [--events E] [--net] [--seed N]
                 [--catalogue FILE | --base NAME@VER [--workdir NAME@VER] [--tool NAME@VER]...]
                 [--json FILE] [--report FILE.html] [--quiet] [-- CMD [ARGS...]]

Load-tests a dsec node the way a fleet of trainers does. An episode creates a
sandbox, runs CMD in it K times, optionally has a trusted command send E Chronus
reports that this process watches arrive, and destroys the sandbox. N episodes
are run, C at a time; at the end a table of counts, rate and latencies (create,
exec, destroy, Chronus: count, p50, p90, p99, max in ms) and the most common
failures is printed on stdout.

Where:
  --connect HOST:PORT    a running dsecd
  --tls DIR              with --connect: speak TLS with the CA, certificate and
                         key in DIR (ca.pem, cert.pem, key.pem), as a dsecd
                         started with --tls requires
  --embedded             a throwaway single-node daemon inside this process,
                         shut down at the end
  --state DIR            the layer store of --embedded (default $DSEC_STATE,
                         else /var/lib/dsec)

What:
  --count N              episodes in total (required)
  --concurrency C        episodes in flight at once (default 16). With --hold:
                         sandboxes being created, commands running, or
                         sandboxes being destroyed at once
  --rate R               at most R sandbox creates per second (a token bucket;
                         default: as fast as the concurrency allows; a number,
                         fractions allowed)
  --sessions S           spread the episodes round-robin (by create request)
                         over S sessions (default 1); each session's quota is
                         its share
  --batch B              B sandboxes per create request (default 1, at most C);
                         a batch's episodes then run concurrently
  --hold                 create all N first (keeping C creates in flight), keep
                         every sandbox live until all N exist, then run the
                         commands of all, then destroy all: density-style load.
                         Not with --rate
  --peak-file FILE       with --hold: once all N exist, write their count to
                         FILE and wait until FILE is removed before the
                         commands and destroys (a script measures the node at
                         its peak meanwhile, e.g. its memory)
  --commands K           run CMD K times per episode, one after the other
                         (default 1; 0: create and destroy only)
  --events E             E Chronus reports per episode: the sandboxes get
                         Chronus, and after the commands a trusted
                         `/bin/sh -c '... /.dsec/bin/chronus report step=I'`
                         sends them (the base needs /bin/sh). Latency: arrival
                         at this process's watch minus the node's
                         CLOCK_MONOTONIC stamp on the event (same host only)
  --net                  sandboxes with a private network (environment.net)
  -- CMD [ARGS...]       the command of each episode (default: true)

Environments:
  --base NAME@VER        the base layer (required without --catalogue)
  --workdir NAME@VER     a workdir layer
  --tool NAME@VER        a tool layer; repeat for more (the last on top)
  --catalogue FILE       one environment per line:
                           BASE [WORKDIR|-] [TOOL,TOOL...|-] [WEIGHT]
                         `#` starts a comment. Give a weight on every line or on
                         none; without weights, popularity falls with line order
                         as a Zipf law (s = 1.1), like real task catalogues.
                         Each create request draws one environment. The syntax
                         is checked up front; layers that do not exist show up
                         as failures with the node's message, and per line in
                         the table
  --seed N               seed of the environment draws (default 1)

Output:
  --json FILE            also write the results as JSON: created, failed,
                         cancelled, count, concurrency, batch, sessions,
                         commands, events, rate_per_s, wall_s, create_ms,
                         (with --hold) create_phase_s and placements_per_s:
                         how long until all N existed, and N over that,
                         exec_ms, destroy_ms (and chronus_ms with --events),
                         each {count, p50, p90, p99, max}, failures, environments
  --report FILE.html     also write a report: one self-contained HTML page (no
                         script, nothing fetched) with the summary, plots of the
                         calls completed per second and of the create latency
                         (p50, p99) over time, and latency histograms (1-2-5
                         buckets from 0.1 ms to 100 s); the same figures as JSON
                         are in its <script id="dsec-load-data"> element, and
                         in FILE.json beside it (FILE.html's name with .json)
  --quiet                no progress line (else one on stderr: rewritten in
                         place on a terminal, one line per second otherwise; its
                         rate is the creates of the last second)
  -h, --help             this text

An episode fails when its create fails, a command cannot run or exits non-zero,
a Chronus report fails or its events do not arrive within 30 s, or its destroy
fails. SIGINT or SIGTERM stops the run: no new creates; the sessions are closed
(which destroys every sandbox this run made, those still being created too);
the partial table is printed.

Exit status: 0 every episode succeeded; 1 some failed (or the node could not be
reached); 2 usage error; 128+SIGNAL when stopped by SIGINT (130) or SIGTERM (143).
)";

int bad(const std::string& msg) {
  std::fprintf(stderr, "dsec-load: %s\nTry 'dsec-load --help'.\n", msg.c_str());
  return 2;
}

bool parse_positive_double(const std::string& s, double& out) {
  if (s.empty() || s[0] == '-' || s[0] == '+' || s[0] == ' ')
    return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  return errno == 0 && *end == '\0' && std::isfinite(out) && out > 0;
}

/// FILE.html -> FILE.json (any other name: FILE.json appended).
std::string report_json_path(const std::string& html) {
  auto dot = html.rfind('.'), slash = html.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
    return html + ".json";
  return html.substr(0, dot) + ".json";
}

double ms_between(clk::time_point a, clk::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// ---- options ------------------------------------------------------------------------

struct env_entry {
  dsec::environment env;
  double weight = 1;
  std::string label;   ///< "BASE WORKDIR TOOLS" as given
  std::string where;   ///< FILE:LINE, or "options"
};

struct options {
  std::string connect_host;
  uint16_t connect_port = 0;
  dsec::tls_options tls;
  bool embedded = false;
  std::string state_dir;
  uint64_t count = 0;
  uint64_t concurrency = 16;
  double rate = 0; ///< 0: unlimited
  uint64_t sessions = 1;
  uint64_t batch = 1;
  bool hold = false;
  std::string peak_file;
  uint64_t commands = 1;
  uint64_t events = 0;
  bool net = false;
  uint64_t seed = 1;
  std::vector<env_entry> envs;
  std::string json_path;
  std::string report_path;
  bool quiet = false;
  std::vector<std::string> cmd{"true"};
};

std::optional<std::string> check_ref(const std::string& what, const std::string& ref) {
  auto r = dsec::parse_layer_ref(ref);
  if (!r)
    return what + ": '" + ref + "' is not NAME@VERSION: " + r.error_value().message;
  return std::nullopt;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// Reads a catalogue; an error names FILE:LINE.
std::optional<std::string> read_catalogue(const std::string& path, std::vector<env_entry>& out) {
  std::ifstream in{path};
  if (!in)
    return "--catalogue: cannot read " + path + ": " + std::strerror(errno);
  std::string line;
  size_t lineno = 0;
  int weighted = -1; // unknown, 0 no, 1 yes
  while (std::getline(in, line)) {
    ++lineno;
    auto where = path + ":" + std::to_string(lineno);
    if (auto hash = line.find('#'); hash != std::string::npos)
      line.resize(hash);
    std::istringstream ls{line};
    std::vector<std::string> tok;
    for (std::string t; ls >> t;)
      tok.push_back(t);
    if (tok.empty())
      continue;
    env_entry e;
    e.where = where;
    double w = 0;
    bool has_weight = false;
    if (tok.size() >= 2 && tok.back().find('@') == std::string::npos && tok.back() != "-") {
      if (!parse_positive_double(tok.back(), w))
        return where + ": '" + tok.back() + "' is neither NAME@VERSION nor a positive weight";
      has_weight = true;
      tok.pop_back();
    }
    if (tok.size() > 3)
      return where + ": too many fields (expected BASE [WORKDIR|-] [TOOL,TOOL...|-] [WEIGHT])";
    if (weighted == -1)
      weighted = has_weight ? 1 : 0;
    else if (weighted != (has_weight ? 1 : 0))
      return where + ": " + (has_weight ? "a weight here but not on the lines before"
                                        : "no weight here but the lines before have one")
             + " (give a weight on every line or on none)";
    if (auto err = check_ref("base", tok[0]))
      return where + ": " + *err;
    e.env.base = tok[0];
    if (tok.size() >= 2 && tok[1] != "-") {
      if (auto err = check_ref("workdir", tok[1]))
        return where + ": " + *err;
      e.env.workdir = tok[1];
    }
    if (tok.size() >= 3 && tok[2] != "-") {
      for (const auto& t : split(tok[2], ',')) {
        if (auto err = check_ref("tool", t))
          return where + ": " + *err;
        e.env.tools.push_back(t);
      }
    }
    e.label = tok[0];
    for (size_t i = 1; i < tok.size(); ++i)
      e.label += " " + tok[i];
    e.weight = has_weight ? w : 0;
    out.push_back(std::move(e));
  }
  if (in.bad())
    return "--catalogue: cannot read " + path + ": " + std::strerror(errno);
  if (out.empty())
    return "--catalogue: " + path + " has no environment";
  if (weighted == 0)
    for (size_t i = 0; i < out.size(); ++i)
      out[i].weight = 1.0 / std::pow(static_cast<double>(i + 1), 1.1);
  return std::nullopt;
}

// Parses argv into `o`; returns the exit status to end with (2) or nullopt to go on.
std::optional<int> parse_options(int argc, char** argv, options& o) {
  dsec::cli::args a{argc, argv, 1};
  bool have_count = false, have_concurrency = false;
  std::string base, workdir, catalogue;
  std::vector<std::string> tools;
  bool have_state = false;
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(usage, stdout);
      return 0;
    }
    std::vector<std::string> rest;
    if (a.rest(rest)) {
      if (rest.empty())
        return bad("--: no command after it");
      o.cmd = rest;
      break;
    }
    std::string v;
    std::optional<std::string> err;
    auto opt = [&](const char* name) {
      if (err)
        return false;
      auto r = a.option(name, v);
      if (!r) {
        err = r.error_value().message;
        return false;
      }
      return *r;
    };
    uint64_t n = 0;
    auto positive = [&](const char* name, uint64_t max, uint64_t& out) -> std::optional<int> {
      if (!dsec::cli::parse_uint(v, max, n) || n == 0)
        return bad(std::string{name} + ": expected a whole number from 1 to " + std::to_string(max)
                   + ", got '" + v + "'");
      out = n;
      return std::nullopt;
    };
    auto whole = [&](const char* name, uint64_t max, uint64_t& out) -> std::optional<int> {
      if (!dsec::cli::parse_uint(v, max, n))
        return bad(std::string{name} + ": expected a whole number from 0 to " + std::to_string(max)
                   + ", got '" + v + "'");
      out = n;
      return std::nullopt;
    };
    std::optional<int> r;
    if (opt("--connect")) {
      auto ep = dsec::parse_endpoint(v, "--connect");
      if (!ep)
        return bad(ep.error_value().message);
      if (!o.connect_host.empty())
        return bad("--connect: given twice");
      o.connect_host = ep->host;
      o.connect_port = ep->port;
    } else if (opt("--tls")) {
      if (v.empty())
        return bad("--tls: expected a directory (with ca.pem, cert.pem and key.pem)");
      o.tls.dir = v;
    } else if (a.flag("--embedded")) {
      o.embedded = true;
    } else if (opt("--state")) {
      o.state_dir = v;
      have_state = true;
    } else if (opt("--count")) {
      r = positive("--count", 100'000'000, o.count);
      have_count = true;
    } else if (opt("--concurrency")) {
      r = positive("--concurrency", 1'000'000, o.concurrency);
      have_concurrency = true;
    } else if (opt("--rate")) {
      if (!parse_positive_double(v, o.rate))
        return bad("--rate: expected a positive number of creates per second, got '" + v + "'");
    } else if (opt("--sessions")) {
      r = positive("--sessions", 10'000, o.sessions);
    } else if (opt("--batch")) {
      r = positive("--batch", 100'000, o.batch);
    } else if (a.flag("--hold")) {
      o.hold = true;
    } else if (opt("--peak-file")) {
      if (v.empty())
        return bad("--peak-file: expected a file name");
      o.peak_file = v;
    } else if (opt("--commands")) {
      r = whole("--commands", 1'000'000, o.commands);
    } else if (opt("--events")) {
      r = whole("--events", 1'000'000, o.events);
    } else if (a.flag("--net")) {
      o.net = true;
    } else if (opt("--seed")) {
      r = whole("--seed", 999'999'999'999, o.seed);
    } else if (opt("--catalogue")) {
      catalogue = v;
    } else if (opt("--base")) {
      if (auto e = check_ref("--base", v))
        return bad(*e);
      base = v;
    } else if (opt("--workdir")) {
      if (auto e = check_ref("--workdir", v))
        return bad(*e);
      workdir = v;
    } else if (opt("--tool")) {
      if (auto e = check_ref("--tool", v))
        return bad(*e);
      tools.push_back(v);
    } else if (opt("--json")) {
      if (v.empty())
        return bad("--json: expected a file name");
      o.json_path = v;
    } else if (opt("--report")) {
      if (v.empty())
        return bad("--report: expected a file name");
      if (v.size() >= 5 && v.compare(v.size() - 5, 5, ".json") == 0)
        return bad("--report: " + v + ": give the HTML file's name (its JSON is written "
                   "beside it, with .json)");
      o.report_path = v;
    } else if (a.flag("--quiet")) {
      o.quiet = true;
    } else if (err) {
      return bad(*err);
    } else {
      return bad("unknown argument '" + std::string{a.peek()} + "'");
    }
    if (err)
      return bad(*err);
    if (r)
      return r;
  }
  if (!have_count)
    return bad("--count: missing (how many episodes to run)");
  if (o.embedded == !o.connect_host.empty())
    return bad(o.embedded ? "--connect and --embedded: give one of them, not both"
                          : "give --connect HOST:PORT or --embedded");
  if (have_state && !o.embedded)
    return bad("--state: only with --embedded (a dsecd has its own)");
  if (o.tls.enabled() && o.embedded)
    return bad("--tls: only with --connect (--embedded has no connection)");
  if (o.embedded && !have_state)
    o.state_dir = dsec::cli::default_state_dir();
  if (o.batch > o.concurrency)
    return bad("--batch " + std::to_string(o.batch) + " is more than --concurrency "
               + std::to_string(o.concurrency) + (have_concurrency ? "" : " (the default)")
               + ": a batch's episodes are all in flight at once");
  if (!o.peak_file.empty() && !o.hold)
    return bad("--peak-file is for --hold (the peak is when all N exist)");
  if (o.hold && o.rate > 0)
    return bad("--hold and --rate: --hold creates as fast as --concurrency allows; pace it "
               "with --concurrency");
  if (!catalogue.empty()) {
    if (!base.empty() || !workdir.empty() || !tools.empty())
      return bad("--catalogue: not with --base, --workdir or --tool (the catalogue names the "
                 "layers)");
    if (auto e = read_catalogue(catalogue, o.envs))
      return bad(*e);
  } else {
    if (base.empty())
      return bad(workdir.empty() && tools.empty()
                   ? "--base: missing (or give --catalogue FILE)"
                   : "--base: missing (--workdir and --tool need it)");
    env_entry e;
    e.env.base = base;
    e.env.workdir = workdir;
    e.env.tools = tools;
    e.label = base + " " + (workdir.empty() ? "-" : workdir) + " ";
    for (size_t i = 0; i < tools.size(); ++i)
      e.label += (i ? "," : "") + tools[i];
    if (tools.empty())
      e.label += "-";
    e.where = "options";
    o.envs.push_back(std::move(e));
  }
  for (auto& e : o.envs) {
    e.env.net = o.net;
    e.env.chronus = o.events > 0;
  }
  for (auto [flag, path] : {std::pair{"--json", o.json_path}, {"--report", o.report_path}}) {
    if (path.empty())
      continue;
    std::ofstream probe{path, std::ios::app};
    if (!probe)
      return bad(std::string{flag} + ": cannot write " + path + ": " + std::strerror(errno));
  }
  return std::nullopt;
}

// ---- results ------------------------------------------------------------------------

struct summary {
  size_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
};

summary summarize(std::vector<double> v) {
  summary s;
  s.count = v.size();
  if (v.empty())
    return s;
  std::sort(v.begin(), v.end());
  auto at = [&](double p) {
    // nearest rank: the smallest value with at least p of the samples at or below it
    auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  s.p50 = at(0.50);
  s.p90 = at(0.90);
  s.p99 = at(0.99);
  s.max = v.back();
  return s;
}

std::string json_summary(const summary& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "{\"count\": %zu, \"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f, "
                "\"max\": %.3f}", s.count, s.p50, s.p90, s.p99, s.max);
  return buf;
}

// ---- the run ----------------------------------------------------------------------

/// One episode's state. Guarded by runner::mu_.
struct episode {
  size_t env = 0;
  size_t session = 0;
  std::string id;             ///< empty until created
  uint64_t commands_left = 0;
  uint64_t events = 0;        ///< Chronus events seen
  bool chronus_started = false;
  bool chronus_done = false;  ///< the trusted command succeeded
  clk::time_point events_deadline;
  bool busy = false;          ///< an async call of this episode is pending
  bool failed = false;
  bool cancelled = false;
  bool finished = false;
  bool destroyed = false;
};

/// What one create request covers: episodes [first, first + count).
struct batch {
  size_t first = 0;
  size_t count = 0;
  size_t reported = 0; ///< ready or failed so far
  clk::time_point t0;
};

class runner {
public:
  runner(const options& o, dsec::client& c, std::vector<std::unique_ptr<dsec::session>>& sessions)
    : o_(o), client_(c), sessions_(sessions), episodes_(o.count), rng_(o.seed),
      env_created_(o.envs.size()), env_failed_(o.envs.size()), env_episodes_(o.envs.size()) {
    std::vector<double> w;
    for (const auto& e : o.envs)
      w.push_back(e.weight);
    pick_ = std::discrete_distribution<size_t>(w.begin(), w.end());
    exec_.argv = o.cmd;
    if (o.events > 0) {
      chronus_.argv = {"/bin/sh", "-c",
                       "i=1; while [ $i -le " + std::to_string(o.events)
                         + " ]; do /.dsec/bin/chronus report step=$i || exit $?; "
                           "i=$((i+1)); done"};
      chronus_.trusted = true;
    }
    tty_ = ::isatty(2) == 1;
  }

  /// Runs until every episode ended or a signal came; returns the signal (0: none).
  int run(const sigset_t& stop_signals);

  /// Chronus: an event of one of the sessions (a CAF thread).
  void on_event(const dsec::chronus_event& ev);

  /// Prints the table on stdout and writes the JSON; returns the exit status.
  int report(int signal);

private:
  enum class act { none, exec, chronus, destroy };

  void dispatch_create(size_t first, size_t count);
  /// Decides the episode's next call and makes it (called without the lock).
  void step(size_t ep);
  /// Under the lock: what to do next for `ep`, marking it busy if anything.
  act next_action(size_t ep);
  /// Under the lock: records a failure of `ep` (once), or a cancellation while stopping.
  /// `message` is the kind of failure (grouped and counted); `example`, e.g.
  /// the first line a failing command wrote to stderr, is kept for the first of
  /// each kind.
  void fail_locked(size_t ep, const std::string& message, const std::string& example = {});
  /// Under the lock: the episode ended (its sandbox destroyed or never made).
  void finish_locked(size_t ep);
  void progress(bool final);
  void stop_everything();

  const options& o_;
  dsec::client& client_;
  std::vector<std::unique_ptr<dsec::session>>& sessions_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<episode> episodes_;
  std::unordered_map<std::string, size_t> by_id_;
  std::mt19937_64 rng_;
  std::discrete_distribution<size_t> pick_;
  dsec::exec_request exec_, chronus_;

  // Counters (under mu_).
  size_t requested_ = 0;   ///< episodes whose create was asked for
  size_t created_ = 0;
  size_t failed_ = 0;
  size_t cancelled_ = 0;
  size_t finished_ = 0;
  size_t live_ = 0;
  size_t in_flight_ = 0;   ///< what counts against --concurrency
  size_t outstanding_ = 0; ///< async calls not completed
  size_t batches_ = 0;
  size_t stray_events_ = 0;
  bool stopping_ = false;
  // --hold: 0 creating, 1 commands, 2 destroying
  int phase_ = 0;
  size_t hold_next_ = 0;   ///< next episode to start in phases 1 and 2
  size_t phase_done_ = 0;  ///< episodes through the current hold phase

  std::vector<size_t> env_created_, env_failed_, env_episodes_;
  // Each call's latency and when it completed (for --report's plots).
  dsec::load::timed_samples create_times_, exec_times_, destroy_times_, chronus_times_;
  std::vector<double> failure_at_s_;
  double since_start(clk::time_point t) const {
    return std::chrono::duration<double>(t - t0_).count();
  }
  struct failure_kind {
    size_t count = 0;
    std::string example;
  };
  std::map<std::string, failure_kind> failures_;
  std::set<size_t> waiting_events_;

  clk::time_point t0_, t_end_;
  std::optional<clk::time_point> t_created_; ///< --hold: when all N existed
  bool tty_ = false;
  std::vector<std::pair<clk::time_point, size_t>> rate_window_;
  clk::time_point last_progress_{};
  size_t progress_len_ = 0;
};

void runner::fail_locked(size_t ep, const std::string& message, const std::string& example) {
  auto& e = episodes_[ep];
  if (e.failed || e.cancelled)
    return;
  if (stopping_) {
    e.cancelled = true;
    return;
  }
  e.failed = true;
  failure_at_s_.push_back(since_start(clk::now()));
  std::string m = message;
  // Group by message: the sandbox's own id would make every message unique.
  if (!e.id.empty())
    for (size_t at = m.find(e.id); at != std::string::npos; at = m.find(e.id, at + 4))
      m.replace(at, e.id.size(), "<id>");
  auto& k = failures_[m];
  if (k.count++ == 0)
    k.example = example;
}

void runner::finish_locked(size_t ep) {
  auto& e = episodes_[ep];
  if (e.finished)
    return;
  e.finished = true;
  ++finished_;
  if (e.failed) {
    ++failed_;
    ++env_failed_[e.env];
  } else if (e.cancelled) {
    ++cancelled_;
  }
}

void runner::dispatch_create(size_t first, size_t count) {
  auto b = std::make_shared<batch>();
  b->first = first;
  b->count = count;
  size_t env, session;
  {
    std::lock_guard g{mu_};
    env = pick_(rng_);
    session = batches_++ % sessions_.size();
    for (size_t i = first; i < first + count; ++i) {
      episodes_[i].env = env;
      episodes_[i].session = session;
      episodes_[i].commands_left = o_.commands;
      episodes_[i].busy = true;
    }
    env_episodes_[env] += count;
    requested_ += count;
    in_flight_ += count;
    ++outstanding_;
    b->t0 = clk::now();
  }
  auto on_ready = [this, b](const std::string& id) {
    auto now = clk::now();
    size_t ep;
    {
      std::lock_guard g{mu_};
      ep = b->first + b->reported++;
      auto& e = episodes_[ep];
      e.id = id;
      e.busy = false;
      by_id_[id] = ep;
      create_times_.add(since_start(now), ms_between(b->t0, now));
      ++created_;
      ++live_;
      ++env_created_[e.env];
      if (o_.hold) {
        --in_flight_;
        ++phase_done_;
      }
    }
    cv_.notify_all();
    if (!o_.hold)
      step(ep);
  };
  auto on_failed = [this, b](const dsec::error& err) {
    {
      std::lock_guard g{mu_};
      size_t ep = b->first + b->reported++;
      episodes_[ep].busy = false;
      fail_locked(ep, "create: " + err.message);
      finish_locked(ep);
      --in_flight_;
      if (o_.hold)
        ++phase_done_;
    }
    cv_.notify_all();
  };
  auto done = [this, b](dsec::expected<std::vector<std::string>> r) {
    {
      std::lock_guard g{mu_};
      --outstanding_;
      // Episodes the batch never reported (the whole request was refused, or
      // the session went away) failed with the request's error.
      std::string why = r ? "create: the node reported neither ready nor failed"
                          : "create: " + r.error_value().message;
      while (b->reported < b->count) {
        size_t ep = b->first + b->reported++;
        episodes_[ep].busy = false;
        fail_locked(ep, why);
        finish_locked(ep);
        --in_flight_;
        if (o_.hold)
          ++phase_done_;
      }
    }
    cv_.notify_all();
  };
  sessions_[session]->create_async(o_.envs[env].env, static_cast<uint32_t>(count), std::move(done),
                                   std::move(on_ready), std::move(on_failed));
}

runner::act runner::next_action(size_t ep) {
  auto& e = episodes_[ep];
  if (e.busy || e.finished)
    return act::none;
  if (stopping_) {
    // The sessions' close destroys the sandbox.
    e.cancelled = e.cancelled || !e.failed;
    finish_locked(ep);
    return act::none;
  }
  bool work_left = !e.failed && (e.commands_left > 0 || (o_.events > 0 && !e.chronus_done));
  if (work_left) {
    if (o_.hold && phase_ != 1)
      return act::none;
    if (e.commands_left > 0) {
      e.busy = true;
      return act::exec;
    }
    if (!e.chronus_started) {
      e.chronus_started = true;
      e.busy = true;
      return act::chronus;
    }
    return act::none; // the trusted command runs
  }
  if (o_.events > 0 && !e.failed && e.events < o_.events) {
    // Every report was acked; wait for their events to reach the watch.
    if (!waiting_events_.count(ep)) {
      e.events_deadline = clk::now() + 30s;
      waiting_events_.insert(ep);
    }
    return act::none;
  }
  waiting_events_.erase(ep);
  if (o_.hold && phase_ == 1) {
    // This episode's commands are through; it waits for the destroy phase.
    e.busy = true; // parked until phase 2
    --in_flight_;
    ++phase_done_;
    return act::none;
  }
  if (o_.hold && phase_ != 2)
    return act::none;
  e.busy = true;
  return act::destroy;
}

void runner::step(size_t ep) {
  act a;
  std::string id;
  size_t session;
  {
    std::lock_guard g{mu_};
    a = next_action(ep);
    id = episodes_[ep].id;
    session = episodes_[ep].session;
    if (a != act::none)
      ++outstanding_;
  }
  cv_.notify_all();
  auto t0 = clk::now();
  switch (a) {
  case act::none:
    return;
  case act::exec:
  case act::chronus:
    sessions_[session]->exec_async(
      id, a == act::exec ? exec_ : chronus_,
      [this, ep, t0, a](dsec::expected<dsec::exec_result> r) {
        auto now = clk::now();
        {
          std::lock_guard g{mu_};
          --outstanding_;
          auto& e = episodes_[ep];
          e.busy = false;
          const char* what = a == act::exec ? "exec" : "chronus report";
          if (!r) {
            fail_locked(ep, std::string{what} + ": " + r.error_value().message);
          } else if (r->exit_code != 0 || r->signal != 0 || r->timed_out) {
            std::string msg = std::string{what} + ": ";
            if (r->timed_out)
              msg += "timed out";
            else if (r->signal != 0)
              msg += "killed by signal " + std::to_string(r->signal);
            else
              msg += "exited with status " + std::to_string(r->exit_code);
            // Grouped by how it ended; what it said is an example of each.
            auto line = r->err.substr(0, r->err.find('\n'));
            fail_locked(ep, msg, line.substr(0, 200));
          }
          if (a == act::exec) {
            if (r)
              exec_times_.add(since_start(now), ms_between(t0, now));
            if (e.commands_left > 0)
              --e.commands_left;
          } else if (r && !e.failed) {
            e.chronus_done = true;
          }
        }
        step(ep);
      });
    return;
  case act::destroy:
    sessions_[session]->destroy_async(id, [this, ep, t0](dsec::expected<void> r) {
      auto now = clk::now();
      {
        std::lock_guard g{mu_};
        --outstanding_;
        auto& e = episodes_[ep];
        e.busy = false;
        if (r) {
          destroy_times_.add(since_start(now), ms_between(t0, now));
          e.destroyed = true;
          --live_;
        } else {
          fail_locked(ep, "destroy: " + r.error_value().message);
        }
        by_id_.erase(e.id);
        --in_flight_;
        if (o_.hold)
          ++phase_done_;
        finish_locked(ep);
      }
      cv_.notify_all();
    });
    return;
  }
}

void runner::on_event(const dsec::chronus_event& ev) {
  auto now = monotonic_ns();
  std::optional<size_t> wake;
  {
    std::lock_guard g{mu_};
    auto it = by_id_.find(ev.sandbox_id);
    if (ev.kind != dsec::chronus_kind::report || it == by_id_.end()) {
      ++stray_events_;
      return;
    }
    chronus_times_.add(since_start(clk::now()),
                 now >= ev.monotonic_ns ? static_cast<double>(now - ev.monotonic_ns) / 1e6 : 0.0);
    auto& e = episodes_[it->second];
    ++e.events;
    if (e.events >= o_.events && waiting_events_.count(it->second))
      wake = it->second;
  }
  if (wake)
    step(*wake);
}

void runner::progress(bool final) {
  // Called by the main thread with mu_ held.
  if (o_.quiet)
    return;
  auto now = clk::now();
  rate_window_.emplace_back(now, created_);
  while (rate_window_.size() > 1 && now - rate_window_.front().first > 1s)
    rate_window_.erase(rate_window_.begin());
  if (!final && now - last_progress_ < (tty_ ? 200ms : 1000ms))
    return;
  last_progress_ = now;
  double rate = 0;
  if (rate_window_.size() > 1) {
    double span = std::chrono::duration<double>(now - rate_window_.front().first).count();
    if (span > 0)
      rate = static_cast<double>(created_ - rate_window_.front().second) / span;
  }
  char line[256];
  int n = std::snprintf(line, sizeof line,
                        "%7.1fs  created %zu/%llu  failed %zu  live %zu  %.0f creates/s (last 1 s)%s",
                        std::chrono::duration<double>(now - t0_).count(), created_,
                        static_cast<unsigned long long>(o_.count), failed_, live_, rate,
                        stopping_ ? "  (stopping)" : "");
  if (tty_) {
    size_t len = static_cast<size_t>(std::max(n, 0));
    std::fprintf(stderr, "\r%s%*s", line,
                 static_cast<int>(progress_len_ > len ? progress_len_ - len : 0), "");
    progress_len_ = len;
    if (final)
      std::fputc('\n', stderr);
  } else {
    std::fprintf(stderr, "%s\n", line);
  }
  std::fflush(stderr);
}

void runner::stop_everything() {
  // Close every session: the node destroys each sandbox this run made, those
  // still being created too; pending calls then fail and are counted cancelled.
  for (auto& s : sessions_) {
    {
      std::lock_guard g{mu_};
      ++outstanding_;
    }
    s->close_async([this](dsec::expected<uint32_t> r) {
      {
        std::lock_guard g{mu_};
        --outstanding_;
        if (r) {
          live_ -= std::min<size_t>(live_, *r);
        } else {
          std::fprintf(stderr, "\ndsec-load: closing a session: %s\n",
                       r.error_value().message.c_str());
        }
      }
      cv_.notify_all();
    });
  }
}

int runner::run(const sigset_t& stop_signals) {
  t0_ = clk::now();
  double tokens = static_cast<double>(o_.batch);
  double capacity = std::max(static_cast<double>(o_.batch), o_.rate / 20);
  auto refilled = t0_;
  int signal = 0;
  bool closed = false;
  std::unique_lock lk{mu_};
  for (;;) {
    // A stop signal? (Blocked in every thread; polled here.)
    if (!signal) {
      timespec zero{};
      int s = ::sigtimedwait(&stop_signals, nullptr, &zero);
      if (s > 0) {
        signal = s;
        stopping_ = true;
        if (!o_.quiet)
          std::fprintf(stderr, "%sdsec-load: %s: stopping; closing the sessions\n",
                       tty_ ? "\n" : "", ::sigabbrev_np(s));
      }
    }
    if (stopping_) {
      if (!closed) {
        closed = true;
        // Episodes waiting for nothing but the next step end now.
        std::vector<size_t> idle;
        for (size_t i = 0; i < requested_; ++i)
          if (!episodes_[i].finished && !episodes_[i].busy)
            idle.push_back(i);
        for (size_t i : idle)
          next_action(i);
        lk.unlock();
        stop_everything();
        lk.lock();
      }
      if (outstanding_ == 0) {
        // Parked --hold episodes (busy, nothing pending) end as cancelled.
        for (size_t i = 0; i < requested_; ++i)
          if (!episodes_[i].finished) {
            episodes_[i].busy = false;
            episodes_[i].cancelled = !episodes_[i].failed;
            finish_locked(i);
          }
        break;
      }
      progress(false);
      cv_.wait_for(lk, 50ms);
      continue;
    }
    auto now = clk::now();
    // Chronus events that never came.
    std::vector<size_t> late;
    for (size_t ep : waiting_events_)
      if (now > episodes_[ep].events_deadline)
        late.push_back(ep);
    for (size_t ep : late) {
      waiting_events_.erase(ep);
      auto& e = episodes_[ep];
      fail_locked(ep, "chronus: " + std::to_string(e.events) + " of " + std::to_string(o_.events)
                        + " events arrived within 30 s");
    }
    if (!late.empty()) {
      lk.unlock();
      for (size_t ep : late)
        step(ep);
      lk.lock();
      continue;
    }
    // Done?
    if (!o_.hold && finished_ == o_.count)
      break;
    if (o_.hold && phase_ == 2 && finished_ == o_.count)
      break;
    std::vector<size_t> to_step;
    std::optional<std::pair<size_t, size_t>> create;
    clk::time_point wake = now + (tty_ ? 200ms : 1000ms);
    if (requested_ < o_.count) {
      size_t b = std::min<size_t>(o_.batch, o_.count - requested_);
      if (o_.rate > 0) {
        tokens = std::min(capacity, tokens + std::chrono::duration<double>(now - refilled).count()
                                               * o_.rate);
        refilled = now;
      }
      if (in_flight_ + b <= o_.concurrency) {
        if (o_.rate <= 0 || tokens >= static_cast<double>(b)) {
          tokens -= static_cast<double>(b);
          create.emplace(requested_, b);
        } else {
          auto need = (static_cast<double>(b) - tokens) / o_.rate;
          wake = std::min(wake, now + std::chrono::duration_cast<clk::duration>(
                                        std::chrono::duration<double>(need)));
        }
      }
    } else if (o_.hold) {
      if (phase_ == 0 && phase_done_ == o_.count) {
        if (!t_created_) {
          t_created_ = now;
          if (!o_.peak_file.empty()) {
            std::ofstream pf{o_.peak_file, std::ios::trunc};
            pf << created_ << "\n";
          }
        }
        if (!o_.peak_file.empty() && ::access(o_.peak_file.c_str(), F_OK) == 0) {
          progress(false);
          cv_.wait_until(lk, now + 50ms);
          continue;
        }
        phase_ = 1;
        phase_done_ = 0;
        hold_next_ = 0;
      }
      if (phase_ == 1 && phase_done_ == o_.count) {
        phase_ = 2;
        phase_done_ = finished_; // those that never got a sandbox are through
        hold_next_ = 0;
        for (auto& e : episodes_)
          if (!e.finished)
            e.busy = false;
      }
      if (phase_ == 1) {
        // Failed creates are already through this phase.
        while (hold_next_ < o_.count && in_flight_ < o_.concurrency) {
          auto& e = episodes_[hold_next_];
          if (e.finished) {
            ++phase_done_;
          } else {
            ++in_flight_;
            to_step.push_back(hold_next_);
          }
          ++hold_next_;
        }
      } else if (phase_ == 2) {
        while (hold_next_ < o_.count && in_flight_ < o_.concurrency) {
          if (!episodes_[hold_next_].finished) {
            ++in_flight_;
            to_step.push_back(hold_next_);
          }
          ++hold_next_;
        }
      }
    }
    if (create || !to_step.empty()) {
      lk.unlock();
      if (create)
        dispatch_create(create->first, create->second);
      for (size_t ep : to_step)
        step(ep);
      lk.lock();
      continue;
    }
    progress(false);
    cv_.wait_until(lk, std::min(wake, now + 50ms));
  }
  t_end_ = clk::now();
  progress(true);
  return signal;
}

int runner::report(int signal) {
  std::lock_guard g{mu_};
  double wall = std::chrono::duration<double>(t_end_ - t0_).count();
  double rate = wall > 0 ? static_cast<double>(created_) / wall : 0;
  auto cs = summarize(create_times_.ms), es = summarize(exec_times_.ms), ds = summarize(destroy_times_.ms),
       xs = summarize(chronus_times_.ms);
  std::vector<std::pair<std::string, failure_kind>> fails(failures_.begin(), failures_.end());
  std::stable_sort(fails.begin(), fails.end(),
                   [](const auto& a, const auto& b) { return a.second.count > b.second.count; });
  size_t not_started = o_.count - requested_;

  std::printf("dsec-load: %llu episodes, concurrency %llu, batch %llu, %llu session%s, "
              "%llu command%s and %llu Chronus event%s each%s%s\n",
              static_cast<unsigned long long>(o_.count),
              static_cast<unsigned long long>(o_.concurrency),
              static_cast<unsigned long long>(o_.batch),
              static_cast<unsigned long long>(o_.sessions), o_.sessions == 1 ? "" : "s",
              static_cast<unsigned long long>(o_.commands), o_.commands == 1 ? "" : "s",
              static_cast<unsigned long long>(o_.events), o_.events == 1 ? "" : "s",
              o_.hold ? ", --hold" : "",
              signal ? (std::string{", stopped by "} + ::sigabbrev_np(signal)).c_str() : "");
  std::printf("  created    %zu\n", created_);
  if (t_created_) {
    double cw = std::chrono::duration<double>(*t_created_ - t0_).count();
    std::printf("  all live   after %.3f s (%.0f placements/s)\n", cw,
                cw > 0 ? static_cast<double>(created_) / cw : 0.0);
  }
  std::printf("  failed     %zu\n", failed_);
  if (cancelled_ || not_started)
    std::printf("  cancelled  %zu (and %zu not started)\n", cancelled_, not_started);
  std::printf("  wall       %.2f s\n", wall);
  std::printf("  rate       %.1f creates/s (created / wall)\n", rate);
  std::printf("\n  latency ms      count       p50       p90       p99       max\n");
  auto row = [](const char* name, const summary& s) {
    std::printf("  %-10s %10zu %9.2f %9.2f %9.2f %9.2f\n", name, s.count, s.p50, s.p90, s.p99,
                s.max);
  };
  row("create", cs);
  row("exec", es);
  row("destroy", ds);
  if (o_.events > 0)
    row("chronus", xs);
  if (o_.envs.size() > 1) {
    // As wide as the longest label, so long ones do not shift the numbers.
    size_t w = std::string_view{"environment"}.size();
    for (const auto& e : o_.envs)
      w = std::max(w, e.where.size() + 1 + e.label.size());
    std::printf("\n  %-*s  episodes   created    failed\n", static_cast<int>(w), "environment");
    for (size_t i = 0; i < o_.envs.size(); ++i)
      std::printf("  %-*s %9zu %9zu %9zu\n", static_cast<int>(w),
                  (o_.envs[i].where + " " + o_.envs[i].label).c_str(), env_episodes_[i],
                  env_created_[i], env_failed_[i]);
  }
  if (!fails.empty()) {
    if (fails.size() > 5)
      std::printf("\n  failures (the 5 commonest of %zu kinds)\n", fails.size());
    else
      std::printf("\n  failures\n");
    for (size_t i = 0; i < fails.size() && i < 5; ++i) {
      std::printf("  %8zu  %s\n", fails[i].second.count, fails[i].first.c_str());
      if (!fails[i].second.example.empty())
        std::printf("            e.g. stderr: %s\n", fails[i].second.example.c_str());
    }
  }
  std::fflush(stdout);

  int status = signal ? 128 + signal : (failed_ > 0 ? 1 : 0);
  if (!o_.json_path.empty() || !o_.report_path.empty()) {
    std::ostringstream j;
    j.setf(std::ios::fixed);
    j.precision(3);
    j << "{\n  \"count\": " << o_.count << ",\n  \"concurrency\": " << o_.concurrency
      << ",\n  \"batch\": " << o_.batch << ",\n  \"sessions\": " << o_.sessions
      << ",\n  \"commands\": " << o_.commands << ",\n  \"events\": " << o_.events
      << ",\n  \"hold\": " << (o_.hold ? "true" : "false")
      << ",\n  \"created\": " << created_ << ",\n  \"failed\": " << failed_
      << ",\n  \"cancelled\": " << cancelled_ << ",\n  \"not_started\": " << not_started
      << ",\n  \"interrupted\": " << (signal ? "true" : "false")
      << ",\n  \"wall_s\": " << wall << ",\n  \"rate_per_s\": " << rate
      << ",\n  \"create_ms\": " << json_summary(cs) << ",\n  \"exec_ms\": " << json_summary(es)
      << ",\n  \"destroy_ms\": " << json_summary(ds);
    if (t_created_) {
      double cw = std::chrono::duration<double>(*t_created_ - t0_).count();
      j << ",\n  \"create_phase_s\": " << cw << ",\n  \"placements_per_s\": "
        << (cw > 0 ? static_cast<double>(created_) / cw : 0.0);
    }
    if (o_.events > 0)
      j << ",\n  \"chronus_ms\": " << json_summary(xs);
    j << ",\n  \"failures\": [";
    for (size_t i = 0; i < fails.size(); ++i)
      j << (i ? ", " : "") << "{\"message\": " << dsec::json_quoted(fails[i].first)
        << ", \"count\": " << fails[i].second.count << ", \"example\": "
        << dsec::json_quoted(fails[i].second.example) << "}";
    j << "],\n  \"environments\": [";
    for (size_t i = 0; i < o_.envs.size(); ++i)
      j << (i ? ", " : "") << "{\"environment\": " << dsec::json_quoted(o_.envs[i].label)
        << ", \"where\": " << dsec::json_quoted(o_.envs[i].where) << ", \"episodes\": "
        << env_episodes_[i] << ", \"created\": " << env_created_[i] << ", \"failed\": "
        << env_failed_[i] << "}";
    j << "],\n  \"exit_status\": " << status << "\n}\n";
    auto write = [&](const char* flag, const std::string& path, const std::string& text) {
      std::ofstream out{path, std::ios::trunc};
      out << text;
      out.close();
      if (!out) {
        std::fprintf(stderr, "dsec-load: %s: cannot write %s\n", flag, path.c_str());
        if (status == 0)
          status = 1;
      }
    };
    if (!o_.json_path.empty())
      write("--json", o_.json_path, j.str());
    if (!o_.report_path.empty()) {
      dsec::load::report_input in;
      in.title = "dsec-load: " + std::to_string(o_.count) + " episodes, concurrency "
                 + std::to_string(o_.concurrency) + (o_.hold ? ", --hold" : "");
      in.summary_json = j.str();
      in.wall_s = wall;
      in.create = create_times_;
      in.exec = exec_times_;
      in.destroy = destroy_times_;
      in.chronus = chronus_times_;
      in.failure_at_s = failure_at_s_;
      write("--report", o_.report_path, dsec::load::report_html(in));
      write("--report", report_json_path(o_.report_path), dsec::load::report_json(in));
    }
  }
  return status;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  if (auto r = parse_options(argc, argv, o))
    return *r;

  // Every thread (CAF's, an embedded engine's) inherits these blocked; the main
  // loop polls for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  caf::actor_system_config cfg;
  if (auto ok = dsec::client::configure(cfg, o.tls); !ok) {
    std::fprintf(stderr, "dsec-load: --tls %s: %s\n", o.tls.dir.c_str(),
                 ok.error_value().to_string().c_str());
    return 1;
  }
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", size_t{2});
  cfg.set("logger.console", caf::atom("none"));
  caf::actor_system sys{cfg};

  std::unique_ptr<dsec::daemon> d;
  std::unique_ptr<dsec::client> c;
  if (o.embedded) {
    dsec::daemon_options dopts;
    dopts.state_dir = o.state_dir;
    // Room for everything this run can hold at once.
    uint64_t most = o.hold ? o.count : o.concurrency;
    dopts.slots = static_cast<uint32_t>(std::max<uint64_t>(dopts.slots, most));
    auto r = dsec::daemon::start(sys, dopts);
    if (!r) {
      std::fprintf(stderr, "dsec-load: --embedded: starting the daemon over %s: %s\n",
                   o.state_dir.c_str(), r.error_value().to_string().c_str());
      return 1;
    }
    d = std::move(*r);
    c = dsec::client::attach(sys, d->scheduler());
  } else {
    auto r = dsec::client::connect(sys, o.connect_host, o.connect_port);
    if (!r) {
      std::fprintf(stderr, "dsec-load: --connect %s:%u: %s\n", o.connect_host.c_str(),
                   o.connect_port, r.error_value().to_string().c_str());
      return 1;
    }
    c = std::move(*r);
  }

  // Each session's quota covers every sandbox it can ever get: its share of
  // the create requests, whole batches.
  uint64_t requests = (o.count + o.batch - 1) / o.batch;
  uint64_t share = (requests + o.sessions - 1) / o.sessions * o.batch;
  std::vector<std::unique_ptr<dsec::session>> sessions;
  int status = 1;
  {
    std::vector<std::unique_ptr<dsec::event_stream>> watches;
    std::unique_ptr<runner> run;
    bool ok = true;
    for (uint64_t i = 0; i < o.sessions && ok; ++i) {
      dsec::session_options so;
      so.quota = static_cast<uint32_t>(std::min<uint64_t>(share, UINT32_MAX));
      so.name = "dsec-load-" + std::to_string(::getpid()) + "-" + std::to_string(i);
      auto s = c->open_session(so);
      if (!s) {
        std::fprintf(stderr, "dsec-load: opening session %llu: %s\n",
                     static_cast<unsigned long long>(i), s.error_value().to_string().c_str());
        ok = false;
        break;
      }
      sessions.push_back(std::move(*s));
    }
    if (ok) {
      run = std::make_unique<runner>(o, *c, sessions);
      if (o.events > 0)
        for (auto& s : sessions) {
          auto w = s->watch([r = run.get()](const dsec::chronus_event& ev) { r->on_event(ev); });
          if (!w) {
            std::fprintf(stderr, "dsec-load: watching session %s: %s\n", s->id().c_str(),
                         w.error_value().to_string().c_str());
            ok = false;
            break;
          }
          watches.push_back(std::move(*w));
        }
    }
    if (ok) {
      int sig = run->run(stop);
      watches.clear();
      // Nothing of this run may be left on the node: close the sessions (a
      // no-op for those closed by a stop), then check.
      for (auto& s : sessions)
        (void) s->close();
      if (auto l = c->list()) {
        std::set<std::string> ours;
        for (auto& s : sessions)
          ours.insert(s->id());
        size_t left = 0;
        for (const auto& info : *l)
          if (ours.count(info.session)) {
            ++left;
            (void) c->destroy(info.id);
          }
        if (left)
          std::fprintf(stderr, "dsec-load: %zu sandboxes of this run were still on the node after "
                       "closing its sessions; destroyed them\n", left);
      }
      status = run->report(sig);
    }
    watches.clear();
    sessions.clear();
    run.reset();
  }
  c.reset();
  if (d) {
    auto n = d->shutdown();
    if (!n) {
      std::fprintf(stderr, "dsec-load: shutting the embedded daemon down: %s\n",
                   n.error_value().to_string().c_str());
      if (status == 0)
        status = 1;
    }
    d.reset();
  }
  return status;
}
