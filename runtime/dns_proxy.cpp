#include "runtime/dns_proxy.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ldns/ldns.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

namespace dsec {

bool dns_name_matches(const std::string& name, const std::vector<std::string>& exact,
                      const std::vector<std::string>& suffixes) {
  for (const auto& e : exact)
    if (name == e)
      return true;
  for (const auto& s : suffixes)
    if (name.size() > s.size() + 1 && name.compare(name.size() - s.size(), s.size(), s) == 0
        && name[name.size() - s.size() - 1] == '.')
      return true;
  return false;
}

namespace {

// The question's name, lower case, without the trailing dot; "" if none.
std::string qname_of(ldns_pkt* p) {
  ldns_rr_list* q = ldns_pkt_question(p);
  if (!q || ldns_rr_list_rr_count(q) != 1)
    return {};
  char* s = ldns_rdf2str(ldns_rr_owner(ldns_rr_list_rr(q, 0)));
  if (!s)
    return {};
  std::string n{s};
  std::free(s);
  if (!n.empty() && n.back() == '.')
    n.pop_back();
  for (auto& c : n)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return n;
}

} // namespace

// How long a TCP connection may go without a whole message, and what it may
// hold buffered (in each direction) before the proxy stops reading its side.
constexpr auto tcp_idle = std::chrono::seconds(10);
constexpr size_t tcp_buffer_cap = 256u << 10;

struct dns_proxy::tcp_conn {
  unique_fd client, up;
  uint32_t src = 0;
  bool up_ready = false;      // the upstream connect completed
  bool client_eof = false;    // the sandbox sent all it will (it may still read)
  size_t pending = 0;         // queries sent upstream, not answered yet
  std::string in, to_up;      // from the sandbox; for the upstream
  std::string from_up, out;   // from the upstream; for the sandbox
  std::chrono::steady_clock::time_point last;
};

expected<std::unique_ptr<dns_proxy>> dns_proxy::start(uint32_t listen, const std::string& upstream,
                                                      allowed_fn allowed, admit_fn admit) {
  std::unique_ptr<dns_proxy> p{new dns_proxy};
  p->allowed_ = std::move(allowed);
  p->admit_ = std::move(admit);
  auto colon = upstream.find(':');
  std::string host = upstream.substr(0, colon);
  int port = colon == std::string::npos ? 53 : std::atoi(upstream.c_str() + colon + 1);
  p->upstream_.sin_family = AF_INET;
  p->upstream_.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &p->upstream_.sin_addr) != 1 || port <= 0 || port > 65535)
    return make_error(errc::invalid_argument,
                      "--dns-upstream '" + upstream + "': expected an IPv4 ADDR[:PORT]");
  p->sock_ = unique_fd{::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  p->up_ = unique_fd{::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  p->tcp_ = unique_fd{::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  p->stop_ = unique_fd{::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
  if (!p->sock_ || !p->up_ || !p->tcp_ || !p->stop_)
    return sys_error("making the DNS proxy's sockets", "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(53);
  a.sin_addr.s_addr = htonl(listen);
  if (::bind(p->sock_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    return sys_error("binding the DNS proxy", "udp port 53");
  int one = 1;
  (void) ::setsockopt(p->tcp_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(p->tcp_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    return sys_error("binding the DNS proxy", "tcp port 53");
  if (::listen(p->tcp_.get(), 64) < 0)
    return sys_error("listening for DNS over TCP", "tcp port 53");
  if (::connect(p->up_.get(), reinterpret_cast<sockaddr*>(&p->upstream_), sizeof p->upstream_) < 0)
    return sys_error("connecting to --dns-upstream", upstream);
  p->thread_ = std::thread([q = p.get()] { q->run(); });
  return p;
}

dns_proxy::~dns_proxy() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void) !::write(stop_.get(), &one, sizeof one);
    thread_.join();
  }
}

bool dns_proxy::check_query(ldns_pkt* q, uint32_t src, std::string& refusal) {
  auto name = qname_of(q);
  if (!name.empty() && !ldns_pkt_qr(q) && allowed_(src, name))
    return true;
  ++stats_.refused;
  ldns_pkt_set_qr(q, true);
  ldns_pkt_set_ra(q, true);
  ldns_pkt_set_rcode(q, LDNS_RCODE_REFUSED);
  uint8_t* wire = nullptr;
  size_t size = 0;
  refusal.clear();
  if (ldns_pkt2wire(&wire, q, &size) == LDNS_STATUS_OK) {
    refusal.assign(reinterpret_cast<char*>(wire), size);
    std::free(wire);
  }
  return false;
}

void dns_proxy::admit_answer(ldns_pkt* r, uint32_t src) {
  std::vector<uint32_t> addrs;
  uint32_t ttl = 0;
  ldns_rr_list* ans = ldns_pkt_answer(r);
  for (size_t i = 0; ans && i < ldns_rr_list_rr_count(ans); ++i) {
    ldns_rr* rr = ldns_rr_list_rr(ans, i);
    if (ldns_rr_get_type(rr) != LDNS_RR_TYPE_A)
      continue;
    ldns_rdf* d = ldns_rr_rdf(rr, 0);
    if (!d || ldns_rdf_size(d) != 4)
      continue;
    uint32_t a;
    std::memcpy(&a, ldns_rdf_data(d), 4);
    addrs.push_back(ntohl(a));
    ttl = ttl == 0 ? ldns_rr_ttl(rr) : std::min(ttl, ldns_rr_ttl(rr));
  }
  if (!addrs.empty())
    admit_(src, addrs, std::max<uint32_t>(ttl, 1));
}

void dns_proxy::accept_tcp(std::vector<tcp_conn>& conns) {
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    unique_fd fd{::accept4(tcp_.get(), reinterpret_cast<sockaddr*>(&from), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC)};
    if (!fd)
      return;
    uint32_t src = ntohl(from.sin_addr.s_addr);
    size_t mine = 0;
    for (const auto& c : conns)
      mine += c.src == src;
    if (conns.size() >= max_tcp || mine >= max_tcp_per_sandbox)
      continue; // closed at once: the resolver retries, or gives up
    ++stats_.tcp_connections;
    tcp_conn c;
    c.client = std::move(fd);
    c.src = src;
    c.last = std::chrono::steady_clock::now();
    conns.push_back(std::move(c));
  }
}

namespace {

// Reads what `fd` has into `into` (up to `cap` bytes held); false once the
// peer closed or failed.
bool read_some(int fd, std::string& into, size_t cap) {
  char b[4096];
  while (into.size() < cap) {
    ssize_t n = ::recv(fd, b, sizeof b, 0);
    if (n > 0) {
      into.append(b, static_cast<size_t>(n));
      continue;
    }
    if (n == 0)
      return false;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
  return true;
}

// Writes what it can of `from`; false when the peer failed.
bool write_some(int fd, std::string& from) {
  while (!from.empty()) {
    ssize_t n = ::send(fd, from.data(), from.size(), MSG_NOSIGNAL);
    if (n > 0) {
      from.erase(0, static_cast<size_t>(n));
      continue;
    }
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
  }
  return true;
}

// The first whole length-prefixed message of `buf`, taken out of it; false if
// none is whole yet.
bool take_message(std::string& buf, std::string& msg) {
  if (buf.size() < 2)
    return false;
  size_t len = (static_cast<uint8_t>(buf[0]) << 8) | static_cast<uint8_t>(buf[1]);
  if (buf.size() < 2 + len)
    return false;
  msg.assign(buf, 2, len);
  buf.erase(0, 2 + len);
  return true;
}

void put_message(std::string& buf, const std::string& msg) {
  buf.push_back(static_cast<char>(msg.size() >> 8));
  buf.push_back(static_cast<char>(msg.size() & 255));
  buf += msg;
}

} // namespace

bool dns_proxy::serve_tcp(tcp_conn& c, short client_ev, short up_ev) {
  auto now = std::chrono::steady_clock::now();
  if (client_ev & (POLLERR | POLLNVAL))
    return false;
  if ((client_ev & (POLLIN | POLLHUP)) && !c.client_eof
      && !read_some(c.client.get(), c.in, tcp_buffer_cap))
    c.client_eof = true; // a half-close after its queries: their answers still go back
  if (c.up) {
    if (up_ev & (POLLERR | POLLNVAL))
      return false;
    if (!c.up_ready && (up_ev & POLLOUT)) {
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(c.up.get(), SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err != 0)
        return false; // the upstream refused: the sandbox's resolver sees the close
      c.up_ready = true;
    }
    if ((up_ev & (POLLIN | POLLHUP)) && !read_some(c.up.get(), c.from_up, tcp_buffer_cap)) {
      if (c.pending > 0 && c.from_up.size() < 2)
        return false; // the upstream went with answers owed
      c.up.reset();   // idle upstreams may close: the next query opens another
      c.up_ready = false;
    }
  }
  // The sandbox's queries: refused here, or on to the upstream.
  std::string msg, refusal;
  while (c.out.size() < tcp_buffer_cap && take_message(c.in, msg)) {
    ++stats_.queries;
    c.last = now;
    ldns_pkt* q = nullptr;
    if (ldns_wire2pkt(&q, reinterpret_cast<const uint8_t*>(msg.data()), msg.size())
        != LDNS_STATUS_OK) {
      ++stats_.failed;
      return false; // not DNS: the stream cannot be trusted further
    }
    bool ok = check_query(q, c.src, refusal);
    ldns_pkt_free(q);
    if (!ok) {
      if (!refusal.empty())
        put_message(c.out, refusal);
      continue;
    }
    if (!c.up) {
      c.up = unique_fd{::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
      if (!c.up)
        return false;
      if (::connect(c.up.get(), reinterpret_cast<const sockaddr*>(&upstream_), sizeof upstream_) == 0)
        c.up_ready = true;
      else if (errno != EINPROGRESS)
        return false;
    }
    put_message(c.to_up, msg);
    ++c.pending;
  }
  // The upstream's answers: their addresses admitted, then relayed.
  while (take_message(c.from_up, msg)) {
    c.last = now;
    ldns_pkt* r = nullptr;
    if (ldns_wire2pkt(&r, reinterpret_cast<const uint8_t*>(msg.data()), msg.size())
        != LDNS_STATUS_OK)
      return false;
    admit_answer(r, c.src);
    ldns_pkt_free(r);
    put_message(c.out, msg);
    ++stats_.answered;
    if (c.pending > 0)
      --c.pending;
  }
  if (c.up && c.up_ready && !write_some(c.up.get(), c.to_up))
    return false;
  if (!write_some(c.client.get(), c.out))
    return false;
  if (c.client_eof && c.pending == 0 && c.out.empty() && c.in.size() < 2)
    return false; // all asked was answered
  return now - c.last <= tcp_idle;
}

void dns_proxy::run() {
  struct pending {
    sockaddr_in client;
    uint16_t id;
    uint32_t src;
    std::chrono::steady_clock::time_point at;
  };
  std::map<uint16_t, pending> waiting; // by the id we sent upstream
  std::vector<tcp_conn> conns;
  std::vector<pollfd> fds;
  uint8_t buf[4096];
  std::string refusal;
  for (;;) {
    fds.assign({{sock_.get(), POLLIN, 0}, {up_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0},
                {tcp_.get(), POLLIN, 0}});
    for (const auto& c : conns) {
      // (What a side may send is read only while there is room for it.)
      short want_client = !c.client_eof && c.in.size() < tcp_buffer_cap ? POLLIN : 0;
      if (!c.out.empty())
        want_client |= POLLOUT;
      fds.push_back({want_client ? c.client.get() : -1, want_client, 0});
      short want_up = c.from_up.size() < tcp_buffer_cap ? POLLIN : 0;
      if (!c.up_ready || !c.to_up.empty())
        want_up |= POLLOUT;
      fds.push_back({c.up ? c.up.get() : -1, want_up, 0});
    }
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR)
      return;
    if (fds[2].revents)
      return;
    auto now = std::chrono::steady_clock::now();
    std::erase_if(waiting, [&](const auto& kv) { return now - kv.second.at > std::chrono::seconds(5); });
    if (fds[0].revents & POLLIN) {
      for (;;) {
        sockaddr_in from{};
        socklen_t len = sizeof from;
        ssize_t n = ::recvfrom(sock_.get(), buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
        if (n < 0)
          break;
        ++stats_.queries;
        ldns_pkt* q = nullptr;
        if (ldns_wire2pkt(&q, buf, static_cast<size_t>(n)) != LDNS_STATUS_OK) {
          ++stats_.failed;
          continue; // not DNS: dropped
        }
        uint32_t src = ntohl(from.sin_addr.s_addr);
        if (!check_query(q, src, refusal)) {
          ldns_pkt_free(q);
          if (!refusal.empty())
            (void) ::sendto(sock_.get(), refusal.data(), refusal.size(), 0,
                            reinterpret_cast<sockaddr*>(&from), len);
          continue;
        }
        uint16_t orig = ldns_pkt_id(q);
        ldns_pkt_free(q);
        uint16_t id = 0;
        do {
          (void) ::getrandom(&id, sizeof id, 0);
        } while (waiting.count(id));
        waiting[id] = {from, orig, src, now};
        buf[0] = static_cast<uint8_t>(id >> 8); // the header's id: our own upstream
        buf[1] = static_cast<uint8_t>(id & 255);
        (void) ::send(up_.get(), buf, static_cast<size_t>(n), 0);
      }
    }
    if (fds[1].revents & POLLIN) {
      for (;;) {
        ssize_t n = ::recv(up_.get(), buf, sizeof buf, 0);
        if (n < 0)
          break;
        ldns_pkt* r = nullptr;
        if (ldns_wire2pkt(&r, buf, static_cast<size_t>(n)) != LDNS_STATUS_OK)
          continue;
        auto it = waiting.find(ldns_pkt_id(r));
        if (it == waiting.end()) {
          ldns_pkt_free(r);
          continue;
        }
        auto w = it->second;
        waiting.erase(it);
        admit_answer(r, w.src);
        ldns_pkt_free(r);
        buf[0] = static_cast<uint8_t>(w.id >> 8);
        buf[1] = static_cast<uint8_t>(w.id & 255);
        (void) ::sendto(sock_.get(), buf, static_cast<size_t>(n), 0,
                        reinterpret_cast<sockaddr*>(&w.client), sizeof w.client);
        ++stats_.answered;
      }
    }
    // TCP: each connection served (and closed when done), then new ones.
    size_t k = 0;
    for (size_t i = 0; i < conns.size(); ++i) {
      if (serve_tcp(conns[i], fds[4 + 2 * i].revents, fds[5 + 2 * i].revents)) {
        if (k != i)
          conns[k] = std::move(conns[i]);
        ++k;
      }
    }
    conns.resize(k);
    if (fds[3].revents & POLLIN)
      accept_tcp(conns);
  }
}

} // namespace dsec
