// dsec-e2b's HTTP server over Boost.Beast (see http.hpp). Each connection lives
// on its own strand: reads, writes, the keepalive timer and answers handed in
// from other threads are serialised there.
#include "tools/e2b/http.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <deque>
#include <optional>
#include <thread>

#include "runtime/hex.hpp"

#include <sys/socket.h>

namespace dsec::e2b {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

namespace {


// Percent-decoding of a URL component ('+' is a space in a query).
std::string decode(std::string_view s, bool query) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() &&
        hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2])));
      i += 2;
    } else if (query && s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// A request's method, decoded path and query, and headers (lower-case names).
http_request head_of(const bhttp::request_header<>& msg) {
  http_request req;
  req.method = std::string(msg.method_string().data(), msg.method_string().size());
  std::string_view target{msg.target().data(), msg.target().size()};
  auto q = target.find('?');
  req.path = decode(target.substr(0, q), false);
  if (q != std::string_view::npos) {
    auto rest = target.substr(q + 1);
    while (!rest.empty()) {
      auto amp = rest.find('&');
      auto part = rest.substr(0, amp);
      auto eq = part.find('=');
      if (!part.empty())
        req.query[decode(part.substr(0, eq), true)] =
          eq == std::string_view::npos ? std::string{} : decode(part.substr(eq + 1), true);
      if (amp == std::string_view::npos)
        break;
      rest = rest.substr(amp + 1);
    }
  }
  for (auto& f : msg) {
    std::string name(f.name_string().data(), f.name_string().size());
    for (auto& ch : name)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    req.headers[name] = std::string(f.value().data(), f.value().size());
  }
  return req;
}

// The head again as bytes, as it came (the target unchanged), less `strip`.
std::string wire_head(const bhttp::request_header<>& msg, const std::vector<std::string>& strip) {
  std::string out;
  out.append(msg.method_string().data(), msg.method_string().size()).push_back(' ');
  out.append(msg.target().data(), msg.target().size());
  out += msg.version() == 10 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n";
  for (auto& f : msg) {
    std::string name(f.name_string().data(), f.name_string().size());
    std::string lower = name;
    for (auto& ch : lower)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (std::find(strip.begin(), strip.end(), lower) != strip.end())
      continue;
    out += name;
    out += ": ";
    out.append(f.value().data(), f.value().size());
    out += "\r\n";
  }
  out += "\r\n";
  return out;
}

// A whole JSON response that ends its connection.
std::shared_ptr<bhttp::response<bhttp::string_body>> closing_reply(int status, std::string body,
                                                                   unsigned version = 11) {
  auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
    static_cast<bhttp::status>(status), version);
  res->set(bhttp::field::server, "dsec-e2b");
  res->set(bhttp::field::content_type, "application/json");
  res->body() = std::move(body);
  res->keep_alive(false);
  res->prepare_payload();
  return res;
}

// A connection a router took, spliced to its target: two fixed buffers, each
// direction reads only once its last piece was written (a side that does not
// read holds the other back, TCP's flow control holds the writer), a
// direction's EOF is passed on as a half-close, an error closes both.
class tunnel : public std::enable_shared_from_this<tunnel> {
public:
  tunnel(tcp::socket client, std::string first, std::atomic<unsigned>& count)
    : client_(std::move(client)), up_(client_.get_executor()), first_(std::move(first)),
      count_(count) {}
  ~tunnel() { --count_; }

  void start(const std::string& host, uint16_t port) {
    beast::error_code ec;
    auto addr = net::ip::make_address(host, ec);
    if (ec)
      return fail("the sandbox's port is at '" + host + "', not an IP address");
    up_.async_connect(tcp::endpoint{addr, port}, [self = shared_from_this(), host,
                                                  port](beast::error_code ec) {
      // (the node's forwarder accepts, then resets when nothing listens inside:
      // that reset may come as early as the connect's own completion)
      if (ec == net::error::connection_reset)
        return self->fail(self->unanswered);
      if (ec)
        return self->fail("cannot reach the sandbox's port at " + host + ":" +
                          std::to_string(port) + ": " + ec.message());
      beast::error_code ignore;
      self->up_.set_option(tcp::no_delay{true}, ignore);
      net::async_write(self->up_, net::buffer(self->first_),
                       [self](beast::error_code ec, size_t) {
                         if (ec)
                           return self->fail(self->unanswered);
                         self->first_.clear();
                         self->first_.shrink_to_fit();
                         self->pump(self->client_, self->up_, self->to_up_, true);
                         self->pump(self->up_, self->client_, self->to_client_, false);
                       });
    });
  }

  // Answers the client with a 502 naming `why`, then closes.
  void fail(const std::string& why) {
    auto res = closing_reply(
      502, std::string{"{\"code\":502,\"message\":"} + quoted(why) + "}");
    bhttp::async_write(client_, *res,
                       [self = shared_from_this(), res](beast::error_code, size_t) {
                         self->close();
                       });
  }

  std::string unanswered; // the 502's message when the target sends nothing

private:
  static std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\')
        out.push_back('\\');
      if (static_cast<unsigned char>(ch) >= 0x20)
        out.push_back(ch);
    }
    return out + "\"";
  }

  void pump(tcp::socket& from, tcp::socket& to, std::array<char, 64 * 1024>& buf, bool upward) {
    from.async_read_some(net::buffer(buf), [self = shared_from_this(), &from, &to, &buf,
                                            upward](beast::error_code ec, size_t n) {
      if (ec) {
        if (!upward && !self->answered_ && !self->closed_)
          return self->fail(self->unanswered);
        if (ec != net::error::eof)
          return self->close();
        beast::error_code ignore;
        to.shutdown(tcp::socket::shutdown_send, ignore);
        if (++self->ended_ == 2)
          self->close();
        return;
      }
      if (!upward)
        self->answered_ = true;
      net::async_write(to, net::buffer(buf.data(), n),
                       [self, &from, &to, &buf, upward](beast::error_code ec, size_t) {
                         if (ec)
                           return self->close();
                         self->pump(from, to, buf, upward);
                       });
    });
  }

  void close() {
    closed_ = true;
    beast::error_code ignore;
    client_.close(ignore);
    up_.close(ignore);
  }

  tcp::socket client_, up_;
  std::string first_;
  std::array<char, 64 * 1024> to_up_{}, to_client_{};
  bool answered_ = false; // the target sent a byte
  bool closed_ = false;
  int ended_ = 0;         // directions that saw their EOF
  std::atomic<unsigned>& count_;
};

class connection : public std::enable_shared_from_this<connection> {
public:
  connection(tcp::socket s, const handler& h, const router& rt, uint64_t limit,
             std::atomic<unsigned>& tunnels, unsigned max_tunnels,
             const std::function<bool(const http_request&)>& streams)
    : sock_(std::move(s)), timer_(sock_.get_executor()), handler_(h), router_(rt),
      limit_(limit), tunnels_(tunnels), max_tunnels_(max_tunnels), streams_(streams) {}

  void start() { read(); }

  // ---- called on the strand -------------------------------------------------------
  using job = std::function<void(std::function<void(beast::error_code)>)>;

  void push(job j, bool last) {
    if (broken_ || done_)
      return;
    if (last)
      done_ = true;
    queue_.push_back({std::move(j), last});
    if (!writing_)
      next_write();
  }

  // The client went away (a write failed, or it closed its end while a
  // stream was being written): the connection is closed and the current
  // response's on_gone callback runs, once.
  void lose() {
    if (!broken_) {
      broken_ = true;
      queue_.clear();
      timer_.cancel();
      beast::error_code ignore;
      sock_.shutdown(tcp::socket::shutdown_both, ignore);
      sock_.close(ignore);
      writing_ = false;
    }
    if (auto f = std::move(on_gone_)) {
      on_gone_ = nullptr;
      f();
    }
  }

  // While a stream is written, notices the client closing its end (a
  // readable socket with nothing to read): the handler learns at once that
  // nobody listens, not at its next write.
  void watch_peer() {
    sock_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this(), gen = generation_](beast::error_code ec) {
                       if (ec || self->generation_ != gen || self->broken_ ||
                           (self->done_ && !self->writing_))
                         return;
                       char b;
                       auto n = ::recv(self->sock_.native_handle(), &b, 1,
                                       MSG_PEEK | MSG_DONTWAIT);
                       if (n > 0)
                         return; // bytes of a next request: read after this response
                       if (n < 0 && (errno == EAGAIN || errno == EINTR))
                         return self->watch_peer();
                       self->lose();
                     });
  }

  [[nodiscard]] bool writing() const { return writing_; }
  std::function<void()> on_gone_; // the current response's
  bool keep_alive_ = true;
  bool broken_ = false;     // a write failed
  bool done_ = false;       // the response's last part is queued
  bool started_ = false;    // a response was begun
  unsigned generation_ = 0; // the request being answered
  tcp::socket sock_;
  net::steady_timer timer_;

private:
  struct item {
    job j;
    bool last;
  };

  // A request must arrive whole within this long of the last response (or of
  // the connection): an idle or trickling client is cut off.
  static constexpr auto request_timeout = std::chrono::seconds(300);

  void read() {
    parser_.emplace();
    parser_->body_limit(limit_);
    parser_->header_limit(64 * 1024);
    timer_.expires_after(request_timeout);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec)
        return; // cancelled: the request came
      beast::error_code ignore;
      self->sock_.close(ignore);
    });
    bhttp::async_read_header(sock_, buf_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                               if (!ec) // decoded once: the router, a stream, on_read use it
                                 self->head_ = head_of(self->parser_->get().base());
                               if (ec || !self->routed())
                                 if (ec || !self->streamed())
                                   self->read_body(ec);
                             });
  }

  // ---- a body read as it arrives (body_stream) ------------------------------------
  // The handler gets the request at once; its pieces are read on demand.
  bool streamed() {
    if (!streams_)
      return false;
    if (!streams_(head_))
      return false;
    auto head = std::move(head_);
    timer_.cancel(); // (each piece has its own idle timer)
    begin_request();
    keep_alive_ = parser_->get().keep_alive();
    body_pending_ = true;
    head.stream = std::make_shared<stream_of>(shared_from_this());
    dispatch(std::move(head), parser_->get().version());
    return true;
  }

  struct stream_of : body_stream {
    explicit stream_of(std::shared_ptr<connection> c) : c_(std::move(c)) {}
    void read(std::function<void(std::string, std::function<void()>)> on_piece,
              std::function<void(bool)> on_end) override {
      auto c = c_;
      net::dispatch(c->sock_.get_executor(), [c, on_piece = std::move(on_piece),
                                              on_end = std::move(on_end)]() mutable {
        c->on_piece_ = std::move(on_piece);
        c->on_end_ = std::move(on_end);
        c->next_piece();
      });
    }
    std::shared_ptr<connection> c_;
  };

  void end_body(bool ok) {
    if (ok)
      body_pending_ = false;
    if (auto f = std::move(on_end_)) {
      on_end_ = nullptr;
      on_piece_ = nullptr;
      f(ok);
    }
  }

  void next_piece() {
    if (!on_end_)
      return;
    if (parser_->is_done())
      return end_body(true);
    timer_.expires_after(request_timeout);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec)
        return; // the piece came
      beast::error_code ignore;
      self->sock_.close(ignore);
    });
    bhttp::async_read_some(
      sock_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
        if (!self->on_end_)
          return; // abandoned: answered already (the connection's timer closes it)
        self->timer_.cancel();
        if (ec) {
          self->keep_alive_ = false;
          return self->end_body(false);
        }
        auto piece = std::move(self->parser_->get().body());
        self->parser_->get().body().clear();
        if (piece.empty())
          return self->next_piece();
        auto more = [self] {
          net::dispatch(self->sock_.get_executor(), [self] { self->next_piece(); });
        };
        if (self->on_piece_)
          self->on_piece_(std::move(piece), more);
      });
  }

  void read_body(beast::error_code ec) {
    if (ec) {
      timer_.cancel();
      return on_read(ec);
    }
    bhttp::async_read(sock_, buf_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        self->timer_.cancel();
                        self->on_read(ec);
                      });
  }

  // Offers the head just read to the router: true if it took the connection.
  bool routed() {
    if (!router_)
      return false;
    auto decide = [self = shared_from_this()](route rt) {
      net::dispatch(self->sock_.get_executor(),
                    [self, rt = std::move(rt)]() mutable { self->tunnel_to(std::move(rt)); });
    };
    return router_(head_, decide);
  }

  void tunnel_to(route rt) {
    timer_.cancel();
    if (!sock_.is_open())
      return; // the request timer closed it meanwhile
    if (rt.port == 0 || tunnels_.load() >= max_tunnels_) {
      if (rt.port != 0) {
        rt.status = 503;
        rt.body = "{\"code\":503,\"message\":\"dsec-e2b has " + std::to_string(max_tunnels_) +
                  " connections to sandboxes' ports open, its limit\"}";
      }
      auto res = closing_reply(rt.status, std::move(rt.body), parser_->get().version());
      bhttp::async_write(sock_, *res, [self = shared_from_this(), res](beast::error_code, size_t) {
        beast::error_code ignore;
        self->sock_.shutdown(tcp::socket::shutdown_send, ignore);
        self->sock_.close(ignore);
      });
      return;
    }
    ++tunnels_;
    auto first = wire_head(parser_->get().base(), rt.strip);
    auto rest = buf_.data();
    first.append(static_cast<const char*>(rest.data()), rest.size());
    buf_.consume(buf_.size());
    auto t = std::make_shared<tunnel>(std::move(sock_), std::move(first), tunnels_);
    t->unanswered = rt.unanswered.empty() ? "nothing answered on the port" : rt.unanswered;
    t->start(rt.host, rt.port);
  }

  void on_read(beast::error_code ec);
  void begin_request() {
    ++generation_;
    started_ = false;
    done_ = false;
  }
  void dispatch(http_request req, unsigned version);

  void next_write() {
    if (queue_.empty() || broken_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    auto it = std::move(queue_.front());
    queue_.pop_front();
    it.j([self = shared_from_this(), last = it.last](beast::error_code ec) {
      if (ec)
        return self->lose();
      if (last) {
        self->timer_.cancel();
        self->writing_ = false;
        self->on_gone_ = nullptr;
        // (a response before its streamed body ended: the rest of the body
        // would be read as the next request, so the connection ends here)
        if (self->keep_alive_ && !self->body_pending_) {
          self->read();
        } else {
          beast::error_code ignore;
          self->sock_.shutdown(tcp::socket::shutdown_send, ignore);
          if (self->body_pending_) {
            // Nobody reads the rest of that body: the client has a while to
            // take the response and hang up, then the connection is closed.
            self->on_piece_ = nullptr;
            self->on_end_ = nullptr;
            self->timer_.expires_after(std::chrono::seconds(30));
            self->timer_.async_wait([self](beast::error_code ec) {
              if (ec)
                return;
              beast::error_code ignore2;
              self->sock_.close(ignore2);
            });
          }
        }
        return;
      }
      self->next_write();
    });
  }

  beast::flat_buffer buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<item> queue_;
  bool writing_ = false;
  const handler& handler_;
  const router& router_;
  uint64_t limit_;
  std::atomic<unsigned>& tunnels_;
  unsigned max_tunnels_;
  const std::function<bool(const http_request&)>& streams_;
  http_request head_; // the request being read, decoded once its header came
  // A streamed body's reader (its handler's callbacks) while it is read.
  std::function<void(std::string, std::function<void()>)> on_piece_;
  std::function<void(bool)> on_end_;
  bool body_pending_ = false; // a streamed body has not ended yet
};

class conn_responder : public responder {
public:
  conn_responder(std::shared_ptr<connection> c, unsigned version, bool keep_alive)
    : c_(std::move(c)), version_(version), keep_alive_(keep_alive) {}

  void reply(int status, const std::string& content_type, std::string body,
             header_list extra) override {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
      static_cast<bhttp::status>(status), version_);
    res->set(bhttp::field::server, "dsec-e2b");
    if (!content_type.empty())
      res->set(bhttp::field::content_type, content_type);
    for (auto& [k, v] : extra)
      res->set(k, v);
    res->body() = std::move(body);
    res->keep_alive(keep_alive_);
    res->prepare_payload();
    on_strand([res](connection& c) {
      if (c.started_)
        return;
      c.started_ = true;
      c.push(
        [&c, res](auto k) {
          bhttp::async_write(c.sock_, *res, [res, k](beast::error_code ec, size_t) { k(ec); });
        },
        true);
    });
  }

  void start_stream(int status, const std::string& content_type) override {
    auto res = std::make_shared<bhttp::response<bhttp::empty_body>>(
      static_cast<bhttp::status>(status), version_);
    res->set(bhttp::field::server, "dsec-e2b");
    res->set(bhttp::field::content_type, content_type);
    res->keep_alive(keep_alive_);
    res->chunked(true);
    on_strand([res](connection& c) {
      if (c.started_)
        return;
      c.started_ = true;
      auto sr = std::make_shared<bhttp::response_serializer<bhttp::empty_body>>(*res);
      c.push(
        [&c, res, sr](auto k) {
          bhttp::async_write_header(c.sock_, *sr,
                                    [res, sr, k](beast::error_code ec, size_t) { k(ec); });
        },
        false);
      c.watch_peer();
    });
  }

  void write(std::string data) override {
    if (data.empty())
      return;
    auto d = std::make_shared<std::string>(std::move(data));
    on_strand([d](connection& c) {
      if (!c.started_)
        return;
      c.push(
        [&c, d](auto k) {
          net::async_write(c.sock_, bhttp::make_chunk(net::buffer(*d)),
                           [d, k](beast::error_code ec, size_t) { k(ec); });
        },
        false);
    });
  }

  void keepalive(std::chrono::milliseconds every, std::string data) override {
    auto d = std::make_shared<std::string>(std::move(data));
    auto self = std::static_pointer_cast<conn_responder>(shared_from_this_());
    on_strand([self, every, d](connection&) { self->arm(every, d); });
  }

  void finish() override {
    on_strand([](connection& c) {
      if (!c.started_)
        return;
      c.push(
        [&c](auto k) {
          net::async_write(c.sock_, bhttp::make_chunk_last(),
                           [k](beast::error_code ec, size_t) { k(ec); });
        },
        true);
    });
  }

  [[nodiscard]] bool gone() const override { return gone_.load(); }

  void on_gone(std::function<void()> f) override {
    on_strand([f = std::move(f)](connection& c) mutable {
      if (c.broken_)
        return f();
      if (!c.done_ || c.writing())
        c.on_gone_ = std::move(f);
    });
  }

  std::weak_ptr<conn_responder> self_;

private:
  std::shared_ptr<responder> shared_from_this_() { return self_.lock(); }

  void arm(std::chrono::milliseconds every, std::shared_ptr<std::string> d) {
    auto& c = *c_;
    if (c.done_ || c.broken_ || c.generation_ != version_gen_)
      return;
    c.timer_.expires_after(every);
    auto self = self_.lock();
    c.timer_.async_wait(net::bind_executor(
      c.sock_.get_executor(), [self, every, d](beast::error_code ec) {
        if (ec || !self)
          return;
        auto& c = *self->c_;
        if (c.done_ || c.broken_)
          return;
        self->write(*d);
        self->arm(every, d);
      }));
  }

  template <class F>
  void on_strand(F f) {
    net::dispatch(c_->sock_.get_executor(), [c = c_, f = std::move(f), this,
                                             keep = self_.lock()]() mutable {
      if (c->generation_ != version_gen_)
        return; // an answer to a request already answered
      f(*c);
      if (c->broken_)
        gone_ = true;
    });
  }

public:
  unsigned version_gen_ = 0;

private:
  std::shared_ptr<connection> c_;
  unsigned version_;
  bool keep_alive_;
  std::atomic<bool> gone_{false};
};

void connection::on_read(beast::error_code ec) {
  if (ec == bhttp::error::end_of_stream || ec == net::error::eof ||
      ec == net::error::connection_reset || ec == net::error::operation_aborted) {
    beast::error_code ignore;
    sock_.shutdown(tcp::socket::shutdown_send, ignore);
    return;
  }
  begin_request();
  if (ec) {
    // Garbage: a clear 400 (or 413), then close.
    keep_alive_ = false;
    auto r = std::make_shared<conn_responder>(shared_from_this(), 11, false);
    r->self_ = r;
    r->version_gen_ = generation_;
    int status = ec == bhttp::error::body_limit ? 413 : 400;
    std::string msg = status == 413 ? "request body too large" : "bad HTTP request: " + ec.message();
    r->reply(status, "application/json",
             std::string{"{\"code\":"} + std::to_string(status) + ",\"message\":\"" + msg + "\"}",
             {});
    return;
  }
  auto msg = parser_->release();
  keep_alive_ = msg.keep_alive();
  http_request req = std::move(head_); // (read with the header)
  req.body = std::move(msg.body());
  dispatch(std::move(req), msg.version());
}

void connection::dispatch(http_request req, unsigned version) {
  auto r = std::make_shared<conn_responder>(shared_from_this(), version, keep_alive_);
  r->self_ = r;
  r->version_gen_ = generation_;
  try {
    handler_(std::move(req), r);
  } catch (const std::exception& e) {
    r->reply(500, "application/json",
             std::string{"{\"code\":500,\"message\":\"internal error\"}"}, {});
  }
}

} // namespace

struct server::impl {
  net::io_context io;
  tcp::acceptor acceptor{io};
  handler h;
  router rt;
  server_options o;
  std::atomic<unsigned> tunnels{0};
  std::vector<std::thread> threads;

  void accept() {
    acceptor.async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket s) {
      if (ec == net::error::operation_aborted)
        return;
      if (!ec) {
        beast::error_code ignore;
        s.set_option(tcp::no_delay{true}, ignore);
        std::make_shared<connection>(std::move(s), h, rt, o.body_limit, tunnels, o.max_tunnels,
                                     o.streams_body)
          ->start();
      }
      accept();
    });
  }
};

expected<std::unique_ptr<server>> server::listen(const server_options& o, handler h,
                                                 router rt) {
  auto p = std::make_unique<impl>();
  p->h = std::move(h);
  p->rt = std::move(rt);
  p->o = o;
  beast::error_code ec;
  auto addr = net::ip::make_address(o.host, ec);
  if (ec)
    return make_error(errc::invalid_argument, "--listen: '" + o.host + "' is not an IP address");
  tcp::endpoint ep{addr, o.port};
  p->acceptor.open(ep.protocol(), ec);
  if (!ec)
    p->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec)
    p->acceptor.bind(ep, ec);
  if (!ec)
    p->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return make_error(errc::system_error, "--listen " + o.host + ":" + std::to_string(o.port) +
                                       ": " + ec.message());
  p->accept();
  return std::unique_ptr<server>(new server(std::move(p)));
}

server::server(std::unique_ptr<impl> p) : p_(std::move(p)) {}

uint16_t server::port() const { return p_->acceptor.local_endpoint().port(); }

void server::run() {
  for (unsigned i = 1; i < std::max(1u, p_->o.threads); ++i)
    p_->threads.emplace_back([this] { p_->io.run(); });
  p_->io.run();
  for (auto& t : p_->threads)
    t.join();
  p_->threads.clear();
}

void server::stop() { p_->io.stop(); }

server::~server() = default;

} // namespace dsec::e2b
