#include "actors/daemon.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/layer_cache.hpp"
#include "actors/layer_store.hpp"
#include "actors/member.hpp"
#include "actors/node.hpp"
#include "actors/scheduler.hpp"
#include "actors/types.hpp"
#include "actors/thread_guard.hpp"
#include "runtime/chronus_endpoint.hpp"
#include "runtime/metrics.hpp"

#include <sys/stat.h>

namespace dsec {

expected<std::unique_ptr<daemon>> daemon::start(caf::actor_system& sys,
                                                 const daemon_options& opts) {
  std::unique_ptr<daemon> d{new daemon};
  d->sys_ = &sys;
  d->key_ = opts.cluster_key ? *opts.cluster_key : internal_key::random();
  if (opts.sim) {
    // No engine, no layers, no trajectory logs: only the actors.
    if (!opts.coordinator)
      return make_error(errc::invalid_argument, "the simulated backend is for a coordinator");
    if (opts.sim_nodes == 0)
      return make_error(errc::invalid_argument, "a simulated cluster needs at least one node");
    for (uint32_t i = 1; i <= opts.sim_nodes; ++i) {
      node_config nc;
      nc.name = "sim-" + std::to_string(i);
      nc.slots = opts.sim_slots;
      nc.oversubscribe = opts.oversubscribe;
      nc.sim = *opts.sim;
      nc.key = d->key_;
      d->sim_nodes_.push_back(spawn_node(sys, std::move(nc)));
    }
    d->node_ = d->sim_nodes_.front();
    scheduler_config sc;
    sc.node = d->node_;
    sc.name = opts.name;
    sc.coordinator = true;
    sc.beat_timeout = opts.beat_timeout;
    sc.door = opts.door;
    sc.key = d->key_;
    d->scheduler_ = spawn_scheduler(sys, std::move(sc));
    for (uint32_t i = 0; i < opts.sim_nodes; ++i) {
      member_config mc;
      mc.name = "sim-" + std::to_string(i + 1);
      mc.node = d->sim_nodes_[i];
      mc.coordinator = d->scheduler_;
      mc.interval = opts.beat_interval;
      mc.grace = opts.orphan_grace;
      mc.key = d->key_;
      d->sim_members_.push_back(spawn_member(sys, std::move(mc)));
    }
    return d;
  }
  engine_options eo;
  eo.state_dir = opts.state_dir;
  eo.spawners = opts.spawners;
  eo.netns_prewarm = opts.netns_prewarm;
  eo.cgroup_pool = opts.cgroup_pool;
  DSEC_TRY(eng, engine::start(eo));
  d->engine_ = std::move(eng);
  d->gc_ = d->engine_->collect_garbage();
  if (!opts.host_mounts.empty()) {
    DSEC_TRY(policy, host_mount_policy::open(opts.host_mounts));
    d->engine_->set_host_mounts(std::move(policy));
  }
  // Chronus's counters are atomics of the reactor thread's: read when scraped.
  d->collector_ = metrics::process_registry().add_collector(
    [eng = d->engine_.get()](std::vector<metrics::sample_family>& out) {
      auto c = eng->chronus().stats();
      out.push_back({"dsec_chronus_events_total",
                     "Chronus frames accepted and mailed to their session.", "counter",
                     {{{}, static_cast<double>(c.events)}}});
      out.push_back({"dsec_chronus_answered_total", "Chronus feedback replies delivered.",
                     "counter", {{{}, static_cast<double>(c.answered)}}});
      out.push_back({"dsec_chronus_rejections_total", "Chronus frames refused, by why.",
                     "counter",
                     {{{{"reason", "too_large"}}, static_cast<double>(c.too_large)},
                      {{{"reason", "malformed"}}, static_cast<double>(c.malformed)},
                      {{{"reason", "unauthenticated"}}, static_cast<double>(c.unauthenticated)},
                      {{{"reason", "invalid"}}, static_cast<double>(c.invalid)},
                      {{{"reason", "flooding"}}, static_cast<double>(c.flooding)}}});
      out.push_back({"dsec_chronus_connections_total", "Chronus connections, by outcome.",
                     "counter",
                     {{{{"outcome", "accepted"}}, static_cast<double>(c.connections)},
                      {{{"outcome", "refused"}}, static_cast<double>(c.refused_connections)}}});
      out.push_back({"dsec_chronus_sandboxes", "Chronus sandboxes served now.", "gauge",
                     {{{}, static_cast<double>(eng->chronus().sandboxes())}}});
    });
  if (opts.egress) {
    auto eo = *opts.egress;
    if (eo.tag.empty())
      eo.tag = egress_tag(opts.state_dir);
    for (auto& what : egress_network::sweep(eo.tag))
      d->gc_.push_back(std::move(what));
    for (auto& what : egress_network::sweep_dead())
      d->gc_.push_back(std::move(what));
    DSEC_TRY(net, egress_network::start(eo));
    d->egress_ = std::move(net);
    d->engine_->set_network(d->egress_.get());
    for (const auto& sp : d->engine_->spawners())
      d->egress_->prewire(sp.get(), opts.egress_prewire,
                          [s = sp.get()] { return s->make_netns(); });
  }
  {
    DSEC_TRY(fw, port_forwarder::start(opts.ports));
    d->ports_ = std::move(fw);
    d->engine_->set_ports(d->ports_.get());
  }
  auto defaults = opts.defaults ? *opts.defaults
                                : derive_defaults(machine_resources::probe(), opts.slots,
                                                  opts.oversubscribe);
  // The first sandboxes take cgroups made now; and if the defaults cannot be
  // applied on this machine (no memory or pids controller), say so now
  // rather than in every sandbox's failure.
  if (auto lim = defaults.as_limits(); lim.any() && opts.slots > 0) {
    auto cg = d->engine_->cgroups();
    if (!cg)
      return make_error(cg.error_value().code,
                        "the default limits (" + defaults.describe() + ") need cgroups: "
                          + cg.error_value().message
                          + " (--default-memory none --default-pids none to run without)");
    if (auto ok = (*cg)->prewarm(lim, opts.cgroup_prewarm); !ok)
      return make_error(ok.error_value().code,
                        "the default limits (" + defaults.describe() + "): "
                          + ok.error_value().message
                          + " (--default-memory none or --default-pids none to go without one)");
  }
  // Build the system layer now rather than in the first sandbox's way.
  DSEC_TRY_VOID(d->engine_->layers().system_layer());
  d->cache_ = spawn_layer_cache(sys, *d->engine_, opts.cache_bytes, d->key_);
  d->layer_store_ = spawn_layer_store(sys, d->engine_->layers(), d->key_);
  std::string trajectories = opts.trajectories;
  if (trajectories.empty() && !opts.state_dir.empty())
    trajectories = opts.state_dir + "/trajectories";
  if (!trajectories.empty() && ::mkdir(trajectories.c_str(), 0700) < 0 && errno != EEXIST)
    return sys_error("creating the trajectory log directory", trajectories);
  node_config nc;
  nc.name = opts.name;
  nc.slots = opts.slots;
  nc.oversubscribe = opts.oversubscribe;
  nc.memory = static_cast<uint64_t>(
    static_cast<double>(opts.node_memory ? *opts.node_memory
                                         : machine_resources::probe().memory_bytes)
    * opts.oversubscribe);
  nc.max_starting = 4 * std::max(1u, opts.spawners);
  nc.disk_path = opts.state_dir;
  nc.min_free_disk = opts.min_free_disk;
  nc.cache = d->cache_;
  nc.eng = d->engine_.get();
  nc.gc = d->gc_;
  nc.trajectories = trajectories;
  nc.key = d->key_;
  nc.defaults = defaults;
  nc.pools = opts.pools;
  nc.pool_pressure_file = opts.pool_pressure_file;
  nc.pool_pressure_avg10 = opts.pool_pressure_avg10;
  nc.microvm = opts.microvm;
  if (!opts.join_host.empty())
    nc.orphan_grace = opts.orphan_grace; // its sessions live on the coordinator
  d->node_ = spawn_node(sys, std::move(nc));
  scheduler_config sc;
  sc.node = d->node_;
  sc.name = opts.name;
  // A node that joins a cluster opens no sessions: its trajectory dir holds
  // only the packs its sandboxes took, which it expires like logs when the dir
  // is its own. A dir shared with the coordinator (--trajectories) is the
  // coordinator's to expire: it knows which sessions are live.
  if (opts.join_host.empty() || opts.trajectories.empty()) {
    sc.trajectories = trajectories;
    sc.trajectory_keep = opts.trajectory_keep;
  }
  sc.coordinator = opts.coordinator;
  sc.store = d->layer_store_;
  sc.cache = d->cache_;
  sc.beat_timeout = opts.beat_timeout;
  sc.orphan_grace = opts.orphan_grace;
  sc.door = opts.door;
  sc.key = d->key_;
  if (!opts.join_host.empty())
    sc.joined = opts.join_host + ":" + std::to_string(opts.join_port);
  d->scheduler_ = spawn_scheduler(sys, std::move(sc));
  if (opts.coordinator || !opts.join_host.empty()) {
    member_config mc;
    mc.name = opts.name;
    mc.node = d->node_;
    mc.cache = d->cache_;
    mc.store = d->layer_store_;
    if (opts.coordinator)
      mc.coordinator = d->scheduler_;
    mc.host = opts.join_host;
    mc.port = opts.join_port;
    mc.connector = opts.connector;
    mc.interval = opts.beat_interval;
    mc.grace = opts.orphan_grace;
    mc.key = d->key_;
    mc.key_file = opts.cluster_key_file;
    d->member_ = spawn_member(sys, std::move(mc));
  }
  return d;
}

expected<uint32_t> daemon::shutdown() {
  if (down_)
    return uint32_t{0};
  down_ = true;
  uint32_t destroyed = 0;
  std::optional<error> failure;
  {
    caller_thread_guard pin; // see thread_guard.hpp
    caf::scoped_actor self{*sys_};
    auto end = [&](const caf::actor& a) {
      if (!a)
        return;
      self->monitor(a);
      self->send_exit(a, caf::exit_reason::user_shutdown);
      self->receive([](caf::down_msg&) {});
    };
    // No more heartbeats or joins: the coordinator sees this node go.
    end(caf::actor_cast<caf::actor>(member_));
    for (auto& m : sim_members_)
      end(caf::actor_cast<caf::actor>(m));
    self->request(scheduler_, std::chrono::seconds(60), shutdown_atom::value, process_key())
      .receive([&](uint32_t n) { destroyed = n; },
               [&](caf::error& e) { failure = from_caf(e); });
    // The other simulated nodes (the scheduler shut down the first, node_).
    for (size_t i = 1; i < sim_nodes_.size(); ++i)
      self->request(sim_nodes_[i], std::chrono::seconds(60), shutdown_atom::value, process_key())
        .receive([&](uint32_t n) { destroyed += n; },
                 [&](caf::error& e) { failure = from_caf(e); });
    for (const caf::actor& a : {caf::actor_cast<caf::actor>(scheduler_),
                                caf::actor_cast<caf::actor>(node_),
                                caf::actor_cast<caf::actor>(cache_),
                                caf::actor_cast<caf::actor>(layer_store_)})
      end(a);
    for (size_t i = 1; i < sim_nodes_.size(); ++i)
      end(caf::actor_cast<caf::actor>(sim_nodes_[i]));
  }
  sim_members_.clear();
  sim_nodes_.clear();
  scheduler_ = nullptr;
  member_ = nullptr;
  node_ = nullptr;
  cache_ = nullptr;
  layer_store_ = nullptr;
  if (failure)
    return *failure;
  return destroyed;
}

daemon::~daemon() {
  (void) shutdown();
  if (collector_ != 0)
    metrics::process_registry().remove_collector(collector_);
  if (egress_)
    egress_->stop_prewiring(); // it asks the spawners for namespaces
  engine_.reset();
}

} // namespace dsec
