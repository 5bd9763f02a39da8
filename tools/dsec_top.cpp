// dsec-top: `dsec top`, a terminal view of dsecds' /metrics (docs/observability.md),
// redrawn every interval: per daemon the creates/s, the create latency's p50
// and p99 over the interval, live sandboxes, free slots, pooled ones, the
// layer cache, failures/s and the daemon's memory. `dsec` execs this (it is
// static; this links cpp-httplib).
#include <httplib.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/endpoint.hpp"
#include "runtime/metrics_http.hpp"
#include "runtime/metrics_text.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/cli.hpp"

namespace {

const char* usage = R"(usage: dsec top [--interval DUR] [--iterations N] [--token FILE] [--tls DIR]
                HOST:PORT...

A terminal view of the daemons whose `dsecd --metrics HOST:PORT` addresses are
given, redrawn every --interval (default 1s): for each, its creates per second,
the p50 and p99 of the create latency over the last interval (ms; - when
nothing was created), live sandboxes, free slots, pooled sandboxes, the layer
cache (mounted bytes, hit ratio), failures per second and the daemon's RSS. A
coordinator's row counts its own node; its view of the cluster (nodes up, the
oldest heartbeat) is on the line below the table.

  --interval DUR   between two redraws (100ms to 1h)
  --iterations N   stop after N redraws (default: until interrupted)
  --token FILE     the bearer token of a dsecd started with --metrics-token
  --tls DIR        HTTPS, for a dsecd started with --tls: the daemons'
                   certificates must be signed by DIR/ca.pem, and this
                   presents DIR/cert.pem and DIR/key.pem (signed by that CA)
  -h, --help       this text
)";

struct target {
  std::string host;
  uint16_t port = 0;
  std::string name;
  std::optional<std::vector<dsec::metrics::sample>> last;
  std::chrono::steady_clock::time_point last_at;
};

std::string ms(double seconds) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", seconds * 1000);
  return b;
}

} // namespace

int main(int argc, char** argv) {
  dsec::cli::args a{argc, argv, 1};
  std::chrono::milliseconds interval{1000};
  uint64_t iterations = 0;
  std::string token, tls;
  std::vector<target> targets;
  auto bad = [](const std::string& m) {
    std::fprintf(stderr, "dsec top: %s\nTry 'dsec top --help'.\n", m.c_str());
    return 2;
  };
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(usage, stdout);
      return 0;
    }
    std::string v;
    auto opt = [&](const char* name) {
      auto r = a.option(name, v);
      if (!r) {
        std::fprintf(stderr, "dsec top: %s\n", r.error_value().message.c_str());
        std::exit(2);
      }
      return *r;
    };
    if (opt("--interval")) {
      auto d = dsec::parse_duration(v, "--interval");
      if (!d)
        return bad(d.error_value().message);
      if (*d < std::chrono::milliseconds(100) || *d > std::chrono::hours(1))
        return bad("--interval: expected a duration from 100ms to 1h, got '" + v + "'");
      interval = *d;
    } else if (opt("--iterations")) {
      if (!dsec::cli::parse_uint(v, 1'000'000'000, iterations) || iterations == 0)
        return bad("--iterations: expected a whole number from 1, got '" + v + "'");
    } else if (opt("--tls")) {
      for (const char* f : {"/ca.pem", "/cert.pem", "/key.pem"})
        if (::access((v + f).c_str(), R_OK) != 0)
          return bad("--tls: cannot read " + v + f + ": " + std::strerror(errno));
      tls = v;
    } else if (opt("--token")) {
      auto t = dsec::load_metrics_token(v);
      if (!t) {
        std::fprintf(stderr, "dsec top: %s\n", t.error_value().to_string().c_str());
        return 1;
      }
      token = *t;
    } else {
      std::string w{a.next()};
      if (!w.empty() && w[0] == '-')
        return bad("unknown option '" + w + "'");
      auto ep = dsec::parse_endpoint(w, "a metrics address");
      if (!ep)
        return bad(ep.error_value().message);
      target t;
      t.host = ep->host == "localhost" ? "127.0.0.1" : ep->host;
      t.port = ep->port;
      t.name = dsec::format_endpoint(t.host, t.port);
      targets.push_back(std::move(t));
    }
  }
  if (targets.empty())
    return bad("give the --metrics HOST:PORT of at least one dsecd");
  bool tty = ::isatty(STDOUT_FILENO) == 1;
  for (uint64_t frame = 1; iterations == 0 || frame <= iterations; ++frame) {
    auto t0 = std::chrono::steady_clock::now();
    std::string out;
    char line[512];
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    ::localtime_r(&now, &tm);
    char when[32];
    std::strftime(when, sizeof when, "%H:%M:%S", &tm);
    std::snprintf(line, sizeof line, "dsec top  %s  every %.1fs  %zu daemon%s\n\n", when,
                  static_cast<double>(interval.count()) / 1000, targets.size(),
                  targets.size() == 1 ? "" : "s");
    out += line;
    std::snprintf(line, sizeof line, "%-22s %9s %8s %8s %7s %7s %7s %16s %7s %9s\n", "DAEMON",
                  "CREATES/S", "P50MS", "P99MS", "LIVE", "FREE", "POOLED", "CACHE", "ERR/S",
                  "RSS");
    out += line;
    std::string cluster;
    for (auto& t : targets) {
      auto where = (tls.empty() ? "http://" : "https://") + t.name;
      httplib::Client c = tls.empty() ? httplib::Client(where)
                                      : httplib::Client(where, tls + "/cert.pem", tls + "/key.pem");
      if (!tls.empty()) {
        c.set_ca_cert_path(tls + "/ca.pem");
        c.enable_server_certificate_verification(true);
      }
      c.set_connection_timeout(std::chrono::milliseconds(800));
      c.set_read_timeout(std::chrono::milliseconds(800));
      httplib::Headers h;
      if (!token.empty())
        h.emplace("Authorization", "Bearer " + token);
      auto res = c.Get("/metrics", h);
      auto at = std::chrono::steady_clock::now();
      std::optional<std::vector<dsec::metrics::sample>> s;
      std::string why;
      if (!res)
        why = "unreachable (" + httplib::to_string(res.error()) + ")";
      else if (res->status != 200)
        why = "HTTP " + std::to_string(res->status);
      else if (auto p = dsec::metrics::parse_text(res->body); !p)
        why = p.error_value().message;
      else
        s = std::move(*p);
      if (!s) {
        std::snprintf(line, sizeof line, "%-22s %s\n", t.name.c_str(), why.c_str());
        out += line;
        t.last.reset();
        continue;
      }
      using dsec::metrics::sum_of;
      std::string rate = "-", p50 = "-", p99 = "-", errs = "-";
      if (t.last) {
        double dt = std::chrono::duration<double>(at - t.last_at).count();
        double dc = sum_of(*s, "dsec_sandbox_creates_total")
                    - sum_of(*t.last, "dsec_sandbox_creates_total");
        double df = sum_of(*s, "dsec_sandbox_failures_total")
                    - sum_of(*t.last, "dsec_sandbox_failures_total");
        char b[32];
        std::snprintf(b, sizeof b, "%.1f", std::max(0.0, dc) / dt);
        rate = b;
        std::snprintf(b, sizeof b, "%.1f", std::max(0.0, df) / dt);
        errs = b;
        auto d = dsec::metrics::difference(
          dsec::metrics::histogram_of(*s, "dsec_sandbox_create_seconds"),
          dsec::metrics::histogram_of(*t.last, "dsec_sandbox_create_seconds"));
        if (d.count() > 0) {
          p50 = ms(d.quantile(0.5));
          p99 = ms(d.quantile(0.99));
        }
      }
      double hits = sum_of(*s, "dsec_layer_cache_hits_total");
      double misses = sum_of(*s, "dsec_layer_cache_misses_total");
      std::string cache = dsec::format_size(static_cast<uint64_t>(sum_of(*s, "dsec_layer_cache_bytes")));
      if (hits + misses > 0) {
        char b[32];
        std::snprintf(b, sizeof b, " %.0f%%", 100 * hits / (hits + misses));
        cache += b;
      }
      auto slots = sum_of(*s, "dsec_slots"), used = sum_of(*s, "dsec_slots_used");
      std::snprintf(line, sizeof line, "%-22s %9s %8s %8s %7.0f %7.0f %7.0f %16s %7s %9s\n",
                    t.name.c_str(), rate.c_str(), p50.c_str(), p99.c_str(),
                    sum_of(*s, "dsec_sandboxes_live"), std::max(0.0, slots - used),
                    sum_of(*s, "dsec_sandboxes_pooled"), cache.c_str(), errs.c_str(),
                    dsec::format_size(static_cast<uint64_t>(
                                        sum_of(*s, "process_resident_memory_bytes")))
                      .c_str());
      out += line;
      // A coordinator's view of its nodes.
      double up = 0, lost = 0, oldest = 0;
      for (const auto& x : *s) {
        if (x.name == "dsec_cluster_node_up")
          (x.value > 0 ? up : lost) += 1;
        if (x.name == "dsec_cluster_node_heartbeat_age_seconds")
          oldest = std::max(oldest, x.value);
      }
      if (up + lost > 0) {
        std::snprintf(line, sizeof line, "  cluster of %s: %.0f nodes up, %.0f lost, oldest heartbeat %s ms\n",
                      t.name.c_str(), up, lost, ms(oldest).c_str());
        cluster += line;
      }
      t.last = std::move(s);
      t.last_at = at;
    }
    if (!cluster.empty())
      out += "\n" + cluster;
    if (tty)
      std::fputs("\x1b[H\x1b[2J", stdout);
    else if (frame > 1)
      std::fputs("\n", stdout);
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
    if (iterations != 0 && frame == iterations)
      break;
    std::this_thread::sleep_until(t0 + interval);
  }
  return 0;
}
