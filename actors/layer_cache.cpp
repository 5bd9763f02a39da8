#include "actors/layer_cache.hpp"

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <memory>
#include <optional>
#include <unordered_map>

#include "actors/types.hpp"
#include "runtime/engine.hpp"
#include "runtime/mount.hpp"

namespace dsec {

namespace {

struct layer_cache_state {
  static inline const char* name = "dsec.layer_cache";

  engine* eng = nullptr;
  uint64_t budget = 0;

  struct mounted {
    std::unique_ptr<layer_mount> mnt;
    uint64_t bytes = 0;
    uint32_t users = 0;
    uint64_t last_used = 0;
  };
  std::unordered_map<std::string, mounted> mounts; // by digest

  struct ref_entry {
    layer_kind kind;
    std::string digest;
    std::optional<layer_lease> lease; // held while users > 0
    uint32_t users = 0;
  };
  std::unordered_map<std::string, ref_entry> refs; // by NAME@VERSION

  struct lease_entry {
    std::vector<std::string> refs;
    std::vector<std::string> digests;
  };
  std::unordered_map<uint64_t, lease_entry> leases;

  std::unique_ptr<layer_mount> system;
  uint64_t next_lease = 1;
  uint64_t tick = 0;
  uint64_t bytes = 0;
  uint64_t evicted = 0;
  // layer distribution: where missing layers come from (none: a single node)
  layer_store_actor source;
  uint64_t fetched = 0, fetched_bytes = 0;

  // Takes a reference on `ref`, checking its kind; leases it in the store when
  // it was unused.
  expected<ref_entry*> use_ref(const std::string& text, layer_kind want, const char* slot) {
    DSEC_TRY(parsed, parse_layer_ref(text));
    auto it = refs.find(text);
    if (it == refs.end() || it->second.users == 0) {
      DSEC_TRY(l, eng->layers().lease(parsed));
      auto& e = refs[text];
      e.kind = l.info().kind;
      e.digest = l.info().digest;
      e.lease.emplace(std::move(l));
      it = refs.find(text);
    }
    auto& e = it->second;
    if (e.kind != want) {
      if (e.users == 0)
        e.lease.reset();
      return dsec::make_error(errc::wrong_kind, std::string{slot} + " " + text + " is a "
                                                  + to_string(e.kind) + " layer, not a "
                                                  + to_string(want) + " layer");
    }
    ++e.users;
    return &e;
  }

  void drop_ref(const std::string& text) {
    auto it = refs.find(text);
    if (it == refs.end() || it->second.users == 0)
      return;
    if (--it->second.users == 0)
      it->second.lease.reset(); // `layer rm` may remove it now
  }

  // Mounts (or finds) a digest's image and takes a reference.
  expected<int> use_mount(const std::string& digest, const std::string& ref) {
    auto it = mounts.find(digest);
    if (it == mounts.end()) {
      const auto& e = refs[ref];
      DSEC_TRY(m, layer_mount::open(e.lease->blob_path(), eng->userns_fd()));
      mounted mm;
      mm.mnt = std::make_unique<layer_mount>(std::move(m));
      mm.bytes = e.lease->info().size;
      bytes += mm.bytes;
      it = mounts.emplace(digest, std::move(mm)).first;
    }
    ++it->second.users;
    it->second.last_used = ++tick;
    return it->second.mnt->dir_fd();
  }

  void drop_mount(const std::string& digest) {
    auto it = mounts.find(digest);
    if (it != mounts.end() && it->second.users > 0)
      --it->second.users;
  }

  // Unmounts unused layers, oldest first, until the budget is kept.
  void evict() {
    while (budget > 0 && bytes > budget) {
      auto victim = mounts.end();
      for (auto it = mounts.begin(); it != mounts.end(); ++it)
        if (it->second.users == 0
            && (victim == mounts.end() || it->second.last_used < victim->second.last_used))
          victim = it;
      if (victim == mounts.end())
        return; // everything is in use
      bytes -= victim->second.bytes;
      mounts.erase(victim);
      ++evicted;
    }
  }

  expected<layer_set> acquire(const environment& env) {
    if (!system) {
      DSEC_TRY(path, eng->layers().system_layer());
      DSEC_TRY(m, layer_mount::open(path, eng->userns_fd()));
      system = std::make_unique<layer_mount>(std::move(m));
    }
    if (env.base.empty())
      return dsec::make_error(errc::invalid_argument, "an environment needs a base layer");
    // Topmost first: the last tool, ..., the first tool, the workdir, the base.
    std::vector<std::pair<std::string, std::pair<layer_kind, const char*>>> wanted;
    for (auto it = env.tools.rbegin(); it != env.tools.rend(); ++it)
      wanted.push_back({*it, {layer_kind::tool, "tool"}});
    if (!env.workdir.empty())
      wanted.push_back({env.workdir, {layer_kind::workdir, "workdir"}});
    wanted.push_back({env.base, {layer_kind::base, "base"}});
    lease_entry le;
    layer_set out;
    out.fds.push_back(system->dir_fd());
    auto undo = [&] {
      for (auto& d : le.digests)
        drop_mount(d);
      for (auto& r : le.refs)
        drop_ref(r);
    };
    for (auto& [text, slot] : wanted) {
      auto e = use_ref(text, slot.first, slot.second);
      if (!e) {
        undo();
        return std::move(e).error_value();
      }
      le.refs.push_back(text);
      auto fd = use_mount((*e)->digest, text);
      if (!fd) {
        undo();
        return std::move(fd).error_value().in_step("mount_layers");
      }
      le.digests.push_back((*e)->digest);
      out.fds.push_back(*fd);
    }
    out.lease = next_lease++;
    leases.emplace(out.lease, std::move(le));
    evict();
    return out;
  }

  void release(uint64_t lease) {
    auto it = leases.find(lease);
    if (it == leases.end())
      return;
    for (auto& d : it->second.digests)
      drop_mount(d);
    for (auto& r : it->second.refs)
      drop_ref(r);
    leases.erase(it);
    evict();
  }
};

layer_cache_actor::behavior_type
layer_cache_impl(layer_cache_actor::stateful_pointer<layer_cache_state> self, engine* eng,
                 uint64_t budget) {
  self->state.eng = eng;
  self->state.budget = budget;
  return {
    [=](acquire_atom, const environment& env) -> caf::result<layer_set> {
      auto r = self->state.acquire(env);
      if (!r)
        return to_caf(r.error_value());
      return std::move(*r);
    },
    [=](release_atom, uint64_t lease) { self->state.release(lease); },
    [=](source_atom, layer_store_actor& src) { self->state.source = std::move(src); },
    [=](list_atom) -> caf::result<std::vector<std::string>, uint64_t, uint64_t> {
      auto& s = self->state;
      std::vector<std::string> refs;
      if (auto all = s.eng->layers().list())
        for (auto& l : *all)
          refs.push_back(l.ref.to_string());
      return {std::move(refs), s.fetched, s.fetched_bytes};
    },
    [=](stats_atom) -> caf::result<uint32_t, uint64_t, uint64_t, uint64_t> {
      auto& s = self->state;
      return {static_cast<uint32_t>(s.mounts.size()), s.bytes, s.budget, s.evicted};
    },
  };
}

} // namespace

layer_cache_actor spawn_layer_cache(caf::actor_system& sys, engine& eng, uint64_t budget) {
  return sys.spawn(layer_cache_impl, &eng, budget);
}

} // namespace dsec
