#include "actors/node.hpp"

#include "runtime/egress.hpp"
#include "runtime/port_forward.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <sys/random.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "actors/backend.hpp"
#include "actors/sandbox.hpp"
#include "actors/sandbox_id.hpp"
#include "actors/types.hpp"
#include "runtime/engine.hpp"
#include "runtime/log.hpp"
#include "runtime/container.hpp"
#include "runtime/metrics.hpp"
#include "runtime/units.hpp"

namespace dsec {

namespace {

// ---- metrics (runtime/metrics.hpp, docs/observability.md) ---------------------
// Every node of the process adds to the process's registry: counters and
// histograms by backend, gauges as the sum of each node's last published value.

using mclock = std::chrono::steady_clock;

struct backend_metrics {
  std::string backend;
  metrics::counter& creates;
  metrics::counter& destroys;
  metrics::histogram& create_seconds;
};

struct backend_metrics_map {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<backend_metrics>, std::less<>> all;
};
backend_metrics_map& backend_metrics_all() {
  static auto* m = new backend_metrics_map; // never destroyed: actors may publish during exit
  return *m;
}

backend_metrics& metrics_of(const std::string& backend) {
  auto& [mu, all] = backend_metrics_all();
  std::lock_guard<std::mutex> g{mu};
  auto& p = all[backend];
  if (!p) {
    auto& r = metrics::process_registry();
    metrics::labels l{{"backend", backend}};
    p.reset(new backend_metrics{
      backend,
      r.get_counter("dsec_sandbox_creates_total",
                    "Sandboxes made ready (warm pools' refills included).", l),
      r.get_counter("dsec_sandbox_destroys_total", "Sandboxes that ended after being ready.", l),
      r.get_histogram("dsec_sandbox_create_seconds",
                      "From a sandbox's admission by its node to its being ready.",
                      metrics::latency_buckets(), l)});
  }
  return *p;
}

// The process's create latency over every backend (node_stats.create_buckets;
// the coordinator sums its nodes' into dsec_cluster_create_seconds).
void create_latency(std::vector<uint64_t>& buckets, double& sum) {
  auto& [mu, all] = backend_metrics_all();
  std::lock_guard<std::mutex> g{mu};
  buckets.assign(metrics::latency_buckets().size() + 1, 0);
  sum = 0;
  for (const auto& [name, p] : all) {
    auto h = p->create_seconds.read();
    for (size_t i = 0; i < buckets.size() && i < h.cumulative.size(); ++i)
      buckets[i] += h.cumulative[i];
    sum += h.sum;
  }
}

// A sandbox asked for that never became ready, by why.
void count_failure(const std::string& backend, const char* reason, uint64_t n = 1) {
  if (n == 0)
    return;
  metrics::process_registry()
    .get_counter("dsec_sandbox_failures_total",
                 "Sandboxes asked for that were refused or ended before they were ready.",
                 {{"backend", backend}, {"reason", reason}})
    .inc(n);
}

// The gauges a node contributes to, and what it contributed last.
struct node_gauges {
  static constexpr size_t n = 8;
  std::array<double, n> last{};
  static std::array<metrics::gauge*, n>& all() {
    static std::array<metrics::gauge*, n> g = [] {
      auto& r = metrics::process_registry();
      return std::array<metrics::gauge*, n>{
        &r.get_gauge("dsec_sandboxes_live",
                     "Sandboxes admitted and not yet gone, creating ones included, pooled "
                     "ones not."),
        &r.get_gauge("dsec_sandboxes_creating", "Sandboxes being created or queued to be."),
        &r.get_gauge("dsec_sandboxes_paused", "Sandboxes paused (dsec pause)."),
        &r.get_gauge("dsec_sandboxes_pooled", "Sandboxes in warm pools, nobody's yet."),
        &r.get_gauge("dsec_slots", "Sandboxes the nodes admit (slots x oversubscribe)."),
        &r.get_gauge("dsec_slots_used", "Slots in use (pooled sandboxes included)."),
        &r.get_gauge("dsec_nodes_cordoned", "Nodes of this process that admit nothing new "
                                            "(cordoned or draining)."),
        &r.get_gauge("dsec_mailbox_messages",
                     "Messages waiting in an actor's mailbox when it last looked (the "
                     "nodes' summed).",
                     {{"actor", "node"}})};
    }();
    return g;
  }
  void publish(const std::array<double, n>& now) {
    auto& g = all();
    for (size_t i = 0; i < n; ++i)
      if (now[i] != last[i]) {
        g[i]->add(now[i] - last[i]);
        last[i] = now[i];
      }
  }
  ~node_gauges() { publish({}); }
};

struct node_state {
  static inline const char* name = "dsec.node";

  node_config cfg;
  uint32_t admit_limit = 0;
  struct entry {
    sandbox_actor handle;
    bool ready = false;
    uint64_t memory = 0; // modelled (a sim node's)
    mclock::time_point admitted{}; // for dsec_sandbox_create_seconds
    backend_metrics* m = nullptr;
    std::string session_id; // whose it is (empty: a pool's, unclaimed)
    create_labels labels;   // its create's key and tags (placement.labels), for adoption
    uint32_t count = 1;     // its create's count
  };
  std::unordered_map<std::string, entry> live;
  // What each session's creates said of it (placement.session, .owned), for
  // a join report after the coordinator was lost (held_session).
  std::unordered_map<std::string, std::pair<session_options, bool>> session_meta;
  std::unordered_set<std::string> paused; // snapshots (issue 16): its sandboxes paused now
  // The backends it offers (actors/backend.hpp), by name. A simulated node
  // has none: it models the container backend itself (sim_sandbox).
  std::map<std::string, std::unique_ptr<backend>, std::less<>> backends;
  // The ids of its microVMs (some may have ended: only those in `live` count).
  std::unordered_set<std::string> microvm_ids;
  // Admitted sandboxes wait here for their turn: creating a few at a time lets
  // the first of a big batch be ready at once instead of all at the end.
  std::deque<sandbox_config> queued;
  uint32_t starting = 0;
  uint32_t creating = 0;
  uint64_t created = 0, failed = 0, destroyed = 0;
  // Memory admitted: the charges (charge_of) of the live sandboxes.
  uint64_t memory_admitted = 0;
  uint64_t sim_rng = 0;    // a sim node's ids: splitmix64, seeded once

  std::vector<caf::typed_response_promise<uint32_t>> shutdown_waiters;
  uint32_t shutdown_count = 0;
  bool shutting_down = false;
  // reset_atom: answered once the node is empty, with how many there were
  std::vector<std::pair<caf::typed_response_promise<uint32_t>, uint32_t>> reset_waiters;
  // Cordoned (cordon_atom, drain_atom): it admits nothing new.
  bool cordoned = false;
  // Its state disk had less than min_free_disk free at the last spawn (said
  // once in the log, and once when it has room again).
  bool disk_low = false;
  // drain_atom: answered once the node is empty (how many there were), or
  // when its timeout (timeout_atom with its number) runs out.
  struct drain_waiter {
    uint64_t number;
    caf::typed_response_promise<internal_key, uint32_t> rp;
    uint32_t had;
  };
  std::vector<drain_waiter> drain_waiters;
  uint64_t next_drain = 1;
  // warm pools (actors/warm_pool.hpp)
  warm_pools pools;
  bool pressure_timer = false;   // a pressure_atom is on its way
  std::set<caf::actor_addr> pool_owners; // sessions monitored for their pools
  node_gauges gauges;
};

using self_ptr = node_actor::stateful_pointer<node_state>;

uint32_t used_slots(const node_state& s);

// Puts the node's levels into the process's gauges (after every change).
void publish(self_ptr self) {
  auto& s = self->state;
  auto live = static_cast<double>(s.live.size());
  auto pooled = static_cast<double>(s.pools.size());
  s.gauges.publish({live - std::min(live, pooled), static_cast<double>(s.creating),
                    static_cast<double>(s.paused.size()), pooled,
                    static_cast<double>(s.admit_limit), static_cast<double>(used_slots(s)),
                    s.cordoned ? 1.0 : 0.0, static_cast<double>(self->mailbox().size())});
}

// Starts queued sandboxes while fewer than max_starting are being created.
void pump(self_ptr self) {
  auto& s = self->state;
  while (s.starting < std::max(1u, s.cfg.max_starting) && !s.queued.empty()) {
    auto sc = std::move(s.queued.front());
    s.queued.pop_front();
    auto it = s.live.find(sc.id);
    if (it == s.live.end())
      continue; // shut down meanwhile
    auto& b = *s.backends.at(sc.env.backend); // checked at admission
    it->second.handle = b.spawn(self->system(), std::move(sc));
    ++s.starting;
  }
}

// A sandbox id like new_sandbox_id()'s (12 hex digits) without a getrandom
// call each: a simulated node makes them by the hundred thousand.
std::string sim_id(node_state& s) {
  static const char hex[] = "0123456789abcdef";
  if (s.sim_rng == 0)
    (void) ::getrandom(&s.sim_rng, sizeof s.sim_rng, 0);
  for (;;) {
    uint64_t z = (s.sim_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::string id = node_tag(s.cfg.name) + std::string(8, '0');
    for (size_t i = 4; i < 12; ++i)
      id[i] = hex[(z >> (4 * i)) & 15];
    if (!s.live.count(id))
      return id;
  }
}

// A new id for a sandbox of this node: it names the node (actors/sandbox_id.hpp)
// and no live one has it.
std::string fresh_id(node_state& s) {
  for (;;)
    if (auto id = sandbox_id_on(s.cfg.name); !s.live.count(id))
      return id;
}

// The memory a node admits sandboxes up to (node_config::memory): a
// simulated node's model, else the configured capacity; 0: no such bound.
uint64_t memory_capacity(const node_state& s) {
  return s.cfg.sim ? s.cfg.sim->node_memory : s.cfg.memory;
}

// What one sandbox of `env` counts against that: the memory it asks for, else
// (a sandbox that takes the node's default limit) the node's memory per slot,
// so that sandboxes of the default size fill the slots before the memory.
uint64_t charge_of(const node_state& s, const environment& env) {
  if (env.memory)
    return env.memory;
  if (s.cfg.sim)
    return s.cfg.sim->memory;
  return s.admit_limit ? s.cfg.memory / s.admit_limit : 0;
}

// The bytes free on the state disk when they are below min_free_disk (the
// node then admits nothing); nothing when there is room or no check. One
// statvfs(2) of the daemon's own dir per spawn.
std::optional<uint64_t> low_disk(node_state& s) {
  if (s.cfg.min_free_disk == 0 || s.cfg.disk_path.empty())
    return std::nullopt;
  struct statvfs v{};
  if (::statvfs(s.cfg.disk_path.c_str(), &v) < 0)
    return std::nullopt; // not knowable: the layer fetch says what is wrong
  auto avail = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
  bool low = avail < s.cfg.min_free_disk;
  if (low != s.disk_low) {
    s.disk_low = low;
    log::write(low ? log::level::warn : log::level::info, "node",
               low ? "state disk low: admitting no sandbox" : "state disk has room again",
               {{"node", s.cfg.name},
                {"path", s.cfg.disk_path},
                {"free", format_size(avail)},
                {"min_free_disk", format_size(s.cfg.min_free_disk)}});
  }
  if (!low)
    return std::nullopt;
  return avail;
}

// Its microVMs alive now.
uint32_t live_microvms(const node_state& s) {
  uint32_t n = 0;
  for (const auto& id : s.microvm_ids)
    n += s.live.count(id) ? 1 : 0;
  return n;
}

// The microVM slots free now (pooled microVMs given up and not yet gone are free).
uint32_t free_microvm_slots(node_state& s) {
  if (!s.cfg.microvm)
    return 0;
  uint32_t used = 0;
  for (auto it = s.microvm_ids.begin(); it != s.microvm_ids.end();) {
    if (!s.live.count(*it)) {
      it = s.microvm_ids.erase(it);
      continue;
    }
    used += s.pools.releasing(*it) ? 0 : 1;
    ++it;
  }
  return s.cfg.microvm->slots > used ? s.cfg.microvm->slots - used : 0;
}

// The backends it offers with their capacity (node_stats, node_report). The
// microvm backend has its own slots (node_config::microvm).
std::vector<backend_offer> offers(const node_state& s) {
  std::vector<backend_offer> out;
  auto live = static_cast<uint32_t>(s.live.size());
  if (s.cfg.sim)
    out.push_back({std::string{backend_container}, s.admit_limit, live});
  for (const auto& [name, b] : s.backends) {
    if (name == "microvm" && s.cfg.microvm)
      out.push_back({name, std::min(s.cfg.microvm->slots, s.admit_limit), live_microvms(s)});
    else
      out.push_back({name, s.admit_limit, live});
  }
  return out;
}

// Whether it offers `name`; else the error naming the ones it does.
std::optional<error> check_backend(const node_state& s, const std::string& name) {
  if (s.cfg.sim ? name == backend_container : s.backends.count(name) > 0)
    return std::nullopt;
  std::string have;
  for (const auto& o : offers(s))
    have += (have.empty() ? "" : ", ") + o.name;
  return make_error(errc::unsupported, "node " + s.cfg.name + " offers no backend '" + name
                                         + "' (it offers: " + (have.empty() ? "none" : have)
                                         + ")");
}

// Slots in use: pooled sandboxes given up (destroyed, not yet gone) are free.
uint32_t used_slots(const node_state& s) {
  return static_cast<uint32_t>(s.live.size()) - s.pools.releasing();
}

void check_shutdown(self_ptr self) {
  auto& s = self->state;
  if (s.live.empty()) {
    for (auto& [rp, n] : s.reset_waiters)
      rp.deliver(n);
    s.reset_waiters.clear();
  }
  // Drained: nothing left but idle pooled sandboxes (a cordoned node makes
  // no new ones and hands none out).
  if (!s.drain_waiters.empty() && s.live.size() <= s.pools.size()) {
    for (auto& w : s.drain_waiters)
      w.rp.deliver(s.cfg.key, w.had);
    s.drain_waiters.clear();
  }
  if (s.shutting_down && s.live.empty()) {
    for (auto& rp : s.shutdown_waiters)
      rp.deliver(s.shutdown_count);
    s.shutdown_waiters.clear();
  }
}

// ---- warm pools (actors/warm_pool.hpp) -------------------------------------------

// Destroys pooled sandboxes no pool keeps any more (a queued one that never
// started is simply dropped).
void destroy_pooled(self_ptr self, const std::vector<std::string>& ids) {
  auto& s = self->state;
  for (const auto& id : ids) {
    auto it = s.live.find(id);
    if (it == s.live.end())
      continue;
    // Its memory is free for creates at once, as its slot is (releasing).
    s.memory_admitted -= it->second.memory;
    it->second.memory = 0;
    if (it->second.handle) {
      caf::anon_send(it->second.handle, destroy_atom::value, s.cfg.key);
      continue;
    }
    std::erase_if(s.queued, [&](const sandbox_config& sc) { return sc.id == id; });
    s.live.erase(it);
    s.pools.gone(id);
    --s.creating;
  }
}

// Makes the sandboxes the pools lack, in the slots no create uses.
void refill_pools(self_ptr self) {
  auto& s = self->state;
  if (s.pools.empty() || s.shutting_down || !s.reset_waiters.empty() || s.cfg.sim)
    return;
  uint32_t used = used_slots(s);
  uint32_t room = used >= s.admit_limit || s.cordoned ? 0 : s.admit_limit - used;
  uint64_t capacity = memory_capacity(s);
  uint32_t vm_room = free_microvm_slots(s);
  for (auto [pid, n] : s.pools.wanted(room)) {
    const auto* p = s.pools.find(pid);
    // A pooled sandbox counts against the node's memory as a created one
    // does (its environment has the node's defaults), so pools fill only
    // the memory that creates leave; a pooled microVM takes a microVM slot.
    uint64_t each = charge_of(s, p->env);
    bool microvm = p->env.backend == "microvm";
    for (uint32_t i = 0; i < n; ++i) {
      if (capacity > 0 && each > 0 && s.memory_admitted + each > capacity)
        break;
      if (microvm && vm_room == 0)
        break;
      sandbox_config sc;
      sc.id = fresh_id(s);
      sc.session_id = p->owner ? p->owner_id : "pool";
      sc.env = p->env;
      sc.env.ttl_ms = 0; // none while pooled; the claim gives it one
      sc.session = p->owner;
      sc.node = self;
      sc.node_name = s.cfg.name;
      sc.cache = s.cfg.cache;
      sc.eng = s.cfg.eng;
      sc.trajectories = s.cfg.trajectories;
      sc.key = s.cfg.key;
      sc.pooled = true;
      if (microvm) {
        s.microvm_ids.insert(sc.id);
        --vm_room;
      }
      s.pools.warming(pid, sc.id);
      s.live.emplace(sc.id, node_state::entry{{}, false, each, mclock::now(),
                                              &metrics_of(sc.env.backend), {}, {}, 1});
      s.memory_admitted += each;
      s.queued.push_back(std::move(sc));
      ++s.creating;
    }
  }
  pump(self);
  publish(self);
}

// A create's sandboxes from the pools, as far as they go: each claimed in one
// message. Not for a sandbox rebuilt from a log (its id, its seed pack), nor
// of a backend pools do not keep; one for packs (a logged session's) is told so.
uint32_t claim_pooled(self_ptr self, const environment& env, uint32_t count,
                      const session_actor& session, const placement& pl) {
  auto& s = self->state;
  if (s.pools.empty() || s.shutting_down || !pl.id.empty() || !pl.seed_pack.empty()
      || !pl.seed_manifest.empty() || !poolable(env))
    return 0;
  auto want = env;
  s.cfg.defaults.apply(want);
  uint64_t ttl = env.ttl_ms != 0 ? env.ttl_ms : pl.ttl_ms;
  uint32_t n = 0;
  while (n < count) {
    auto id = s.pools.take(want, session.address());
    if (!id)
      break;
    auto& e = s.live.at(*id);
    e.session_id = pl.session_id;
    e.labels = pl.labels;
    e.count = pl.count;
    // Claimed, it counts what a create of `env` counts.
    uint64_t charge = charge_of(s, env);
    s.memory_admitted = s.memory_admitted - e.memory + charge;
    e.memory = charge;
    // (Its answer matters only if it is gone already: then nobody told the
    // session, and its request would wait for ever.)
    self->request(e.handle, std::chrono::seconds(30), claim_atom::value, process_key(),
                  caf::actor_cast<caf::actor>(session), pl.session_id, pl.request, ttl,
                  pl.keep_upper)
      .then([](bool) {},
            [=, key = s.cfg.key, id = *id, request = pl.request](caf::error&) {
              self->send(session, failed_atom::value, key,
                         to_caf(make_error(errc::sandbox_failed,
                                           "pooled sandbox " + id + " ended before it was claimed")),
                         request);
            });
    ++n;
  }
  if (n > 0) {
    static auto& claims = metrics::process_registry().get_counter(
      "dsec_pool_claims_total", "Sandboxes handed out from warm pools.");
    claims.inc(n);
  }
  return n;
}

// Destroys up to `n` idle pooled sandboxes for a create (with `only_microvm`,
// pooled microVMs, for a create that needs their slots); how many.
uint32_t evict_pooled(self_ptr self, uint32_t n, bool only_microvm = false) {
  auto& s = self->state;
  std::vector<std::string> ids;
  while (ids.size() < n) {
    auto id = s.pools.evict(only_microvm);
    if (!id)
      break;
    ids.push_back(std::move(*id));
  }
  destroy_pooled(self, ids);
  return static_cast<uint32_t>(ids.size());
}

void drop_session_pools(self_ptr self) {
  std::vector<std::string> orphans;
  self->state.pools.drop_sessions(orphans);
  destroy_pooled(self, orphans);
}

void check_pressure(self_ptr self) {
  auto& s = self->state;
  s.pressure_timer = false;
  std::vector<std::string> orphans;
  bool was = s.pools.pressure();
  bool on = memory_pressure(s.cfg.pool_pressure_file, s.cfg.pool_pressure_avg10);
  s.pools.set_pressure(on, orphans);
  destroy_pooled(self, orphans);
  if (on != was) {
    std::printf("dsecd: node %s: memory pressure %s: warm pools %s\n", s.cfg.name.c_str(),
                on ? "high" : "gone", on ? "shrunk" : "refill");
    std::fflush(stdout);
  }
  if (!on)
    refill_pools(self);
  if (!s.pools.empty() && !s.shutting_down) {
    s.pressure_timer = true;
    self->delayed_send(self, s.cfg.pool_pressure_interval, pressure_atom::value, process_key());
  }
}

expected<uint32_t> set_pool(self_ptr self, environment env, uint32_t size,
                            const session_actor& owner, const std::string& owner_id) {
  auto& s = self->state;
  if (s.cfg.sim)
    return make_error(errc::unsupported,
                      "node " + s.cfg.name + " is simulated: it keeps no warm pools");
  if (s.shutting_down)
    return make_error(errc::overloaded, "node " + s.cfg.name + " is shutting down");
  // Every way a pool comes here (dsecd --pool, `dsec pool set`, a session's
  // pool) meets the one validation of an environment.
  if (auto v = env.validate(); !v)
    return std::move(v).error_value();
  if (!poolable(env))
    return make_error(errc::unsupported, "a warm pool keeps containers or microVMs, not "
                                           + env.backend
                                           + " sandboxes (backend container, function or microvm)");
  bool microvm = env.backend == "microvm";
  if (auto e = check_backend(s, env.backend); microvm && e && size > 0)
    return std::move(*e);
  uint32_t fits = microvm && s.cfg.microvm ? std::min(s.cfg.microvm->slots, s.admit_limit)
                                           : s.admit_limit;
  if (size > fits)
    return make_error(errc::invalid_argument,
                      "a pool of " + std::to_string(size) + " does not fit node " + s.cfg.name
                        + " (" + std::to_string(fits) + (microvm ? " microVM slots)" : " slots)"));
  auto asked = pool_key(env);
  s.cfg.defaults.apply(env);
  env.ttl_ms = 0;
  env.backend = microvm ? "microvm" : "container";
  std::vector<std::string> orphans;
  s.pools.set(env, asked, owner, owner.address() ? owner_id : "node", size, orphans);
  destroy_pooled(self, orphans);
  if (owner && s.pool_owners.insert(owner.address()).second)
    self->monitor(owner);
  refill_pools(self);
  if (!s.pressure_timer && !s.pools.empty())
    check_pressure(self);
  return size;
}

void start_pools(self_ptr self) {
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (!s.pool_owners.count(dm.source))
      return;
    auto hdl = caf::actor_cast<caf::actor>(dm.source);
    if (hdl && !really_down(hdl, "a down message of a pool's session"))
      return;
    s.pool_owners.erase(dm.source);
    std::vector<std::string> orphans;
    s.pools.drop_owner(dm.source, orphans);
    destroy_pooled(self, orphans);
  });
  for (const auto& p : self->state.cfg.pools)
    if (auto r = set_pool(self, p.env, p.size, session_actor{}, "node"); !r) {
      std::printf("dsecd: node %s: --pool %s: %s\n", self->state.cfg.name.c_str(),
                  p.env.base.c_str(), r.error_value().message.c_str());
      std::fflush(stdout);
    }
}

node_actor::behavior_type node_impl(self_ptr self, node_config cfg) {
  self->state.cfg = std::move(cfg);
  auto& st = self->state;
  st.admit_limit = static_cast<uint32_t>(static_cast<double>(st.cfg.slots)
                                         * std::max(0.0, st.cfg.oversubscribe));
  if (!st.cfg.sim) {
    auto c = make_container_backend();
    st.backends.emplace(std::string{c->name()}, std::move(c));
    if (st.cfg.microvm && st.cfg.eng) {
      auto m = make_microvm_backend(*st.cfg.microvm, *st.cfg.eng);
      std::printf("dsecd: node %s: microvm backend, %u slots, %s, guest %s\n", st.cfg.name.c_str(),
                  st.cfg.microvm->slots, microvm_accel_of(*st.cfg.microvm).c_str(),
                  st.cfg.microvm->guest_dir.c_str());
      std::fflush(stdout);
      st.backends.emplace(std::string{m->name()}, std::move(m));
    }
  }
  start_pools(self);
  publish(self);
  return {
    [=](spawn_atom, const internal_key& k, const environment& env, uint32_t count,
        const session_actor& session, const placement& pl) -> caf::result<internal_key, uint32_t> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "spawn (node)"))
        return refuse("spawn");
      uint64_t request = pl.request;
      // Names that become parts of paths on this node (its trajectory dir).
      if (auto v = check_name(pl.session_id, "a session id"); !v)
        return to_caf(v.error_value());
      if (!pl.id.empty())
        if (auto v = check_name(pl.id, "a sandbox id"); !v)
          return to_caf(v.error_value());
      if (!pl.seed_pack.empty())
        if (auto v = check_name(pl.seed_pack, "a pack name"); !v)
          return to_caf(v.error_value());
      if (!session)
        return to_caf(make_error(errc::invalid_argument, "spawn: no session given"));
      if (auto e = check_backend(s, env.backend))
        return to_caf(*e);
      if (!pl.id.empty()) {
        // A sandbox rebuilt under its old id (a resumed session).
        if (count != 1)
          return to_caf(make_error(errc::invalid_argument,
                                   "a placement with a fixed id is for one sandbox, not "
                                     + std::to_string(count)));
        if (s.live.count(pl.id))
          return to_caf(make_error(errc::already_exists, "sandbox " + pl.id
                                                           + " already lives on node "
                                                           + s.cfg.name));
      }
      if (pl.session_id != "pool")
        s.session_meta[pl.session_id] = {pl.session, pl.owned};
      // A cordoned node hands out no pooled sandbox either.
      uint32_t claimed = s.cordoned || s.shutting_down ? 0 : claim_pooled(self, env, count, session, pl);
      count -= claimed;
      auto disk_free = s.shutting_down || s.cordoned ? std::nullopt : low_disk(s);
      uint32_t room = s.shutting_down || s.cordoned || disk_free
                          || used_slots(s) >= s.admit_limit
                        ? 0
                        : s.admit_limit - used_slots(s);
      if (room < count && !s.shutting_down && !s.cordoned && !disk_free)
        room += evict_pooled(self, count - room); // pools give up their slots first
      // Memory: a node admits what its memory capacity holds (actors/node.hpp).
      uint64_t each = charge_of(s, env);
      uint64_t capacity = memory_capacity(s);
      bool memory_bound = false;
      if (capacity > 0 && each > 0) {
        auto fits = [&]() -> uint64_t {
          return s.memory_admitted >= capacity ? 0 : (capacity - s.memory_admitted) / each;
        };
        // Pools give up their memory too, an idle sandbox at a time.
        while (fits() < std::min(room, count) && !s.shutting_down && !s.cordoned
               && evict_pooled(self, 1) == 1) {
        }
        uint64_t fit = fits();
        if (fit < room) {
          room = static_cast<uint32_t>(fit);
          memory_bound = true;
        }
      }
      bool microvm = env.backend == "microvm" && s.cfg.microvm;
      if (microvm) {
        uint32_t vm_room = free_microvm_slots(s);
        // Pooled microVMs (of other environments) give up their slots first.
        if (vm_room < std::min(room, count) && !s.shutting_down && !s.cordoned)
          vm_room += evict_pooled(self, std::min(room, count) - vm_room, true);
        room = std::min(room, vm_room);
      }
      uint32_t admitted = std::min(count, room);
      if (s.cfg.sim && admitted > 0) {
        // No runtime: spawn them all now; they share one description.
        auto c = std::make_shared<sim_common>();
        c->session_id = pl.session_id;
        c->env = env;
        if (c->env.ttl_ms == 0)
          c->env.ttl_ms = pl.ttl_ms;
        c->session = session;
        c->node = self;
        c->node_name = s.cfg.name;
        c->model = *s.cfg.sim;
        c->key = s.cfg.key;
        std::shared_ptr<const sim_common> shared = std::move(c);
        auto t0 = mclock::now();
        auto* bm = &metrics_of(env.backend);
        for (uint32_t i = 0; i < admitted; ++i) {
          auto id = pl.id.empty() ? sim_id(s) : pl.id;
          auto h = spawn_sim_sandbox(self->system(), shared, id, request);
          s.live.emplace(std::move(id), node_state::entry{std::move(h), false, each, t0, bm,
                                                          pl.session_id, pl.labels, pl.count});
          s.memory_admitted += each;
          ++s.creating;
          ++s.starting;
        }
      }
      for (uint32_t i = 0; i < admitted && !s.cfg.sim; ++i) {
        sandbox_config sc;
        sc.id = pl.id.empty() ? fresh_id(s) : pl.id;
        sc.session_id = pl.session_id;
        sc.env = env;
        if (sc.env.ttl_ms == 0)
          sc.env.ttl_ms = pl.ttl_ms;
        // Every sandbox has limits: the node's defaults where it asks for none.
        s.cfg.defaults.apply(sc.env);
        sc.session = session;
        sc.request = request;
        sc.node = self;
        sc.node_name = s.cfg.name;
        sc.cache = s.cfg.cache;
        sc.eng = s.cfg.eng;
        sc.keep_upper = pl.keep_upper;
        sc.seed_pack = pl.seed_pack;
        sc.seed_manifest = pl.seed_manifest;
        sc.trajectories = s.cfg.trajectories;
        sc.key = s.cfg.key;
        sc.orphan_grace = s.cfg.orphan_grace;
        s.live.emplace(sc.id, node_state::entry{{}, false, each, mclock::now(),
                                                &metrics_of(env.backend), pl.session_id,
                                                pl.labels, pl.count});
        if (microvm)
          s.microvm_ids.insert(sc.id);
        s.memory_admitted += each;
        s.queued.push_back(std::move(sc));
        ++s.creating;
      }
      pump(self);
      if (claimed > 0)
        refill_pools(self);
      publish(self);
      if (!pl.report_refusals)
        return {s.cfg.key, admitted + claimed}; // the cluster's scheduler places them elsewhere
      // Every sandbox asked for gets an answer; the ones without room now,
      // naming the resource that ran out.
      if (admitted < count) {
        std::string why;
        count_failure(env.backend,
                      s.shutting_down ? "shutting_down"
                      : s.cordoned    ? "cordoned"
                      : disk_free     ? "no_disk"
                      : memory_bound  ? "no_memory"
                                      : "no_slots",
                      count - admitted);
        if (s.shutting_down)
          why = "node " + s.cfg.name + " is shutting down";
        else if (s.cordoned)
          why = "node " + s.cfg.name + " is cordoned: it admits no new sandbox (dsec node "
                "uncordon " + s.cfg.name + ")";
        else if (disk_free)
          why = "node " + s.cfg.name + " is full: its state disk (" + s.cfg.disk_path + ") has "
                + format_size(*disk_free) + " free, less than --min-free-disk "
                + format_size(s.cfg.min_free_disk);
        else if (memory_bound)
          why = "node " + s.cfg.name + " is full: memory: " + format_size(s.memory_admitted)
                + " of " + format_size(capacity) + " admitted, a sandbox takes "
                + format_size(each);
        else
          why = "node " + s.cfg.name + " is full: " + std::to_string(s.live.size()) + " of "
                + std::to_string(s.admit_limit) + " slots in use";
        auto e = to_caf(make_error(errc::overloaded, why));
        for (uint32_t i = admitted; i < count; ++i)
          self->send(session, failed_atom::value, s.cfg.key, e, request);
      }
      s.failed += count - admitted;
      return {s.cfg.key, admitted + claimed};
    },
    [=](lookup_atom, const internal_key& k,
        const std::string& id) -> caf::result<internal_key, sandbox_actor> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "lookup (node)"))
        return refuse("lookup");
      auto it = s.live.find(id);
      if (it == s.live.end() || !it->second.handle || s.pools.pooled(id))
        return to_caf(make_error(errc::not_found, "no sandbox " + id + " on node "
                                                    + s.cfg.name));
      return {s.cfg.key, it->second.handle};
    },
    [=](list_atom,
        const internal_key& k) -> caf::result<internal_key, std::vector<sandbox_info>> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "list (node)"))
        return refuse("list");
      std::vector<sandbox_info> queued;
      std::vector<sandbox_actor> boxes;
      for (auto& [id, e] : s.live) {
        if (s.pools.pooled(id))
          continue; // nobody's yet (node stats shows pools)
        if (e.handle) {
          boxes.push_back(e.handle);
          continue;
        }
        sandbox_info info; // still queued: no actor to ask yet
        info.id = id;
        info.node = s.cfg.name;
        info.state = "queued";
        queued.push_back(std::move(info));
      }
      auto rp = self->make_response_promise<internal_key, std::vector<sandbox_info>>();
      gather_infos(self, s.cfg.key, std::move(queued), boxes,
                   [rp, key = s.cfg.key](std::vector<sandbox_info> all) mutable {
                     rp.deliver(key, std::move(all));
                   });
      return rp;
    },
    [=](stats_atom, const internal_key& k) -> caf::result<internal_key, node_stats> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "stats (node)"))
        return refuse("stats");
      node_stats ns;
      ns.node = s.cfg.name;
      ns.slots = s.admit_limit;
      ns.live = static_cast<uint32_t>(s.live.size());
      ns.creating = s.creating;
      ns.created = s.created;
      ns.failed = s.failed;
      ns.destroyed = s.destroyed;
      ns.gc = s.cfg.gc;
      ns.refused_internal = refused_internal();
      ns.default_memory = s.cfg.defaults.memory_bytes.value_or(0);
      ns.default_pids = s.cfg.defaults.pids.value_or(0);
      ns.default_disk = s.cfg.defaults.disk_bytes;
      ns.backends = offers(s);
      ns.memory_capacity = memory_capacity(s);
      ns.memory_admitted = s.memory_admitted;
      ns.cordoned = s.cordoned;
      ns.pools = s.pools.infos(s.cfg.name);
      ns.pooled = s.pools.size();
      ns.memory_pressure = s.pools.pressure();
      ns.paused = static_cast<uint32_t>(s.paused.size());
      create_latency(ns.create_buckets, ns.create_sum);
      if (s.cfg.eng) {
        auto pool = s.cfg.eng->cgroup_pool_stats();
        ns.cgroups_reused = pool.reused;
        ns.cgroups_made = pool.made;
        auto c = s.cfg.eng->chronus().stats();
        ns.chronus_sandboxes = static_cast<uint32_t>(s.cfg.eng->chronus().sandboxes());
        if (auto* net = s.cfg.eng->network()) {
          auto c = net->counters();
          ns.egress_sandboxes = static_cast<uint32_t>(net->attached());
          ns.egress_allowed = c.allowed;
          ns.egress_denied = c.denied;
          for (auto& t : net->traffic())
            ns.egress_by_sandbox.push_back({t.sandbox.empty() ? t.ifname : t.sandbox,
                                            t.sent_bytes, t.received_bytes, t.connections,
                                            t.denied_packets});
        }
        if (auto* fw = s.cfg.eng->ports()) {
          auto c = fw->stats();
          ns.exposed_ports = static_cast<uint32_t>(c.forwards);
          ns.exposed_connections = c.accepted;
          ns.exposed_refused = c.refused;
          ns.exposed_idle_closed = c.idle_closed;
        }
        ns.chronus_events = c.events;
        ns.chronus_answered = c.answered;
        ns.chronus_too_large = c.too_large;
        ns.chronus_malformed = c.malformed;
        ns.chronus_unauthenticated = c.unauthenticated;
        ns.chronus_invalid = c.invalid;
        ns.chronus_flooding = c.flooding;
        ns.chronus_refused_connections = c.refused_connections;
      }
      if (!s.cfg.cache)
        return {s.cfg.key, ns}; // a simulated node: no layers
      auto rp = self->make_response_promise<internal_key, node_stats>();
      auto key = s.cfg.key;
      self->request(s.cfg.cache, std::chrono::seconds(10), stats_atom::value, process_key())
        .then(
          [=](uint32_t n, uint64_t bytes, uint64_t budget, uint64_t evicted) mutable {
            auto out = ns;
            out.layers_mounted = n;
            out.layer_bytes = bytes;
            out.cache_budget = budget;
            out.evicted = evicted;
            rp.deliver(key, std::move(out));
          },
          [=](caf::error&) mutable { rp.deliver(key, ns); });
      return rp;
    },
    [=](cordon_atom, const internal_key& k,
        bool on) -> caf::result<internal_key, uint32_t> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "cordon (node)"))
        return refuse("cordon");
      if (s.cordoned != on) {
        std::printf("dsecd: node %s %s\n", s.cfg.name.c_str(),
                    on ? "cordoned: it admits no new sandbox" : "uncordoned");
        std::fflush(stdout);
      }
      s.cordoned = on;
      if (on) // its idle pooled sandboxes go; no new ones are made while cordoned
        evict_pooled(self, UINT32_MAX);
      else
        refill_pools(self);
      if (!on) { // nothing to wait for any more: the drains end with what is left
        for (auto& w : s.drain_waiters)
          w.rp.deliver(to_caf(make_error(errc::closed, "node " + s.cfg.name
                                                         + " was uncordoned while draining")));
        s.drain_waiters.clear();
      }
      publish(self);
      return {s.cfg.key, static_cast<uint32_t>(s.live.size())};
    },
    [=](drain_atom, const internal_key& k,
        uint64_t timeout_ms) -> caf::result<internal_key, uint32_t> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "drain (node)"))
        return refuse("drain");
      if (!s.cordoned) {
        std::printf("dsecd: node %s draining: it admits no new sandbox\n", s.cfg.name.c_str());
        std::fflush(stdout);
      }
      s.cordoned = true;
      evict_pooled(self, UINT32_MAX);
      publish(self);
      auto had = static_cast<uint32_t>(s.live.size() - std::min<size_t>(s.live.size(),
                                                                         s.pools.size()));
      if (had == 0)
        return {s.cfg.key, 0u};
      auto rp = self->make_response_promise<internal_key, uint32_t>();
      auto number = s.next_drain++;
      s.drain_waiters.push_back({number, rp, had});
      if (timeout_ms > 0)
        self->delayed_send(self, std::chrono::milliseconds(timeout_ms), timeout_atom::value,
                           process_key(), number);
      return rp;
    },
    [=](timeout_atom, const internal_key& k, uint64_t number) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "timeout (node)"))
        return;
      auto it = std::find_if(s.drain_waiters.begin(), s.drain_waiters.end(),
                             [&](const auto& w) { return w.number == number; });
      if (it == s.drain_waiters.end())
        return; // drained meanwhile
      it->rp.deliver(to_caf(make_error(
        errc::timeout, "node " + s.cfg.name + " still has " + std::to_string(s.live.size())
                         + " of its " + std::to_string(it->had)
                         + " sandboxes; it stays cordoned (dsec node uncordon to undo)")));
      s.drain_waiters.erase(it);
    },
    [=](ready_atom, const internal_key& k, const std::string& id) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "ready (node)"))
        return;
      auto it = s.live.find(id);
      if (it != s.live.end() && !it->second.ready) {
        s.pools.ready(id);
        it->second.ready = true;
        --s.creating;
        ++s.created;
        --s.starting;
        if (auto* m = it->second.m) {
          m->creates.inc();
          m->create_seconds.observe(
            std::chrono::duration<double>(mclock::now() - it->second.admitted).count());
        }
        pump(self);
        publish(self);
      }
    },
    [=](gone_atom, const internal_key& k, const std::string& id, bool was_created) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "gone (node)"))
        return;
      auto it = s.live.find(id);
      if (it == s.live.end())
        return;
      if (!it->second.ready) {
        --s.creating;
        --s.starting;
      }
      s.memory_admitted -= it->second.memory;
      s.paused.erase(id);
      auto* m = it->second.m;
      s.live.erase(it);
      pump(self);
      if (was_created)
        ++s.destroyed;
      else
        ++s.failed;
      if (m && was_created)
        m->destroys.inc();
      else if (m)
        count_failure(m->backend, "create_failed");
      s.pools.gone(id);
      check_shutdown(self);
      refill_pools(self);
      publish(self);
    },
    [=](pool_atom, const internal_key& k, environment& env, uint32_t size,
        const session_actor& owner, const std::string& owner_id)
      -> caf::result<internal_key, uint32_t> {
      if (!genuine(k, self->state.cfg.key, "pool (node)"))
        return refuse("pool");
      auto r = set_pool(self, std::move(env), size, owner, owner_id);
      if (!r)
        return to_caf(r.error_value());
      return {self->state.cfg.key, *r};
    },
    [=](pressure_atom, const internal_key& k) {
      if (genuine(k, process_key(), "pressure (node)"))
        check_pressure(self);
    },
    [=](held_atom, const internal_key& k)
      -> caf::result<internal_key, std::vector<held_session>> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "held (node)"))
        return refuse("held");
      // The ready sandboxes of each session (a pool's unclaimed ones have
      // none); those still being created went with their session.
      std::map<std::string, held_session> by;
      for (const auto& [id, e] : s.live) {
        if (!e.ready || !e.handle || e.session_id.empty() || s.pools.pooled(id))
          continue;
        auto& h = by[e.session_id];
        if (h.id.empty()) {
          h.id = e.session_id;
          if (auto m = s.session_meta.find(e.session_id); m != s.session_meta.end()) {
            h.options = m->second.first;
            h.owned = m->second.second;
          }
        }
        h.sandboxes.push_back(id);
      }
      // Forget what no live sandbox needs any more.
      std::erase_if(s.session_meta, [&](const auto& kv) {
        return std::none_of(s.live.begin(), s.live.end(),
                            [&](const auto& e) { return e.second.session_id == kv.first; });
      });
      std::vector<held_session> out;
      for (auto& [sid, h] : by)
        out.push_back(std::move(h));
      return {process_key(), std::move(out)};
    },
    [=](adopt_atom, const internal_key& k, const std::string& session_id,
        const session_actor& session) -> caf::result<internal_key, uint32_t> {
      auto& s = self->state;
      if (!genuine(k, s.cfg.key, "adopt (node)"))
        return refuse("adopt");
      uint32_t n = 0;
      // No session: the coordinator will not adopt them (their session keeps
      // a trajectory log, and is resumed from it, rebuilding them under
      // their ids): they go now rather than at the grace.
      if (!session) {
        for (const auto& [id, e] : s.live)
          if (e.ready && e.handle && e.session_id == session_id) {
            caf::anon_send(e.handle, destroy_atom::value, s.cfg.key);
            ++n;
          }
        return {s.cfg.key, n};
      }
      for (const auto& [id, e] : s.live)
        if (e.ready && e.handle && e.session_id == session_id) {
          // Each tells the session itself (adopt_atom) if it was orphaned.
          self->send(e.handle, adopt_atom::value, process_key(),
                     caf::actor_cast<caf::actor>(session), e.labels, e.count);
          ++n;
        }
      return {s.cfg.key, n};
    },
    [=](reset_atom, const internal_key& k, const std::string& why) -> caf::result<uint32_t> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "reset (node)"))
        return refuse("reset");
      auto rp = self->make_response_promise<uint32_t>();
      drop_session_pools(self);
      for (auto& sc : s.queued) {
        s.pools.gone(sc.id);
        if (!sc.pooled) {
          count_failure(sc.env.backend, "lost");
          self->send(sc.session, failed_atom::value, s.cfg.key,
                     to_caf(make_error(errc::lost, "node " + s.cfg.name
                                                     + " lost its coordinator")),
                     sc.request);
        }
        s.live.erase(sc.id);
        --s.creating;
        ++s.failed;
      }
      s.queued.clear();
      s.reset_waiters.emplace_back(rp, static_cast<uint32_t>(s.live.size()));
      for (auto& [id, e] : s.live)
        caf::anon_send(e.handle, destroy_atom::value, s.cfg.key, why);
      check_shutdown(self);
      publish(self);
      return rp;
    },
    [=](shutdown_atom, const internal_key& k) -> caf::result<uint32_t> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "shutdown (node)"))
        return refuse("shutdown");
      auto rp = self->make_response_promise<uint32_t>();
      s.shutdown_waiters.push_back(rp);
      if (!s.shutting_down) {
        s.shutting_down = true;
        // Queued ones never started: they fail now.
        for (auto& sc : s.queued) {
          s.pools.gone(sc.id);
          if (!sc.pooled) {
            count_failure(sc.env.backend, "shutting_down");
            self->send(sc.session, failed_atom::value, s.cfg.key,
                       to_caf(make_error(errc::overloaded,
                                         "node " + s.cfg.name + " is shutting down")),
                       sc.request);
          }
          s.live.erase(sc.id);
          --s.creating;
          ++s.failed;
        }
        s.queued.clear();
        s.shutdown_count = static_cast<uint32_t>(s.live.size());
        for (auto& [id, e] : s.live)
          caf::anon_send(e.handle, destroy_atom::value, s.cfg.key); // their replies are not ours to take
      }
      check_shutdown(self);
      publish(self);
      return rp;
    },
    // ---- snapshots (issue 16) ----
    [=](pause_atom, const internal_key& k, const std::string& id, bool on) {
      auto& s = self->state;
      if (!genuine(k, process_key(), "pause (node)"))
        return;
      if (on && s.live.count(id) != 0)
        s.paused.insert(id);
      else
        s.paused.erase(id);
      publish(self);
    },
  };
}

} // namespace

node_actor spawn_node(caf::actor_system& sys, node_config cfg) {
  return sys.spawn(node_impl, std::move(cfg));
}

} // namespace dsec
