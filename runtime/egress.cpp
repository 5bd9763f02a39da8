#include "runtime/egress.hpp"

#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <unistd.h>

#include <nftables/libnftables.h>

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <functional>
#include <fstream>
#include <sstream>

#include "runtime/metrics.hpp"
#include "runtime/netlink.hpp"

namespace dsec {

namespace {

// A /proc/sys file's first line, or "" if it cannot be read.
std::string read_sysctl(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return {};
  char buf[32];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0)
    return {};
  std::string s{buf, static_cast<size_t>(n)};
  while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
    s.pop_back();
  return s;
}

expected<void> write_sysctl(const std::string& path, const std::string& value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return sys_error("opening", path);
  bool ok = ::write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
  int err = errno;
  ::close(fd);
  if (!ok)
    return sys_error("writing", path, err);
  return {};
}

std::string forwarding_path(const std::string& ifname) {
  return "/proc/sys/net/ipv4/conf/" + ifname + "/forwarding";
}

bool ifname_ok(const std::string& n) {
  if (n.empty() || n.size() >= IFNAMSIZ)
    return false;
  for (char c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      return false;
  return true;
}

std::string base36(uint64_t v) {
  const char* digits = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string s;
  do {
    s.insert(s.begin(), digits[v % 36]);
    v /= 36;
  } while (v);
  return s;
}

struct nft_owner {
  nft_ctx* p;
  ~nft_owner() {
    if (p)
      nft_ctx_free(p);
  }
};

nft_ctx* new_nft() {
  nft_ctx* c = nft_ctx_new(NFT_CTX_DEFAULT);
  if (c) {
    nft_ctx_buffer_output(c);
    nft_ctx_buffer_error(c);
  }
  return c;
}

expected<void> run_nft(nft_ctx* c, const std::string& cmds) {
  if (nft_run_cmd_from_buffer(c, cmds.c_str()) != 0) {
    std::string err = nft_ctx_get_error_buffer(c);
    while (!err.empty() && err.back() == '\n')
      err.pop_back();
    auto e = make_error(errc::system_error, "nftables: " + err);
    e.path = "nftables";
    return e;
  }
  return {};
}

// Drops the rules another rule of the same list covers (the kernel refuses
// some nested intervals of one set), and duplicates.
std::vector<net_rule> normalised(std::vector<net_rule> rules) {
  std::vector<net_rule> out;
  for (size_t i = 0; i < rules.size(); ++i) {
    bool covered = false;
    for (size_t j = 0; j < rules.size() && !covered; ++j) {
      if (i == j)
        continue;
      const auto& a = rules[i];
      const auto& b = rules[j];
      bool in = b.net.contains(a.net) && b.port_lo <= a.port_lo && a.port_hi <= b.port_hi;
      bool same = b.net == a.net && b.port_lo == a.port_lo && b.port_hi == a.port_hi;
      covered = in && (!same || j < i);
    }
    if (!covered)
      out.push_back(rules[i]);
  }
  return out;
}

// An element of an interval set "ifname . ipv4_addr . inet_service": from
// the network's first address and the lowest port to its last and the
// highest.
nft_elem element(const std::string& ifname, const net_rule& r) {
  nft_elem e;
  e.key.ifname(ifname).ipv4(r.net.first()).port(r.port_lo);
  e.key_end.ifname(ifname).ipv4(r.net.last()).port(r.port_hi);
  return e;
}

// The anti-spoofing element of a sandbox: its veth and its address.
nft_set_elems addrs_element(const std::string& ifname, uint32_t addr) {
  nft_elem e;
  e.key.ifname(ifname).ipv4(addr);
  return {"addrs", {e}};
}

// The elements a sandbox has: its address, then its policy's.
std::vector<nft_set_elems> with_addrs(const std::string& ifname, uint32_t addr,
                                      std::vector<nft_set_elems> policy) {
  policy.insert(policy.begin(), addrs_element(ifname, addr));
  return policy;
}

} // namespace

std::string egress_tag(const std::string& state_dir) {
  uint32_t h = 2166136261u;
  for (unsigned char c : state_dir)
    h = (h ^ c) * 16777619u;
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04x", (h ^ (h >> 16)) & 0xffff);
  return buf;
}

uint32_t egress_link::resolver() const { return net_->resolver(); }

std::vector<std::string> egress_network::sweep(const std::string& tag) {
  std::vector<std::string> gone;
  if (auto nl = rtnl::open()) {
    auto links = nl->links_with_prefix("dx" + tag + "_");
    std::vector<std::string> names = links ? *links : std::vector<std::string>{};
    if (::if_nametoindex(("dx" + tag + "-dns").c_str()) != 0)
      names.push_back("dx" + tag + "-dns");
    for (const auto& n : names)
      if (nl->delete_link(n))
        gone.push_back("link " + n);
  }
  nft_owner c{new_nft()};
  if (c.p && run_nft(c.p, "list table inet dsec_" + tag))
    if (run_nft(c.p, "delete table inet dsec_" + tag))
      gone.push_back("nftables table inet dsec_" + tag);
  return gone;
}

std::vector<std::string> egress_network::sweep_dead() {
  std::vector<std::string> gone;
  nft_owner c{new_nft()};
  if (!c.p || !run_nft(c.p, "list tables inet"))
    return gone;
  std::istringstream tables{nft_ctx_get_output_buffer(c.p)};
  std::string line;
  std::vector<std::string> tags;
  while (std::getline(tables, line)) {
    const std::string mark = "table inet dsec_";
    if (line.rfind(mark, 0) == 0 && line.size() == mark.size() + 4)
      tags.push_back(line.substr(mark.size()));
  }
  for (const auto& tag : tags) {
    if (!run_nft(c.p, "list table inet dsec_" + tag))
      continue;
    std::string text = nft_ctx_get_output_buffer(c.p);
    auto at = text.find("comment \"dsecd pid ");
    if (at == std::string::npos)
      continue; // not one of ours, or from before owners were written
    long pid = std::strtol(text.c_str() + at + 19, nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)
      continue; // its daemon lives
    for (auto& what : sweep(tag))
      gone.push_back(std::move(what) + " (of dead dsecd " + std::to_string(pid) + ")");
  }
  return gone;
}

expected<std::unique_ptr<egress_network>> egress_network::start(const egress_options& opts) {
  std::unique_ptr<egress_network> n{new egress_network};
  n->opts_ = opts;
  auto net = parse_ipv4_net(opts.sandbox_net);
  if (!net)
    return make_error(errc::invalid_argument, "--sandbox-net " + net.error_value().message);
  if (net->prefix < 8 || net->prefix > 29)
    return make_error(errc::invalid_argument, "--sandbox-net " + opts.sandbox_net
                                                + ": expected a network from /8 to /29");
  n->net_ = *net;
  if (opts.tag.size() != 4 || opts.tag.find_first_not_of("0123456789abcdef") != std::string::npos)
    return make_error(errc::invalid_argument, "egress tag '" + opts.tag + "': expected 4 hex digits");
  n->prefix_ = "dx" + opts.tag + "_";
  n->dns_link_ = "dx" + opts.tag + "-dns";
  n->table_ = "dsec_" + opts.tag;
  if (!ifname_ok(opts.uplink))
    return make_error(errc::invalid_argument,
                      "--uplink '" + opts.uplink + "' is not an interface name");
  if (opts.uplink.starts_with("dx" + opts.tag))
    return make_error(errc::invalid_argument,
                      "--uplink " + opts.uplink + " is one of dsecd's own links");
  if (::if_nametoindex(opts.uplink.c_str()) == 0)
    return make_error(errc::not_found, "--uplink " + opts.uplink + ": no such interface here");
  (void) sweep(opts.tag);
  (void) sweep_dead();
  n->home_ns_ = unique_fd{::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)};
  if (!n->home_ns_)
    return sys_error("opening the node's network namespace", "/proc/thread-self/ns/net");
  n->nft_ = new_nft();
  if (!n->nft_)
    return make_error(errc::system_error, "nft_ctx_new failed");
  {
    DSEC_TRY(el, nft_elements::open(n->table_));
    n->elems_.emplace(std::move(el));
  }
  DSEC_TRY(nl, rtnl::open());
  // A veth pair of the node's own rather than a dummy link (kernels without
  // the dummy driver): the resolver's address lives on one end.
  DSEC_TRY_VOID(nl.add_veth(n->dns_link_, "dx" + opts.tag + "-dnp", 0));
  DSEC_TRY_VOID(nl.set_up("dx" + opts.tag + "-dnp"));
  DSEC_TRY(dns_idx, nl.set_up_index(n->dns_link_));
  DSEC_TRY_VOID(nl.add_address(dns_idx, n->resolver(), 32));
  // Always denied unless named: the special ranges, the node's own addresses
  // (taken now), and the sandboxes' network.
  n->special_ = always_denied_ranges();
  for (const auto& r : opts.deny_ranges) {
    auto dr = parse_ipv4_net(r);
    if (!dr)
      return make_error(errc::invalid_argument, "--deny-range " + dr.error_value().message);
    n->special_.push_back(*dr);
  }
  if (!opts.services_file.empty())
    DSEC_TRY_VOID(n->load_services(opts.services_file));
  std::string special;
  for (const auto& r : n->special_)
    special += (special.empty() ? "" : ", ") + r.to_string();
  DSEC_TRY(own, nl.ipv4_addresses());
  for (auto a : own)
    special += ", " + ipv4_to_string(a);
  special += ", " + n->net_.to_string();
  const std::string& up = opts.uplink;
  const std::string match = "\"" + n->prefix_ + "*\"";
  std::string t = "table inet " + n->table_ + " {\n"
    "  comment \"dsecd pid " + std::to_string(::getpid()) + "\";\n"
    "  set addrs { type ifname . ipv4_addr; }\n"
    "  set allow { type ifname . ipv4_addr . inet_service; flags interval; }\n"
    "  set allow_special { type ifname . ipv4_addr . inet_service; flags interval; }\n"
    "  set deny { type ifname . ipv4_addr . inet_service; flags interval; }\n"
    "  set dns_allow { type ifname . ipv4_addr; flags timeout; }\n"
    "  set special { type ipv4_addr; flags interval; auto-merge; elements = { " + special + " } }\n"
    "  counter allowed { }\n"
    "  counter denied { }\n"
    // Per sandbox (by its veth), each element with its counter: what it sent
    // and received through the node, the connections its policy let it
    // open, the packets it denied; and what it tried to reach and was
    // denied (for its session's events, egress_network::poll).
    "  set sb_tx { type ifname; counter; }\n"
    "  set sb_rx { type ifname; counter; }\n"
    "  set sb_new { type ifname; counter; }\n"
    "  set sb_denied { type ifname; counter; }\n"
    "  set denied_to { type ifname . ipv4_addr . inet_proto . inet_service;"
    " flags dynamic,timeout; timeout " + std::to_string(denied_memory_s) + "s; size 65536; }\n"
    "  chain sb_out {\n"
    "    ct state established,related iifname @sb_tx accept\n"
    "    ct state established,related accept\n"
    "    ct state invalid drop\n"
    "    meta nfproto ipv6 goto sb_deny\n"
    "    iifname . ip saddr != @addrs goto sb_deny\n"
    "    oifname != \"" + up + "\" goto sb_deny\n"
    "    meta l4proto != { tcp, udp } goto sb_deny\n"
    "    iifname . ip daddr . th dport @deny goto sb_deny\n"
    "    iifname . ip daddr . th dport @allow_special goto sb_allow\n"
    "    ip daddr @special goto sb_deny\n"
    "    iifname . ip daddr . th dport @allow goto sb_allow\n"
    "    iifname . ip daddr @dns_allow goto sb_allow\n"
    "    goto sb_deny\n"
    "  }\n"
    "  chain sb_allow {\n"
    "    iifname @sb_new\n"
    "    iifname @sb_tx\n"
    "    counter name allowed accept\n"
    "  }\n"
    "  chain sb_deny {\n"
    "    iifname @sb_denied\n"
    "    meta l4proto { tcp, udp } add @denied_to { iifname . ip daddr . meta l4proto . th dport }\n"
    "    counter name denied drop\n"
    "  }\n"
    "  chain sb_in {\n"
    "    ct state established,related accept\n"
    "    ip daddr " + ipv4_to_string(n->resolver()) + " meta l4proto { tcp, udp } th dport 53 accept\n"
    "    goto sb_deny\n"
    "  }\n"
    "  chain forward {\n"
    "    type filter hook forward priority filter - 5; policy accept;\n"
    "    iifname " + match + " jump sb_out\n"
    "    oifname " + match + " ct state established,related oifname @sb_rx accept\n"
    "    oifname " + match + " ct state established,related accept\n"
    "    oifname " + match + " drop\n"
    "  }\n"
    "  chain input {\n"
    "    type filter hook input priority filter - 5; policy accept;\n"
    "    iifname " + match + " jump sb_in\n"
    "  }\n"
    "  chain postrouting {\n"
    "    type nat hook postrouting priority srcnat; policy accept;\n"
    "    ip saddr " + n->net_.to_string() + " oifname \"" + up + "\" masquerade\n"
    "  }\n"
    "}\n";
  if (auto r = n->nft(t); !r)
    return std::move(r).error_value().in_step("egress_table");
  if (!opts.dns_upstream.empty()) {
    auto* self = n.get();
    auto p = dns_proxy::start(
      n->resolver(), opts.dns_upstream,
      [self](uint32_t src, const std::string& name) { return self->dns_allowed(src, name); },
      [self](uint32_t src, const std::vector<uint32_t>& a, uint32_t ttl) {
        self->dns_admit(src, a, ttl);
      });
    if (!p)
      return std::move(p).error_value().in_step("dns_proxy");
    n->dns_ = std::move(*p);
  }
  n->uplink_forwarding_ = read_sysctl(forwarding_path(up));
  if (auto r = write_sysctl(forwarding_path(up), "1"); !r)
    return std::move(r).error_value().in_step("uplink_forwarding");
  n->json_ = new_nft();
  if (!n->json_)
    return make_error(errc::system_error, "nft_ctx_new failed");
  nft_ctx_output_set_flags(n->json_, NFT_CTX_OUTPUT_JSON);
  n->poller_ = std::thread([self = n.get()] { self->poll_loop(); });
  // /metrics reads what the poll thread read (no nft call from a scrape).
  n->gauges_->dns = n->dns_ != nullptr;
  n->collector_ = metrics::process_registry().add_collector(
    [g = n->gauges_](std::vector<metrics::sample_family>& out) {
      auto d = [](const std::atomic<uint64_t>& v) { return static_cast<double>(v.load()); };
      out.push_back({"dsec_egress_sandboxes", "Egress sandboxes attached now.", "gauge",
                     {{{}, d(g->attached)}},
                     {}});
      out.push_back({"dsec_egress_prewired", "Network namespaces wired ahead and ready now "
                     "(dsecd --egress-prewire).", "gauge",
                     {{{}, d(g->prewired)}},
                     {}});
      out.push_back({"dsec_egress_prewire_total", "Egress creates that found a namespace "
                     "wired ahead (taken) or none (missed: wired on the create's path).",
                     "counter",
                     {{{{"outcome", "taken"}}, d(g->prewire_taken)},
                      {{{"outcome", "missed"}}, d(g->prewire_missed)}},
                     {}});
      out.push_back({"dsec_egress_packets_total",
                     "Packets of egress sandboxes by verdict: allowed (first packets of "
                     "connections their policies allowed) and denied (read once a second).",
                     "counter",
                     {{{{"verdict", "allowed"}}, d(g->allowed)},
                      {{{"verdict", "denied"}}, d(g->denied)}},
                     {}});
      if (g->dns)
        out.push_back({"dsec_egress_dns_queries_total",
                       "Queries to the node's DNS proxy, by outcome (read once a second).",
                       "counter",
                       {{{{"outcome", "answered"}}, d(g->dns_answered)},
                        {{{"outcome", "refused"}}, d(g->dns_refused)},
                        {{{"outcome", "failed"}}, d(g->dns_failed)}},
                       {}});
    });
  return n;
}

egress_network::~egress_network() {
  stop_prewiring(); // its links release into this network
  if (collector_)
    metrics::process_registry().remove_collector(collector_);
  if (poller_.joinable()) {
    {
      std::lock_guard<std::mutex> g{mu_};
      stopping_ = true;
    }
    poll_cv_.notify_all();
    poller_.join();
  }
  if (json_)
    nft_ctx_free(json_);
  dns_.reset(); // its thread takes mu_
  std::lock_guard<std::mutex> g{mu_};
  if (nft_) {
    (void) run_nft(nft_, "delete table inet " + table_);
    nft_ctx_free(nft_);
  }
  if (auto nl = rtnl::open()) {
    (void) nl->delete_link(dns_link_);
    if (auto links = nl->links_with_prefix(prefix_))
      for (const auto& l : *links)
        (void) nl->delete_link(l);
  }
  if (!uplink_forwarding_.empty() && uplink_forwarding_ != "1")
    (void) write_sysctl(forwarding_path(opts_.uplink), uplink_forwarding_);
}

expected<void> egress_network::nft(const std::string& cmds) { return run_nft(nft_, cmds); }

size_t egress_network::attached() const {
  std::lock_guard<std::mutex> g{mu_};
  return attached_;
}

expected<void> egress_network::load_services(const std::string& path) {
  std::ifstream in{path};
  if (!in)
    return sys_error("opening --services", path);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (auto h = line.find('#'); h != std::string::npos)
      line.resize(h);
    std::istringstream words{line};
    std::string name, rule;
    if (!(words >> name))
      continue;
    auto nr = parse_net_rule(name);
    if (!nr || nr->what != net_rule::kind::service)
      return make_error(errc::invalid_argument, path + ":" + std::to_string(no) + ": '" + name
                                                  + "' is not a service name (letters, digits, "
                                                    "'-', '_')");
    auto& rules = services_[nr->name];
    while (words >> rule) {
      auto r = parse_net_rule(rule);
      if (!r)
        return make_error(errc::invalid_argument, path + ":" + std::to_string(no) + ": "
                                                    + r.error_value().message);
      if (r->what == net_rule::kind::service)
        return make_error(errc::invalid_argument, path + ":" + std::to_string(no) + ": service "
                                                    + name + " names service " + rule
                                                    + " (only CIDRs and domains)");
      rules.push_back(rule);
    }
    if (rules.empty())
      return make_error(errc::invalid_argument,
                        path + ":" + std::to_string(no) + ": service " + name + " has no rules");
  }
  return {};
}

namespace {
// The packets of the table's named counter `name` (0 if it cannot be read).
uint64_t counter_packets(nft_ctx* c, const std::string& table, const char* name) {
  if (!run_nft(c, "list counter inet " + table + " " + name))
    return 0;
  std::string text = nft_ctx_get_output_buffer(c);
  auto at = text.find("packets ");
  return at == std::string::npos ? 0 : std::strtoull(text.c_str() + at + 8, nullptr, 10);
}
} // namespace

egress_network::counters_t egress_network::counters() {
  std::lock_guard<std::mutex> g{mu_};
  return {counter_packets(nft_, table_, "allowed"), counter_packets(nft_, table_, "denied")};
}

expected<egress_network::compiled> egress_network::compile(
  const std::string& ifname, const std::vector<std::string>& allow,
  const std::vector<std::string>& deny) const {
  compiled out;
  std::vector<net_rule> a, as, d;
  auto add_rule = [&](const net_rule& r, bool is_allow) -> expected<void> {
    switch (r.what) {
      case net_rule::kind::cidr:
        if (!is_allow)
          d.push_back(r);
        else if (names_special(r.net, special_))
          as.push_back(r);
        else
          a.push_back(r);
        return {};
      case net_rule::kind::domain:
      case net_rule::kind::wildcard:
        if (!dns_)
          return make_error(errc::unsupported,
                            "rule '" + r.text + "': domain rules need the node's DNS proxy "
                                                "(dsecd --dns-upstream), which this node does not run");
        (r.what == net_rule::kind::domain ? (is_allow ? out.dns_exact : out.deny_exact)
                                          : (is_allow ? out.dns_suffix : out.deny_suffix))
          .push_back(r.name);
        return {};
      case net_rule::kind::service:
        break;
    }
    return make_error(errc::invalid_argument, "rule '" + r.text + "': a service inside a service");
  };
  auto parse = [&](const std::vector<std::string>& rules, bool is_allow) -> expected<void> {
    for (const auto& text : rules) {
      DSEC_TRY(r, parse_net_rule(text));
      if (r.what != net_rule::kind::service) {
        DSEC_TRY_VOID(add_rule(r, is_allow));
        continue;
      }
      auto svc = services_.find(r.name);
      if (svc == services_.end()) {
        std::string names;
        for (const auto& [n, _] : services_)
          names += (names.empty() ? "" : ", ") + n;
        return make_error(errc::not_found,
                          "rule '" + text + "': no such service on this node ("
                            + (names.empty() ? std::string{"it names none: dsecd --services FILE"}
                                             : "it names " + names)
                            + ")");
      }
      for (const auto& sub : svc->second) {
        DSEC_TRY(sr, parse_net_rule(sub));
        DSEC_TRY_VOID(add_rule(sr, is_allow));
      }
    }
    return {};
  };
  DSEC_TRY_VOID(parse(allow, true));
  DSEC_TRY_VOID(parse(deny, false));
  auto add = [&](const char* set, const std::vector<net_rule>& rules) {
    if (rules.empty())
      return;
    nft_set_elems elems{set, {}};
    for (const auto& r : normalised(rules))
      elems.elems.push_back(element(ifname, r));
    out.elements.push_back(std::move(elems));
  };
  add("allow", a);
  add("allow_special", as);
  add("deny", d);
  return out;
}

expected<void> egress_network::check_policy(const std::vector<std::string>& allow,
                                            const std::vector<std::string>& deny) const {
  DSEC_TRY_VOID(compile("x", allow, deny));
  return {};
}


// With mu_ held: a free /31 whose last veth is gone, and a fresh name,
// reserved for a link (released by its destructor, which takes mu_).
expected<std::unique_ptr<egress_link>> egress_network::reserve_link() {
  size_t count = ((size_t{1} << (32 - net_.prefix)) - 2) / 2;
  size_t slot = count;
  for (size_t k = 0; k < count; ++k) {
    size_t i = (next_slot_ + k) % count;
    if (i >= slots_.size())
      slots_.resize(i + 1);
    auto& s = slots_[i];
    if (s.used)
      continue;
    if (!s.last_ifname.empty() && ::if_nametoindex(s.last_ifname.c_str()) != 0)
      continue;
    slot = i;
    break;
  }
  if (slot == count)
    return make_error(errc::overloaded, "--sandbox-net " + net_.to_string()
                                          + " has no free address for another egress sandbox");
  std::unique_ptr<egress_link> l{new egress_link};
  l->slot_ = slot;
  l->ifname_ = prefix_ + base36(next_name_++);
  l->addr_ = net_.addr + 3 + 2 * static_cast<uint32_t>(slot);
  l->net_ = this;
  slots_[slot].used = true;
  slots_[slot].last_ifname = l->ifname_;
  next_slot_ = (slot + 1) % count;
  return l;
}

// Without mu_: the veth (made by `add_veth`, its peer "eth0" in the
// namespace `ns`, a namespace fd or a pidfd), the node's end up with the even
// address and forwarding on, the sandbox's end up with the odd one and the
// default route; with `loopback` its lo up too. A failure deletes the veth.
expected<void> egress_network::wire(egress_link& l,
                                    const std::function<expected<void>(rtnl&)>& add_veth,
                                    int ns, bool loopback) {
  auto fail = [&](error e) -> error {
    if (auto nl = rtnl::open())
      (void) nl->delete_link(l.ifname_);
    return std::move(e).in_step("setup_egress");
  };
  {
    DSEC_TRY(nl, rtnl::open());
    if (auto r = add_veth(nl); !r)
      return fail(r.error_value());
    auto idx = nl.set_up_index(l.ifname_);
    if (!idx)
      return fail(idx.error_value());
    if (auto r = nl.add_address(*idx, l.gateway(), 31); !r)
      return fail(r.error_value());
    if (auto r = write_sysctl(forwarding_path(l.ifname_), "1"); !r)
      return fail(r.error_value());
  }
  auto in = rtnl::open_in(ns, home_ns_.get());
  if (!in)
    return fail(in.error_value());
  if (loopback)
    if (auto r = in->set_up("lo"); !r)
      return fail(r.error_value());
  auto idx = in->set_up_index("eth0");
  if (!idx)
    return fail(idx.error_value());
  if (auto r = in->add_address(*idx, l.addr_, 31); !r)
    return fail(r.error_value());
  if (auto r = in->add_default_route(*idx, l.gateway()); !r)
    return fail(r.error_value());
  return {};
}

// With mu_ held: the link serves its sandbox from now on (its policy's
// elements are in the table).
void egress_network::install(egress_link& l, compiled pol, const std::vector<std::string>& allow,
                             const std::vector<std::string>& deny) {
  l.allow_ = allow;
  l.deny_ = deny;
  l.dns_exact_ = std::move(pol.dns_exact);
  l.dns_suffix_ = std::move(pol.dns_suffix);
  l.deny_exact_ = std::move(pol.deny_exact);
  l.deny_suffix_ = std::move(pol.deny_suffix);
  by_addr_[l.addr_] = &l;
  by_ifname_[l.ifname_] = &l;
  l.active_ = true;
  ++attached_;
  gauges_->attached = attached_;
}

expected<std::unique_ptr<egress_link>> egress_network::attach(pid_t pid, int pidfd,
                                                              const std::vector<std::string>& allow,
                                                              const std::vector<std::string>& deny) {
  std::unique_ptr<egress_link> l;
  {
    std::lock_guard<std::mutex> g{mu_};
    DSEC_TRY(r, reserve_link());
    l = std::move(r);
  }
  // From here a failure's `l` releases its slot (taking mu_): none is held.
  DSEC_TRY(pol, compile(l->ifname_, allow, deny));
  DSEC_TRY_VOID(wire(
    *l, [&](rtnl& nl) { return nl.add_veth(l->ifname_, "eth0", pid); }, pidfd, false));
  auto elems = with_addrs(l->ifname_, l->addr_, std::move(pol.elements));
  auto adding = elems;
  for (auto& c : counting_elements(l->ifname_))
    adding.push_back(std::move(c));
  expected<void> added;
  {
    std::lock_guard<std::mutex> g{mu_};
    added = elems_->apply({}, adding);
    if (added) {
      l->elements_ = std::move(elems);
      install(*l, std::move(pol), allow, deny);
      return l;
    }
  }
  if (auto nl = rtnl::open())
    (void) nl->delete_link(l->ifname_);
  return std::move(added).error_value().in_step("setup_egress"); // `l` releases its slot
}

// ---- namespaces wired ahead ------------------------------------------------

void egress_network::prewire(const void* owner, size_t n,
                             std::function<expected<unique_fd>()> make) {
  std::vector<prewired> drop;
  {
    std::lock_guard<std::mutex> g{mu_};
    auto it = std::find_if(pools_.begin(), pools_.end(),
                           [&](const prewire_pool& p) { return p.owner == owner; });
    if (it == pools_.end()) {
      if (n == 0)
        return;
      it = pools_.insert(pools_.end(), prewire_pool{owner, 0, {}, {}, {}});
    }
    it->want = n;
    it->make = std::move(make);
    while (it->ready.size() > n) {
      drop.push_back(std::move(it->ready.back()));
      it->ready.pop_back();
      --gauges_->prewired;
    }
    if (!prewirer_.joinable() && n > 0)
      prewirer_ = std::thread([this] { prewire_loop(); });
  }
  prewire_cv_.notify_all();
  // `drop` goes here, without mu_ (its links' destructors take it).
}

void egress_network::stop_prewiring() {
  {
    std::lock_guard<std::mutex> g{mu_};
    prewire_stop_ = true;
  }
  prewire_cv_.notify_all();
  if (prewirer_.joinable())
    prewirer_.join();
  std::vector<prewired> drop;
  {
    std::lock_guard<std::mutex> g{mu_};
    for (auto& p : pools_)
      for (auto& w : p.ready)
        drop.push_back(std::move(w));
    pools_.clear();
    gauges_->prewired = 0;
  }
}

std::optional<egress_network::prewired> egress_network::take(const void* owner) {
  std::optional<prewired> out;
  {
    std::lock_guard<std::mutex> g{mu_};
    for (auto& p : pools_)
      if (p.owner == owner) {
        if (p.ready.empty()) {
          ++pstats_.missed;
          gauges_->prewire_missed = pstats_.missed;
        } else {
          out.emplace(std::move(p.ready.front()));
          p.ready.erase(p.ready.begin());
          ++pstats_.taken;
          gauges_->prewire_taken = pstats_.taken;
          --gauges_->prewired;
        }
        break;
      }
  }
  prewire_cv_.notify_all();
  return out;
}

expected<void> egress_network::activate(egress_link& l, const std::vector<std::string>& allow,
                                        const std::vector<std::string>& deny) {
  DSEC_TRY(pol, compile(l.ifname_, allow, deny));
  std::lock_guard<std::mutex> g{mu_};
  // Its address (the anti-spoofing element) is there since it was wired;
  // its counters start now.
  auto adding = pol.elements;
  for (auto& c : counting_elements(l.ifname_))
    adding.push_back(std::move(c));
  if (auto r = elems_->apply({}, adding); !r)
    return std::move(r).error_value().in_step("setup_egress");
  l.elements_ = with_addrs(l.ifname_, l.addr_, std::move(pol.elements));
  install(l, std::move(pol), allow, deny);
  return {};
}

egress_network::prewire_counters egress_network::prewire_stats() const {
  std::lock_guard<std::mutex> g{mu_};
  auto c = pstats_;
  c.ready = 0;
  for (const auto& p : pools_)
    c.ready += p.ready.size();
  return c;
}

void egress_network::prewire_loop() {
  std::unique_lock<std::mutex> lk{mu_};
  while (!prewire_stop_ && !stopping_) {
    auto now = std::chrono::steady_clock::now();
    prewire_pool* p = nullptr;
    auto wake = now + std::chrono::hours(1);
    for (auto& q : pools_) {
      if (q.ready.size() >= q.want)
        continue;
      if (q.retry_at > now) {
        wake = std::min(wake, q.retry_at);
        continue;
      }
      p = &q;
      break;
    }
    if (!p) {
      prewire_cv_.wait_until(lk, wake);
      continue;
    }
    const void* owner = p->owner;
    auto make = p->make;
    lk.unlock();
    // The namespace from the owner's zygote, then its link: none of it
    // under mu_ (attaches, the DNS proxy and the poll thread go on).
    std::optional<prewired> w;
    std::optional<error> failed;
    auto ns = make();
    if (!ns) {
      failed = ns.error_value();
    } else {
      std::unique_ptr<egress_link> l;
      {
        std::lock_guard<std::mutex> g{mu_};
        if (auto r = reserve_link())
          l = std::move(*r);
        else
          failed = r.error_value();
      }
      if (l) {
        int fd = ns->get();
        if (auto r = wire(
              *l, [&](rtnl& nl) { return nl.add_veth_into(l->ifname_, "eth0", fd); }, fd, true);
            !r) {
          failed = r.error_value();
          l.reset();
        } else {
          std::lock_guard<std::mutex> g{mu_};
          auto adding = addrs_element(l->ifname_, l->addr_);
          if (auto a = elems_->apply({}, {&adding, 1}); !a) {
            failed = a.error_value();
          } else {
            l->elements_ = {addrs_element(l->ifname_, l->addr_)};
            w.emplace(prewired{std::move(*ns), std::move(l)});
          }
        }
        if (!w && l) {
          if (auto nl = rtnl::open())
            (void) nl->delete_link(l->ifname_);
          l.reset();
        }
      }
    }
    lk.lock();
    auto it = std::find_if(pools_.begin(), pools_.end(),
                           [&](const prewire_pool& q) { return q.owner == owner; });
    if (failed) {
      ++pstats_.failed;
      // Not again for a second (a zygote gone, --sandbox-net full).
      if (it != pools_.end())
        it->retry_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      pstats_.last_error = failed->to_string();
    } else if (w) {
      ++pstats_.made;
      if (it != pools_.end() && it->ready.size() < it->want && !prewire_stop_) {
        it->ready.push_back(std::move(*w));
        ++gauges_->prewired;
      } else {
        lk.unlock();
        w.reset(); // not wanted any more
        lk.lock();
      }
    }
  }
}

void egress_network::forget_admitted(egress_link& l) {
  // One transaction each: an element whose TTL ran out is gone already, and
  // its failed delete must not undo the others.
  for (auto a : l.admitted_) {
    nft_elem e;
    e.key.ifname(l.ifname_).ipv4(a);
    nft_set_elems one{"dns_allow", {e}};
    (void) elems_->apply({&one, 1}, {});
  }
  l.admitted_.clear();
}

void egress_network::release(egress_link& l) {
  std::lock_guard<std::mutex> g{mu_};
  // A link reserved but never wired has no elements; one wired ahead and
  // never taken only its address.
  auto removing = l.elements_;
  if (l.active_)
    for (auto& c : counting_elements(l.ifname_))
      removing.push_back(std::move(c));
  if (!removing.empty())
    (void) elems_->apply(removing, {});
  forget_admitted(l);
  slots_[l.slot_].used = false;
  if (!l.active_)
    return; // reserved or wired ahead, never a sandbox's
  by_addr_.erase(l.addr_);
  by_ifname_.erase(l.ifname_);
  --attached_;
  gauges_->attached = attached_;
}

bool egress_network::dns_allowed(uint32_t src, const std::string& name) {
  std::lock_guard<std::mutex> g{mu_};
  auto it = by_addr_.find(src);
  if (it == by_addr_.end())
    return false;
  const auto& l = *it->second;
  bool ok = dns_name_matches(name, l.dns_exact_, l.dns_suffix_)
            && !dns_name_matches(name, l.deny_exact_, l.deny_suffix_);
  // A refused name is a denied attempt too (an agent's first try at a
  // domain is its lookup): reported like a destination, once a while.
  if (!ok && l.on_denied_) {
    auto now = std::chrono::steady_clock::now();
    auto key = l.ifname_ + " dns " + name;
    auto [r, fresh] = reported_.try_emplace(key, now + std::chrono::seconds(denied_memory_s));
    if (!fresh && r->second <= now) {
      r->second = now + std::chrono::seconds(denied_memory_s);
      fresh = true;
    }
    if (fresh) {
      denied_attempt a;
      a.protocol = "dns";
      a.name = name;
      l.on_denied_(a);
    }
  }
  return ok;
}

void egress_network::dns_admit(uint32_t src, const std::vector<uint32_t>& addrs, uint32_t ttl_s) {
  std::lock_guard<std::mutex> g{mu_};
  auto it = by_addr_.find(src);
  if (it == by_addr_.end())
    return;
  auto& l = *it->second;
  nft_set_elems elems{"dns_allow", {}};
  for (auto a : addrs) {
    nft_elem e;
    e.key.ifname(l.ifname_).ipv4(a);
    e.timeout_ms = uint64_t{std::min<uint32_t>(ttl_s, 86400)} * 1000;
    elems.elems.push_back(e);
    if (std::find(l.admitted_.begin(), l.admitted_.end(), a) == l.admitted_.end())
      l.admitted_.push_back(a);
  }
  (void) elems_->apply({}, {&elems, 1});
}

expected<void> egress_link::set_policy(const std::vector<std::string>& allow,
                                       const std::vector<std::string>& deny) {
  std::lock_guard<std::mutex> g{net_->mu_};
  DSEC_TRY(pol, net_->compile(ifname_, allow, deny));
  auto elems = with_addrs(ifname_, addr_, std::move(pol.elements));
  DSEC_TRY_VOID(net_->elems_->apply(elements_, elems));
  // What the old domain rules admitted goes too: new connections follow the
  // new policy only.
  net_->forget_admitted(*this);
  elements_ = std::move(elems);
  allow_ = allow;
  deny_ = deny;
  dns_exact_ = std::move(pol.dns_exact);
  dns_suffix_ = std::move(pol.dns_suffix);
  deny_exact_ = std::move(pol.deny_exact);
  deny_suffix_ = std::move(pol.deny_suffix);
  return {};
}

std::vector<nft_set_elems> egress_network::counting_elements(const std::string& ifname) {
  std::vector<nft_set_elems> out;
  nft_elem e;
  e.key.ifname(ifname);
  for (const char* set : {"sb_tx", "sb_rx", "sb_new", "sb_denied"})
    out.push_back({set, {e}});
  return out;
}

namespace {

// The elements of set `name` as libnftables' JSON lists them ("elem"), or
// an empty array (a table being made or gone, a failed listing).
nlohmann::json set_elements(nft_ctx* c, const std::string& table, const std::string& name) {
  if (!run_nft(c, "list set inet " + table + " " + name))
    return nlohmann::json::array();
  auto doc = nlohmann::json::parse(nft_ctx_get_output_buffer(c), nullptr, false);
  if (doc.is_discarded() || !doc.contains("nftables"))
    return nlohmann::json::array();
  for (const auto& item : doc["nftables"])
    if (item.contains("set") && item["set"].contains("elem"))
      return item["set"]["elem"];
  return nlohmann::json::array();
}

// An element's counter (packets, bytes) keyed by its ifname.
void counters_of(const nlohmann::json& elems,
                 const std::function<void(const std::string&, uint64_t, uint64_t)>& f) {
  for (const auto& e : elems) {
    if (!e.contains("elem"))
      continue;
    const auto& el = e["elem"];
    if (!el.contains("val") || !el["val"].is_string() || !el.contains("counter"))
      continue;
    const auto& c = el["counter"];
    f(el["val"].get<std::string>(), c.value("packets", uint64_t{0}),
      c.value("bytes", uint64_t{0}));
  }
}

} // namespace

sandbox_traffic egress_link::traffic() const {
  for (auto& t : net_->traffic())
    if (t.ifname == ifname_)
      return t;
  sandbox_traffic none;
  none.ifname = ifname_;
  return none;
}

std::vector<sandbox_traffic> egress_network::traffic() {
  std::lock_guard<std::mutex> g{mu_};
  std::map<std::string, sandbox_traffic> by;
  for (const auto& [name, l] : by_ifname_) {
    auto& t = by[name];
    t.ifname = name;
    t.sandbox = l->owner_;
  }
  auto take = [&](const char* set, auto&& f) {
    counters_of(set_elements(json_, table_, set),
                [&](const std::string& ifname, uint64_t packets, uint64_t bytes) {
                  if (auto it = by.find(ifname); it != by.end())
                    f(it->second, packets, bytes);
                });
  };
  take("sb_tx", [](sandbox_traffic& t, uint64_t p, uint64_t b) {
    t.sent_packets = p;
    t.sent_bytes = b;
  });
  take("sb_rx", [](sandbox_traffic& t, uint64_t p, uint64_t b) {
    t.received_packets = p;
    t.received_bytes = b;
  });
  take("sb_new", [](sandbox_traffic& t, uint64_t p, uint64_t) { t.connections = p; });
  take("sb_denied", [](sandbox_traffic& t, uint64_t p, uint64_t b) {
    t.denied_packets = p;
    t.denied_bytes = b;
  });
  std::vector<sandbox_traffic> out;
  out.reserve(by.size());
  for (auto& [name, t] : by)
    out.push_back(std::move(t));
  return out;
}

void egress_network::poll_loop() {
  std::unique_lock<std::mutex> lk{mu_};
  while (!stopping_) {
    poll_cv_.wait_for(lk, std::chrono::milliseconds(poll_interval_ms));
    if (stopping_)
      break;
    auto& g = *gauges_;
    g.attached = attached_;
    if (dns_) {
      g.dns_answered = dns_->stats().answered.load();
      g.dns_refused = dns_->stats().refused.load();
      g.dns_failed = dns_->stats().failed.load();
    }
    g.allowed = counter_packets(nft_, table_, "allowed");
    g.denied = counter_packets(nft_, table_, "denied");
    if (attached_ > 0)
      poll_denied();
  }
}

// With mu_ held: the denied destinations not reported yet (each is
// reported once while the set remembers it), to their links' watchers.
void egress_network::poll_denied() {
  auto now = std::chrono::steady_clock::now();
  for (auto it = reported_.begin(); it != reported_.end();)
    it = it->second <= now ? reported_.erase(it) : std::next(it);
  for (const auto& e : set_elements(json_, table_, "denied_to")) {
    // {"elem": {"val": {"concat": [ifname, addr, proto, port]}, "expires": ...}}
    // or, without an expiry shown, {"concat": [...]} itself.
    const nlohmann::json* v = &e;
    if (v->contains("elem"))
      v = &(*v)["elem"];
    if (v->contains("val"))
      v = &(*v)["val"];
    if (!v->contains("concat") || !(*v)["concat"].is_array() || (*v)["concat"].size() != 4)
      continue;
    const auto& c = (*v)["concat"];
    if (!c[0].is_string() || !c[1].is_string())
      continue;
    auto link = by_ifname_.find(c[0].get<std::string>());
    if (link == by_ifname_.end() || !link->second->on_denied_)
      continue;
    auto addr = parse_ipv4_net(c[1].get<std::string>());
    if (!addr || addr->prefix != 32)
      continue;
    denied_attempt a;
    a.address = addr->addr;
    a.protocol = c[2].is_string() ? c[2].get<std::string>()
                                  : std::to_string(c[2].is_number() ? c[2].get<int>() : 0);
    a.port = c[3].is_number() ? static_cast<uint16_t>(c[3].get<int>()) : 0;
    auto key = c[0].get<std::string>() + " " + a.protocol + " " + c[1].get<std::string>() + ":"
               + std::to_string(a.port);
    if (!reported_.emplace(key, now + std::chrono::seconds(denied_memory_s)).second)
      continue;
    link->second->on_denied_(a);
  }
}

void egress_link::watch(std::string sandbox, std::function<void(const denied_attempt&)> on_denied) {
  std::lock_guard<std::mutex> g{net_->mu_};
  owner_ = std::move(sandbox);
  on_denied_ = std::move(on_denied);
}

egress_link::~egress_link() {
  if (net_)
    net_->release(*this);
}

} // namespace dsec
