// egress: a node's network for sandboxes with environment.network "egress"
// (docs/network.md). Each such sandbox gets
//  - a veth pair: "<prefix>N" on the node, "eth0" in the sandbox's own network
//    namespace (the one init was cloned with);
//  - a routed /31 out of the node's --sandbox-net: the node's end is the
//    even address, the sandbox's the odd one, with the default route via the
//    node's end; no bridge, so sandboxes share no L2 segment (no ARP or MAC
//    spoofing between them) and each one's traffic is told apart by the
//    interface it came in on;
//  - a resolver address (the first address of --sandbox-net after the network
//    address, on the node's veth pair "dx<tag>-dns"/"dx<tag>-dnp": some
//    kernels have no dummy driver);
//  - its policy as elements of the sets of one nftables table of the node,
//    "inet dsec_<tag>", whose chains are fixed: a create or a policy change
//    adds and removes set elements in one transaction, never rules (made
//    with libnftables, the elements sent as netlink messages directly:
//    runtime/nft_elements.hpp).
// The node NATs (masquerades) the sandboxes' traffic out through --uplink
// only: a packet from a sandbox that would leave by any other interface is
// dropped, whatever the policy says.
//
// Names: every link and the table carry a tag of the daemon instance (from
// its state dir), so a daemon that starts sweeps what a killed predecessor
// left (sweep()), and two daemons on one machine keep apart.
//
// Teardown: a sandbox's veth goes with its network namespace when its last
// process ends (one batched kernel teardown, not a 16 ms link delete each);
// its set elements are removed by its egress_link's destructor, in one
// transaction (most of a destroy's cost: the kernel's interval sets take
// ~0.15 ms to remove an element, where adding one is cheap); its /31 is
// reused only once the old veth is gone.
//
// No CAF. Thread-safe (one lock).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/fd.hpp"
#include "runtime/dns_proxy.hpp"
#include "runtime/net_policy.hpp"
#include "runtime/nft_elements.hpp"

struct nft_ctx;

namespace dsec {

class rtnl; // runtime/netlink.hpp

struct egress_options {
  std::string uplink;                       ///< dsecd --uplink IFACE (required)
  std::string sandbox_net = "198.19.0.0/16"; ///< dsecd --sandbox-net CIDR (/8 to /29)
  std::string tag;                          ///< 4 hex digits: egress_tag(state dir)
  /// dsecd --dns-upstream ADDR[:PORT]: where the node's DNS proxy asks;
  /// empty: no proxy, and domain and service rules are refused.
  std::string dns_upstream;
  /// dsecd --services FILE: lines "NAME RULE..." (CIDR, DOMAIN, *.DOMAIN
  /// rules; '#' starts a comment) naming services for policies.
  std::string services_file;
  /// dsecd --deny-range CIDR: more ranges denied unless named (besides
  /// always_denied_ranges(), the node's addresses and --sandbox-net).
  std::vector<std::string> deny_ranges;
};

/// The tag of a daemon instance: 4 hex digits hashed from its state dir.
std::string egress_tag(const std::string& state_dir);

class egress_network;

/// What one egress sandbox moved through its node (its veth's elements in
/// the table's counting sets): packets and bytes it sent and received,
/// connections its policy let it open (their first packets), and packets it
/// sent that were denied (each a connection attempt, or its retry).
struct sandbox_traffic {
  std::string sandbox; ///< egress_link::watch's id (empty if none)
  std::string ifname;
  uint64_t sent_packets = 0, sent_bytes = 0;
  uint64_t received_packets = 0, received_bytes = 0;
  uint64_t connections = 0;
  uint64_t denied_packets = 0, denied_bytes = 0;
};

/// A destination a sandbox tried to reach and was denied: TCP or UDP (or
/// the protocol's number), the address, the port; or (protocol "dns") a
/// name the node's resolver refused it.
struct denied_attempt {
  std::string protocol;
  uint32_t address = 0;
  uint16_t port = 0;
  std::string name; ///< protocol "dns" only
};

/// One sandbox's attachment: its veth, its /31, its set elements. The
/// destructor removes the elements (the veth goes with the sandbox's netns).
class egress_link {
public:
  [[nodiscard]] const std::string& ifname() const { return ifname_; }
  [[nodiscard]] uint32_t address() const { return addr_; }       ///< the sandbox's
  [[nodiscard]] uint32_t gateway() const { return addr_ - 1; }   ///< the node's end
  [[nodiscard]] uint32_t resolver() const;
  /// The policy in force (as given).
  [[nodiscard]] const std::vector<std::string>& allow() const { return allow_; }
  [[nodiscard]] const std::vector<std::string>& deny() const { return deny_; }

  /// Replaces the policy, in one nftables transaction: new connections see the
  /// new policy at once, established ones go on. On error the old one stays.
  expected<void> set_policy(const std::vector<std::string>& allow,
                            const std::vector<std::string>& deny);

  /// Names the link's sandbox (in traffic()) and has `on_denied` told of
  /// each destination it is denied, once per destination while the node
  /// remembers it (denied_memory_s): within about a second (poll_interval_ms)
  /// on the network's poll thread, and a name its resolver refused at once,
  /// on the DNS proxy's thread (with the network's lock held: tell and
  /// return).
  void watch(std::string sandbox, std::function<void(const denied_attempt&)> on_denied);

  /// This link's figures in the counting sets (egress_network::traffic's,
  /// one listing of each set).
  [[nodiscard]] sandbox_traffic traffic() const;

  ~egress_link();
  egress_link(const egress_link&) = delete;
  egress_link& operator=(const egress_link&) = delete;

private:
  friend class egress_network;
  egress_link() = default;
  egress_network* net_ = nullptr;
  bool active_ = false; // a sandbox's (not reserved, nor wired ahead)
  std::string ifname_;
  uint32_t addr_ = 0;
  size_t slot_ = 0;
  std::vector<std::string> allow_, deny_;
  std::vector<nft_set_elems> elements_; // its policy's (and addrs') elements
  // Domain rules (the DNS proxy's), and the addresses it admitted.
  std::vector<std::string> dns_exact_, dns_suffix_, deny_exact_, deny_suffix_;
  std::vector<uint32_t> admitted_;
  std::string owner_;
  std::function<void(const denied_attempt&)> on_denied_;
};

class egress_network {
public:
  /// Sweeps what an earlier daemon of this tag left, then makes the table,
  /// the resolver's link, and sets forwarding on the uplink.
  static expected<std::unique_ptr<egress_network>> start(const egress_options& opts);

  /// Removes the links and the table of `tag` (a killed daemon's); returns
  /// what it removed.
  static std::vector<std::string> sweep(const std::string& tag);
  /// Sweeps every dsec table (and its links) whose daemon is dead: the table
  /// names its owner ("dsecd pid N" comment). For daemons whose state dir is
  /// gone (a test's, a killed one's that nobody restarts).
  static std::vector<std::string> sweep_dead();

  /// Checks `allow`/`deny` (the rules this node can enforce) without
  /// attaching anything.
  expected<void> check_policy(const std::vector<std::string>& allow,
                              const std::vector<std::string>& deny) const;

  /// Gives the sandbox whose init is `pid` (with `pidfd`) its veth, /31,
  /// default route and policy.
  expected<std::unique_ptr<egress_link>> attach(pid_t pid, int pidfd,
                                                const std::vector<std::string>& allow,
                                                const std::vector<std::string>& deny);

  // ---- network namespaces wired ahead (dsecd --egress-prewire N) ----
  /// A network namespace made by a spawner's zygote (owned by the sandbox
  /// user namespace) and wired by this network's thread before any create
  /// asks: veth, /31, default route, loopback up, the link's address and
  /// counting elements in the table. Only the policy is left (activate).
  /// Given to that spawner's spawn (container_options::netns) and then
  /// closed here: the namespace lives on in the sandbox, its veth goes with it.
  struct prewired {
    unique_fd netns;
    std::unique_ptr<egress_link> link;
  };
  /// Keeps `n` wired ahead for the sandboxes of one spawner (`owner`), made
  /// by `make` (its spawner::make_netns) on a thread of this network's; 0:
  /// none. `make` must stay callable until stop_prewiring().
  void prewire(const void* owner, size_t n, std::function<expected<unique_fd>()> make);
  /// Stops the thread and drops what it wired (before the spawners go).
  void stop_prewiring();
  /// One of `owner`'s if one is ready, never waiting (an empty pool: the
  /// caller attaches the old way); the thread wires another.
  std::optional<prewired> take(const void* owner);
  /// A taken link's policy, in one transaction: from now on it is the
  /// sandbox's like one attach() made.
  expected<void> activate(egress_link& l, const std::vector<std::string>& allow,
                          const std::vector<std::string>& deny);
  struct prewire_counters {
    uint64_t taken = 0;  ///< creates that found one ready
    uint64_t missed = 0; ///< creates that found none (attached the old way)
    uint64_t made = 0;
    uint64_t failed = 0;
    uint64_t ready = 0;  ///< wired and waiting now
    std::string last_error;
  };
  [[nodiscard]] prewire_counters prewire_stats() const;

  [[nodiscard]] const std::string& table() const { return table_; }
  [[nodiscard]] const std::string& link_prefix() const { return prefix_; }
  [[nodiscard]] uint32_t resolver() const { return net_.addr + 1; }
  /// Whether domain and service rules can be enforced (a DNS proxy runs).
  [[nodiscard]] bool has_dns() const { return dns_ != nullptr; }
  /// The DNS proxy's counters (null without one).
  [[nodiscard]] const dns_proxy::counters* dns_stats() const {
    return dns_ ? &dns_->stats() : nullptr;
  }
  [[nodiscard]] const egress_options& options() const { return opts_; }
  /// Links attached now.
  [[nodiscard]] size_t attached() const;
  /// Packets the policies allowed (first packets of connections) and denied.
  struct counters_t {
    uint64_t allowed = 0, denied = 0;
  };
  counters_t counters();
  /// Each attached sandbox's counters (one listing of each counting set).
  std::vector<sandbox_traffic> traffic();

  /// How often the poll thread looks for denied destinations, and how long
  /// the table remembers one (a destination denied again within that is
  /// not reported again).
  static constexpr int poll_interval_ms = 1000;
  static constexpr int denied_memory_s = 60;


  /// Deletes the table and the dummy link, restores the uplink's forwarding.
  ~egress_network();
  egress_network(const egress_network&) = delete;
  egress_network& operator=(const egress_network&) = delete;

private:
  friend class egress_link;
  egress_network() = default;
  expected<void> nft(const std::string& cmds);
  // A policy for `ifname`: its set elements (addrs, allow, allow_special,
  // deny) and its domain rules; or an error naming the bad rule.
  struct compiled {
    std::vector<nft_set_elems> elements;
    std::vector<std::string> dns_exact, dns_suffix, deny_exact, deny_suffix;
  };
  expected<compiled> compile(const std::string& ifname, const std::vector<std::string>& allow,
                             const std::vector<std::string>& deny) const;
  void release(egress_link& l);
  expected<std::unique_ptr<egress_link>> reserve_link(); // with mu_ held
  expected<void> wire(egress_link& l, const std::function<expected<void>(rtnl&)>& add_veth,
                      int ns, bool loopback);
  void install(egress_link& l, compiled pol, const std::vector<std::string>& allow,
               const std::vector<std::string>& deny); // with mu_ held
  void prewire_loop();
  static std::vector<nft_set_elems> counting_elements(const std::string& ifname);
  void poll_loop();
  void poll_denied(); // with mu_ held
  expected<void> load_services(const std::string& path);
  void forget_admitted(egress_link& l); // with mu_ held
  // The DNS proxy's callbacks.
  bool dns_allowed(uint32_t src, const std::string& name);
  void dns_admit(uint32_t src, const std::vector<uint32_t>& addrs, uint32_t ttl_s);

  egress_options opts_;
  ipv4_net net_;
  std::vector<ipv4_net> special_;
  std::string table_, prefix_, dns_link_;
  unique_fd home_ns_;
  std::string uplink_forwarding_; // its value before we set it, to restore
  mutable std::mutex mu_;
  nft_ctx* nft_ = nullptr;
  std::optional<nft_elements> elems_; // the hot path's: adds and removes elements
  uint64_t next_name_ = 0;
  // /31 slot i: addresses net + 2 + 2i (node) and net + 3 + 2i (sandbox).
  struct slot {
    bool used = false;
    std::string last_ifname; // the veth it had: reused once that is gone
  };
  std::vector<slot> slots_;
  size_t next_slot_ = 0;
  size_t attached_ = 0;
  std::map<std::string, std::vector<std::string>> services_; // --services
  std::map<uint32_t, egress_link*> by_addr_;                 // for the DNS proxy
  std::map<std::string, egress_link*> by_ifname_;            // for traffic() and poll
  // The poll thread's: its own context (JSON output), the destinations
  // reported and until when.
  nft_ctx* json_ = nullptr;
  std::map<std::string, std::chrono::steady_clock::time_point> reported_;
  bool stopping_ = false;
  std::condition_variable poll_cv_;
  std::thread poller_;
  // Namespaces wired ahead, per spawner, and the thread that wires them.
  struct prewire_pool {
    const void* owner;
    size_t want;
    std::function<expected<unique_fd>()> make;
    std::vector<prewired> ready;
    std::chrono::steady_clock::time_point retry_at;
  };
  std::vector<prewire_pool> pools_;
  prewire_counters pstats_;
  bool prewire_stop_ = false;
  std::condition_variable prewire_cv_;
  std::thread prewirer_;

  // For /metrics: what the poll thread read last (shared with the
  // collector, which a scrape may be running while this network goes).
  struct gauges {
    std::atomic<uint64_t> allowed{0}, denied{0}, attached{0};
    std::atomic<uint64_t> prewired{0}, prewire_taken{0}, prewire_missed{0};
    std::atomic<uint64_t> dns_answered{0}, dns_refused{0}, dns_failed{0};
    std::atomic<bool> dns{false};
  };
  std::shared_ptr<gauges> gauges_ = std::make_shared<gauges>();
  uint64_t collector_ = 0;
  std::unique_ptr<dns_proxy> dns_;                           // last: stopped first
};

} // namespace dsec
