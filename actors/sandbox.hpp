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
  std::string seed_pack;    ///< restore this pack first (placement.seed_pack)
  std::string seed_blobs;
};

sandbox_actor spawn_sandbox(caf::actor_system& sys, sandbox_config cfg);

/// A sandbox's end as its session and node must hear it (the real sandbox and
/// the simulated one alike): the session gets gone_atom if it was ready, else
/// failed_atom for its create request (its batch waits for every sandbox),
/// unless it heard that already (`failure_told`); the node gets gone_atom.
template <class Self>
void tell_end(Self* self, const session_actor& session, const node_actor& node,
              const std::string& id, uint64_t request, bool was_created, bool failure_told) {
  if (was_created)
    self->send(session, gone_atom::value, id);
  else if (!failure_told)
    self->send(session, failed_atom::value,
               to_caf(make_error(errc::sandbox_failed,
                                 "sandbox " + id + " was destroyed before it was ready")),
               request);
  self->send(node, gone_atom::value, id, was_created);
}

/// Asks each of `boxes` for its sandbox_info (10 s each; one that does not
/// answer is left out) and delivers them, after `known`, to `rp`. For the
/// list verbs of the node and the session.
template <class Self>
caf::typed_response_promise<std::vector<sandbox_info>>
gather_infos(Self* self, std::vector<sandbox_info> known,
             const std::vector<sandbox_actor>& boxes) {
  auto rp = self->template make_response_promise<std::vector<sandbox_info>>();
  if (boxes.empty()) {
    rp.deliver(std::move(known));
    return rp;
  }
  struct gather {
    std::vector<sandbox_info> infos;
    size_t left;
  };
  auto g = std::make_shared<gather>(gather{std::move(known), boxes.size()});
  for (const auto& sb : boxes)
    self->request(sb, std::chrono::seconds(10), list_atom::value)
      .then(
        [=](sandbox_info& info) mutable {
          g->infos.push_back(std::move(info));
          if (--g->left == 0)
            rp.deliver(std::move(g->infos));
        },
        [=](caf::error&) mutable {
          if (--g->left == 0)
            rp.deliver(std::move(g->infos));
        });
  return rp;
}

} // namespace dsec
