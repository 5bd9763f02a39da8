// dns_proxy: the node-local resolver of egress sandboxes (docs/network.md).
// One thread, one UDP socket on the resolver address (port 53) and one to the
// upstream (dsecd --dns-upstream). A query from a sandbox (known by its source
// address) is answered REFUSED unless its name is allowed by that sandbox's
// policy; an allowed one goes upstream, and the A records of the answer are
// admitted for that sandbox for their TTL (the `admit` callback: nftables
// dns_allow elements with a timeout) before the answer is relayed.
//
// DNS over TCP (RFC 7766: what a resolver falls back to when a UDP answer was
// truncated) is served on the same address and port, by the same rules: each
// sandbox connection gets its own upstream TCP connection, opened on its first
// allowed query; queries may be pipelined. Connections are bounded (in all,
// per sandbox, in buffered bytes) and closed after 10 s without a message.
//
// Messages are parsed and built with ldns. Nothing here blocks: the sockets
// are non-blocking and the thread only polls them. No CAF.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"

struct ldns_struct_pkt;

namespace dsec {

class dns_proxy {
public:
  /// Whether sandbox `src` (its address, host order) may resolve `name`
  /// (lower case, no trailing dot); nullopt-like false for an unknown source.
  using allowed_fn = std::function<bool(uint32_t src, const std::string& name)>;
  /// Admits `addrs` (host order) for sandbox `src` for `ttl_s` seconds.
  using admit_fn =
    std::function<void(uint32_t src, const std::vector<uint32_t>& addrs, uint32_t ttl_s)>;

  /// Binds `listen` (host order):53 and starts the thread. `upstream` is
  /// ADDR[:PORT] (IPv4; port 53 when omitted).
  static expected<std::unique_ptr<dns_proxy>> start(uint32_t listen, const std::string& upstream,
                                                    allowed_fn allowed, admit_fn admit);
  ~dns_proxy();

  struct counters {
    std::atomic<uint64_t> queries{0}, refused{0}, answered{0}, failed{0};
    std::atomic<uint64_t> tcp_connections{0}; ///< accepted so far
  };
  /// TCP connections at most, in all and from one sandbox.
  static constexpr size_t max_tcp = 256, max_tcp_per_sandbox = 16;
  [[nodiscard]] const counters& stats() const { return stats_; }

private:
  dns_proxy() = default;
  struct tcp_conn;
  void run();
  void accept_tcp(std::vector<tcp_conn>& conns);
  bool serve_tcp(tcp_conn& c, short client_ev, short up_ev); // false: close it
  /// The answer's A records admitted for `src`.
  void admit_answer(ldns_struct_pkt* r, uint32_t src);
  /// Whether query `q` from `src` may go upstream; if not, `refusal` holds
  /// the REFUSED answer (empty if none can be built).
  bool check_query(ldns_struct_pkt* q, uint32_t src, std::string& refusal);
  unique_fd sock_, up_, tcp_, stop_;
  sockaddr_in upstream_{};
  allowed_fn allowed_;
  admit_fn admit_;
  std::thread thread_;
  counters stats_;
};

/// Whether `name` matches one of `exact` or is below one of `suffixes`
/// ("a.example.org" is below "example.org"; "example.org" is not).
bool dns_name_matches(const std::string& name, const std::vector<std::string>& exact,
                      const std::vector<std::string>& suffixes);

} // namespace dsec
