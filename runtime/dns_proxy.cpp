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
  p->stop_ = unique_fd{::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
  if (!p->sock_ || !p->up_ || !p->stop_)
    return sys_error("making the DNS proxy's sockets", "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(53);
  a.sin_addr.s_addr = htonl(listen);
  if (::bind(p->sock_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    return sys_error("binding the DNS proxy", "udp port 53");
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

void dns_proxy::run() {
  struct pending {
    sockaddr_in client;
    uint16_t id;
    uint32_t src;
    std::chrono::steady_clock::time_point at;
  };
  std::map<uint16_t, pending> waiting; // by the id we sent upstream
  uint8_t buf[4096];
  for (;;) {
    pollfd fds[3] = {{sock_.get(), POLLIN, 0}, {up_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    if (::poll(fds, 3, 1000) < 0 && errno != EINTR)
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
        auto name = qname_of(q);
        if (name.empty() || ldns_pkt_qr(q) || !allowed_(src, name)) {
          ++stats_.refused;
          ldns_pkt_set_qr(q, true);
          ldns_pkt_set_ra(q, true);
          ldns_pkt_set_rcode(q, LDNS_RCODE_REFUSED);
          uint8_t* wire = nullptr;
          size_t size = 0;
          if (ldns_pkt2wire(&wire, q, &size) == LDNS_STATUS_OK) {
            (void) ::sendto(sock_.get(), wire, size, 0, reinterpret_cast<sockaddr*>(&from), len);
            std::free(wire);
          }
          ldns_pkt_free(q);
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
        ldns_pkt_free(r);
        if (!addrs.empty())
          admit_(w.src, addrs, std::max<uint32_t>(ttl, 1));
        buf[0] = static_cast<uint8_t>(w.id >> 8);
        buf[1] = static_cast<uint8_t>(w.id & 255);
        (void) ::sendto(sock_.get(), buf, static_cast<size_t>(n), 0,
                        reinterpret_cast<sockaddr*>(&w.client), sizeof w.client);
        ++stats_.answered;
      }
    }
  }
}

} // namespace dsec
