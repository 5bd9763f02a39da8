#include "runtime/nft_elements.hpp"

#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <sys/socket.h>

#include <libmnl/libmnl.h>
#include <libnftnl/common.h>
#include <libnftnl/set.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace dsec {

nft_key& nft_key::ifname(const std::string& name) {
  // IFNAMSIZ bytes, zero-padded: what `meta iifname` loads.
  size_t n = std::min<size_t>(name.size(), IFNAMSIZ - 1);
  std::memcpy(bytes.data() + len, name.data(), n);
  len = static_cast<uint8_t>(len + IFNAMSIZ);
  return *this;
}

nft_key& nft_key::ipv4(uint32_t addr) {
  uint32_t be = htonl(addr);
  std::memcpy(bytes.data() + len, &be, 4);
  len = static_cast<uint8_t>(len + 4);
  return *this;
}

nft_key& nft_key::port(uint16_t port) {
  uint16_t be = htons(port);
  std::memcpy(bytes.data() + len, &be, 2); // then 2 bytes of padding
  len = static_cast<uint8_t>(len + 4);
  return *this;
}

expected<nft_elements> nft_elements::open(std::string table) {
  if (table.empty() || table.size() >= NFT_NAME_MAXLEN)
    return make_error(errc::invalid_argument, "nftables table name '" + table + "'");
  nft_elements e;
  e.table_ = std::move(table);
  e.nl_ = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (!e.nl_)
    return sys_error("nftables: opening a netfilter netlink socket");
  if (mnl_socket_bind(e.nl_, 0, MNL_SOCKET_AUTOPID) < 0)
    return sys_error("nftables: binding a netfilter netlink socket");
  // Errors without a copy of the message they answer.
  int one = 1;
  (void) mnl_socket_setsockopt(e.nl_, NETLINK_CAP_ACK, &one, sizeof one);
  e.portid_ = mnl_socket_get_portid(e.nl_);
  e.seq_ = 1;
  return e;
}

nft_elements::nft_elements(nft_elements&& o) noexcept
  : nl_(o.nl_), portid_(o.portid_), seq_(o.seq_), table_(std::move(o.table_)),
    buf_(std::move(o.buf_)) {
  o.nl_ = nullptr;
}

nft_elements& nft_elements::operator=(nft_elements&& o) noexcept {
  if (this != &o) {
    if (nl_)
      mnl_socket_close(nl_);
    nl_ = o.nl_;
    o.nl_ = nullptr;
    portid_ = o.portid_;
    seq_ = o.seq_;
    table_ = std::move(o.table_);
    buf_ = std::move(o.buf_);
  }
  return *this;
}

nft_elements::~nft_elements() {
  if (nl_)
    mnl_socket_close(nl_);
}

namespace {

struct set_owner {
  nftnl_set* p;
  ~set_owner() {
    if (p)
      nftnl_set_free(p);
  }
};

// The most one element takes in a message: its nest, its key and key end
// (nest, value attribute, 32 bytes each), its timeout.
constexpr size_t max_elem_bytes = 4 + 2 * (4 + 4 + 32) + (4 + 8) + 16;
// A message's header, nfgenmsg, table and set names, the elements' nest.
constexpr size_t max_msg_bytes = NLMSG_HDRLEN + 4 + 2 * (4 + NFT_NAME_MAXLEN) + 4 + 16;

} // namespace

expected<void> nft_elements::apply(std::span<const nft_set_elems> del,
                                   std::span<const nft_set_elems> add) {
  size_t need = 2 * max_msg_bytes;
  for (auto list : {del, add})
    for (const auto& s : list) {
      if (s.set.empty() || s.set.size() >= NFT_NAME_MAXLEN)
        return make_error(errc::invalid_argument, "nftables set name '" + s.set + "'");
      need += max_msg_bytes + max_elem_bytes * s.elems.size();
    }
  if (buf_.size() < need)
    buf_.resize(need);
  char* p = buf_.data();
  size_t off = 0;
  auto advance = [&](nlmsghdr* h) { off += NLMSG_ALIGN(h->nlmsg_len); };
  // What each message of the batch did, by its sequence number, to name a
  // failure.
  struct sent {
    const std::string* set;
    bool del;
    uint32_t seq;
  };
  std::vector<sent> msgs;
  msgs.reserve(del.size() + add.size());
  advance(nftnl_batch_begin(p + off, seq_++));
  auto put = [&](const nft_set_elems& s, bool is_del) -> expected<void> {
    if (s.elems.empty())
      return {};
    set_owner set{nftnl_set_alloc()};
    if (!set.p)
      return make_error(errc::system_error, "nftnl_set_alloc: out of memory");
    nftnl_set_set_str(set.p, NFTNL_SET_TABLE, table_.c_str());
    nftnl_set_set_str(set.p, NFTNL_SET_NAME, s.set.c_str());
    for (const auto& e : s.elems) {
      nftnl_set_elem* el = nftnl_set_elem_alloc();
      if (!el)
        return make_error(errc::system_error, "nftnl_set_elem_alloc: out of memory");
      nftnl_set_elem_set(el, NFTNL_SET_ELEM_KEY, e.key.bytes.data(), e.key.len);
      if (e.key_end.len)
        nftnl_set_elem_set(el, NFTNL_SET_ELEM_KEY_END, e.key_end.bytes.data(), e.key_end.len);
      if (e.timeout_ms && !is_del)
        nftnl_set_elem_set_u64(el, NFTNL_SET_ELEM_TIMEOUT, e.timeout_ms);
      nftnl_set_elem_add(set.p, el); // the set owns it
    }
    // As nft sends them: an add creates (without NLM_F_EXCL an element
    // already there is no error), a delete names each element.
    uint16_t type = is_del ? NFT_MSG_DELSETELEM : NFT_MSG_NEWSETELEM;
    uint16_t flags = NLM_F_ACK | (is_del ? 0 : NLM_F_CREATE);
    nlmsghdr* h = nftnl_nlmsg_build_hdr(p + off, type, NFPROTO_INET, flags, seq_);
    nftnl_set_elems_nlmsg_build_payload(h, set.p);
    msgs.push_back({&s.set, is_del, seq_++});
    advance(h);
    return {};
  };
  for (const auto& s : del)
    if (auto r = put(s, true); !r)
      return r;
  for (const auto& s : add)
    if (auto r = put(s, false); !r)
      return r;
  advance(nftnl_batch_end(p + off, seq_++));
  if (msgs.empty())
    return {};
  if (mnl_socket_sendto(nl_, p, off) < 0)
    return sys_error("nftables: sending set elements");
  // The kernel handles a batch within the send: every answer (an ack for
  // each message, or its error; the batch is applied only if none failed)
  // is queued by now, so nothing here waits.
  char rbuf[MNL_SOCKET_BUFFER_SIZE];
  size_t got = 0;
  int err = 0;
  uint32_t failed_seq = 0;
  int fd = mnl_socket_get_fd(nl_);
  while (got < msgs.size()) {
    ssize_t n = ::recv(fd, rbuf, sizeof rbuf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (n < 0)
      return sys_error("nftables: reading the kernel's answer");
    int len = static_cast<int>(n);
    auto* h = reinterpret_cast<nlmsghdr*>(rbuf);
    while (mnl_nlmsg_ok(h, len)) {
      if (h->nlmsg_type == NLMSG_ERROR && h->nlmsg_pid == portid_) {
        auto* e = static_cast<nlmsgerr*>(mnl_nlmsg_get_payload(h));
        ++got;
        if (e->error != 0 && err == 0) {
          err = -e->error;
          failed_seq = h->nlmsg_seq;
        }
      }
      h = mnl_nlmsg_next(h, &len);
    }
  }
  if (err == 0 && got < msgs.size())
    return make_error(errc::system_error,
                      "nftables: answered " + std::to_string(got) + " of "
                        + std::to_string(msgs.size()) + " set element messages");
  if (err == 0)
    return {};
  std::string what = "the batch";
  for (const auto& m : msgs)
    if (m.seq == failed_seq)
      what = std::string{m.del ? "deleting elements from" : "adding elements to"} + " set "
             + *m.set;
  return sys_error("nftables: " + what + " of table inet " + table_, {}, err);
}

} // namespace dsec
