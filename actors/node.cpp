#include "actors/node.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <sys/random.h>

#include <deque>
#include <set>
#include <memory>
#include <unordered_map>

#include "actors/sandbox.hpp"
#include "actors/types.hpp"
#include "runtime/engine.hpp"
#include "runtime/container.hpp"

namespace dsec {

namespace {

struct node_state {
  static inline const char* name = "dsec.node";

  node_config cfg;
  uint32_t admit_limit = 0;
  struct entry {
    sandbox_actor handle;
    bool ready = false;
    uint64_t memory = 0; // modelled (a sim node's)
  };
  std::unordered_map<std::string, entry> live;
  // Admitted sandboxes wait here for their turn: creating a few at a time lets
  // the first of a big batch be ready at once instead of all at the end.
  std::deque<sandbox_config> queued;
  uint32_t starting = 0;
  uint32_t creating = 0;
  uint64_t created = 0, failed = 0, destroyed = 0;
  uint64_t sim_memory = 0; // modelled bytes of the live sandboxes (a sim node)
  uint64_t sim_rng = 0;    // a sim node's ids: splitmix64, seeded once

  std::vector<caf::typed_response_promise<uint32_t>> shutdown_waiters;
  uint32_t shutdown_count = 0;
  bool shutting_down = false;
  // reset_atom: answered once the node is empty, with how many there were
  std::vector<std::pair<caf::typed_response_promise<uint32_t>, uint32_t>> reset_waiters;
  // warm pools (actors/warm_pool.hpp)
  warm_pools pools;
  bool pressure_timer = false;   // a pressure_atom is on its way
  std::set<caf::actor_addr> pool_owners; // sessions monitored for their pools
};

using self_ptr = node_actor::stateful_pointer<node_state>;

// Starts queued sandboxes while fewer than max_starting are being created.
void pump(self_ptr self) {
  auto& s = self->state;
  while (s.starting < std::max(1u, s.cfg.max_starting) && !s.queued.empty()) {
    auto sc = std::move(s.queued.front());
    s.queued.pop_front();
    auto it = s.live.find(sc.id);
    if (it == s.live.end())
      continue; // shut down meanwhile
    it->second.handle = spawn_sandbox(self->system(), std::move(sc));
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
    std::string id(12, '0');
    for (size_t i = 0; i < 12; ++i)
      id[i] = hex[(z >> (4 * i)) & 15];
    if (!s.live.count(id))
      return id;
  }
}

// Every sandbox has limits: the node's defaults where it asks for none.
void fill_defaults(const node_state& s, environment& env) {
  if (env.memory == 0)
    env.memory = s.cfg.defaults.memory_bytes.value_or(0);
  if (env.pids == 0)
    env.pids = s.cfg.defaults.pids.value_or(0);
  if (env.disk == 0)
    env.disk = s.cfg.defaults.disk_bytes;
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
  uint32_t room = used >= s.admit_limit ? 0 : s.admit_limit - used;
  for (auto [pid, n] : s.pools.wanted(room)) {
    const auto* p = s.pools.find(pid);
    for (uint32_t i = 0; i < n; ++i) {
      sandbox_config sc;
      sc.id = new_sandbox_id();
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
      s.pools.warming(pid, sc.id);
      s.live.emplace(sc.id, node_state::entry{});
      s.queued.push_back(std::move(sc));
      ++s.creating;
    }
  }
  pump(self);
}

// A create's sandboxes from the pools, as far as they go: each claimed in one
// message. Not for a sandbox rebuilt from a log or made for packs.
uint32_t claim_pooled(self_ptr self, const environment& env, uint32_t count,
                      const session_actor& session, const placement& pl) {
  auto& s = self->state;
  if (s.pools.empty() || s.shutting_down || !pl.id.empty() || !pl.seed_pack.empty()
      || !pl.seed_manifest.empty() || pl.keep_upper)
    return 0;
  auto want = env;
  fill_defaults(s, want);
  uint64_t ttl = env.ttl_ms != 0 ? env.ttl_ms : pl.ttl_ms;
  uint32_t n = 0;
  while (n < count) {
    auto id = s.pools.take(want, session.address());
    if (!id)
      break;
    auto& e = s.live.at(*id);
    // (Its answer matters only if it is gone already: then nobody told the
    // session, and its request would wait for ever.)
    self->request(e.handle, std::chrono::seconds(30), claim_atom::value, process_key(),
                  caf::actor_cast<caf::actor>(session), pl.session_id, pl.request, ttl)
      .then([](bool) {},
            [=, key = s.cfg.key, id = *id, request = pl.request](caf::error&) {
              self->send(session, failed_atom::value, key,
                         to_caf(make_error(errc::sandbox_failed,
                                           "pooled sandbox " + id + " ended before it was claimed")),
                         request);
            });
    ++n;
  }
  return n;
}

// Destroys up to `n` idle pooled sandboxes for a create; how many.
uint32_t evict_pooled(self_ptr self, uint32_t n) {
  auto& s = self->state;
  std::vector<std::string> ids;
  while (ids.size() < n) {
    auto id = s.pools.evict();
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
  if (env.base.empty())
    return make_error(errc::invalid_argument, "a pool's environment needs a base layer");
  if (size > s.admit_limit)
    return make_error(errc::invalid_argument,
                      "a pool of " + std::to_string(size) + " does not fit node " + s.cfg.name
                        + " (" + std::to_string(s.admit_limit) + " slots)");
  fill_defaults(s, env);
  env.ttl_ms = 0;
  env.backend = "container";
  std::vector<std::string> orphans;
  s.pools.set(env, owner, owner.address() ? owner_id : "node", size, orphans);
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
  start_pools(self);
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
      uint32_t claimed = claim_pooled(self, env, count, session, pl);
      count -= claimed;
      uint32_t room = s.shutting_down || used_slots(s) >= s.admit_limit
                        ? 0
                        : s.admit_limit - used_slots(s);
      if (room < count && !s.shutting_down)
        room += evict_pooled(self, count - room); // pools give up their slots first
      if (s.cfg.sim && s.cfg.sim->node_memory > 0) {
        // The modelled memory: a node admits what fits.
        uint64_t each = env.memory ? env.memory : s.cfg.sim->memory;
        if (each > 0) {
          uint64_t used = s.sim_memory;
          uint64_t fit = used >= s.cfg.sim->node_memory ? 0
                                                        : (s.cfg.sim->node_memory - used) / each;
          room = static_cast<uint32_t>(std::min<uint64_t>(room, fit));
        }
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
        uint64_t each = env.memory ? env.memory : s.cfg.sim->memory;
        std::shared_ptr<const sim_common> shared = std::move(c);
        for (uint32_t i = 0; i < admitted; ++i) {
          auto id = pl.id.empty() ? sim_id(s) : pl.id;
          auto h = spawn_sim_sandbox(self->system(), shared, id, request);
          s.live.emplace(std::move(id), node_state::entry{std::move(h), false, each});
          s.sim_memory += each;
          ++s.creating;
          ++s.starting;
        }
      }
      for (uint32_t i = 0; i < admitted && !s.cfg.sim; ++i) {
        sandbox_config sc;
        sc.id = pl.id.empty() ? new_sandbox_id() : pl.id;
        sc.session_id = pl.session_id;
        sc.env = env;
        if (sc.env.ttl_ms == 0)
          sc.env.ttl_ms = pl.ttl_ms;
        fill_defaults(s, sc.env);
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
        s.live.emplace(sc.id, node_state::entry{});
        s.queued.push_back(std::move(sc));
        ++s.creating;
      }
      pump(self);
      if (claimed > 0)
        refill_pools(self);
      if (!pl.report_refusals)
        return {s.cfg.key, admitted + claimed}; // the cluster's scheduler places them elsewhere
      // Every sandbox asked for gets an answer; the ones without a slot now.
      for (uint32_t i = admitted; i < count; ++i)
        self->send(session, failed_atom::value, s.cfg.key,
                   to_caf(make_error(errc::overloaded,
                                     s.shutting_down
                                       ? "node " + s.cfg.name + " is shutting down"
                                       : "node " + s.cfg.name + " is full: "
                                           + std::to_string(s.live.size()) + " of "
                                           + std::to_string(s.admit_limit)
                                           + " slots in use")),
                   request);
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
      ns.pools = s.pools.infos(s.cfg.name);
      ns.pooled = s.pools.size();
      ns.memory_pressure = s.pools.pressure();
      if (s.cfg.eng) {
        auto pool = s.cfg.eng->cgroup_pool_stats();
        ns.cgroups_reused = pool.reused;
        ns.cgroups_made = pool.made;
        auto c = s.cfg.eng->chronus().stats();
        ns.chronus_sandboxes = static_cast<uint32_t>(s.cfg.eng->chronus().sandboxes());
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
        pump(self);
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
      s.sim_memory -= it->second.memory;
      s.live.erase(it);
      pump(self);
      if (was_created)
        ++s.destroyed;
      else
        ++s.failed;
      s.pools.gone(id);
      check_shutdown(self);
      refill_pools(self);
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
    [=](reset_atom, const internal_key& k) -> caf::result<uint32_t> {
      auto& s = self->state;
      if (!genuine(k, process_key(), "reset (node)"))
        return refuse("reset");
      auto rp = self->make_response_promise<uint32_t>();
      drop_session_pools(self);
      for (auto& sc : s.queued) {
        s.pools.gone(sc.id);
        if (!sc.pooled)
          self->send(sc.session, failed_atom::value, s.cfg.key,
                     to_caf(make_error(errc::lost, "node " + s.cfg.name
                                                     + " lost its coordinator")),
                     sc.request);
        s.live.erase(sc.id);
        --s.creating;
        ++s.failed;
      }
      s.queued.clear();
      s.reset_waiters.emplace_back(rp, static_cast<uint32_t>(s.live.size()));
      for (auto& [id, e] : s.live)
        caf::anon_send(e.handle, destroy_atom::value, s.cfg.key);
      check_shutdown(self);
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
          if (!sc.pooled)
            self->send(sc.session, failed_atom::value, s.cfg.key,
                       to_caf(make_error(errc::overloaded,
                                         "node " + s.cfg.name + " is shutting down")),
                       sc.request);
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
      return rp;
    },
  };
}

} // namespace

node_actor spawn_node(caf::actor_system& sys, node_config cfg) {
  return sys.spawn(node_impl, std::move(cfg));
}

} // namespace dsec
