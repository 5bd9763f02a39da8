#include "runtime/netlink.hpp"

#include <arpa/inet.h>
#include <net/if.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/netlink.h>
#include <netlink/cache.h>
#include <netlink/errno.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/route/link/veth.h>
#include <netlink/route/route.h>
#include <netlink/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dsec {

namespace {

error nl_error(std::string_view what, const std::string& name, int err) {
  auto e = make_error(err == -NLE_OBJ_NOTFOUND || err == -NLE_NODEV ? errc::not_found
                                                                    : errc::system_error,
                      std::string{what} + " " + name + ": " + nl_geterror(err));
  e.path = name;
  return e;
}

struct link_ptr {
  rtnl_link* p;
  ~link_ptr() {
    if (p)
      rtnl_link_put(p);
  }
};

nl_addr* v4(uint32_t host_order, uint8_t prefix) {
  uint32_t n = htonl(host_order);
  nl_addr* a = nl_addr_build(AF_INET, &n, sizeof n);
  if (a)
    nl_addr_set_prefixlen(a, prefix);
  return a;
}

} // namespace

expected<rtnl> rtnl::open() {
  nl_sock* s = nl_socket_alloc();
  if (!s)
    return make_error(errc::system_error, "nl_socket_alloc: out of memory");
  if (int err = nl_connect(s, NETLINK_ROUTE); err < 0) {
    nl_socket_free(s);
    return nl_error("connecting to", "rtnetlink", err);
  }
  return rtnl{s};
}

expected<rtnl> rtnl::open_in(int ns, int home) {
  if (::setns(ns, CLONE_NEWNET) < 0)
    return sys_error("entering the sandbox's network namespace", "setns");
  int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  int err = errno;
  if (::setns(home, CLONE_NEWNET) < 0)
    std::abort(); // a thread of dsecd left in a sandbox's namespace: never go on
  if (fd < 0)
    return sys_error("a netlink socket in the sandbox's network namespace", "socket", err);
  nl_sock* s = nl_socket_alloc();
  if (!s) {
    ::close(fd);
    return make_error(errc::system_error, "nl_socket_alloc: out of memory");
  }
  if (int e = nl_socket_set_fd(s, NETLINK_ROUTE, fd); e < 0) {
    ::close(fd);
    nl_socket_free(s);
    return nl_error("adopting", "a netlink socket", e);
  }
  return rtnl{s};
}

rtnl::rtnl(rtnl&& o) noexcept : sk_(o.sk_) { o.sk_ = nullptr; }
rtnl& rtnl::operator=(rtnl&& o) noexcept {
  std::swap(sk_, o.sk_);
  return *this;
}
rtnl::~rtnl() {
  if (sk_)
    nl_socket_free(sk_); // closes the socket
}

namespace {
// A veth pair `name`/`peer`, the peer placed by `place` (its namespace).
expected<void> make_veth(nl_sock* sk, const std::string& name, const std::string& peer,
                         void (*place)(rtnl_link*, int), int where) {
  link_ptr l{rtnl_link_veth_alloc()};
  if (!l.p)
    return make_error(errc::system_error, "rtnl_link_veth_alloc: out of memory");
  rtnl_link_set_name(l.p, name.c_str());
  rtnl_link* p = rtnl_link_veth_get_peer(l.p);
  rtnl_link_set_name(p, peer.c_str());
  if (place)
    place(p, where);
  int err = rtnl_link_add(sk, l.p, NLM_F_CREATE | NLM_F_EXCL);
  rtnl_link_put(p);
  if (err < 0)
    return nl_error("adding the veth pair", name, err);
  return {};
}

void place_by_pid(rtnl_link* p, int pid) { rtnl_link_set_ns_pid(p, pid); }
void place_by_fd(rtnl_link* p, int fd) { rtnl_link_set_ns_fd(p, fd); }
} // namespace

expected<void> rtnl::add_veth(const std::string& name, const std::string& peer, pid_t peer_pid) {
  return make_veth(sk_, name, peer, peer_pid > 0 ? place_by_pid : nullptr, peer_pid);
}

expected<void> rtnl::add_veth_into(const std::string& name, const std::string& peer,
                                   int peer_ns) {
  return make_veth(sk_, name, peer, place_by_fd, peer_ns);
}

expected<void> rtnl::set_up(const std::string& name) {
  rtnl_link* l = nullptr;
  if (int err = rtnl_link_get_kernel(sk_, 0, name.c_str(), &l); err < 0)
    return nl_error("finding the link", name, err);
  link_ptr orig{l};
  link_ptr change{rtnl_link_alloc()};
  if (!change.p)
    return make_error(errc::system_error, "rtnl_link_alloc: out of memory");
  rtnl_link_set_flags(change.p, IFF_UP);
  if (int err = rtnl_link_change(sk_, orig.p, change.p, 0); err < 0)
    return nl_error("bringing up", name, err);
  return {};
}

expected<int> rtnl::set_up_index(const std::string& name) {
  DSEC_TRY_VOID(set_up(name));
  return index_of(name);
}

expected<void> rtnl::add_dummy(const std::string& name) {
  link_ptr l{rtnl_link_alloc()};
  if (!l.p)
    return make_error(errc::system_error, "rtnl_link_alloc: out of memory");
  rtnl_link_set_name(l.p, name.c_str());
  if (int err = rtnl_link_set_type(l.p, "dummy"); err < 0)
    return nl_error("making the dummy link", name, err);
  rtnl_link_set_flags(l.p, IFF_UP);
  if (int err = rtnl_link_add(sk_, l.p, NLM_F_CREATE | NLM_F_EXCL); err < 0)
    return nl_error("adding the dummy link", name, err);
  return {};
}

expected<int> rtnl::index_of(const std::string& name) {
  rtnl_link* l = nullptr;
  if (int err = rtnl_link_get_kernel(sk_, 0, name.c_str(), &l); err < 0)
    return nl_error("finding the link", name, err);
  int idx = rtnl_link_get_ifindex(l);
  rtnl_link_put(l);
  return idx;
}

expected<void> rtnl::add_address(int ifindex, uint32_t addr, uint8_t prefix) {
  rtnl_addr* a = rtnl_addr_alloc();
  nl_addr* local = v4(addr, prefix);
  if (!a || !local) {
    if (a)
      rtnl_addr_put(a);
    if (local)
      nl_addr_put(local);
    return make_error(errc::system_error, "rtnl_addr_alloc: out of memory");
  }
  rtnl_addr_set_ifindex(a, ifindex);
  rtnl_addr_set_local(a, local);
  nl_addr_put(local);
  int err = rtnl_addr_add(sk_, a, 0);
  rtnl_addr_put(a);
  if (err < 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%u.%u.%u.%u/%u", addr >> 24, (addr >> 16) & 255,
                  (addr >> 8) & 255, addr & 255, prefix);
    return nl_error("adding the address", buf, err);
  }
  return {};
}

expected<void> rtnl::add_default_route(int ifindex, uint32_t gw) {
  rtnl_route* r = rtnl_route_alloc();
  nl_addr* dst = v4(0, 0);
  nl_addr* via = v4(gw, 32);
  rtnl_nexthop* nh = rtnl_route_nh_alloc();
  if (!r || !dst || !via || !nh) {
    if (r)
      rtnl_route_put(r);
    if (dst)
      nl_addr_put(dst);
    if (via)
      nl_addr_put(via);
    if (nh)
      rtnl_route_nh_free(nh);
    return make_error(errc::system_error, "rtnl_route_alloc: out of memory");
  }
  rtnl_route_set_family(r, AF_INET);
  rtnl_route_set_dst(r, dst);
  nl_addr_put(dst);
  rtnl_route_nh_set_ifindex(nh, ifindex);
  rtnl_route_nh_set_gateway(nh, via);
  nl_addr_put(via);
  rtnl_route_add_nexthop(r, nh); // r owns nh now
  int err = rtnl_route_add(sk_, r, NLM_F_CREATE | NLM_F_EXCL);
  rtnl_route_put(r);
  if (err < 0)
    return nl_error("adding the default route", "0.0.0.0/0", err);
  return {};
}

expected<void> rtnl::delete_link(const std::string& name) {
  link_ptr l{rtnl_link_alloc()};
  if (!l.p)
    return make_error(errc::system_error, "rtnl_link_alloc: out of memory");
  rtnl_link_set_name(l.p, name.c_str());
  if (int err = rtnl_link_delete(sk_, l.p); err < 0)
    return nl_error("deleting the link", name, err);
  return {};
}

expected<std::vector<std::string>> rtnl::links_with_prefix(const std::string& prefix) {
  nl_cache* cache = nullptr;
  if (int err = rtnl_link_alloc_cache(sk_, AF_UNSPEC, &cache); err < 0)
    return nl_error("listing", "the links", err);
  std::vector<std::string> out;
  for (nl_object* o = nl_cache_get_first(cache); o; o = nl_cache_get_next(o)) {
    const char* n = rtnl_link_get_name(reinterpret_cast<rtnl_link*>(o));
    if (n && std::string_view{n}.starts_with(prefix))
      out.emplace_back(n);
  }
  nl_cache_free(cache);
  return out;
}

expected<std::vector<uint32_t>> rtnl::ipv4_addresses() {
  nl_cache* cache = nullptr;
  if (int err = rtnl_addr_alloc_cache(sk_, &cache); err < 0)
    return nl_error("listing", "the addresses", err);
  std::vector<uint32_t> out;
  for (nl_object* o = nl_cache_get_first(cache); o; o = nl_cache_get_next(o)) {
    auto* a = reinterpret_cast<rtnl_addr*>(o);
    nl_addr* l = rtnl_addr_get_local(a);
    if (rtnl_addr_get_family(a) == AF_INET && l && nl_addr_get_len(l) == 4) {
      uint32_t n;
      std::memcpy(&n, nl_addr_get_binary_addr(l), 4);
      out.push_back(ntohl(n));
    }
  }
  nl_cache_free(cache);
  return out;
}

} // namespace dsec
