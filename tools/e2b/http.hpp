// dsec-e2b's HTTP/1.1 server (Boost.Beast): keep-alive connections, one
// request at a time on each (no pipelining), bodies read whole (chunked or
// not) up to a limit, responses whole or streamed as chunks. It knows nothing
// of E2B: every request goes to one handler with a responder to answer it on,
// unless a router takes the connection whole as a byte tunnel to another
// server (a sandbox's port). No CAF here; the handler and the router may
// answer from any thread.
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

class body_stream;

struct http_request {
  std::string method;                         ///< "GET", "POST", ...
  std::string path;                           ///< the target before '?', percent-decoded
  std::map<std::string, std::string> query;   ///< decoded query parameters (last one wins)
  std::map<std::string, std::string> headers; ///< lower-case names
  std::string body;
  /// Instead of `body`, for a request server_options::streams_body picked:
  /// its body as it arrives.
  std::shared_ptr<body_stream> stream;
  [[nodiscard]] std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string{} : it->second;
  }
};

using header_list = std::vector<std::pair<std::string, std::string>>;

/// A request body read as it arrives (a client-streaming call), in pieces, each
/// read only once the one before was taken: a handler that does not take
/// more holds the client back (TCP's flow control), nothing grows.
class body_stream {
public:
  virtual ~body_stream() = default;
  /// Starts reading: `on_piece(data, more)` for each piece (on the server's
  /// thread), where calling `more()` (once, from any thread) reads the next;
  /// then `on_end(ok)` once: true at the body's end, false if it broke (the
  /// client went away or sent a bad chunk, or sent nothing for 300 s).
  virtual void read(std::function<void(std::string data, std::function<void()> more)> on_piece,
                    std::function<void(bool ok)> on_end) = 0;
};

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

/// What a router decides for a connection it took: splice it to host:port
/// (port > 0), or answer `status` with the JSON `body` and close.
struct route {
  std::string host;
  uint16_t port = 0;
  std::vector<std::string> strip; ///< lower-case header names not passed on
  std::string unanswered;         ///< the 502's message should the target send nothing
  int status = 0;
  std::string body;
};

/// Sees each request's head (no body read yet). Returns false to leave it to
/// the handler; true to take the connection, and then calls `decide` once,
/// from any thread. A taken connection is a tunnel from then on: its head (less
/// the headers route.strip names), the bytes after it and everything later go
/// to the target unparsed, and the target's bytes come back, until both sides
/// have closed their ends. Should the target close or reset before it sent a
/// byte, the client gets a 502 naming it instead.
using router = std::function<bool(const http_request& head, std::function<void(route)> decide)>;

struct server_options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;        ///< 0: any free port
  unsigned threads = 2;
  uint64_t body_limit = 256ull << 20;
  unsigned max_tunnels = 4096; ///< a router's tunnels at once; past it a 503
  /// Which requests (by their head) get their body as a stream
  /// (http_request::stream) rather than whole. A response given before such
  /// a body ended closes the connection after it.
  std::function<bool(const http_request& head)> streams_body;
};

class server {
public:
  /// Binds and listens (nothing served before run()).
  static expected<std::unique_ptr<server>> listen(const server_options& o, handler h,
                                                  router rt = {});
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
