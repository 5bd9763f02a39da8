#include "runtime/chronus_endpoint.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/reactor.hpp"

namespace dsec {

namespace {

// Frames read from one connection before the reactor serves others.
constexpr int frames_per_wakeup = 64;

uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// One packet, never blocking, never raising SIGPIPE. A client that does not
// read its replies loses them; nothing waits for it.
bool send_frame(int fd, const std::string& frame) {
  auto n = ::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  return n == static_cast<ssize_t>(frame.size());
}

} // namespace

struct chronus_endpoint::conn {
  unique_fd fd;
  uint64_t watch = 0; // armed watch, 0 when none
  bool closed = false;
  bool trusted = false; // opened over the trusted channel: no token, own limits
};

struct chronus_endpoint::box {
  std::string id;
  unique_fd listener;
  uint64_t listen_watch = 0;
  chronus_token token;
  chronus_rate_limiter limiter; // frames on /run/chronus.sock's connections
  // The trusted channel (its node end), and what its connections may use: a
  // budget of their own, which nothing the agent does can spend.
  std::shared_ptr<conn> channel;
  chronus_rate_limiter trusted_limiter;
  size_t trusted_conns = 0;
  uint64_t seq = 0;
  event_fn on_event;
  bool closed = false;
  std::unordered_map<conn*, std::shared_ptr<conn>> conns;
  // A feedback request waiting for the trainer: its client, and the timerfd
  // of its timeout when it has one.
  struct waiting {
    std::weak_ptr<conn> client;
    std::shared_ptr<conn> timer; // a timerfd, watched like a connection
  };
  std::unordered_map<uint64_t, waiting> pending; // by request id (the event's seq)
};

struct chronus_endpoint::impl : std::enable_shared_from_this<impl> {
  impl(reactor& r, config c) : io(r), cfg(c), buf(new std::byte[chronus_max_frame + 8]) {}

  reactor& io;
  config cfg;
  struct {
    std::atomic<uint64_t> frames{0}, events{0}, too_large{0}, malformed{0},
      unauthenticated{0}, invalid{0}, flooding{0}, connections{0}, refused_connections{0},
      answered{0};
  } n;
  std::atomic<size_t> served{0};
  // Reactor thread only.
  std::unordered_map<std::string, std::shared_ptr<box>> boxes;
  std::unique_ptr<std::byte[]> buf; // new[] of std::byte: aligned for any scalar

  void arm_listener(const std::shared_ptr<box>& b) {
    auto self = shared_from_this();
    b->listen_watch = io.watch(b->listener.get(), POLLIN, [self, b](int result) {
      b->listen_watch = 0;
      self->on_accept(b, result);
    });
  }

  void arm_conn(const std::shared_ptr<box>& b, const std::shared_ptr<conn>& c) {
    auto self = shared_from_this();
    c->watch = io.watch(c->fd.get(), POLLIN, [self, b, c](int result) {
      c->watch = 0;
      self->on_readable(b, c, result);
    });
  }

  void arm_channel(const std::shared_ptr<box>& b) {
    auto self = shared_from_this();
    auto ch = b->channel;
    ch->watch = io.watch(ch->fd.get(), POLLIN, [self, b, ch](int result) {
      ch->watch = 0;
      self->on_channel(b, ch, result);
    });
  }

  // Packets on the trusted channel: each one opens a trusted connection
  // (chronus_channel_hello and one SOCK_SEQPACKET descriptor attached).
  void on_channel(const std::shared_ptr<box>& b, const std::shared_ptr<conn>& ch, int result) {
    if (b->closed || ch->closed)
      return;
    if (result < 0 || (result & (POLLERR | POLLNVAL))) {
      ch->closed = true;
      return;
    }
    for (int i = 0; i < frames_per_wakeup; ++i) {
      char data[64];
      alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
      iovec iov{data, sizeof data};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      auto got = ::recvmsg(ch->fd.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (got < 0) {
        if (errno == EINTR)
          continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
          break;
        ch->closed = true; // the sandbox is going
        return;
      }
      if (got == 0 && !(msg.msg_flags & MSG_CTRUNC) && msg.msg_controllen == 0) {
        // The end of the channel (the helper and every trusted command are
        // gone: so is the sandbox), or an empty packet.
        pollfd p{ch->fd.get(), POLLRDHUP, 0};
        if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP))) {
          ch->closed = true;
          return;
        }
      }
      std::vector<unique_fd> fds;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (size_t k = 0; k < n; ++k) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
            fds.emplace_back(fd);
          }
        }
      on_channel_packet(b, std::string_view{data, static_cast<size_t>(got)},
                        (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0, std::move(fds));
      if (b->closed)
        return;
    }
    arm_channel(b);
  }

  void on_channel_packet(const std::shared_ptr<box>& b, std::string_view data, bool truncated,
                         std::vector<unique_fd> fds) {
    n.frames.fetch_add(1, std::memory_order_relaxed);
    if (!b->trusted_limiter.admit(monotonic_ns())) {
      n.flooding.fetch_add(1, std::memory_order_relaxed);
      if (fds.size() == 1)
        send_frame(fds[0].get(), encode_reply_rejected("rate limit: too many connections "
                                                       "opened over the trusted channel"));
      return;
    }
    int type = 0, domain = 0;
    socklen_t len = sizeof type;
    bool ok = !truncated && data == chronus_channel_hello && fds.size() == 1
              && ::getsockopt(fds[0].get(), SOL_SOCKET, SO_TYPE, &type, &len) == 0
              && type == SOCK_SEQPACKET;
    len = sizeof domain;
    ok = ok && ::getsockopt(fds[0].get(), SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0
         && domain == AF_UNIX;
    if (!ok) {
      n.malformed.fetch_add(1, std::memory_order_relaxed);
      return; // the descriptors close here
    }
    if (b->trusted_conns >= cfg.max_trusted_connections) {
      n.refused_connections.fetch_add(1, std::memory_order_relaxed);
      send_frame(fds[0].get(), encode_reply_rejected("too many trusted Chronus connections "
                                                     "from this sandbox"));
      return;
    }
    n.connections.fetch_add(1, std::memory_order_relaxed);
    auto c = std::make_shared<conn>();
    c->fd = std::move(fds[0]);
    c->trusted = true;
    ++b->trusted_conns;
    b->conns.emplace(c.get(), c);
    arm_conn(b, c);
  }

  void on_accept(const std::shared_ptr<box>& b, int result) {
    if (b->closed || result < 0)
      return;
    for (;;) {
      int fd = ::accept4(b->listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED)
          continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // The listener stays readable: re-arming now would spin the reactor.
          // Try again in 100 ms; the pending clients wait in the backlog.
          n.refused_connections.fetch_add(1, std::memory_order_relaxed);
          if (auto t = one_shot_timer(100)) {
            auto self = shared_from_this();
            t->watch = io.watch(t->fd.get(), POLLIN, [self, b, t](int result) {
              t->watch = 0;
              if (result >= 0 && !b->closed)
                self->arm_listener(b);
            });
            return;
          }
        }
        break; // EAGAIN (or no timer: try on the next wakeup)
      }
      unique_fd cfd(fd);
      if (b->conns.size() - b->trusted_conns >= cfg.max_connections) {
        n.refused_connections.fetch_add(1, std::memory_order_relaxed);
        send_frame(cfd.get(), encode_reply_rejected("too many Chronus connections from this sandbox"));
        continue; // closed here
      }
      n.connections.fetch_add(1, std::memory_order_relaxed);
      auto c = std::make_shared<conn>();
      c->fd = std::move(cfd);
      b->conns.emplace(c.get(), c);
      arm_conn(b, c);
    }
    arm_listener(b);
  }

  void on_readable(const std::shared_ptr<box>& b, const std::shared_ptr<conn>& c, int result) {
    if (c->closed || b->closed)
      return;
    if (result < 0 || (result & (POLLERR | POLLNVAL))) {
      close_conn(*b, c);
      return;
    }
    for (int i = 0; i < frames_per_wakeup; ++i) {
      // MSG_TRUNC: the packet's real length, so an oversized one is seen as such.
      auto got = ::recv(c->fd.get(), buf.get(), chronus_max_frame + 1, MSG_DONTWAIT | MSG_TRUNC);
      if (got < 0) {
        if (errno == EINTR)
          continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
          break;
        close_conn(*b, c);
        return;
      }
      if (got == 0) { // the client hung up (an empty packet ends it too)
        close_conn(*b, c);
        return;
      }
      on_frame(b, c, static_cast<size_t>(got));
      if (c->closed)
        return;
    }
    arm_conn(b, c);
  }

  void reject(conn& c, std::atomic<uint64_t>& counter, std::string_view why) {
    counter.fetch_add(1, std::memory_order_relaxed);
    send_frame(c.fd.get(), encode_reply_rejected(why));
  }

  void on_frame(const std::shared_ptr<box>& bp, const std::shared_ptr<conn>& c, size_t size) {
    auto& b = *bp;
    n.frames.fetch_add(1, std::memory_order_relaxed);
    auto now = monotonic_ns();
    if (size > chronus_max_frame) {
      reject(*c, n.too_large,
             "a frame of " + std::to_string(size) + " bytes is over the limit of " +
               std::to_string(chronus_max_frame));
      return;
    }
    // Before decoding: a flood costs the node as little as possible. Trusted
    // connections have a budget of their own.
    if (!(c->trusted ? b.trusted_limiter : b.limiter).admit(now)) {
      reject(*c, n.flooding, "rate limit: too many frames from this sandbox");
      return;
    }
    auto req = c->trusted ? decode_trusted_request({buf.get(), size})
                          : decode_request({buf.get(), size}, b.token);
    if (!req) {
      const auto& e = req.error_value();
      switch (e.code) {
        case errc::too_large: reject(*c, n.too_large, e.message); break;
        case errc::unauthenticated: reject(*c, n.unauthenticated, e.message); break;
        case errc::invalid_argument: reject(*c, n.invalid, e.message); break;
        default: reject(*c, n.malformed, e.message); break;
      }
      return;
    }
    auto seq = ++b.seq;
    auto event = encode_event(b.id, seq, now, *req);
    n.events.fetch_add(1, std::memory_order_relaxed);
    // The event is handed on before the ack goes out: a client that heard
    // "ack" may rely on its stage having reached the node's consumer.
    bool feedback = req->kind == chronus_kind::feedback;
    if (feedback) {
      auto& w = b.pending[seq];
      w.client = c;
      if (req->timeout_ms > 0)
        w.timer = start_timer(bp, seq, req->timeout_ms);
    }
    if (b.on_event)
      b.on_event(std::move(event));
    if (!feedback)
      send_frame(c->fd.get(), encode_reply_ack());
  }

  // The timeout of feedback request `id`: a timerfd on the reactor. When it
  // fires and the request still waits, the client hears `timedOut`.
  std::shared_ptr<conn> start_timer(const std::shared_ptr<box>& bp, uint64_t id, uint32_t ms) {
    auto t = one_shot_timer(ms);
    if (!t)
      return nullptr; // no timer: the request waits for its answer or its client
    auto self = shared_from_this();
    std::weak_ptr<box> wb = bp;
    t->watch = io.watch(t->fd.get(), POLLIN, [self, wb, id, t](int result) {
      t->watch = 0;
      auto bx = wb.lock();
      if (result < 0 || t->closed || !bx || bx->closed)
        return;
      auto it = bx->pending.find(id);
      if (it == bx->pending.end() || it->second.timer != t)
        return;
      if (auto c = it->second.client.lock(); c && !c->closed)
        send_frame(c->fd.get(), encode_reply_timed_out());
      bx->pending.erase(it);
    });
    return t;
  }

  // A timerfd that fires once after `ms`, owned like a connection; or null.
  static std::shared_ptr<conn> one_shot_timer(uint32_t ms) {
    auto t = std::make_shared<conn>();
    t->fd.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (!t->fd)
      return nullptr;
    itimerspec its{};
    its.it_value.tv_sec = ms / 1000;
    its.it_value.tv_nsec = static_cast<long>(ms % 1000) * 1'000'000;
    if (::timerfd_settime(t->fd.get(), 0, &its, nullptr) != 0)
      return nullptr;
    return t;
  }

  void stop_timer(const std::shared_ptr<conn>& t) {
    if (!t || t->closed)
      return;
    t->closed = true;
    if (t->watch != 0)
      io.cancel(t->watch);
  }

  void close_conn(box& b, const std::shared_ptr<conn>& c) {
    if (c->closed)
      return;
    c->closed = true;
    if (c->watch != 0)
      io.cancel(c->watch); // the callback keeps the fd open until it ran
    if (c->trusted)
      --b.trusted_conns;
    b.conns.erase(c.get());
    // Its feedback requests go with it: nobody would read their answers.
    for (auto it = b.pending.begin(); it != b.pending.end();) {
      auto waiter = it->second.client.lock();
      if (!waiter || waiter == c) {
        stop_timer(it->second.timer);
        it = b.pending.erase(it);
      } else {
        ++it;
      }
    }
  }

  void close_box(const std::shared_ptr<box>& b, bool session_gone) {
    if (b->closed)
      return;
    auto gone = encode_reply_session_gone();
    for (auto& [id, w] : b->pending) {
      stop_timer(w.timer);
      if (auto c = w.client.lock(); session_gone && c && !c->closed)
        send_frame(c->fd.get(), gone);
    }
    b->pending.clear();
    b->closed = true;
    if (b->listen_watch != 0)
      io.cancel(b->listen_watch);
    if (b->channel) {
      b->channel->closed = true;
      if (b->channel->watch != 0)
        io.cancel(b->channel->watch);
    }
    std::vector<std::shared_ptr<conn>> all;
    for (auto& [p, c] : b->conns)
      all.push_back(c);
    for (auto& c : all)
      close_conn(*b, c);
    served.fetch_sub(1, std::memory_order_relaxed);
  }
};

chronus_endpoint::chronus_endpoint(reactor& io, config cfg)
    : impl_(std::make_shared<impl>(io, cfg)) {}

chronus_endpoint::~chronus_endpoint() {
  auto i = impl_;
  i->io.post([i] {
    for (auto& [id, b] : i->boxes)
      i->close_box(b, false);
    i->boxes.clear();
  });
}

void chronus_endpoint::add(std::string sandbox_id, unique_fd listener, unique_fd channel,
                           chronus_token token, event_fn on_event) {
  auto b = std::make_shared<box>();
  b->id = std::move(sandbox_id);
  b->listener = std::move(listener);
  b->token = token;
  b->limiter = chronus_rate_limiter(impl_->cfg.rate, monotonic_ns());
  b->trusted_limiter = chronus_rate_limiter(impl_->cfg.rate, monotonic_ns());
  if (channel) {
    b->channel = std::make_shared<conn>();
    b->channel->fd = std::move(channel);
  }
  b->on_event = std::move(on_event);
  impl_->served.fetch_add(1, std::memory_order_relaxed);
  auto i = impl_;
  i->io.post([i, b] {
    auto& slot = i->boxes[b->id];
    if (slot)
      i->close_box(slot, false);
    slot = b;
    if (b->listener)
      i->arm_listener(b);
    if (b->channel)
      i->arm_channel(b);
  });
}

void chronus_endpoint::remove(std::string sandbox_id, bool session_gone) {
  auto i = impl_;
  i->io.post([i, id = std::move(sandbox_id), session_gone] {
    auto it = i->boxes.find(id);
    if (it == i->boxes.end())
      return;
    i->close_box(it->second, session_gone);
    i->boxes.erase(it);
  });
}

void chronus_endpoint::answer(std::string sandbox_id, chronus_feedback feedback, done_fn done) {
  auto i = impl_;
  i->io.post([i, id = std::move(sandbox_id), fb = std::move(feedback), done = std::move(done)] {
    auto finish = [&](expected<void> r) {
      if (done)
        done(std::move(r));
    };
    if (auto ok = check_feedback(fb); !ok) {
      finish(std::move(ok).error_value());
      return;
    }
    auto it = i->boxes.find(id);
    if (it == i->boxes.end()) {
      finish(make_error(errc::not_found, "sandbox " + id + " has no Chronus endpoint"));
      return;
    }
    auto& b = *it->second;
    auto p = b.pending.find(fb.request_id);
    if (p == b.pending.end()) {
      finish(make_error(errc::not_found, "sandbox " + id + " has no feedback request " +
                                           std::to_string(fb.request_id) +
                                           " waiting (answered already, or never asked)"));
      return;
    }
    auto c = p->second.client.lock();
    i->stop_timer(p->second.timer);
    b.pending.erase(p);
    if (!c || c->closed) {
      finish(make_error(errc::not_found, "the client of feedback request " +
                                           std::to_string(fb.request_id) + " in sandbox " + id +
                                           " hung up"));
      return;
    }
    if (!send_frame(c->fd.get(), encode_reply_feedback(fb))) {
      int err = errno;
      finish(make_error(errc::not_found, "could not deliver feedback request " +
                                           std::to_string(fb.request_id) + " to sandbox " + id +
                                           ": " + std::strerror(err)));
      return;
    }
    i->n.answered.fetch_add(1, std::memory_order_relaxed);
    finish({});
  });
}

expected<void> chronus_endpoint::answer_and_wait(std::string sandbox_id,
                                                 chronus_feedback feedback,
                                                 std::chrono::milliseconds limit) {
  auto p = std::make_shared<std::promise<expected<void>>>();
  auto f = p->get_future();
  answer(std::move(sandbox_id), std::move(feedback),
         [p](expected<void> r) { p->set_value(std::move(r)); });
  if (f.wait_for(limit) != std::future_status::ready)
    return make_error(errc::timeout, "the Chronus endpoint did not answer in time");
  return f.get();
}

chronus_endpoint::counters chronus_endpoint::stats() const {
  auto& n = impl_->n;
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  counters c;
  c.frames = ld(n.frames);
  c.events = ld(n.events);
  c.too_large = ld(n.too_large);
  c.malformed = ld(n.malformed);
  c.unauthenticated = ld(n.unauthenticated);
  c.invalid = ld(n.invalid);
  c.flooding = ld(n.flooding);
  c.connections = ld(n.connections);
  c.refused_connections = ld(n.refused_connections);
  c.answered = ld(n.answered);
  return c;
}

size_t chronus_endpoint::sandboxes() const {
  return impl_->served.load(std::memory_order_relaxed);
}

} // namespace dsec
