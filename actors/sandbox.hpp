// sandbox: one actor per sandbox, owning its runtime::container.
//
// States: creating (layers acquired, init setting itself up), ready (idle),
// running (one or more commands), destroying (being torn down; then the actor
// quits). If init dies unexpectedly the sandbox destroys itself, and its
// commands in flight fail with the reason. A sandbox is destroyed on request,
// when its TTL expires, when its session ends (it monitors the session), or
// when its init dies.
//
// Nothing here blocks on the sandbox: the node's reactor thread watches init's
// control socket, its pidfd and the commands' output pipes, and posts what it
// sees to this actor (event_atom, output_atom, reaped_atom).
#pragma once

#include <map>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "actors/interfaces.hpp"
#include "actors/types.hpp"

namespace dsec {

class engine;

struct sandbox_config {
  std::string id;
  std::string session_id;
  environment env;         ///< ttl_ms already defaulted by the session
  session_actor session;
  uint64_t request = 0;    ///< the session's create request it belongs to
  node_actor node;
  std::string node_name;   ///< for sandbox_info
  layer_cache_actor cache;
  engine* eng = nullptr;
  bool keep_upper = false;  ///< packs can be taken (placement.keep_upper)
  /// Restore this pack first (placement.seed_pack: a name in the trajectory
  /// dir's packs/ of its session), or this manifest (placement.seed_manifest).
  std::string seed_pack;
  std::string seed_manifest;
  /// The node's trajectory dir (<state dir>/trajectories, or dsecd
  /// --trajectories): its packs go to <trajectories>/<session_id>/packs/, their
  /// contents to .../blobs/. Empty: the node keeps none, packs are refused.
  std::string trajectories;
  /// The member key (actors/surface.hpp): every message of the member surface
  /// it gets must carry it, and the ones it sends carry it.
  internal_key key;
  /// A sandbox of a warm pool (actors/warm_pool.hpp): until its node hands it
  /// to a create (claim_atom) it tells no session anything, has no TTL and
  /// refuses every command; `session` is the pool's owner (null: the node's).
  bool pooled = false;
  /// When its session's process goes away (its connection dropped), it is
  /// kept this long (orphaned: idle, its TTL running) for a restarted
  /// coordinator to adopt (adopt_atom); 0: destroyed at once.
  std::chrono::milliseconds orphan_grace{0};
};

sandbox_actor spawn_sandbox(caf::actor_system& sys, sandbox_config cfg);

/// A sandbox's end as its session and node must hear it (the real sandbox and
/// the simulated one alike): the session gets gone_atom if it was ready, else
/// failed_atom for its create request (its batch waits for every sandbox),
/// unless it heard that already (`failure_told`); the node gets gone_atom.
template <class Self>
void tell_end(Self* self, const internal_key& key, const session_actor& session,
              const node_actor& node, const std::string& id, uint64_t request, bool was_created,
              bool failure_told) {
  if (was_created)
    self->send(session, gone_atom::value, key, id);
  else if (!failure_told)
    self->send(session, failed_atom::value, key,
               to_caf(make_error(errc::sandbox_failed,
                                 "sandbox " + id + " was destroyed before it was ready")),
               request);
  self->send(node, gone_atom::value, process_key(), id, was_created);
}

/// A pooled sandbox handed to a create (claim_atom), the container's and the
/// microVM's alike: from now on its config names the claiming session (which
/// it monitors instead of the pool's owner), its id, the create request and
/// the TTL that starts at the claim.
template <class Self>
void take_claim(Self* self, sandbox_config& cfg, const session_actor& session,
                const std::string& session_id, uint64_t request, uint64_t ttl_ms) {
  if (cfg.session && cfg.session != session)
    self->demonitor(cfg.session.address());
  if (cfg.session != session)
    self->monitor(session);
  cfg.session = session;
  cfg.session_id = session_id;
  cfg.request = request;
  cfg.env.ttl_ms = ttl_ms;
}

/// Asks each of `boxes` for its sandbox_info (10 s each; one that does not
/// answer is left out) and hands them, after `known`, to `done`. For the list
/// verbs of the node and the session.
template <class Self, class Done>
void gather_infos(Self* self, const internal_key& key, std::vector<sandbox_info> known,
                  const std::vector<sandbox_actor>& boxes, Done done) {
  if (boxes.empty()) {
    done(std::move(known));
    return;
  }
  struct gather {
    std::vector<sandbox_info> infos;
    size_t left;
  };
  auto g = std::make_shared<gather>(gather{std::move(known), boxes.size()});
  for (const auto& sb : boxes)
    self->request(sb, std::chrono::seconds(10), list_atom::value, key)
      .then(
        [=](sandbox_info& info) mutable {
          g->infos.push_back(std::move(info));
          if (--g->left == 0)
            done(std::move(g->infos));
        },
        [=](caf::error&) mutable {
          if (--g->left == 0)
            done(std::move(g->infos));
        });
}

/// Like gather_infos, for a session's list: each of `boxes` (id, actor) gets
/// `wait` to answer; one that does not (its node hung, or cut off and not yet
/// lost) is listed as state "no answer", with its node's name when another
/// sandbox of that node answered.
template <class Self, class Done>
void gather_infos_or_silent(Self* self, const internal_key& key, std::vector<sandbox_info> known,
                            const std::vector<std::pair<std::string, sandbox_actor>>& boxes,
                            const std::string& session, std::chrono::milliseconds wait,
                            Done done) {
  if (boxes.empty()) {
    done(std::move(known));
    return;
  }
  struct gather {
    std::vector<sandbox_info> infos;
    std::vector<std::pair<std::string, caf::node_id>> silent;
    std::map<caf::node_id, std::string> names;
    size_t left;
  };
  auto g = std::make_shared<gather>();
  g->infos = std::move(known);
  g->left = boxes.size();
  auto finish = [=]() mutable {
    if (--g->left > 0)
      return;
    for (auto& [id, where] : g->silent) {
      sandbox_info info;
      info.id = id;
      info.session = session;
      info.state = "no answer";
      if (auto n = g->names.find(where); n != g->names.end())
        info.node = n->second;
      g->infos.push_back(std::move(info));
    }
    done(std::move(g->infos));
  };
  for (const auto& [id, sb] : boxes)
    self->request(sb, wait, list_atom::value, key)
      .then(
        [=, where = sb.node()](sandbox_info& info) mutable {
          if (!info.node.empty())
            g->names.emplace(where, info.node);
          g->infos.push_back(std::move(info));
          finish();
        },
        [=, id = id, where = sb.node()](caf::error&) mutable {
          g->silent.emplace_back(id, where);
          finish();
        });
}

} // namespace dsec
