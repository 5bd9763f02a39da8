// dsecd: the node daemon. It starts the engine (zygotes, reactor, layer store)
// and the node's actors, publishes the scheduler with CAF's middleman (over TLS
// with --tls), and runs until SIGINT or SIGTERM, when it destroys every sandbox
// and exits.
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "actors/basp_guard.hpp"
#include "actors/daemon.hpp"
#include "runtime/microvm.hpp"
#include "runtime/net_policy.hpp"
#include "actors/warm_pool.hpp"
#include "actors/door.hpp"
#include "runtime/log.hpp"
#include "actors/transport.hpp"
#include "actors/types.hpp"
#include "runtime/defaults.hpp"
#include "runtime/endpoint.hpp"
#include "runtime/metrics.hpp"
#include "runtime/metrics_http.hpp"
#include "runtime/units.hpp"
#include "tools/dsec/cli.hpp"

namespace {

const char* usage = R"(usage: dsecd [OPTIONS]

The dsec node daemon: makes sandboxes on this machine for trainers and for
`dsec --connect HOST:PORT ...`, through CAF actors published on HOST:PORT.

Options:
  --listen HOST:PORT     where to accept clients (default 127.0.0.1:7070; port 0
                         picks a free one, printed at start). HOST is an IPv4 or
                         IPv6 address ([::1]:7070); 0.0.0.0 is every IPv4 one.
                         Without --tls only loopback addresses are accepted, and
                         only processes of root and of the --group's members
                         get in: the kernel tells whose socket connected, before
                         its first message (others are refused and counted in
                         `node stats`; docs/security.md)
  --group NAME           the group whose members may use a daemon without --tls
                         besides root (default dsec; a missing group: root only)
  --tls DIR              speak only TLS, with the CA, certificate and key in
                         DIR/ca.pem, DIR/cert.pem, DIR/key.pem (tools/tls-certs
                         makes them): a peer must present a certificate signed
                         by DIR/ca.pem before it can send a single request, and
                         it checks dsecd's the same way. Required to listen on
                         any address that is not loopback. docs/security.md
                         says what it protects and what it does not.
  --state DIR            the layer store (default $DSEC_STATE, else /var/lib/dsec)
  --slots N              sandboxes this node is sized for (default 3200; 0, for
                         a --coordinator or a --join node: it runs none, and
                         a joined one stays a member, e.g. while upgraded)
  --oversubscribe R      admit up to slots * R sandboxes (default 1.0), asking
                         for up to node memory * R bytes of memory in all
  --node-memory SIZE|none
                         the memory sandboxes are admitted against (default:
                         the machine's; none: admit by slots only). A sandbox
                         counts with the memory it asks for; one that takes
                         the default limit counts with the node memory * R
                         per admitted slot, so default-sized sandboxes fill
                         the slots first and large ones the memory. A node
                         out of either refuses with `overloaded`, naming it
  --default-memory SIZE|none
                         the memory limit of a sandbox that asks for none; it
                         also bounds the writable layer (a tmpfs, whose pages
                         are charged to the sandbox). Default: below
  --default-pids N|none  the pids limit of a sandbox that asks for none
  --default-disk SIZE    the writable layer of a sandbox that asks for none
  --min-free-disk SIZE   admit no sandbox while the filesystem of --state has
                         less than SIZE free (default 64m; 0: no check): the
                         node refuses with `overloaded`, naming its disk, and
                         a cluster's coordinator places elsewhere, rather
                         than creates failing as a layer fetch meets ENOSPC
  --cache-bytes SIZE     unmount unused layers beyond this many mounted bytes
                         (default: no limit), e.g. 20g
  --spawners N           zygotes creating sandboxes in parallel (default 2)
  --pool NAME@V=N[,workdir=W@V][,tool=T@V][,memory=SIZE][,net][,chronus][,microvm]
                         keep a warm pool of N ready sandboxes of that
                         environment on this node (,microvm: booted microVMs,
                         needs --microvm-slots; repeatable; the node's own,
                         it lives with the node): a create or call of an equal
                         environment claims one in one message, and the pool
                         refills in the background. Pooled sandboxes take
                         slots, give them up to real creates first, and shrink
                         under memory pressure (actors/warm_pool.hpp)
  --pool-pressure-file PATH
                         where memory pressure is read, in PSI format (default
                         /proc/pressure/memory; a test points it at a file it
                         writes). Pools shrink while its "some avg10=" is at
                         least --pool-pressure-avg10 (default 10); without the
                         file, while MemAvailable is under 5% of MemTotal
  --threads N            CAF scheduler threads (default 2; the 'sharing' policy)
  --metrics HOST:PORT    serve GET /metrics (Prometheus text format), /healthz,
                         /readyz and the /status page (with /status.json) there,
                         on threads of their own (docs/
                         observability.md); port 0 picks a free one, printed at
                         start. Off by default. Without --tls only loopback
                         addresses; with --tls it is HTTPS and a scraper must
                         present a certificate signed by the same CA
  --metrics-token FILE   also require "Authorization: Bearer TOKEN" on those,
                         TOKEN being FILE's first line (at least 16 characters;
                         the file open to neither group nor others)
  --allow-host-mount DIR[:rw]
                         sandboxes may bind-mount what lies beneath DIR
                         (`run -v HOST:SANDBOX[:ro|:rw]`; repeatable): read-only,
                         or also writable with :rw, which needs DIR on a nosuid
                         mount. Paths are resolved beneath DIR as opened at
                         start (a symlink out of it is refused). Without it,
                         every host mount is refused (docs/security.md)
  --uplink IFACE         egress networking (docs/network.md): sandboxes made
                         with --network egress get a veth to this node, an
                         address from --sandbox-net, a default route, and are
                         NATed out through IFACE only, by their policy (an
                         nftables table "inet dsec_TAG" of this daemon's;
                         forwarding is turned on for IFACE and the veths).
                         Without it, egress sandboxes are refused
  --sandbox-net CIDR     the node-local network egress sandboxes get routed
                         /31s from (default 198.19.0.0/16; /8 to /29). Its
                         first address is the sandboxes' resolver address.
                         Two daemons on one machine need different ones
  --dns-upstream ADDR[:PORT]
                         run the sandboxes' resolver (a DNS proxy on the
                         resolver address, UDP): it answers only names their
                         policy allows (DOMAIN, *.DOMAIN rules; others get
                         REFUSED), asking ADDR, and admits the answers'
                         addresses for that sandbox for their TTL. Without it,
                         domain and service rules are refused
  --services FILE        named services for policies: lines "NAME RULE..."
                         (e.g. "pypi pypi.org files.pythonhosted.org"), so a
                         policy can say --allow pypi
  --deny-range CIDR      one more range egress sandboxes never reach unless a
                         rule names it (repeatable), besides private, link-
                         local, metadata and the node's own addresses
  --egress-prewire N     network namespaces each spawner keeps wired for
                         egress sandboxes (veth, /31, route, loopback made
                         ahead, off the create's path; default 4, 0: none,
                         every create wires its own)
  --expose-address ADDR  where exposed ports listen (`dsec expose`, `run
                         --expose`; docs/network.md): each is a fresh port of
                         ADDR (an IPv4 or IPv6 address of this node; 0.0.0.0
                         for all) forwarded by dsecd to a port on a sandbox's
                         loopback. Default 127.0.0.1
  --expose-idle-timeout D
                         close a forwarded connection through which no byte
                         moved either way for D (e.g. 30s, 10m; 0: never).
                         Default 1h
  --coordinator          be a cluster's coordinator: nodes join it (--join), it
                         holds the sessions and places every sandbox over the
                         nodes (this one among them, filled last) with
                         power-of-k choices led by free slots, layer locality
                         breaking near ties (docs/cluster.md)
  --join HOST:PORT       join the coordinator at HOST:PORT as a node: send it
                         heartbeats, make the sandboxes it places here, fetch
                         missing layers from its store; sessions are opened
                         at the coordinator, not here. With --tls the link is
                         TLS both ways (both need certificates of one CA)
  --cluster-key FILE     (with --coordinator or --join) the key every message
                         between the cluster's daemons carries: a node without
                         it cannot join, nor send the coordinator or a node
                         anything but a client's requests (docs/security.md).
                         64 hex digits in a file owned by dsecd's user and open
                         to neither group nor others (0600). Default
                         STATE/cluster.key; a coordinator makes it when it is
                         missing, a node must be given a copy
  --trajectories DIR     where sessions keep trajectory logs and sandboxes the
                         packs of their writable layers (docs/trajectory.md),
                         default STATE/trajectories. Give the daemons of a
                         cluster one shared DIR (tools/cluster does): a sandbox
                         is rebuilt from a pack on whichever node it is placed
  --beat-interval DUR    between two heartbeats of a node (default 500ms)
  --beat-timeout DUR     a coordinator counts a node without a heartbeat for
                         this long as lost (default 1500ms)
  --orphan-grace DUR     a node that lost its coordinator keeps its ready
                         sandboxes this long (default 60s) and joins again
                         as soon as a coordinator answers on that address,
                         reporting them: a restarted coordinator adopts them
                         into their sessions; those not adopted by then are
                         destroyed. On a coordinator: how long a session it
                         rebuilt that way waits for its trainer to reattach
  --log-format F         text (default) or json: the format of the log lines on
                         stderr, each with a time, a level, the component and
                         the ids involved (sandbox=, session=, node=);
                         docs/observability.md, "Logs"
  --log-level L          debug, info (default: sandboxes and sessions made and
                         ended, nodes joined and lost), warn (refusals, once per
                         cause every 10 s) or error
  --client-timeout DUR   drop a connection (a client's, a node's) that sent
                         nothing, not even CAF's heartbeat, for this long
                         (default 30s). dsec's clients send a heartbeat every
                         second however long their commands run or they idle,
                         so only a dead, hung or cut-off client is dropped
  --trajectory-keep DUR  remove a trajectory log (docs/trajectory.md) that no
                         session wrote to for DUR, checked at start and hourly
                         (default 168h, a week; 0: keep logs until their
                         session is closed)
  --backend sim          (with --coordinator) a simulated cluster, to drive the
                         control plane at full scale on one machine: no engine,
                         no zygotes, no mounts, no state dir; the coordinator
                         spawns --sim-nodes nodes sim-1..sim-N in its own
                         process, each joining its scheduler like a real node,
                         whose sandboxes are actors with a model of the runtime
                         (commands exit 0 with no output; put is accepted,
                         get/pack are unsupported). Trajectory logs are refused
  --microvm-slots N      also offer the microvm backend (docs/microvm.md): at
                         most N microVMs at once (QEMU's microvm machine, KVM
                         when usable, else TCG: said in the log at start)
  --microvm-guest DIR    the guest kernel and initramfs (vmlinux, initrd.cpio:
                         what tools/microvm-guest prints); needs --microvm-slots
  --microvm-accel A      auto (default), kvm or tcg
  --sim-nodes N          simulated nodes (default 160)
  --sim-slots N          slots per simulated node (default 3200)
  --sim-create DUR       modelled time to create a sandbox (default 0: at once)
  --sim-exec DUR         modelled time of a command (default 0)
  --sim-destroy DUR      modelled time to destroy a sandbox (default 0)
  --sim-memory SIZE      modelled memory of a sandbox (default 0); with
                         --sim-node-memory a node admits only what fits
  --sim-node-memory SIZE modelled memory of a simulated node (default 0: no limit)
  -h, --help             this text

A node is lost when its connection drops (the process died) or after
--beat-timeout without one of its heartbeats (it hangs). A connection itself
is dropped only after --client-timeout of silence.

Every sandbox has a memory and a pids limit and a bounded writable layer. The
defaults give each of the slots * oversubscribe sandboxes a node admits its
share of the machine, within bounds (runtime/defaults.hpp): memory is the
memory's share (at least 256 MiB, at most half), pids the share of 3/4 of
kernel.pid_max (at least 512, at most half), disk half the memory limit (so a
full disk answers ENOSPC before the memory limit). `node stats` shows them.

At start dsecd removes what a crashed predecessor left (cgroups of dead dsec
processes) and says what it removed. SIGINT or SIGTERM: every sandbox is
destroyed, then dsecd exits.
)";

struct options {
  std::string host = "127.0.0.1";
  uint16_t port = 7070;
  dsec::tls_options tls;
  dsec::daemon_options d;
  unsigned threads = 2;
  std::string group = "dsec";
  std::chrono::milliseconds client_timeout{30000};
  std::optional<dsec::metrics_http_options> metrics;
  std::string metrics_token_file;
  dsec::log::options log; ///< --log-format, --log-level
};

// 127.0.0.0/8 or ::1: only this machine's processes can connect.
bool is_loopback(const std::string& host) {
  in_addr a4{};
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1)
    return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  return inet_pton(AF_INET6, host.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

int bad(const std::string& msg) {
  std::fprintf(stderr, "dsecd: %s\nTry 'dsecd --help'.\n", msg.c_str());
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  o.d.state_dir = dsec::cli::default_state_dir();
  bool backend_sim = false;
  const char* sim_flag = nullptr; // the last --sim-* option given
  dsec::sim_model model;
  // --default-*: unset means derived; 0 for memory and pids means none.
  std::optional<uint64_t> default_memory, default_pids, default_disk;
  dsec::cli::args a{argc, argv, 1};
  while (!a.empty()) {
    if (a.help()) {
      std::fputs(usage, stdout);
      auto m = dsec::machine_resources::probe();
      auto d = dsec::derive_defaults(m, dsec::default_slots, dsec::default_oversubscribe);
      std::printf("\nOn this machine (%s of memory, pid_max %llu), with the default --slots\n"
                  "and --oversubscribe: --default-memory %s, --default-pids %llu,\n"
                  "--default-disk %s.\n",
                  dsec::format_size(m.memory_bytes).c_str(),
                  static_cast<unsigned long long>(m.pid_max),
                  dsec::format_size(*d.memory_bytes).c_str(),
                  static_cast<unsigned long long>(*d.pids),
                  dsec::format_size(d.disk_bytes).c_str());
      return 0;
    }
    std::string v;
    auto opt = [&](const char* name) {
      auto r = a.option(name, v);
      if (!r) {
        bad(r.error_value().message);
        std::exit(2);
      }
      return *r;
    };
    uint64_t n = 0;
    if (opt("--listen")) {
      auto ep = dsec::parse_endpoint(v, "--listen", dsec::port_zero::allowed);
      if (!ep)
        return bad(ep.error_value().message);
      o.host = ep->host;
      o.port = ep->port;
      if (o.host == "localhost")
        o.host = "127.0.0.1";
      in_addr a4{};
      in6_addr a6{};
      if (inet_pton(AF_INET, o.host.c_str(), &a4) != 1
          && inet_pton(AF_INET6, o.host.c_str(), &a6) != 1)
        return bad("--listen: " + o.host + " is not an IPv4 or IPv6 address");
    } else if (opt("--metrics")) {
      auto ep = dsec::parse_endpoint(v, "--metrics", dsec::port_zero::allowed);
      if (!ep)
        return bad(ep.error_value().message);
      dsec::metrics_http_options m;
      m.host = ep->host == "localhost" ? "127.0.0.1" : ep->host;
      m.port = ep->port;
      in_addr a4{};
      in6_addr a6{};
      if (inet_pton(AF_INET, m.host.c_str(), &a4) != 1
          && inet_pton(AF_INET6, m.host.c_str(), &a6) != 1)
        return bad("--metrics: " + m.host + " is not an IPv4 or IPv6 address");
      o.metrics = m;
    } else if (opt("--log-format")) {
      if (!dsec::log::parse_format(v, o.log.fmt))
        return bad("--log-format: expected text or json, got '" + v + "'");
    } else if (opt("--log-level")) {
      if (!dsec::log::parse_level(v, o.log.min))
        return bad("--log-level: expected debug, info, warn or error, got '" + v + "'");
    } else if (opt("--metrics-token")) {
      if (v.empty())
        return bad("--metrics-token: expected a file holding the token");
      o.metrics_token_file = v;
    } else if (opt("--tls")) {
      if (v.empty())
        return bad("--tls: expected a directory (with ca.pem, cert.pem and key.pem)");
      o.tls.dir = v;
    } else if (opt("--group")) {
      if (v.empty())
        return bad("--group: expected a group name");
      o.group = v;
    } else if (opt("--client-timeout")) {
      auto dur = dsec::parse_duration(v, "--client-timeout");
      if (!dur)
        return bad(dur.error_value().message);
      if (*dur < std::chrono::seconds(3) || *dur > std::chrono::hours(24))
        return bad("--client-timeout: expected a duration from 3s to 24h, got '" + v + "'");
      o.client_timeout = *dur;
    } else if (opt("--allow-host-mount")) {
      if (v.empty() || v.front() != '/')
        return bad("--allow-host-mount: expected an absolute directory (DIR or DIR:rw), got '"
                   + v + "'");
      o.d.host_mounts.push_back(v);
    } else if (opt("--uplink")) {
      if (v.empty())
        return bad("--uplink: expected an interface name");
      if (!o.d.egress)
        o.d.egress.emplace();
      o.d.egress->uplink = v;
    } else if (opt("--sandbox-net")) {
      auto n = dsec::parse_ipv4_net(v);
      if (!n)
        return bad("--sandbox-net: " + n.error_value().message);
      if (!o.d.egress)
        o.d.egress.emplace();
      o.d.egress->sandbox_net = v;
    } else if (opt("--dns-upstream")) {
      if (!o.d.egress)
        o.d.egress.emplace();
      o.d.egress->dns_upstream = v;
    } else if (opt("--services")) {
      if (!o.d.egress)
        o.d.egress.emplace();
      o.d.egress->services_file = v;
    } else if (opt("--deny-range")) {
      auto n = dsec::parse_ipv4_net(v);
      if (!n)
        return bad("--deny-range: " + n.error_value().message);
      if (!o.d.egress)
        o.d.egress.emplace();
      o.d.egress->deny_ranges.push_back(v);
    } else if (opt("--egress-prewire")) {
      if (!dsec::cli::parse_uint(v, 256, n))
        return bad("--egress-prewire: expected a whole number from 0 to 256, got '" + v + "'");
      o.d.egress_prewire = static_cast<unsigned>(n);
    } else if (opt("--expose-address")) {
      if (v.empty())
        return bad("--expose-address: expected an address of this node (e.g. 127.0.0.1)");
      o.d.ports.address = v;
    } else if (opt("--expose-idle-timeout")) {
      if (v == "0") {
        o.d.ports.idle_timeout = std::chrono::milliseconds(0);
      } else {
        auto dur = dsec::parse_duration(v, "--expose-idle-timeout");
        if (!dur)
          return bad(dur.error_value().message);
        o.d.ports.idle_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(*dur);
      }
    } else if (opt("--state")) {
      o.d.state_dir = v;
    } else if (opt("--cluster-key")) {
      if (v.empty())
        return bad("--cluster-key: expected a file");
      o.d.cluster_key_file = v;
    } else if (opt("--trajectories")) {
      if (v.empty() || v.front() != '/')
        return bad("--trajectories: expected an absolute directory, got '" + v + "'");
      o.d.trajectories = v;
    } else if (opt("--slots")) {
      if (!dsec::cli::parse_uint(v, 1'000'000, n))
        return bad("--slots: expected a whole number from 1 to 1000000 (0: a coordinator "
                   "or a joined node that runs no sandboxes), got '" + v + "'");
      o.d.slots = static_cast<uint32_t>(n);
    } else if (opt("--pool")) {
      auto spec = dsec::parse_pool_spec(v);
      if (!spec)
        return bad(spec.error_value().message);
      o.d.pools.push_back(std::move(*spec));
    } else if (opt("--pool-pressure-file")) {
      o.d.pool_pressure_file = v;
    } else if (opt("--microvm-slots")) {
      if (!dsec::cli::parse_uint(v, 100'000, n) || n == 0)
        return bad("--microvm-slots: expected a count from 1 to 100000, got '" + v + "'");
      if (!o.d.microvm)
        o.d.microvm.emplace();
      o.d.microvm->slots = static_cast<uint32_t>(n);
    } else if (opt("--microvm-guest")) {
      if (!o.d.microvm)
        o.d.microvm.emplace();
      o.d.microvm->guest_dir = v;
    } else if (opt("--microvm-accel")) {
      if (v != "auto" && v != "kvm" && v != "tcg")
        return bad("--microvm-accel: expected auto, kvm or tcg, got '" + v + "'");
      if (!o.d.microvm)
        o.d.microvm.emplace();
      o.d.microvm->accel = v;
    } else if (opt("--pool-pressure-avg10")) {
      char* end = nullptr;
      double r = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(r >= 0 && r <= 100))
        return bad("--pool-pressure-avg10: expected a percentage from 0 to 100, got '" + v + "'");
      o.d.pool_pressure_avg10 = r;
    } else if (opt("--oversubscribe")) {
      char* end = nullptr;
      double r = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(r >= 0.1 && r <= 100))
        return bad("--oversubscribe: expected a ratio from 0.1 to 100, got '" + v + "'");
      o.d.oversubscribe = r;
    } else if (opt("--node-memory")) {
      if (v == "none") {
        o.d.node_memory = 0;
      } else {
        auto sz = dsec::parse_size(v, "--node-memory");
        if (!sz)
          return bad(sz.error_value().message);
        if (*sz < (4ull << 20))
          return bad("--node-memory: expected at least 4m (or none), got '" + v + "'");
        o.d.node_memory = *sz;
      }
    } else if (opt("--default-memory")) {
      if (v == "none") {
        default_memory = 0;
      } else {
        auto sz = dsec::parse_size(v, "--default-memory");
        if (!sz)
          return bad(sz.error_value().message);
        if (*sz < (4ull << 20))
          return bad("--default-memory: a sandbox needs at least 4 MiB, got '" + v + "'");
        default_memory = *sz;
      }
    } else if (opt("--default-pids")) {
      if (v == "none")
        default_pids = 0;
      else if (!dsec::cli::parse_uint(v, 4'194'304, n) || n == 0)
        return bad("--default-pids: expected a whole number from 1 to 4194304 or 'none', got '"
                   + v + "'");
      else
        default_pids = n;
    } else if (opt("--default-disk")) {
      auto sz = dsec::parse_size(v, "--default-disk");
      if (!sz)
        return bad(sz.error_value().message);
      if (*sz < (1ull << 20))
        return bad("--default-disk: must be at least 1m, got '" + v + "'");
      default_disk = *sz;
    } else if (opt("--min-free-disk")) {
      auto sz = dsec::parse_size(v, "--min-free-disk");
      if (!sz)
        return bad(sz.error_value().message);
      o.d.min_free_disk = *sz;
    } else if (opt("--cache-bytes")) {
      auto s = dsec::parse_size(v, "--cache-bytes");
      if (!s)
        return bad(s.error_value().message);
      o.d.cache_bytes = *s;
    } else if (opt("--spawners")) {
      if (!dsec::cli::parse_uint(v, 64, n) || n == 0)
        return bad("--spawners: expected a whole number from 1 to 64, got '" + v + "'");
      o.d.spawners = static_cast<unsigned>(n);
    } else if (opt("--trajectory-keep")) {
      if (v == "0") {
        o.d.trajectory_keep = std::chrono::milliseconds{0};
      } else {
        auto dur = dsec::parse_duration(v, "--trajectory-keep");
        if (!dur)
          return bad(dur.error_value().message);
        o.d.trajectory_keep = *dur;
      }
    } else if (opt("--backend")) {
      if (v == "sim")
        backend_sim = true;
      else if (v != "real")
        return bad("--backend: expected 'real' or 'sim', got '" + v + "'");
    } else if (opt("--sim-nodes")) {
      if (!dsec::cli::parse_uint(v, 100'000, n) || n == 0)
        return bad("--sim-nodes: expected a whole number from 1 to 100000, got '" + v + "'");
      o.d.sim_nodes = static_cast<uint32_t>(n);
      sim_flag = "--sim-nodes";
    } else if (opt("--sim-slots")) {
      if (!dsec::cli::parse_uint(v, 1'000'000, n) || n == 0)
        return bad("--sim-slots: expected a whole number from 1 to 1000000, got '" + v + "'");
      o.d.sim_slots = static_cast<uint32_t>(n);
      sim_flag = "--sim-slots";
    } else if (const char* name = opt("--sim-create")    ? "--sim-create"
                                  : opt("--sim-exec")    ? "--sim-exec"
                                  : opt("--sim-destroy") ? "--sim-destroy"
                                                         : nullptr) {
      std::chrono::milliseconds dur{0};
      if (v != "0") {
        auto d = dsec::parse_duration(v, name);
        if (!d)
          return bad(d.error_value().message);
        dur = *d;
      }
      if (dur > std::chrono::hours(1))
        return bad(std::string{name} + ": expected a duration up to 1h, got '" + v + "'");
      (name == std::string_view{"--sim-create"} ? model.create
       : name == std::string_view{"--sim-exec"} ? model.exec
                                                : model.destroy) = dur;
      sim_flag = name;
    } else if (const char* name = opt("--sim-memory")        ? "--sim-memory"
                                  : opt("--sim-node-memory") ? "--sim-node-memory"
                                                             : nullptr) {
      auto sz = dsec::parse_size(v, name);
      if (!sz)
        return bad(sz.error_value().message);
      (name == std::string_view{"--sim-memory"} ? model.memory : model.node_memory) = *sz;
      sim_flag = name;
    } else if (a.flag("--coordinator")) {
      o.d.coordinator = true;
    } else if (opt("--join")) {
      auto ep = dsec::parse_endpoint(v, "--join");
      if (!ep)
        return bad(ep.error_value().message);
      o.d.join_host = ep->host;
      o.d.join_port = ep->port;
    } else if (const char* name = opt("--beat-interval")  ? "--beat-interval"
                                  : opt("--beat-timeout") ? "--beat-timeout"
                                  : opt("--orphan-grace") ? "--orphan-grace"
                                                          : nullptr) {
      auto dur = dsec::parse_duration(v, name);
      if (!dur)
        return bad(dur.error_value().message);
      if (dur->count() < 10 || *dur > std::chrono::hours(1))
        return bad(std::string{name} + ": expected a duration from 10ms to 1h, got '" + v + "'");
      (name == std::string_view{"--beat-interval"}  ? o.d.beat_interval
       : name == std::string_view{"--beat-timeout"} ? o.d.beat_timeout
                                                    : o.d.orphan_grace) = *dur;
    } else if (opt("--threads")) {
      if (!dsec::cli::parse_uint(v, 256, n) || n == 0)
        return bad("--threads: expected a whole number from 1 to 256, got '" + v + "'");
      o.threads = static_cast<unsigned>(n);
    } else {
      return bad("unknown argument '" + std::string{a.peek()} + "'");
    }
  }
  if (o.d.microvm && (o.d.microvm->slots == 0 || o.d.microvm->guest_dir.empty()))
    return bad("the microvm backend needs both --microvm-slots N and --microvm-guest DIR");
  if (o.d.microvm)
    if (auto g = dsec::microvm_guest::in(o.d.microvm->guest_dir); !g)
      return bad("--microvm-guest: " + g.error_value().message);
  if (backend_sim && !o.d.coordinator)
    return bad("--backend sim simulates a whole cluster and needs --coordinator (its nodes "
               "are simulated in the coordinator's process)");
  if (sim_flag && !backend_sim)
    return bad(std::string{sim_flag} + " is for --backend sim");
  if (backend_sim)
    o.d.sim = model;
  // Every thread (the log's, CAF's, the reactor's, the egress network's)
  // inherits these blocked; main waits for them. Before the first thread: a
  // SIGTERM that found one without them blocked killed dsecd outright, its
  // sandboxes, table and links left for the next start to sweep.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  ::pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  // The log's writer thread, from here on (runtime/log.hpp).
  dsec::log::configure(o.log);
  {
    auto d = dsec::derive_defaults(dsec::machine_resources::probe(), o.d.slots,
                                   o.d.oversubscribe);
    if (default_memory)
      d.memory_bytes = *default_memory ? std::optional<uint64_t>{*default_memory} : std::nullopt;
    if (default_pids)
      d.pids = *default_pids ? std::optional<uint64_t>{*default_pids} : std::nullopt;
    if (default_disk)
      d.disk_bytes = *default_disk;
    else if (default_memory && *default_memory)
      d.disk_bytes = std::max<uint64_t>(*default_memory / 2 >> 20 << 20, 1ull << 20);
    o.d.defaults = d;
  }
  if (o.d.slots == 0 && !o.d.coordinator && o.d.join_host.empty())
    return bad("--slots 0 is for a --coordinator or a --join node that runs no sandboxes "
               "(it stays in the cluster, e.g. while it is upgraded); a daemon of its own needs "
               "at least 1");
  if (o.d.coordinator && !o.d.join_host.empty())
    return bad("--coordinator and --join exclude each other: a coordinator's own node "
               "joins it already");
  if ((o.d.coordinator || !o.d.join_host.empty()) && o.d.beat_timeout <= o.d.beat_interval)
    return bad("--beat-timeout must be longer than --beat-interval");
  if (!o.d.cluster_key_file.empty() && !o.d.coordinator && o.d.join_host.empty())
    return bad("--cluster-key is for a --coordinator or a node that joins one (--join)");
  if (o.d.coordinator || !o.d.join_host.empty()) {
    // The key of the cluster: made by a coordinator that has none yet, needed
    // by every node (a simulated cluster's members are in this process: a
    // random key of its own does, unless one is given).
    if (o.d.sim && o.d.cluster_key_file.empty()) {
      o.d.cluster_key = dsec::internal_key::random();
    } else {
      if (o.d.cluster_key_file.empty()) {
        if (o.d.state_dir.empty())
          return bad("a cluster's daemons need --cluster-key FILE (or --state DIR, for "
                     "DIR/cluster.key)");
        o.d.cluster_key_file = o.d.state_dir + "/cluster.key";
        if (o.d.coordinator)
          (void) ::mkdir(o.d.state_dir.c_str(), 0700); // a fresh state dir: the key goes first
      }
      auto key = dsec::load_cluster_key(o.d.cluster_key_file, o.d.coordinator);
      if (!key) {
        std::fprintf(stderr, "dsecd: %s%s\n", key.error_value().to_string().c_str(),
                     o.d.coordinator ? ""
                                     : " (a node cannot join its cluster without the "
                                       "coordinator's key)");
        return 1;
      }
      o.d.cluster_key = *key;
    }
  }
  if (o.d.egress && o.d.egress->uplink.empty())
    return bad("--sandbox-net, --dns-upstream, --services and --deny-range are for egress "
               "networking: give --uplink IFACE too");
  if (!o.metrics_token_file.empty() && !o.metrics)
    return bad("--metrics-token is for --metrics HOST:PORT");
  if (o.metrics) {
    if (!o.tls.enabled() && !is_loopback(o.metrics->host))
      return bad("--metrics: " + o.metrics->host
                 + " is not a loopback address; serving metrics there needs --tls DIR (a "
                   "scraper then presents a certificate from your CA)");
    o.metrics->tls_dir = o.tls.dir;
    if (!o.metrics_token_file.empty()) {
      auto t = dsec::load_metrics_token(o.metrics_token_file);
      if (!t) {
        std::fprintf(stderr, "dsecd: %s\n", t.error_value().to_string().c_str());
        return 1;
      }
      o.metrics->token = *t;
    }
  }
  if (!o.tls.enabled() && !is_loopback(o.host))
    return bad("--listen: " + o.host
               + " is not a loopback address; listening there needs --tls DIR, so that "
                 "only peers with a certificate from your CA get in (tools/tls-certs makes "
                 "one; docs/security.md)");
  // Descriptors 0-2 must be something, or the first sockets we open become them.
  for (int fd = 0; fd < 3; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && ::open("/dev/null", O_RDWR) != fd)
      return 1;
  ::signal(SIGPIPE, SIG_IGN);

  caf::actor_system_config cfg;
  dsec::register_types(cfg);
  // CAF's middleman, whose BASP broker keeps CAF's own messages from a
  // connection off dsec's actors (actors/basp_guard.hpp).
  dsec::load_guarded_middleman(cfg);
  if (auto ok = dsec::configure_tls(cfg, o.tls); !ok) {
    std::fprintf(stderr, "dsecd: --tls %s: %s\n", o.tls.dir.c_str(),
                 ok.error_value().to_string().c_str());
    return 1;
  }
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("scheduler.max-threads", static_cast<size_t>(o.threads));
  cfg.set("logger.console", caf::atom("none"));
  // CAF's heartbeat keeps every link alive while its peer lives and drops it
  // after --client-timeout of silence. That timeout is CAF's one setting for
  // all links, so it suits clients (whose commands run for minutes): a hung
  // node is found sooner by its missed node heartbeats (--beat-timeout), a
  // dead one when its connection drops.
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::seconds(1)});
  cfg.set("middleman.connection-timeout", caf::timespan{o.client_timeout});
  caf::actor_system sys{cfg};

  if (o.port == 0) {
    // Pick the port now, so that the node's name (in `node stats` and errors)
    // is the one clients use. Another process could take it in between: then
    // publishing below fails and says so.
    sockaddr_storage ss{};
    socklen_t len = 0;
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (::inet_pton(AF_INET, o.host.c_str(), &sin->sin_addr) == 1) {
      sin->sin_family = AF_INET;
      len = sizeof *sin;
    } else {
      ::inet_pton(AF_INET6, o.host.c_str(), &sin6->sin6_addr);
      sin6->sin6_family = AF_INET6;
      len = sizeof *sin6;
    }
    int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0
        && ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
      o.port = ntohs(ss.ss_family == AF_INET ? sin->sin_port : sin6->sin6_port);
    if (fd >= 0)
      ::close(fd);
  }
  // IPv6 addresses in brackets, as --connect takes them.
  o.d.name = dsec::format_endpoint(o.host, o.port);
  // A node joins its coordinator through the same transport (TLS with --tls).
  o.d.connector = caf::actor_cast<caf::actor>(dsec::middleman_of(sys));
  dsec::door_policy door;
  door.group = o.group;
  if (!o.tls.enabled())
    o.d.door = door.counts;
  auto d = dsec::daemon::start(sys, o.d);
  // No handle on the middleman may outlive the actor system: it waits for them.
  o.d.connector = nullptr;
  if (!d) {
    std::fprintf(stderr, "dsecd: %s\n", d.error_value().to_string().c_str());
    return 1;
  }
  for (const auto& what : (*d)->collected())
    std::printf("dsecd: removed %s (left by a dsec that is gone)\n", what.c_str());
  const auto& sched = (*d)->scheduler();
  // Without TLS, the door admits root and the group's members only.
  auto port = o.tls.enabled()
                ? dsec::publish(sys, caf::actor_cast<caf::strong_actor_ptr>(sched),
                                sys.message_types(sched), o.port, o.host)
                : dsec::publish_behind_door(sys, caf::actor_cast<caf::strong_actor_ptr>(sched),
                                            sys.message_types(sched), o.port, o.host,
                                            door);
  if (!port) {
    std::fprintf(stderr, "dsecd: %s\n", port.error_value().message.c_str());
    (void) (*d)->shutdown();
    return 1;
  }
  std::string tls = o.tls.enabled() ? " with TLS: peers need a certificate signed by "
                                        + o.tls.dir + "/ca.pem"
                                     : " without TLS: root and group " + o.group + " only";
  std::string role = o.d.coordinator ? ", coordinator"
                     : o.d.join_host.empty()
                       ? ""
                       : ", joining " + dsec::format_endpoint(o.d.join_host, o.d.join_port);
  if (o.d.sim)
    std::printf("dsecd: listening on %s%s (state none: simulated backend, %u nodes x %u "
                "slots, %u threads, coordinator)\n",
                dsec::format_endpoint(o.host, *port).c_str(), tls.c_str(), o.d.sim_nodes,
                o.d.sim_slots, o.threads);
  else
    std::printf("dsecd: listening on %s%s (state %s, %u slots x %.2g, %u spawners, "
                "%u threads%s; sandbox defaults: %s)\n",
                dsec::format_endpoint(o.host, *port).c_str(), tls.c_str(),
                o.d.state_dir.c_str(), o.d.slots, o.d.oversubscribe, o.d.spawners, o.threads,
                role.c_str(), o.d.defaults->describe().c_str());
  dsec::log::write(dsec::log::level::info, "daemon", "listening",
                   {{"address", dsec::format_endpoint(o.host, *port)},
                    {"role", o.d.coordinator ? "coordinator"
                             : o.d.join_host.empty() ? "node" : "member"},
                    {"tls", o.tls.enabled() ? "yes" : "no"}});
  // /metrics, /healthz, /readyz (docs/observability.md): on threads of their
  // own, reading what the actors publish in atomics.
  std::atomic<bool> stopping{false};
  std::unique_ptr<dsec::metrics_http> metrics;
  if (o.metrics) {
    auto& reg = dsec::metrics::process_registry();
    dsec::metrics::add_process_collector(reg);
    reg.get_gauge("dsec_build_info", "1, labelled with dsec's version and the daemon's role.",
                  {{"version", DSEC_VERSION},
                   {"role", o.d.coordinator         ? "coordinator"
                            : o.d.join_host.empty() ? "node"
                                                    : "member"}})
      .set(1);
    std::string blobs = o.d.sim ? std::string{} : o.d.state_dir + "/blobs";
    std::string coordinator = o.d.join_host.empty()
                                ? std::string{}
                                : dsec::format_endpoint(o.d.join_host, o.d.join_port);
    o.metrics->ready = [&stopping, &reg, blobs, coordinator]() -> std::optional<std::string> {
      if (stopping)
        return std::string{"shutting down"};
      if (reg.value("dsec_nodes_cordoned") > 0)
        return std::string{"cordoned or draining (dsec node uncordon)"};
      if (reg.value("dsec_cluster_joined") < reg.value("dsec_cluster_members"))
        return coordinator.empty() ? std::string{"its own node has not joined it yet"}
                                   : "not joined to the coordinator " + coordinator;
      if (!blobs.empty() && ::access(blobs.c_str(), R_OK | X_OK) != 0)
        return "the layer store " + blobs + " is not reachable: " + std::strerror(errno);
      return std::nullopt;
    };
    auto m = dsec::metrics_http::start(*o.metrics, reg);
    if (!m) {
      std::fprintf(stderr, "dsecd: %s\n", m.error_value().message.c_str());
      (void) dsec::unpublish(sys, (*d)->scheduler().address(), *port);
      (void) (*d)->shutdown();
      return 1;
    }
    metrics = std::move(*m);
    std::printf("dsecd: metrics on %s://%s/metrics (and /healthz, /readyz, /status)%s\n",
                o.tls.enabled() ? "https" : "http",
                dsec::format_endpoint(o.metrics->host, metrics->port()).c_str(),
                o.metrics->token.empty() ? "" : ", with a bearer token");
  }
  std::fflush(stdout);
  int sig = 0;
  ::sigwait(&stop, &sig);
  stopping = true;
  std::printf("dsecd: %s: destroying every sandbox\n", ::sigabbrev_np(sig));
  std::fflush(stdout);
  (void) dsec::unpublish(sys, (*d)->scheduler().address(), *port);
  auto n = (*d)->shutdown();
  metrics.reset(); // before the daemon: its collectors read the engine
  if (n)
    std::printf("dsecd: %u sandboxes destroyed; bye\n", *n);
  else
    std::fprintf(stderr, "dsecd: shutdown: %s\n", n.error_value().to_string().c_str());
  d->reset();
  dsec::log::write(dsec::log::level::info, "daemon", "stopped",
                   {{"signal", ::sigabbrev_np(sig)},
                    {"destroyed", n ? std::to_string(*n) : std::string{"?"}}});
  dsec::log::flush_and_stop();
  return n ? 0 : 1;
}
