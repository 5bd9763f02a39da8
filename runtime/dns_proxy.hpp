// dns_proxy: the node-local resolver of egress sandboxes (docs/network.md).
// One thread, one UDP socket on the resolver address (port 53) and one to the
// upstream (dsecd --dns-upstream). A query from a sandbox (known by its source
// address) is answered REFUSED unless its name is allowed by that sandbox's
// policy; an allowed one goes upstream, and the A records of the answer are
// admitted for that sandbox for their TTL (the `admit` callback: nftables
// dns_allow elements with a timeout) before the answer is relayed. Messages
// are parsed and built with ldns. Nothing here blocks: the sockets are
// non-blocking and the thread only polls them. No CAF.
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
  };
  [[nodiscard]] const counters& stats() const { return stats_; }

private:
  dns_proxy() = default;
  void run();
  unique_fd sock_, up_, stop_;
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
