#include "runtime/peer.hpp"

#include <arpa/inet.h>
#include <grp.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "runtime/fd.hpp"

namespace dsec {

namespace {

bool is_loopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    auto a = ntohl(reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a))
      return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

uint16_t port_of(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in&>(ss).sin_port
                                 : reinterpret_cast<const sockaddr_in6&>(ss).sin6_port;
}

std::string shown(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, buf, sizeof buf);
    return std::string{buf} + ":" + std::to_string(ntohs(port_of(ss)));
  }
  ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, buf, sizeof buf);
  return "[" + std::string{buf} + "]:" + std::to_string(ntohs(port_of(ss)));
}

// The address bytes as sock_diag wants them (network order, in 4 words).
void put_address(const sockaddr_storage& ss, __be32 out[4]) {
  std::memset(out, 0, 4 * sizeof(__be32));
  if (ss.ss_family == AF_INET)
    out[0] = reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr;
  else
    std::memcpy(out, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, 16);
}

// The uid owning the TCP socket whose local end is `src` and remote end `dst`.
expected<uid_t> tcp_socket_owner(const sockaddr_storage& src, const sockaddr_storage& dst) {
  unique_fd nl{::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)};
  if (!nl)
    return sys_error("socket(AF_NETLINK, NETLINK_SOCK_DIAG)");
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } q{};
  q.nlh.nlmsg_len = sizeof q;
  q.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  q.nlh.nlmsg_flags = NLM_F_REQUEST;
  q.nlh.nlmsg_seq = 1;
  q.req.sdiag_family = static_cast<uint8_t>(src.ss_family);
  q.req.sdiag_protocol = IPPROTO_TCP;
  q.req.idiag_states = ~0u;
  q.req.id.idiag_sport = port_of(src);
  q.req.id.idiag_dport = port_of(dst);
  put_address(src, q.req.id.idiag_src);
  put_address(dst, q.req.id.idiag_dst);
  q.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  q.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl.get(), &q, sizeof q, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel)
      < 0)
    return sys_error("sock_diag: cannot ask the kernel for the peer's socket");
  alignas(nlmsghdr) char buf[8192];
  for (;;) {
    auto got = ::recv(nl.get(), buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return sys_error("sock_diag: no answer from the kernel");
    int len = static_cast<int>(got);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_type == NLMSG_ERROR) {
        auto* e = reinterpret_cast<nlmsgerr*>(NLMSG_DATA(h));
        if (e->error == -ENOENT)
          return make_error(errc::not_found, "the peer's socket is gone");
        return sys_error("sock_diag: the kernel refused the look-up", {}, -e->error);
      }
      if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY)
        return static_cast<uid_t>(reinterpret_cast<inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid);
      if (h->nlmsg_type == NLMSG_DONE)
        return make_error(errc::not_found, "the peer's socket is gone");
    }
  }
}

} // namespace

expected<tcp_peer> tcp_peer_of(int fd) {
  sockaddr_storage mine{}, theirs{};
  socklen_t ml = sizeof mine, tl = sizeof theirs;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &ml) != 0)
    return sys_error("getsockname");
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &tl) != 0)
    return sys_error("getpeername");
  if (theirs.ss_family != AF_INET && theirs.ss_family != AF_INET6)
    return make_error(errc::invalid_argument, "not a TCP/IP socket");
  tcp_peer p;
  p.address = shown(theirs);
  p.loopback = is_loopback(theirs);
  if (!p.loopback)
    return p;
  // The peer's socket has our peer address as its local end.
  auto uid = tcp_socket_owner(theirs, mine);
  if (!uid)
    return std::move(uid).error_value();
  p.uid = *uid;
  return p;
}

gid_t group_id(const char* name) {
  group g{}, *found = nullptr;
  std::vector<char> buf(16384);
  if (::getgrnam_r(name, &g, buf.data(), buf.size(), &found) != 0 || !found)
    return static_cast<gid_t>(-1);
  return found->gr_gid;
}

bool uid_in_group(uid_t uid, gid_t gid) {
  if (uid == 0)
    return true;
  if (gid == static_cast<gid_t>(-1))
    return false;
  passwd pw{}, *found = nullptr;
  std::vector<char> buf(16384);
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || !found)
    return false;
  if (found->pw_gid == gid)
    return true;
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  while (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) < 0)
    groups.resize(static_cast<size_t>(n));
  groups.resize(static_cast<size_t>(n));
  for (auto g : groups)
    if (g == gid)
      return true;
  return false;
}

} // namespace dsec
