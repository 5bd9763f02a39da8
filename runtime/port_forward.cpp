// port_forward: see port_forward.hpp. One epoll thread; every socket
// non-blocking; two fixed buffers per connection.
#include "runtime/port_forward.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace dsec {

namespace {

// epoll data: id * 4 + what.
enum tag : uint64_t { t_listener = 0, t_outer = 1, t_inner = 2, t_wake = 3 };

// Bytes read from one side, not yet written to the other: [head, head+len).
struct buffer {
  std::unique_ptr<char[]> data;
  size_t cap = 0, head = 0, len = 0;
  [[nodiscard]] size_t room() const { return cap - len; }
  // Where the next read goes, compacting first when the tail is full.
  char* tail() {
    if (head + len == cap && head > 0) {
      std::memmove(data.get(), data.get() + head, len);
      head = 0;
    }
    return data.get() + head + len;
  }
  [[nodiscard]] size_t tail_room() const { return cap - head - len; }
  void consumed(size_t n) {
    head += n;
    len -= n;
    if (len == 0)
      head = 0;
  }
};

struct side {
  unique_fd fd;
  uint32_t registered = 0; // the events epoll has for it (0: not in epoll)
  bool eof = false;        // its peer shut down its writing: nothing more to read
  bool shut = false;       // we shut down our writing to it
};

using steady = std::chrono::steady_clock;

struct connection {
  uint64_t forward = 0;
  steady::time_point active; // the last time a byte moved (or it was accepted)
  side outer; // the trainer's, accepted on the node
  side inner; // ours, inside the sandbox
  bool connecting = true;
  buffer in;  // outer -> inner
  buffer out; // inner -> outer
};

struct listener {
  unique_fd fd;
  unique_fd pidfd;
  uint16_t port = 0;
  size_t connections = 0;
};

bool would_block(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == EINTR; }

// Closes with a reset: the trainer's client sees "connection reset", not a
// clean end, when the sandbox side could not be reached.
void reset_close(unique_fd& fd) {
  linger l{1, 0};
  (void) ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
  fd.reset();
}

void no_delay(int fd) {
  int one = 1;
  (void) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

} // namespace

struct port_forward_impl {
  using counters = port_forwarder::counters;
  port_forward_options opts;
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  unique_fd home_ns; // the daemon's network namespace, to come back to
  unique_fd epoll, wake;
  std::thread thread;
  std::atomic<bool> stop{false};

  mutable std::mutex mu; // everything below; the thread holds it while it works
  bool stopped = false;
  uint64_t next_id = 1;
  std::map<uint64_t, listener> listeners;
  std::map<uint64_t, connection> conns;
  counters c;

  void run();
  void on_listener(uint64_t id);
  void on_side(uint64_t id, bool is_inner, uint32_t events);
  void join(uint64_t lid, listener& l, unique_fd outer);
  // After any progress: shut down what is finished, close what is done,
  // tell epoll what each side waits for now.
  void settle(uint64_t id, connection& cn);
  enum class outcome { done, broken, refused, idle };
  void sweep_idle(steady::time_point now);
  void close_conn(uint64_t id, outcome how);
  void forget(side& sd);
  bool pump(connection& cn, bool from_inner); // false: the connection broke
  void watch(uint64_t id, side& s, tag t, uint32_t want);
  void remove(uint64_t id);
};

// ---- the thread ---------------------------------------------------------------------

void port_forward_impl::run() {
  epoll_event evs[64];
  // With an idle timeout, the connections are looked over every eighth of
  // it (between 10 ms and 1 s): one is closed within 1.125 timeouts.
  auto idle = opts.idle_timeout;
  auto every = std::clamp(idle / 8, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  auto next_sweep = steady::now() + every;
  while (!stop.load()) {
    int wait_ms = -1;
    if (idle.count() > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_sweep - steady::now());
      wait_ms = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    int n = ::epoll_wait(epoll.get(), evs, 64, wait_ms);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      std::abort(); // a broken epoll descriptor: nothing to forward with
    }
    std::lock_guard lk(mu);
    if (idle.count() > 0 && steady::now() >= next_sweep) {
      auto now = steady::now();
      sweep_idle(now);
      next_sweep = now + every;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t d = evs[i].data.u64;
      uint64_t id = d / 4;
      switch (static_cast<tag>(d % 4)) {
        case t_wake: {
          uint64_t v;
          (void) !::read(wake.get(), &v, sizeof v);
          break;
        }
        case t_listener: on_listener(id); break;
        case t_outer: on_side(id, false, evs[i].events); break;
        case t_inner: on_side(id, true, evs[i].events); break;
      }
    }
  }
}

void port_forward_impl::on_listener(uint64_t lid) {
  auto it = listeners.find(lid);
  if (it == listeners.end())
    return; // removed since epoll_wait
  auto& l = it->second;
  for (int i = 0; i < 16; ++i) { // a few at a time: the other sockets get their turn
    int fd = ::accept4(l.fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return; // EAGAIN, or a connection that went before we took it
    unique_fd outer(fd);
    if (l.connections >= opts.per_port || conns.size() >= opts.max_connections) {
      ++c.refused;
      reset_close(outer);
      continue;
    }
    join(lid, l, std::move(outer));
  }
}

void port_forward_impl::join(uint64_t lid, listener& l, unique_fd outer) {
  // The inner socket, made in the sandbox's network namespace: a socket
  // keeps the namespace it was made in.
  if (::setns(l.pidfd.get(), CLONE_NEWNET) < 0) { // the sandbox is going
    ++c.refused;
    reset_close(outer);
    return;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (::setns(home_ns.get(), CLONE_NEWNET) < 0)
    std::abort(); // a thread of dsecd left in a sandbox's namespace: never go on
  if (fd < 0) {
    ++c.refused;
    reset_close(outer);
    return;
  }
  unique_fd inner(fd);
  no_delay(outer.get());
  no_delay(inner.get());
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(l.port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool connected = false;
  if (::connect(inner.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) == 0)
    connected = true;
  else if (errno != EINPROGRESS) { // nothing listens there
    ++c.refused;
    reset_close(outer);
    return;
  }
  uint64_t id = next_id++;
  auto& cn = conns[id];
  cn.forward = lid;
  cn.active = steady::now();
  cn.outer.fd = std::move(outer);
  cn.inner.fd = std::move(inner);
  cn.connecting = !connected;
  for (auto* b : {&cn.in, &cn.out}) {
    b->data = std::make_unique<char[]>(opts.buffer);
    b->cap = opts.buffer;
  }
  ++l.connections;
  if (connected)
    ++c.accepted;
  settle(id, cn);
}

// Moves what one side has to the other: reads from `from` into its buffer
// while there is room, writes the buffer to the other side.
bool port_forward_impl::pump(connection& cn, bool from_inner) {
  side& src = from_inner ? cn.inner : cn.outer;
  side& dst = from_inner ? cn.outer : cn.inner;
  buffer& b = from_inner ? cn.out : cn.in;
  if (!src.eof && b.room() > 0 && !(from_inner && cn.connecting)) {
    char* at = b.tail();
    ssize_t n = ::recv(src.fd.get(), at, b.tail_room(), 0);
    if (n > 0) {
      b.len += static_cast<size_t>(n);
      c.bytes += static_cast<uint64_t>(n);
      cn.active = steady::now();
    } else if (n == 0) {
      src.eof = true;
    } else if (!would_block(errno)) {
      return false;
    }
  }
  if (b.len > 0 && !(cn.connecting && &dst == &cn.inner)) {
    ssize_t n = ::send(dst.fd.get(), b.data.get() + b.head, b.len, MSG_NOSIGNAL);
    if (n > 0) {
      b.consumed(static_cast<size_t>(n));
      cn.active = steady::now(); // a slow reader taking what was held is not idle
    } else if (n < 0 && !would_block(errno))
      return false;
  }
  return true;
}

void port_forward_impl::on_side(uint64_t id, bool is_inner, uint32_t events) {
  auto it = conns.find(id);
  if (it == conns.end())
    return;
  auto& cn = it->second;
  if (is_inner && cn.connecting) {
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(cn.inner.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) < 0)
      err = errno;
    if (err != 0)
      return close_conn(id, outcome::refused); // nothing listens on that port inside
    if (!(events & EPOLLOUT))
      return; // not yet
    cn.connecting = false;
    ++c.accepted;
  } else if (events & EPOLLERR) {
    return close_conn(id, outcome::broken);
  }
  // Either side's readiness can let both directions move on.
  if (!pump(cn, is_inner) || !pump(cn, !is_inner))
    return close_conn(id, outcome::broken);
  settle(id, cn);
}

void port_forward_impl::settle(uint64_t id, connection& cn) {
  if (!cn.connecting) {
    if (cn.outer.eof && cn.in.len == 0 && !cn.inner.shut) {
      (void) ::shutdown(cn.inner.fd.get(), SHUT_WR);
      cn.inner.shut = true;
    }
    if (cn.inner.eof && cn.out.len == 0 && !cn.outer.shut) {
      (void) ::shutdown(cn.outer.fd.get(), SHUT_WR);
      cn.outer.shut = true;
    }
    if (cn.inner.shut && cn.outer.shut)
      return close_conn(id, outcome::done);
  }
  uint32_t outer = 0, inner = 0;
  if (!cn.outer.eof && cn.in.room() > 0)
    outer |= EPOLLIN;
  if (cn.out.len > 0)
    outer |= EPOLLOUT;
  if (cn.connecting) {
    inner = EPOLLOUT;
  } else {
    if (!cn.inner.eof && cn.out.room() > 0)
      inner |= EPOLLIN;
    if (cn.in.len > 0)
      inner |= EPOLLOUT;
  }
  watch(id, cn.outer, t_outer, outer);
  watch(id, cn.inner, t_inner, inner);
}

// A side that waits for nothing is taken out of epoll, which would otherwise
// report its hang-up again and again.
void port_forward_impl::watch(uint64_t id, side& s, tag t, uint32_t want) {
  if (want == s.registered)
    return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = id * 4 + t;
  int op = want == 0 ? EPOLL_CTL_DEL : s.registered == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
  if (::epoll_ctl(epoll.get(), op, s.fd.get(), &ev) < 0 && op != EPOLL_CTL_DEL)
    std::abort(); // ENOMEM: the forwarder cannot see its sockets any more
  s.registered = want;
}

// Out of epoll before it is closed: a copy of the descriptor that a fork of
// the daemon holds until its exec would keep the registration alive.
void port_forward_impl::forget(side& sd) {
  if (sd.registered != 0)
    (void) ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, sd.fd.get(), nullptr);
  sd.registered = 0;
}

void port_forward_impl::close_conn(uint64_t id, outcome how) {
  auto it = conns.find(id);
  if (it == conns.end())
    return;
  auto& cn = it->second;
  forget(cn.outer);
  forget(cn.inner);
  if (how == outcome::refused)
    ++c.refused;
  if (how == outcome::idle)
    ++c.idle_closed;
  if (how != outcome::done) // the trainer sees a reset, not a clean end
    reset_close(cn.outer.fd);
  if (auto l = listeners.find(cn.forward); l != listeners.end())
    --l->second.connections;
  conns.erase(it);
}

// Closes the connections through which nothing moved for the idle timeout.
void port_forward_impl::sweep_idle(steady::time_point now) {
  std::vector<uint64_t> idle;
  for (auto& [id, cn] : conns)
    if (now - cn.active >= opts.idle_timeout)
      idle.push_back(id);
  for (auto id : idle)
    close_conn(id, outcome::idle);
}

void port_forward_impl::remove(uint64_t lid) {
  std::lock_guard lk(mu);
  for (auto it = conns.begin(); it != conns.end();) {
    if (it->second.forward != lid) {
      ++it;
      continue;
    }
    forget(it->second.outer);
    forget(it->second.inner);
    reset_close(it->second.outer.fd);
    it = conns.erase(it);
  }
  if (auto l = listeners.find(lid); l != listeners.end()) {
    (void) ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, l->second.fd.get(), nullptr);
    listeners.erase(l);
  }
}

// ---- the API ------------------------------------------------------------------------

expected<std::unique_ptr<port_forwarder>> port_forwarder::start(const port_forward_options& o) {
  if (o.buffer < 4096 || o.per_port == 0 || o.max_connections == 0)
    return make_error(errc::invalid_argument,
                      "port forwarding: a buffer of at least 4096 bytes and at least one"
                      " connection per port are needed");
  if (o.idle_timeout.count() < 0)
    return make_error(errc::invalid_argument,
                      "--expose-idle-timeout: expected a duration of 0 (never) or more");
  auto im = std::make_shared<port_forward_impl>();
  im->opts = o;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&im->addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&im->addr);
  if (::inet_pton(AF_INET, o.address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    im->addr_len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, o.address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    im->addr_len = sizeof *v6;
  } else {
    return make_error(errc::invalid_argument,
                      "--expose-address " + o.address
                        + ": expected an IPv4 or IPv6 address of this node (e.g. 127.0.0.1)");
  }
  im->home_ns = unique_fd(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!im->home_ns)
    return sys_error("opening the daemon's network namespace", "/proc/thread-self/ns/net");
  im->epoll = unique_fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!im->epoll)
    return sys_error("port forwarding: epoll_create1");
  im->wake = unique_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!im->wake)
    return sys_error("port forwarding: eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = t_wake;
  if (::epoll_ctl(im->epoll.get(), EPOLL_CTL_ADD, im->wake.get(), &ev) < 0)
    return sys_error("port forwarding: epoll_ctl");
  std::unique_ptr<port_forwarder> f(new port_forwarder);
  f->opts_ = o;
  im->thread = std::thread([p = im.get()] { p->run(); });
  f->impl_ = std::move(im);
  return f;
}

expected<std::unique_ptr<port_forward>> port_forwarder::expose(int pidfd, uint16_t port) {
  if (port == 0)
    return make_error(errc::invalid_argument, "port 0: expected a TCP port from 1 to 65535");
  auto& im = *impl_;
  unique_fd pfd(::fcntl(pidfd, F_DUPFD_CLOEXEC, 3));
  if (!pfd)
    return sys_error("port forwarding: duplicating the sandbox's pidfd");
  unique_fd l(::socket(im.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!l)
    return sys_error("port forwarding: a listening socket");
  if (::bind(l.get(), reinterpret_cast<const sockaddr*>(&im.addr), im.addr_len) < 0)
    return sys_error("port forwarding: binding a port of --expose-address", opts_.address);
  if (::listen(l.get(), 128) < 0)
    return sys_error("port forwarding: listen", opts_.address);
  sockaddr_storage got{};
  socklen_t len = sizeof got;
  if (::getsockname(l.get(), reinterpret_cast<sockaddr*>(&got), &len) < 0)
    return sys_error("port forwarding: getsockname", opts_.address);
  uint16_t host_port = ntohs(got.ss_family == AF_INET
                               ? reinterpret_cast<sockaddr_in*>(&got)->sin_port
                               : reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  std::unique_ptr<port_forward> fw(new port_forward);
  fw->owner_ = impl_;
  fw->port_ = port;
  fw->host_ = opts_.address;
  fw->host_port_ = host_port;
  std::lock_guard lk(im.mu);
  if (im.stopped)
    return make_error(errc::closed, "port forwarding has stopped (the node is going)");
  uint64_t id = im.next_id++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = id * 4 + t_listener;
  if (::epoll_ctl(im.epoll.get(), EPOLL_CTL_ADD, l.get(), &ev) < 0)
    return sys_error("port forwarding: epoll_ctl");
  auto& entry = im.listeners[id];
  entry.fd = std::move(l);
  entry.pidfd = std::move(pfd);
  entry.port = port;
  fw->id_ = id;
  return fw;
}

port_forwarder::counters port_forwarder::stats() const {
  std::lock_guard lk(impl_->mu);
  auto c = impl_->c;
  c.forwards = impl_->listeners.size();
  c.connections = impl_->conns.size();
  return c;
}

port_forwarder::~port_forwarder() {
  if (!impl_)
    return;
  impl_->stop.store(true);
  uint64_t one = 1;
  (void) !::write(impl_->wake.get(), &one, sizeof one);
  if (impl_->thread.joinable())
    impl_->thread.join();
  std::lock_guard lk(impl_->mu);
  impl_->stopped = true;
  impl_->conns.clear();
  impl_->listeners.clear();
}

port_forward::~port_forward() {
  if (owner_)
    owner_->remove(id_);
}

} // namespace dsec
