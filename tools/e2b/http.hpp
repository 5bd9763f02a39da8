// dsec-e2b's HTTP/1.1 server (Boost.Beast): keep-alive connections, one
// request at a time on each (no pipelining), bodies read whole (chunked or
// not) up to a limit, responses whole or streamed as chunks. It knows nothing
// of E2B: every request goes to one handler with a responder to answer it on.
// No CAF here; the handler may answer from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.hpp"

namespace dsec::e2b {

struct http_request {
  std::string method;                         ///< "GET", "POST", ...
  std::string path;                           ///< the target before '?', percent-decoded
  std::map<std::string, std::string> query;   ///< decoded query parameters (last one wins)
  std::map<std::string, std::string> headers; ///< lower-case names
  std::string body;
  [[nodiscard]] std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string{} : it->second;
  }
};

using header_list = std::vector<std::pair<std::string, std::string>>;

/// Answers one request. Thread-safe; every call after the response ended (or
/// the client went away) is dropped.
class responder {
public:
  virtual ~responder() = default;
  /// A whole response.
  virtual void reply(int status, const std::string& content_type, std::string body,
                     header_list extra = {}) = 0;
  /// A streamed response: its header now (Transfer-Encoding: chunked) ...
  virtual void start_stream(int status, const std::string& content_type) = 0;
  /// ... its pieces ...
  virtual void write(std::string data) = 0;
  /// ... a piece written every `every` until the stream ends ...
  virtual void keepalive(std::chrono::milliseconds every, std::string data) = 0;
  /// ... and its end.
  virtual void finish() = 0;
  /// True once a write failed: the client is gone.
  [[nodiscard]] virtual bool gone() const = 0;
  /// Runs `f` once (on the server's thread) if the client goes away before
  /// the response ends: a write fails, or, while a stream is written, it
  /// closes its end. At once if it is gone already.
  virtual void on_gone(std::function<void()> f) = 0;
};

using handler = std::function<void(http_request, std::shared_ptr<responder>)>;

struct server_options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;        ///< 0: any free port
  unsigned threads = 2;
  uint64_t body_limit = 256ull << 20;
};

class server {
public:
  /// Binds and listens (nothing served before run()).
  static expected<std::unique_ptr<server>> listen(const server_options& o, handler h);
  [[nodiscard]] uint16_t port() const;
  /// Serves on o.threads threads until stop().
  void run();
  void stop();
  ~server();

  struct impl;
private:
  explicit server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

} // namespace dsec::e2b
