#include "runtime/metrics_http.hpp"

#include <httplib.h>

#include "runtime/status_page.hpp"

#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <thread>

namespace dsec {

struct metrics_http::impl {
  std::unique_ptr<metrics::status_history> history; // outlives the server
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
};

namespace {

// Equal without telling by its timing how much of a guess was right.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size())
    return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

} // namespace

expected<std::unique_ptr<metrics_http>> metrics_http::start(metrics_http_options opts,
                                                            metrics::registry& reg) {
  std::unique_ptr<metrics_http> m{new metrics_http};
  m->impl_ = std::make_unique<impl>();
  std::string where = opts.host + ":" + std::to_string(opts.port);
  if (!opts.tls_dir.empty()) {
    auto ca = opts.tls_dir + "/ca.pem", cert = opts.tls_dir + "/cert.pem",
         key = opts.tls_dir + "/key.pem";
    // A client must present a certificate signed by ca.pem (verify peer, fail without one).
    auto s = std::make_unique<httplib::SSLServer>(cert.c_str(), key.c_str(), ca.c_str());
    if (!s->is_valid())
      return make_error(errc::invalid_argument,
                        "--metrics: cannot load the TLS files of " + opts.tls_dir
                          + " (ca.pem, cert.pem, key.pem)");
    m->impl_->server = std::move(s);
  } else {
    m->impl_->server = std::make_unique<httplib::Server>();
  }
  auto& srv = *m->impl_->server;
  // Two threads are plenty for a scraper or two; a slow client is cut off.
  srv.new_task_queue = [] { return new httplib::ThreadPool(2); };
  srv.set_read_timeout(std::chrono::seconds(5));
  srv.set_write_timeout(std::chrono::seconds(5));
  srv.set_keep_alive_timeout(5);
  srv.set_payload_max_length(4096);
  // httplib's default sets SO_REUSEPORT, which would let another process bind
  // the same port and take scrapes: only SO_REUSEADDR (a restart rebinds).
  srv.set_socket_options([](int sock) {
    int yes = 1;
    (void) ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  auto token = opts.token;
  auto authorized = [token](const httplib::Request& req, httplib::Response& res) {
    if (token.empty())
      return true;
    auto h = req.get_header_value("Authorization");
    if (h.rfind("Bearer ", 0) == 0 && same_secret(h.substr(7), token))
      return true;
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer");
    res.set_content("a bearer token is required (dsecd --metrics-token)\n", "text/plain");
    return false;
  };
  metrics::registry* r = &reg;
  srv.Get("/metrics", [=](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res))
      return;
    res.set_content(r->expose(), "text/plain; version=0.0.4; charset=utf-8");
  });
  srv.Get("/healthz", [=](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res))
      return;
    res.set_content("ok\n", "text/plain");
  });
  auto ready = opts.ready;
  srv.Get("/readyz", [=](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res))
      return;
    auto why = ready ? ready() : std::nullopt;
    if (why) {
      res.status = 503;
      res.set_content("not ready: " + *why + "\n", "text/plain");
    } else {
      res.set_content("ready\n", "text/plain");
    }
  });
  // The status page: the HTML holds no figures (a browser asks for it without
  // the token; its script sends the one of the URL's fragment), the JSON does.
  m->impl_->history = std::make_unique<metrics::status_history>(reg, opts.status_interval);
  metrics::status_history* history = m->impl_->history.get();
  srv.Get("/status", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics::status_html(), "text/html; charset=utf-8");
  });
  srv.Get("/status.json", [=](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res))
      return;
    res.set_content(history->json(), "application/json");
  });
  if (opts.port == 0) {
    int p = srv.bind_to_any_port(opts.host);
    if (p <= 0)
      return make_error(errc::system_error, "--metrics: cannot listen on " + opts.host
                                              + " (any port)");
    m->port_ = static_cast<uint16_t>(p);
  } else {
    if (!srv.bind_to_port(opts.host, opts.port))
      return make_error(errc::system_error, "--metrics: cannot listen on " + where
                                              + " (in use, or not an address of this machine)");
    m->port_ = opts.port;
  }
  m->impl_->thread = std::thread([&srv] { srv.listen_after_bind(); });
  // stop() only works once the loop runs: wait for it.
  while (!srv.is_running())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return m;
}

metrics_http::~metrics_http() {
  if (impl_ && impl_->server) {
    impl_->server->stop();
    if (impl_->thread.joinable())
      impl_->thread.join();
  }
}

expected<std::string> load_metrics_token(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) < 0)
    return sys_error("reading the metrics token", path);
  if ((st.st_mode & 077) != 0)
    return make_error(errc::invalid_argument,
                      "--metrics-token: " + path
                        + " is open to its group or others (chmod 600 it)");
  std::ifstream in(path);
  std::string t;
  std::getline(in, t);
  while (!t.empty() && (t.back() == '\r' || t.back() == ' '))
    t.pop_back();
  if (t.size() < 16)
    return make_error(errc::invalid_argument,
                      "--metrics-token: " + path + " holds no token of at least 16 characters");
  return t;
}

} // namespace dsec
