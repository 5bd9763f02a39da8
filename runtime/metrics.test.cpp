#include "runtime/metrics.hpp"
#include "runtime/metrics_http.hpp"
#include "runtime/metrics_text.hpp"

#include <cmath>

#include <doctest/doctest.h>
#include <httplib.h>

#include <thread>

using namespace dsec;

TEST_CASE("metrics: counters, gauges and histograms in the text format") {
  metrics::registry r;
  r.get_counter("dsec_x_total", "Things.", {{"reason", "a\"b\\c\nd"}}).inc(3);
  r.get_counter("dsec_x_total", "Things.", {{"reason", "plain"}}).inc();
  r.get_gauge("dsec_g", "A level.").set(2.5);
  auto& h = r.get_histogram("dsec_h_seconds", "Times.", {0.1, 1});
  h.observe(0.05);
  h.observe(0.1); // le is inclusive
  h.observe(0.5);
  h.observe(7);
  auto text = r.expose();
  CHECK(text.find("# HELP dsec_x_total Things.\n# TYPE dsec_x_total counter\n")
        != std::string::npos);
  CHECK(text.find("dsec_x_total{reason=\"a\\\"b\\\\c\\nd\"} 3\n") != std::string::npos);
  CHECK(text.find("dsec_x_total{reason=\"plain\"} 1\n") != std::string::npos);
  CHECK(text.find("# TYPE dsec_g gauge\ndsec_g 2.5\n") != std::string::npos);
  CHECK(text.find("dsec_h_seconds_bucket{le=\"0.1\"} 2\n") != std::string::npos);
  CHECK(text.find("dsec_h_seconds_bucket{le=\"1\"} 3\n") != std::string::npos);
  CHECK(text.find("dsec_h_seconds_bucket{le=\"+Inf\"} 4\n") != std::string::npos);
  CHECK(text.find("dsec_h_seconds_sum 7.65\n") != std::string::npos);
  CHECK(text.find("dsec_h_seconds_count 4\n") != std::string::npos);
  CHECK(r.value("dsec_x_total", {{"reason", "plain"}}) == 1);
  CHECK(r.value("dsec_g") == 2.5);
  CHECK(r.value("dsec_missing") == 0);
  // Values: the shortest text that reads back the same.
  CHECK(metrics::format_value(0.0001) == "0.0001");
  CHECK(metrics::format_value(0.1 + 0.2) == "0.30000000000000004");
  CHECK(metrics::format_value(42) == "42");
  CHECK(metrics::format_value(INFINITY) == "+Inf");
  CHECK(metrics::format_value(std::nan("")) == "NaN");
}

TEST_CASE("metrics: the same name and labels give the same metric; misuse is a bug") {
  metrics::registry r;
  auto& a = r.get_counter("dsec_a_total", "A.", {{"k", "v"}});
  CHECK(&a == &r.get_counter("dsec_a_total", "A.", {{"k", "v"}}));
  CHECK(&a != &r.get_counter("dsec_a_total", "A.", {{"k", "w"}}));
  CHECK_THROWS_AS(r.get_gauge("dsec_a_total", "A."), std::logic_error);
  CHECK_THROWS_AS(r.get_counter("dsec_a_total", "A.", {{"other", "v"}}), std::logic_error);
  CHECK_THROWS_AS(r.get_counter("0bad", "A."), std::logic_error);
  CHECK_THROWS_AS(r.get_counter("dsec_b_total", "B.", {{"le", "1"}}), std::logic_error);
  CHECK_THROWS_AS(metrics::histogram({1, 0.5}), std::logic_error);
}

TEST_CASE("metrics: histogram quantiles interpolate as PromQL's histogram_quantile") {
  metrics::histogram h({1, 2, 4});
  CHECK(h.read().quantile(0.5) == 0);
  for (int i = 0; i < 10; ++i)
    h.observe(1.5); // all in (1, 2]
  auto s = h.read();
  CHECK(s.count() == 10);
  CHECK(s.quantile(0.5) == doctest::Approx(1.5));
  CHECK(s.quantile(0.9) == doctest::Approx(1.9));
  h.observe(100); // +Inf: the highest finite bound
  CHECK(h.read().quantile(1.0) == 4);
}

TEST_CASE("metrics: concurrent observations are all counted") {
  metrics::registry r;
  auto& c = r.get_counter("dsec_n_total", "N.");
  auto& h = r.get_histogram("dsec_t_seconds", "T.", metrics::latency_buckets());
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.inc();
        h.observe(0.001 * (i % 7));
      }
    });
  for (auto& t : ts)
    t.join();
  CHECK(c.value() == 40000);
  CHECK(h.read().count() == 40000);
}

TEST_CASE("metrics: the process collector reports this process") {
  metrics::registry r;
  metrics::add_process_collector(r);
  auto text = r.expose();
  CHECK(text.find("# TYPE process_cpu_seconds_total counter\n") != std::string::npos);
  auto at = text.find("\nprocess_resident_memory_bytes ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(text.substr(at + 31)) > 1e6); // a process of ours has more than a megabyte
  at = text.find("\nprocess_start_time_seconds ");
  REQUIRE(at != std::string::npos);
  double start = std::stod(text.substr(at + 28));
  CHECK(start > static_cast<double>(::time(nullptr)) - 86400 * 365);
  CHECK(start <= static_cast<double>(::time(nullptr)) + 1);
}

TEST_CASE("metrics_http: /metrics, /healthz and /readyz over real HTTP on loopback") {
  metrics::registry r;
  r.get_counter("dsec_served_total", "Served.").inc(5);
  std::atomic<bool> ready{false};
  metrics_http_options o;
  o.ready = [&]() -> std::optional<std::string> {
    if (ready)
      return std::nullopt;
    return std::string{"draining"};
  };
  auto srv = metrics_http::start(o, r);
  REQUIRE(srv);
  REQUIRE((*srv)->port() != 0);
  httplib::Client cli("127.0.0.1", (*srv)->port());
  auto res = cli.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type").find("version=0.0.4") != std::string::npos);
  CHECK(res->body.find("dsec_served_total 5\n") != std::string::npos);
  res = cli.Get("/healthz");
  REQUIRE(res);
  CHECK(res->status == 200);
  res = cli.Get("/readyz");
  REQUIRE(res);
  CHECK(res->status == 503);
  CHECK(res->body.find("draining") != std::string::npos);
  ready = true;
  res = cli.Get("/readyz");
  REQUIRE(res);
  CHECK(res->status == 200);
  res = cli.Get("/nothing");
  REQUIRE(res);
  CHECK(res->status == 404);
  // A port in use is refused, naming it.
  metrics_http_options again;
  again.port = (*srv)->port();
  auto clash = metrics_http::start(again, r);
  REQUIRE_FALSE(clash);
  CHECK(clash.error_value().message.find(std::to_string(again.port)) != std::string::npos);
}

TEST_CASE("metrics_http: a bearer token is required when one is set") {
  metrics::registry r;
  metrics_http_options o;
  o.token = "0123456789abcdef0123";
  auto srv = metrics_http::start(o, r);
  REQUIRE(srv);
  httplib::Client cli("127.0.0.1", (*srv)->port());
  auto res = cli.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 401);
  res = cli.Get("/metrics", {{"Authorization", "Bearer 0123456789abcdef0124"}});
  REQUIRE(res);
  CHECK(res->status == 401);
  res = cli.Get("/metrics", {{"Authorization", "Bearer 0123456789abcdef0123"}});
  REQUIRE(res);
  CHECK(res->status == 200);
}

TEST_CASE("metrics_text: what expose() prints parses back, sums and histograms") {
  metrics::registry r;
  r.get_counter("dsec_c_total", "C.", {{"backend", "container"}, {"reason", "x\"y"}}).inc(2);
  r.get_counter("dsec_c_total", "C.", {{"backend", "vm"}, {"reason", "z"}}).inc(5);
  auto& h1 = r.get_histogram("dsec_l_seconds", "L.", {0.1, 1}, {{"backend", "a"}});
  auto& h2 = r.get_histogram("dsec_l_seconds", "L.", {0.1, 1}, {{"backend", "b"}});
  h1.observe(0.05);
  h2.observe(0.5);
  auto before = metrics::parse_text(r.expose());
  REQUIRE(before);
  h2.observe(0.7);
  h2.observe(3);
  auto s = metrics::parse_text(r.expose());
  REQUIRE(s);
  CHECK(metrics::sum_of(*s, "dsec_c_total") == 7);
  CHECK(metrics::sum_of(*s, "dsec_c_total", {{"backend", "vm"}}) == 5);
  CHECK(metrics::sum_of(*s, "dsec_c_total", {{"reason", "x\"y"}}) == 2);
  auto h = metrics::histogram_of(*s, "dsec_l_seconds");
  CHECK(h.bounds == std::vector<double>{0.1, 1});
  CHECK(h.cumulative == std::vector<uint64_t>{1, 3, 4});
  CHECK(h.sum == doctest::Approx(4.25));
  auto d = metrics::difference(h, metrics::histogram_of(*before, "dsec_l_seconds"));
  CHECK(d.cumulative == std::vector<uint64_t>{0, 1, 2});
  CHECK(d.count() == 2);
}

TEST_CASE("metrics_text: a malformed line is refused, naming its number") {
  auto r = metrics::parse_text("# HELP a A\na 1\nb{x=\"1\" 2\n");
  REQUIRE_FALSE(r);
  CHECK(r.error_value().code == errc::malformed);
  CHECK(r.error_value().message.find("line 3") != std::string::npos);
  CHECK_FALSE(metrics::parse_text("a one\n"));
  CHECK_FALSE(metrics::parse_text("{x=\"1\"} 1\n"));
  auto ok = metrics::parse_text("a 1 1700000000000\nb +Inf\n");
  REQUIRE(ok);
  CHECK(ok->size() == 2);
  CHECK(std::isinf((*ok)[1].value));
}
